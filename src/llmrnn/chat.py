"""`llmrnn chat --model DIR [--compare base|DIR]`: talk to a trained model in the terminal.

Each line you type is a user turn (the conversation is kept); `/reset` clears it, `/quit` or end of
input leaves. With --compare every turn is answered by both models, one block each. `--compare base`
follows the merge checks (DIR/../merge_check.json names the model the adapter was merged into) back to
the first model that is not a merge: the untrained base.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.models import model_folder

PROMPT = "you> "


def resolve_base(model_dir: str | Path) -> Path:
    """The model at the root of the merge chain of `model_dir` (itself when it was never merged)."""
    current = Path(model_dir)
    for _ in range(8):  # GRPO merged <- SFT merged <- base: two hops in the qa recipe
        check = current.parent / "merge_check.json"
        if current.name != "merged" or not check.is_file():
            return current
        current = model_folder(io.read_json(check)["base"])
    raise InputError(f"{model_dir}: merge chain longer than 8 models")


def _answer(gen, history: list[dict], args) -> str:
    out = gen.generate([history], 1, args.temperature, args.top_p, args.max_new_tokens)
    return out[0][0].strip()


def run_chat(args: argparse.Namespace, stdin=None, stdout=None) -> int:
    from llmrnn.qa.evaluate import Generator

    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    models = {"model": Path(args.model)}
    if args.compare:
        models["base" if args.compare == "base" else "compare"] = (
            resolve_base(args.model) if args.compare == "base" else Path(args.compare))
    gens = {name: Generator(path, args.threads) for name, path in models.items()}
    system = [{"role": "system", "content": args.system}] if args.system else []
    histories = {name: list(system) for name in gens}
    names = ", ".join(f"{n}={p}" for n, p in models.items())
    print(f"chat with {names}; /reset clears the conversation, /quit leaves", file=stdout, flush=True)
    while True:
        print(PROMPT, end="", file=stdout, flush=True)
        line = stdin.readline()
        if not line or line.strip() == "/quit":
            print("bye", file=stdout, flush=True)
            return 0
        text = line.strip()
        if not text:
            continue
        if text == "/reset":
            histories = {name: list(system) for name in gens}
            print("(conversation cleared)", file=stdout, flush=True)
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
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.set_defaults(func=run_chat)
