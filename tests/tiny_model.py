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


# Gemma-2's special ids: <pad> 0, <eos> 1, <bos> 2, <unk> 3, <mask> 4, ... <start_of_turn> 106, <end_of_turn> 107
GEMMA2_SPECIAL = (["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] + [f"<unused{i}>" for i in range(101)]
                  + ["<start_of_turn>", "<end_of_turn>"])
GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n' + "
    "message['content'] + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<start_of_turn>model\n' }}{% endif %}"
)


def build_tiny_gemma2(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny Gemma2ForCausalLM + tokenizer to out_dir, its token ids as google/gemma-2-2b-it's: the
    tokenizer's eos is <eos> (1), while config.json and generation_config.json stop on a LIST of eos ids,
    [1, 107] (<eos>, <end_of_turn>); pad 0, bos 2. Tied embeddings, head_dim 32, ~0.1M parameters."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Gemma2Config, Gemma2ForCausalLM, GenerationConfig, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=GEMMA2_SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(seed=seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>")
    fast.chat_template = GEMMA2_TEMPLATE
    fast.save_pretrained(out)
    eos = [fast.eos_token_id, fast.convert_tokens_to_ids("<end_of_turn>")]
    assert (fast.pad_token_id, fast.bos_token_id, eos) == (0, 2, [1, 107]), "not Gemma-2's ids"

    torch.manual_seed(seed)
    config = Gemma2Config(
        vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, max_position_embeddings=512, sliding_window=64,
        tie_word_embeddings=True, bos_token_id=2, eos_token_id=eos, pad_token_id=0,
    )
    model = Gemma2ForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=2, eos_token_id=eos, pad_token_id=0,
                                               cache_implementation="hybrid")
    model.save_pretrained(out, safe_serialization=True)
    return out
