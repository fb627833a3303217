"""A tiny random Llama with a real trained byte-level BPE tokenizer and a ChatML template.

Built offline in about a second; tests and benchmarks use it wherever a real HF model is needed but
its answers do not matter (hidden 128, 2 layers, ~0.56M parameters, 2.3 MB). head_dim stays 32: vLLM's
CPU attention rejects head_dim 16.
"""

from __future__ import annotations

import random
from pathlib import Path

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]


def _corpus(n: int = 9000, seed: int = 0) -> list[str]:
    from llmrnn.cohort import ACUTE, CHRONIC, COMPLAINT

    rng = random.Random(seed)
    words = list(CHRONIC) + ACUTE + list(COMPLAINT.values()) + [
        '{"evolving_summary": "', '"}', "Score: ", "primary_diagnosis", "top_5_diagnoses", "memory",
        "patient", "visit", "history", "json", "true", "false", "[", "]", "{", "}", ":", ",",
    ]
    lines = []
    for _ in range(n):
        k = rng.randint(3, 12)
        lines.append(" ".join(rng.choice(words) for _ in range(k)) + f" {rng.randint(0, 99)}")
    return lines


def build_tiny_model(out_dir: str | Path, seed: int = 0, vocab_size: int = 2048) -> Path:
    """Write a tiny LlamaForCausalLM + tokenizer to out_dir (safetensors, chat template included)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_corpus(seed=seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id
    )
    model.save_pretrained(out, safe_serialization=True)
    return out
