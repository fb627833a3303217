"""The judge model is a file-tracked target: prepare_judge_model downloads it once (huggingface_hub, HF_TOKEN
from the environment for a gated repo) from a real HTTP server on 127.0.0.1 standing in for the Hub; the
server resolves only a local copy, never a hub id."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml

from llmrnn.errors import InputError
from llmrnn.judge.launcher import judge_model_dir, prepare_judge_model, resolve_model
from llmrnn.rubric import load_rubric
from tests.conftest import REPO
from tests.judge_helpers import LocalServer

TOKEN = "hf_test_token_for_the_fake_hub"


class GatedHub:
    """A FAKE Hub (the real one is offline here) on 127.0.0.1 serving one gated model repo: the endpoints
    snapshot_download uses (repo info, HEAD/GET resolve), 401 without the right Bearer token."""

    def __init__(self, repo_id: str, files: dict[str, bytes]):
        sha = "0" * 40
        seen = self.auth = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _gated(self) -> bool:
                seen.append(self.headers.get("Authorization"))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_response(401)
                    self.send_header("X-Error-Code", "GatedRepo")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return True
                return False

            def _file(self, head: bool):
                prefix = f"/{repo_id}/resolve/"
                if not self.path.startswith(prefix):  # other Hub routes the client may probe
                    body = None
                elif self._gated():
                    return
                else:
                    body = files.get(self.path[len(prefix):].split("/", 1)[1])
                if body is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("X-Repo-Commit", sha)
                self.send_header("ETag", f'"{hashlib.sha256(body).hexdigest()}"')
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def do_HEAD(self):
                self._file(head=True)

            def do_GET(self):
                info = self.path.startswith(f"/api/models/{repo_id}/revision/")
                tree = self.path.startswith(f"/api/models/{repo_id}/tree/")
                if info or tree:
                    if self._gated():
                        return
                    data = json.dumps({"id": repo_id, "sha": sha, "siblings": [{"rfilename": n} for n in files]}
                                      if info else [{"type": "file", "path": n, "size": len(b),
                                                     "oid": hashlib.sha1(b).hexdigest()} for n, b in files.items()]
                                      ).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self._file(head=False)

        self.server = LocalServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _rubric(tmp_path: Path, model: str, source: str) -> Path:
    raw = yaml.safe_load((REPO / "config/rubrics/rubric_v2_rubricarm_scalar.yaml").read_text())
    raw["judge"].update(model=model, source=source)
    path = tmp_path / "rubric.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _prepare(rubric: Path, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    marker = judge_model_dir(load_rubric(rubric)) / ".ready"
    return subprocess.run([sys.executable, "-m", "llmrnn.cli", "judge", "prepare-model", "--rubric", str(rubric),
                           "--out", str(marker)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def test_gated_hub_download_with_the_token_from_the_environment(tmp_path, tiny_model_dir):
    files = {p.name: p.read_bytes() for p in tiny_model_dir.iterdir() if p.is_file()}
    hub = GatedHub("org/judge-8b", files)
    rubric = _rubric(tmp_path, "org/judge-8b", "hub")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(REPO / "src"))
    try:
        refused = _prepare(rubric, tmp_path, env)  # gated: no token, no model
        assert refused.returncode != 0
        lines = refused.stderr.strip().splitlines()
        assert "cannot download org/judge-8b" in lines[-1] and "HF_TOKEN" in lines[-1], refused.stderr
        proc = _prepare(rubric, tmp_path, dict(env, HF_TOKEN=TOKEN))
    finally:
        hub.close()
    assert proc.returncode == 0, proc.stderr
    assert f"Bearer {TOKEN}" in hub.auth and TOKEN not in proc.stderr
    folder = tmp_path / "resources/judge_models/org--judge-8b"
    assert (folder / "model.safetensors").read_bytes() == files["model.safetensors"]
    assert json.loads((folder / ".ready").read_text())["origin"].startswith("hub org/judge-8b")
    os.chdir(tmp_path)
    try:  # the server's model is that folder, never the hub id
        assert resolve_model(load_rubric(rubric)) == "resources/judge_models/org--judge-8b"
    finally:
        os.chdir(REPO)


def test_missing_copy_names_the_rule_and_path_is_used_as_is(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="prepare_judge_model downloads it"):
        resolve_model(load_rubric(_rubric(tmp_path, "org/judge-8b", "hub")))
    rubric = _rubric(tmp_path, str(tiny_model_dir), "path")
    assert resolve_model(load_rubric(rubric)) == str(tiny_model_dir)
    with pytest.raises(InputError, match="nothing to download"):
        prepare_judge_model(str(rubric), tmp_path / "x/.ready")
    hub = _rubric(tmp_path, "org/judge-8b", "hub")
    with pytest.raises(InputError, match="goes to resources/judge_models/org--judge-8b/.ready"):
        prepare_judge_model(str(hub), tmp_path / "elsewhere/.ready")
