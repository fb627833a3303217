"""Reward throughput: 128 rollouts scored concurrently (compute_score_batch: one thread pool, one
connection pool) vs one after another (compute_score in a loop), against a local OpenAI-compatible
endpoint on 127.0.0.1 that answers every judge call after a fixed delay (a stand-in for a busy vLLM
judge). All 128 candidates differ, so the request cache does not help either side.

    .venv/bin/python benchmarks/bench_reward_concurrency.py [--calls 128] [--delay 0.1] [--concurrency 64]

Prints both wall times and the ratio (target >= 10x).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # listen() backlog: the default 5 drops SYNs under 100+ concurrent calls


def start_server(delay_s: float) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out as separate writes

        def log_message(self, *args):
            pass

        def _send(self, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send({"status": "ok", "data": [{"id": "judge"}]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            time.sleep(delay_s)
            score = 1 + sum(map(ord, body["messages"][0]["content"])) % 9
            self._send({"choices": [{"index": 0, "message": {"role": "assistant", "content": f"Score: {score}"},
                                     "finish_reason": "stop"}]})

    server = _Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=128)
    parser.add_argument("--delay", type=float, default=0.1, help="seconds the endpoint takes per judge call")
    parser.add_argument("--concurrency", type=int, default=64, help="reward.max_concurrency")
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from omegaconf import OmegaConf

    from llmrnn.reward import compute_score, compute_score_batch

    server = start_server(args.delay)
    tmp = Path(tempfile.mkdtemp(prefix="bench_reward_"))
    raw = OmegaConf.to_container(OmegaConf.load(REPO / "config/rubrics/outcome_v2_smollm2.yaml"))
    raw["request"].update(score_method="text", assistant_prefix="", max_tokens=16)
    raw["judge"] = {"model": "judge", "source": "hub", "served_model_name": "judge"}
    OmegaConf.save(OmegaConf.create(raw), tmp / "rubric.yaml")
    (tmp / "endpoint.json").write_text(json.dumps({
        "url": f"http://127.0.0.1:{server.server_address[1]}/v1", "model": "judge", "api_key_file": None,
        "rubric": str(tmp / "rubric.yaml"), "pid": os.getpid(), "status": "ready"}))
    step = {"h_ref": json.dumps({"evolving_summary": "CKD"}), "next_ground_truth_diagnoses": ["heart failure"],
            "next_prediction": {"primary_diagnosis": "copd"}, "next_evaluation": {"primary_correct": False}}
    gt = json.dumps(step)
    kw = {"endpoint_file": str(tmp / "endpoint.json"), "audit_dir": str(tmp / "audit"),
          "reward_cfg": {"max_concurrency": args.concurrency, "cache_size": 0}}

    def sols(tag: str) -> list[str]:
        return [json.dumps({"evolving_summary": f"{tag} candidate {i}"}) for i in range(args.calls)]

    compute_score("x", sols("warm")[0], gt, {}, **kw)  # connect + load the rubric once

    t0 = time.perf_counter()
    seq = [compute_score("x", s, gt, {}, **kw)["score"] for s in sols("seq")]
    sequential = time.perf_counter() - t0

    t0 = time.perf_counter()
    conc = [r["score"] for r in compute_score_batch(["x"] * args.calls, sols("conc"), [gt] * args.calls,
                                                    [{}] * args.calls, **kw)]
    concurrent = time.perf_counter() - t0
    server.shutdown()
    assert len(seq) == len(conc) == args.calls

    print(f"calls={args.calls} endpoint_delay={args.delay:.3f}s max_concurrency={args.concurrency}")
    print(f"sequential  {sequential:7.2f} s  ({args.calls / sequential:7.1f} calls/s)")
    print(f"concurrent  {concurrent:7.2f} s  ({args.calls / concurrent:7.1f} calls/s)")
    print(f"ratio       {sequential / concurrent:7.1f}x  (target >= 10x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
