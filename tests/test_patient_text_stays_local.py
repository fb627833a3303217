"""Patient text reaches a host outside the site only with an explicit opt-in: the final judge
(`eval.final_judge.allow_external`) and openai-backend roles (`roles.<role>.allow_external`); `llmrnn check`
verifies the opt-in together with the API key variable before anything is queued, and the reproduction
grades locally by default."""

from __future__ import annotations

import pytest
import yaml

from llmrnn import backends, check
from llmrnn.errors import InputError
from llmrnn.evaluate import FinalJudge
from tests.conftest import REPO

HOSTED = {"url": "https://api.openai.com/v1", "model": "gpt-4o-mini", "api_key_env": "LLMRNN_FINAL_JUDGE_API_KEY"}


@pytest.mark.parametrize("url, external", [
    ("https://api.openai.com/v1", "api.openai.com"),
    ("http://judge.example.org:8000/v1", "judge.example.org"),
    ("http://8.8.8.8/v1", "8.8.8.8"),
    ("http://127.0.0.1:8001/v1", None),
    ("http://localhost:8001/v1", None),
    ("http://[::1]:8001/v1", None),
    ("http://10.3.4.5:8000/v1", None),
    ("http://gpu-node-12:8000/v1", None),  # a cluster-internal short name
])
def test_external_host(url, external):
    assert backends.external_host(url) == external


def test_final_judge_refuses_a_hosted_endpoint_without_the_opt_in(monkeypatch):
    monkeypatch.setenv("LLMRNN_FINAL_JUDGE_API_KEY", "k")
    with pytest.raises(InputError, match=r"api.openai.com .* eval.final_judge.allow_external: true") as err:
        FinalJudge({"mode": "llm", "llm": HOSTED})
    assert "\n" not in str(err.value)
    FinalJudge({"mode": "llm", "llm": HOSTED, "allow_external": True})  # opted in: allowed
    FinalJudge({"mode": "llm", "llm": dict(HOSTED, url="http://127.0.0.1:9/v1")})  # local: no opt-in needed


def test_openai_role_refuses_a_hosted_endpoint_without_the_opt_in(monkeypatch):
    monkeypatch.setenv("K", "k")
    role = {"backend": "openai", "url": "https://api.example.com/v1", "model": "m", "api_key_env": "K"}
    with pytest.raises(InputError, match="allow_external"):
        backends.make_backend(role, None, cache=False)
    assert backends.make_backend(dict(role, allow_external=True), None, cache=False).url == role["url"]


@pytest.fixture
def in_workflow(workflow_dir, monkeypatch):
    monkeypatch.chdir(workflow_dir)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("LLMRNN_FINAL_JUDGE_API_KEY", raising=False)
    return workflow_dir


def _config(tmp_path, final_judge):
    path = tmp_path / "judge.yaml"
    path.write_text(yaml.safe_dump({"eval": {"final_judge": final_judge}}))
    config, problems = check.load_config([REPO / "config/config.yaml", REPO / "config/reproduce.yaml", path])
    assert not problems, problems
    return config


def test_reproduction_grades_locally_by_default(in_workflow):
    config, problems = check.load_config([REPO / "config/config.yaml", REPO / "config/reproduce.yaml"])
    assert not problems, problems
    judge = config["eval"]["final_judge"]
    assert judge["mode"] == "matcher" and judge["allow_external"] is False
    assert check.check_external_endpoints(config) == []


def test_check_verifies_the_opt_in_and_the_key_at_check_time(in_workflow, tmp_path, monkeypatch):
    hosted = {"mode": "llm", "llm": HOSTED}
    problems = check.check_external_endpoints(_config(tmp_path, hosted))
    assert len(problems) == 1 and "eval.final_judge.allow_external: true" in problems[0], problems
    opted_in = _config(tmp_path, dict(hosted, allow_external=True))
    assert check.check_external_endpoints(opted_in) == [(
        "eval.final_judge.llm.api_key_env: $LLMRNN_FINAL_JUDGE_API_KEY is not set: export the endpoint's API key "
        "before submitting")]
    monkeypatch.setenv("LLMRNN_FINAL_JUDGE_API_KEY", "sk-test")
    assert check.check_external_endpoints(opted_in) == []
    no_key = _config(tmp_path, {"mode": "llm", "allow_external": True, "llm": dict(HOSTED, api_key_env=None)})
    assert "name the variable holding its key" in check.check_external_endpoints(no_key)[0]
    local = _config(tmp_path, {"mode": "llm", "llm": {"url": "http://127.0.0.1:8001/v1", "model": "m"}})
    assert check.check_external_endpoints(local) == []


def test_llmrnn_check_lists_the_problem(in_workflow, tmp_path, capsys):
    from llmrnn.cli import main

    path = tmp_path / "hosted.yaml"
    path.write_text(yaml.safe_dump({"eval": {"final_judge": {"mode": "llm", "llm": HOSTED}}}))
    assert main(["check", "--configfile", str(path)]) == 1
    assert "eval.final_judge.allow_external: true" in capsys.readouterr().err
