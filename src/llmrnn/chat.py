"""`llmrnn chat --model DIR [--compare base|DIR]`: talk to a trained model in the terminal.

Each line you type is a user turn (the conversation is kept); `/reset` clears it, `/quit` or end of
input leaves. With --compare every turn is answered by both models, one block each. `--compare base`
follows the merge checks (DIR/../merge_check.json names the model the adapter was merged into) back to
the first model that is not a merge: the untrained base; a model that was never merged (or whose
weights equal its base's) is refused, since it would be compared with itself.

A line that is not UTF-8, or that does not fit the model's context with --max-new-tokens left for the
answer, is refused with one line and not sent; the chat goes on, and its exit status is then 2. A line is
read at most line_byte_limit() bytes at a time: a longer one (it could not fit: no token of the model's
vocabulary is that long) is refused before it is tokenised and its rest skipped in bounded chunks, so a
huge line costs neither the memory nor the time of tokenising it. A system prompt that leaves no room in
the context is refused at the start, naming --system.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.models import model_folder
from llmrnn.qa.evaluate import Generator

PROMPT = "you> "
REFUSED_EXIT = 2
# The bytes one token may stand for, at most, in the line bound (a model's longest vocabulary entry, capped:
# longer entries are runs of spaces or dashes that no typed line is made of).
MAX_BYTES_PER_TOKEN = 32
SKIP_CHUNK = 1 << 20


def _number(kind, name: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False):
    """An argparse type: a finite `kind` within [lo, hi] (lo excluded with lo_open); one line otherwise."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise InputError(f"{name}: {text!r} is not {'an integer' if kind is int else 'a number'}") from None
        bad = (not math.isfinite(value) or (lo is not None and (value <= lo if lo_open else value < lo))
               or (hi is not None and value > hi))
        if bad:
            low = "" if lo is None else f"{'>' if lo_open else '>='} {lo}"
            high = "" if hi is None else f"<= {hi}"
            raise InputError(f"{name}: {text} is out of range (must be {' and '.join(x for x in (low, high) if x)})")
        return value
    return parse


def resolve_base(model_dir: str | Path) -> Path:
    """The model at the root of the merge chain of `model_dir` (itself when it was never merged)."""
    current = Path(model_dir)
    for _ in range(8):  # GRPO merged <- SFT merged <- base: two hops in the qa recipe
        check = current.parent / "merge_check.json"
        if current.name != "merged" or not check.is_file():
            return current
        current = model_folder(io.read_json(check)["base"])
    raise InputError(f"{model_dir}: merge chain longer than 8 models")


