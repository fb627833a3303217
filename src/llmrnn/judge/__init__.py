"""Stage `judge`: the judge server a GRPO reward talks to, split the way TRL splits its vLLM client from
its server script:

- llmrnn.judge.client    the endpoint file, `wait_for_endpoint`, `JudgeClient` (what consumers import);
- llmrnn.judge.launcher  `llmrnn judge server` (the `judge_server` service): start the rubric's engine,
                         prove the server on the port is ours, publish the endpoint;
- llmrnn.judge.server    `llmrnn judge serve`: our OpenAI-compatible CPU server (engine `llmrnn`) on the
                         forward pass's TransformersBackend.
"""

from __future__ import annotations

from llmrnn.cli import json_arg
from llmrnn.judge.client import (
    Endpoint,
    JudgeClient,
    JudgeRequestError,
    JudgeUnavailable,
    health_ok,
    wait_for_endpoint,
)
from llmrnn.judge.launcher import prepare_judge_model, run_server

__all__ = ["Endpoint", "JudgeClient", "JudgeRequestError", "JudgeUnavailable", "health_ok", "register",
           "wait_for_endpoint"]


# ----------------------------------------------------------------------------- CLI
def _cmd_server(args) -> int:
    judge = args.cfg.get("judge", args.cfg)  # the rule passes {"judge": {...}}
    return run_server(args.rubric, args.endpoint, judge.get("startup_timeout_s"), host=judge.get("host"))


def _cmd_serve(args) -> int:
    # lazy: the reward (verl's workers) imports this package's client; the server brings the forward pass
    from llmrnn.judge.server import serve

    return serve(args.model, args.served_model_name, args.host, args.port, args.api_key_file,
                 args.max_model_len, args.dtype)


def _cmd_prepare_model(args) -> int:
    prepare_judge_model(args.rubric, args.out)
    return 0


def _cmd_wait(args) -> int:
    ep = wait_for_endpoint(args.endpoint, args.timeout)
    print(ep.url)
    return 0


def register(sub) -> None:
    p = sub.add_parser("judge", help="judge server: start (service), serve (our CPU server), wait")
    jsub = p.add_subparsers(dest="judge_command", required=True)

    s = jsub.add_parser("server", help="start the rubric's judge server and publish its endpoint (service)")
    s.add_argument("--rubric", required=True, help="config/rubrics/<x>.yaml")
    s.add_argument("--endpoint", required=True, help="endpoint JSON written once the server is healthy")
    s.add_argument("--cfg", type=json_arg, default={}, help="JSON of config section `judge`")
    s.set_defaults(func=_cmd_server)

    v = jsub.add_parser("serve", help="our OpenAI-compatible CPU server with logprobs (used by `server`)")
    v.add_argument("--model", required=True, help="HF model directory")
    v.add_argument("--served-model-name", required=True)
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--port", type=int, required=True)
    v.add_argument("--api-key-file", default=None, help="file holding the Bearer key (mode 0600)")
    v.add_argument("--max-model-len", type=int, default=4096)
    v.add_argument("--dtype", default="float32")
    v.set_defaults(func=_cmd_serve)

    m = jsub.add_parser("prepare-model", help="download the rubric's judge model (source: hub) once")
    m.add_argument("--rubric", required=True, help="config/rubrics/<x>.yaml")
    m.add_argument("--out", required=True, help="output: resources/judge_models/<slug>/.ready")
    m.set_defaults(func=_cmd_prepare_model)

    w = jsub.add_parser("wait", help="wait until the endpoint is healthy; print its URL")
    w.add_argument("--endpoint", required=True)
    w.add_argument("--timeout", type=float, default=900.0)
    w.set_defaults(func=_cmd_wait)

