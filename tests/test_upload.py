"""Hub upload through huggingface_hub against a local HTTP endpoint that records every request.

The Hugging Face Hub itself is unreachable from this machine (offline sandbox), so `FakeHub` below is a
real HTTP server on 127.0.0.1 that speaks the part of the Hub API huggingface_hub uses for
create_repo + upload_folder (POST /api/repos/create, /api/validate-yaml, .../preupload/main,
.../commit/main with inline "regular" file contents). It is a stand-in for the Hub only; huggingface_hub is the real client.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llmrnn import upload
from llmrnn.errors import CheckFailed
from tests.test_release import make_inputs, run_release

TOKEN = "hf_test_token_do_not_log_0123456789"


class FakeHub:
    def __init__(self, fail_commit: bool = False):
        self.requests: list[dict] = []
        self.files: dict[str, bytes] = {}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                return None

            def _send(self, code: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                hub.requests.append({"method": "GET", "path": self.path, "auth": self.headers.get("authorization")})
                self._send(404, {"error": "not here"})

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hub.requests.append({"method": "POST", "path": self.path, "auth": self.headers.get("authorization"),
                                     "body": body})
                host = f"http://{self.headers['Host']}"
                if self.path == "/api/repos/create":
                    req = json.loads(body)
                    return self._send(200, {"url": f"{host}/{req.get('organization') or 'tester'}/{req['name']}"})
                if self.path == "/api/validate-yaml":  # upload_folder checks the card's metadata first
                    return self._send(200, {"errors": [], "warnings": []})
                if "/preupload/" in self.path:
                    files = json.loads(body)["files"]
                    return self._send(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                       "shouldIgnore": False} for f in files]})
                if "/commit/" in self.path:
                    if fail_commit:
                        return self._send(403, {"error": "no write access to this namespace"})
                    for line in body.decode().splitlines():
                        op = json.loads(line)
                        if op.get("key") == "file":
                            hub.files[op["value"]["path"]] = base64.b64decode(op["value"]["content"])
                    repo = self.path.split("/api/models/")[1].split("/commit/")[0]
                    oid = "c" * 40
                    return self._send(200, {"commitUrl": f"{host}/{repo}/commit/{oid}", "commitOid": oid})
                return self._send(404, {"error": "unknown route"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # conftest sets offline mode for everything else
    server = FakeHub()
    monkeypatch.setattr(constants, "ENDPOINT", server.url)  # huggingface_hub's own side requests stay local too
    yield server
    server.close()


def test_release_uploads_merged_model_card_and_manifest(tiny_model_dir, tmp_path, hub, monkeypatch, caplog):
    caplog.set_level("DEBUG")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    inputs = make_inputs(tmp_path / "run", tiny_model_dir)
    out = tmp_path / "run" / "release"
    receipt = run_release(inputs, out, rel={"upload": True, "endpoint": hub.url, "base_model": "x/y"})

    assert receipt["uploaded"] is True and receipt["repo_id"] == "tester/llmrnn-demo-merged"
    assert receipt["commit_oid"] == "c" * 40 and receipt["private"] is True
    posts = [r for r in hub.requests if r["method"] == "POST"]
    paths = [r["path"] for r in posts]
    assert paths[0] == "/api/repos/create"
    assert json.loads(posts[0]["body"]) == {"name": "llmrnn-demo-merged", "organization": None,
                                                   "visibility": "private", "type": "model"}
    assert any(p.startswith("/api/models/tester/llmrnn-demo-merged/commit/main") for p in paths)
    assert all(r["auth"] == f"Bearer {TOKEN}" for r in hub.requests if r["method"] == "POST")
    assert set(hub.files) == {"README.md", "MANIFEST.json", "config.json", "generation_config.json",
                              "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    assert hub.files["README.md"] == (out / "README.md").read_bytes()
    assert hub.files["model.safetensors"] == (inputs["merged"] / "model.safetensors").read_bytes()
    # the token is never written or logged
    for f in out.iterdir():
        assert TOKEN not in f.read_text()
    assert TOKEN not in caplog.text


def test_public_repo_only_when_configured(tiny_model_dir, tmp_path, hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    inputs = make_inputs(tmp_path / "run", tiny_model_dir)
    run_release(inputs, tmp_path / "rel", rel={"upload": True, "endpoint": hub.url, "private": False,
                                               "repo_id": "org/model-x"})
    create = json.loads(next(r for r in hub.requests if r["path"] == "/api/repos/create")["body"])
    assert create["visibility"] == "public" and create["organization"] == "org" and create["name"] == "model-x"


def test_phi_guard_refusal_sends_nothing(tiny_model_dir, tmp_path, hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    inputs = make_inputs(tmp_path / "run", tiny_model_dir)
    (inputs["merged"] / "notes.md").write_text(f"patient {inputs['patients'][2]['subject_id']}\n")
    with pytest.raises(CheckFailed, match="PHI guard refused"):
        run_release(inputs, tmp_path / "rel", rel={"upload": True, "endpoint": hub.url})
    assert hub.requests == []


def test_upload_error_is_one_line_without_the_token(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    server = FakeHub(fail_commit=True)
    monkeypatch.setattr(constants, "ENDPOINT", server.url)
    try:
        folder = tmp_path / "b"
        folder.mkdir()
        (folder / "README.md").write_text("card")
        with pytest.raises(CheckFailed) as err:
            upload.upload_bundle(folder, "me/x", token=TOKEN, endpoint=server.url)
    finally:
        server.close()
    msg = str(err.value)
    assert msg.startswith(f"upload to {server.url} repo me/x failed:") and "\n" not in msg
    assert TOKEN not in msg


def test_token_only_from_the_environment(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    assert upload.token_from_env() is None
    monkeypatch.setenv("MY_TOKEN", "  abc ")
    assert upload.token_from_env("MY_TOKEN") == "abc"
    assert Path(upload.__file__).read_text().count("write") == 0  # the module never writes files


@pytest.mark.parametrize("name", ["HF_TOKEN", "LLMRNN_FINAL_JUDGE_API_KEY", "my_token", "_X", "OPENAI_API_KEY2",
                                  "TOKEN_20240101", "AZURE_OPENAI_API_KEY_EASTUS2"])
def test_plain_variable_names_are_accepted(name):
    assert upload.env_name_problem(name) is None


@pytest.mark.parametrize("value", [TOKEN, "hf_AbCdEfGhIjKlMnOpQrStUvWx", "sk-proj-abcdefghijklmnop1234",
                                   "ghp_16C7e42F292c6912E7710c838347Ae178B4a", "aB3dE5gH7jK9mN1pQ3sT5vX7",
                                   "abcd1234efgh5678ijkl",
                                   "HF TOKEN", "1ABC", "$HF_TOKEN", "", 42])
def test_keys_and_non_names_are_refused_without_being_repeated(value):
    problem = upload.env_name_problem(value)
    assert problem and (not isinstance(value, str) or not value or value not in problem)


def test_check_and_schema_refuse_a_key_in_any_env_field_without_echoing_it(tmp_path, monkeypatch):
    from llmrnn import check

    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the schema is read from the workflow folder
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"run_name: x\nrelease: {{token_env: {TOKEN}}}\n"
                   "eval: {final_judge: {llm: {api_key_env: 'sk-AbCd EfGh'}}}\n")
    config, schema_problems = check.load_config([Path("config/config.yaml"), cfg])
    assert schema_problems == []  # the schema's pattern errors would echo the value: check_env_names speaks
    problems = check.check_env_names(config)
    by_key = {p.split(" ")[1]: p for p in problems}
    assert set(by_key) == {"release.token_env", "eval.final_judge.llm.api_key_env"}
    assert "looks like a key" in by_key["release.token_env"]
    assert "is not an environment variable NAME" in by_key["eval.final_judge.llm.api_key_env"]
    assert all(TOKEN not in p and "AbCd" not in p for p in problems)

    import jsonschema
    import yaml

    schema = yaml.safe_load(Path("workflow/schemas/config.schema.yaml").read_text())
    token_env = schema["properties"]["release"]["properties"]["token_env"]
    assert not jsonschema.Draft202012Validator(token_env).is_valid(TOKEN)
    assert jsonschema.Draft202012Validator(token_env).is_valid("HF_TOKEN")


def test_openai_backend_does_not_echo_a_key_typed_as_api_key_env():
    from llmrnn import backends
    from llmrnn.errors import InputError

    with pytest.raises(InputError, match="api_key_env looks like a key") as err:
        backends.OpenAIBackend(url="http://127.0.0.1:1/v1", model="m", api_key_env=TOKEN)
    assert TOKEN not in str(err.value)