def _weight_files(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin"))}


def same_weights(a: Path, b: Path) -> bool:
    """True when two model folders hold byte-identical weight files (a copy of the base, not a merge)."""
    files = _weight_files(a)
    if not files or files != _weight_files(b):
        return False
    return all(io.sha256_file(a / name) == io.sha256_file(b / name) for name in files)


def compare_target(model_dir: str | Path, compare: str) -> Path:
    """The model `--compare` answers with (`base`: the root of the merge chain); refused when that would
    be the model itself (never merged, the same folder, or the same weights)."""
    model = Path(model_folder(model_dir))
    other = Path(model_folder(resolve_base(model_dir) if compare == "base" else compare))
    if model.resolve() == other.resolve():
        if compare == "base":
            raise InputError(f"--compare base: {model_dir} was never merged (no merge_check.json beside it names "
                             "a base), so it would be compared with itself; give the base model folder to --compare")
        raise InputError(f"--compare: {compare} is the model itself")
    if same_weights(model, other):
        what = f"its base {other} (no adapter was merged into it)" if compare == "base" else compare
        raise InputError(f"--compare {compare}: {model_dir} has the same weights as {what}, so it would be "
                         "compared with itself")
    return other


def _text_arg(name: str):
    """An argparse type for free text: argv bytes that are not UTF-8 arrive as lone surrogates."""
    def parse(text: str) -> str:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InputError(f"{name}: character {exc.start}: not UTF-8 text") from None
        return text
    return parse


def context_limit(gen) -> int | None:
    """The most tokens the model takes (its max positions), None when its config does not say."""
    config = gen.model.config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def bytes_per_token(gen) -> int:
    """The most bytes one token of the model's vocabulary spells (UTF-8 of its entry), at most
    MAX_BYTES_PER_TOKEN."""
    vocab = gen.tokenizer.get_vocab()
    longest = max((len(t.encode("utf-8", "replace")) for t in vocab), default=MAX_BYTES_PER_TOKEN)
    return max(1, min(longest, MAX_BYTES_PER_TOKEN))


def line_byte_limit(gens: dict, max_new: int) -> tuple[int, str, int] | None:
    """(bytes, model name, its context) of the longest line any model could take: the context left after
    max_new tokens x the most bytes a token spells. A longer line cannot fit and is never tokenised."""
    best = None
    for name, gen in gens.items():
        limit = context_limit(gen)
        if limit is None:
            continue
        nbytes = (limit - max_new) * bytes_per_token(gen)
        if best is None or nbytes < best[0]:
            best = (nbytes, name, limit)
    return best


def prompt_tokens(gen, history: list[dict]) -> int:
    """Tokens of the chat as Generator.generate sends it (template + generation prompt)."""
    text = gen.tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
    return len(gen.tokenizer(text, add_special_tokens=False)["input_ids"])


def _answer(gen, history: list[dict], args) -> str:
    out = gen.generate([history], 1, args.temperature, args.top_p, args.max_new_tokens)
    return out[0][0].strip()


def _too_long(gens: dict, histories: dict, text: str, max_new: int) -> str | None:
    """Why the line cannot be sent (None when it fits every model's context with max_new tokens left)."""
    turn = {"role": "user", "content": text}
    for name, gen in gens.items():
        limit = context_limit(gen)
        if limit is None:
            continue
        used = prompt_tokens(gen, [*histories[name], turn])
        if used + max_new > limit:
            system = [m for m in histories[name][:1] if m["role"] == "system"]
            alone = prompt_tokens(gen, [*system, turn])
            hint = "shorten the line" if alone + max_new > limit else "/reset the conversation or shorten the line"
            return (f"{used} tokens with the conversation so far + {max_new} new tokens exceed the {name} model's "
                    f"context of {limit}; not sent ({hint})")
    return None


def _check_system(gens: dict, system: list[dict], max_new: int, bound: tuple[int, str, int] | None) -> None:
    """The system prompt must leave room for a line and the answer in every model's context: else one line
    naming --system (not a user line, which would then be refused one by one)."""
    text = system[0]["content"]
    if bound and len(text.encode("utf-8")) > bound[0]:
        raise InputError(f"--system: {len(text.encode('utf-8'))} bytes, more than fit in the {bound[1]} model's "
                         f"context of {bound[2]} tokens with --max-new-tokens {max_new} left; shorten the system "
                         "prompt")
    for name, gen in gens.items():
        limit = context_limit(gen)
        if limit is None:
            continue
        used = prompt_tokens(gen, [*system, {"role": "user", "content": ""}])
        if used + max_new >= limit:
            raise InputError(f"--system: the system prompt takes {used} tokens; with --max-new-tokens {max_new} "
                             f"that leaves no room for a line in the {_model(name)}'s context of {limit}; shorten "
                             "the system prompt")


def _model(name: str) -> str:
    """How a line names a model: "model" (the one chatted with), "base model", "compare model"."""
    return "model" if name == "model" else f"{name} model"


def _lines(stdin, bound: tuple[int, str, int] | None = None):
    """Input lines as (text or None, problem): bytes decoded as UTF-8 one line at a time, each read at most
    bound[0] bytes (+1) at a time; a longer line is a problem and its rest is skipped in bounded chunks."""
    source = getattr(stdin, "buffer", None)
    read = source.readline if source else stdin.readline
    newline = b"\n" if source else "\n"
    max_bytes = bound[0] if bound else None
    number = 0
    while raw := (read(max_bytes + 1) if max_bytes else read()):
        number += 1
        if max_bytes and len(raw) > max_bytes and not raw.endswith(newline):
            size = len(raw)
            while raw and not raw.endswith(newline):  # the rest of the line, never held whole
                raw = read(SKIP_CHUNK)
                size += len(raw)
            size -= 1 if raw.endswith(newline) else 0
            yield None, (f"input line {number}: {size} bytes, not tokenised: a line over {max_bytes} bytes would "
                         f"exceed the {_model(bound[1])}'s context of {bound[2]}; not sent (shorten the line)")
            continue
        if isinstance(raw, str):
            yield raw, None
            continue
        try:
            yield raw.decode("utf-8"), None
        except UnicodeDecodeError as exc:
            yield None, f"input line {number}: byte {exc.start}: not UTF-8 text ({exc.reason}); not sent"


def run_chat(args: argparse.Namespace, stdin=None, stdout=None) -> int:
    from transformers.utils import logging as hf_logging


    hf_logging.disable_progress_bar()  # stderr is for the refusals a user must read, one line each
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    models = {"model": Path(args.model)}
    if args.compare:
        models["base" if args.compare == "base" else "compare"] = compare_target(args.model, args.compare)
    gens = {name: Generator(path, args.threads) for name, path in models.items()}
    for name, gen in gens.items():
        limit = context_limit(gen)
        if limit is not None and args.max_new_tokens >= limit:
            raise InputError(f"--max-new-tokens: {args.max_new_tokens} leaves no room for a prompt in the "
                             f"{_model(name)}'s context of {limit} tokens")
    system = [{"role": "system", "content": args.system}] if args.system else []
    bound = line_byte_limit(gens, args.max_new_tokens)
    if system:
        _check_system(gens, system, args.max_new_tokens, bound)
    histories = {name: list(system) for name in gens}
    names = ", ".join(f"{n}={p}" for n, p in models.items())
    print(f"chat with {names}; /reset clears the conversation, /quit leaves", file=stdout, flush=True)
    refused = 0
    lines = _lines(stdin, bound)
    while True:
        print(PROMPT, end="", file=stdout, flush=True)
        line, problem = next(lines, ("", None))
        if problem:
            refused += 1
            print(f"llmrnn chat: {problem}", file=sys.stderr, flush=True)
            continue
        if not line or line.strip() == "/quit":
            print("bye", file=stdout, flush=True)
            return REFUSED_EXIT if refused else 0
        text = line.strip()
        if not text:
            continue
        if text == "/reset":
            histories = {name: list(system) for name in gens}
            print("(conversation cleared)", file=stdout, flush=True)
            continue
        if problem := _too_long(gens, histories, text, args.max_new_tokens):
            refused += 1
            print(f"llmrnn chat: {problem}", file=sys.stderr, flush=True)
            continue
        for name, gen in gens.items():
            histories[name].append({"role": "user", "content": text})
            reply = _answer(gen, histories[name], args) or "(empty answer)"
            histories[name].append({"role": "assistant", "content": reply})
            print(f"[{name}] {reply}" if len(gens) > 1 else reply, file=stdout, flush=True)


def register(sub) -> None:
    p = sub.add_parser("chat", help="interactive chat with a (merged) model, optionally side by side with its base")
    p.add_argument("--model", required=True, help="HF model folder (e.g. results/RUN/merged)")
    p.add_argument("--compare", default=None, help="'base' (the model it was trained from) or another model folder")
    p.add_argument("--system", type=_text_arg("--system"), default=None, help="system prompt")
    p.add_argument("--temperature", type=_number(float, "--temperature", 0), default=0.0,
                   help="0 = greedy (default)")
    p.add_argument("--top-p", type=_number(float, "--top-p", 0, 1, lo_open=True), default=1.0)
    p.add_argument("--max-new-tokens", type=_number(int, "--max-new-tokens", 1), default=128)
    p.add_argument("--threads", type=_number(int, "--threads", 1), default=1)
    p.set_defaults(func=run_chat)
