"""Hub upload through huggingface_hub against a local HTTP endpoint that records every request.

The Hugging Face Hub itself is unreachable from this machine (offline sandbox), so `FakeHub` below is a
real HTTP server on 127.0.0.1 that speaks the part of the Hub API huggingface_hub uses for
create_repo + create_commit (POST /api/repos/create, /api/validate-yaml, .../preupload/main,
.../commit/main with inline "regular" file contents) and list_repo_commits (GET .../commits/main, the
commits it received, newest first). It is a stand-in for the Hub only; huggingface_hub is the real client.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from llmrnn import upload
from llmrnn.errors import CheckFailed
from tests.judge_helpers import LocalServer
from tests.test_release import KNOBS, make_inputs, run_release

TOKEN = "hf_test_token_do_not_log_0123456789"


class FakeHub:
    def __init__(self, fail_commit: bool = False, list_commits: bool = True):
        self.requests: list[dict] = []
        self.files: dict[str, bytes] = {}
        self.commits: dict[str, list[dict]] = {}  # repo -> commits, newest first (as the Hub lists them)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                return None

            def _send(self, code: int, obj: dict | list) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                hub.requests.append({"method": "GET", "path": self.path, "auth": self.headers.get("authorization")})
                if "/commits/" in self.path and list_commits:
                    repo = self.path.split("/api/models/")[1].split("/commits/")[0]
                    return self._send(200, hub.commits.get(repo, []))
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
                    header = {}
                    for line in body.decode().splitlines():
                        op = json.loads(line)
                        if op.get("key") == "file":
                            hub.files[op["value"]["path"]] = base64.b64decode(op["value"]["content"])
                        elif op.get("key") == "header":
                            header = op["value"]
                    repo = self.path.split("/api/models/")[1].split("/commit/")[0]
                    oid = "c" * 40 if not hub.commits.get(repo) else f"{len(hub.commits[repo]):040x}"
                    hub.commits.setdefault(repo, []).insert(0, {
                        "id": oid, "authors": [{"user": "tester"}], "date": "2026-01-01T00:00:00.000Z",
                        "title": header.get("summary", ""), "message": header.get("description", "")})
                    return self._send(200, {"commitUrl": f"{host}/{repo}/commit/{oid}", "commitOid": oid})
                return self._send(404, {"error": "unknown route"})

        self.server = LocalServer(("127.0.0.1", 0), Handler)
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
    tags = ["llmrnn", f"patient {inputs['patients'][2]['subject_id']}"]
    with pytest.raises(CheckFailed, match="PHI guard refused"):
        run_release(inputs, tmp_path / "rel", rel={"upload": True, "endpoint": hub.url, "tags": tags})
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
            upload.upload_bundle(folder, "me/x", token=TOKEN, endpoint=server.url, release_id="r1",
                                 files={"README.md": hashlib.sha256(b"card").hexdigest()})
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


# ----------------------------------------------------------------------------- what is uploaded is what was scanned
def commits_posted(hub: FakeHub) -> list[dict]:
    return [r for r in hub.requests if r["method"] == "POST" and "/commit/" in r["path"]]


def _after_the_scan(monkeypatch, action) -> None:
    """Run `action(stage)` right after the PHI guard passed the staged bundle, before anything is uploaded
    (the window in which a file used to be rewritten and then published)."""
    from llmrnn import phi_guard

    real = phi_guard.enforce

    def enforce_then_act(report, bundle):
        real(report, bundle)
        stage = Path(str(bundle).split(" ")[0])
        action(next(Path(p) for p in Path.cwd().glob("**/" + stage.name)) if not stage.is_absolute()
               else stage)

    monkeypatch.setattr(phi_guard, "enforce", enforce_then_act)


@pytest.mark.parametrize("where", ["merged", "staged copy"])
def test_a_file_rewritten_between_scan_and_upload_is_not_uploaded(tiny_model_dir, tmp_path, hub, monkeypatch, where):
    """The guard passed; then a file gets an id and clinical text. Neither merged/ nor the private staged copy
    may change what is published: the hashes recorded at the scan are checked again just before upload."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.chdir(tmp_path)
    inputs = make_inputs(tmp_path / "run", tiny_model_dir)
    patient = inputs["patients"][0]
    leak = json.dumps({"note": f"patient {patient['subject_id']}: "
                       + patient["visits"][0]["clinical_sections"]["hospital_course"]})

    def rewrite(stage: Path) -> None:
        target = inputs["merged"] / "generation_config.json" if where == "merged" else stage / "generation_config.json"
        target.chmod(0o600)  # the staged copy is read-only; its owner can still change that
        target.write_text(leak)

    _after_the_scan(monkeypatch, rewrite)
    out = tmp_path / "run" / "release"
    with pytest.raises(CheckFailed, match=r"generation_config.json: changed after the PHI guard scanned it") as err:
        run_release(inputs, out, rel={"upload": True, "endpoint": hub.url})
    assert "\n" not in str(err.value) and str(patient["subject_id"]) not in str(err.value)
    assert commits_posted(hub) == [] and hub.files == {}
    assert not out.exists()  # no card, no manifest, no receipt
    assert not list((tmp_path / "run").glob(".bundle.*"))


def test_the_staged_bundle_is_a_private_copy(tiny_model_dir, tmp_path, monkeypatch):
    """Real copies (not links to merged/), read-only, in a folder only the owner can enter."""
    import os
    import stat

    seen = {}

    def inspect(stage: Path) -> None:
        seen["dir_mode"] = stat.S_IMODE(stage.stat().st_mode)
        st = (stage / "model.safetensors").stat()
        seen["file_mode"], seen["links"] = stat.S_IMODE(st.st_mode), st.st_nlink
        seen["same_inode"] = os.path.samefile(stage / "model.safetensors", inputs["merged"] / "model.safetensors")

    monkeypatch.chdir(tmp_path)
    inputs = make_inputs(tmp_path / "run", tiny_model_dir)
    _after_the_scan(monkeypatch, inspect)
    run_release(inputs, tmp_path / "run" / "release")
    assert seen == {"dir_mode": 0o700, "file_mode": 0o400, "links": 1, "same_inode": False}


def test_credentials_in_urls_never_reach_manifest_card_receipt_or_hub(tiny_model_dir, tmp_path, hub, monkeypatch, caplog):
    caplog.set_level("INFO")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    inputs = make_inputs(tmp_path / "run", tiny_model_dir)
    endpoint = hub.url.replace("http://", "http://alice:s3cr3t-pw@")
    knobs = json.loads(json.dumps(KNOBS))
    knobs["roles"] = {"judge": {"backend": "openai", "url": "https://bob:hunter2-pw@judge.example.org/v1"}}
    knobs["eval"] = {"final_judge": {"llm": {"url": "http://carol:p@ss-pw@10.0.0.1:8000/v1"}}}
    out = tmp_path / "run" / "release"
    receipt = run_release(inputs, out, rel={"upload": True, "endpoint": endpoint}, knobs=knobs)
    assert receipt["uploaded"] is True
    written = {f.name: f.read_text() for f in out.iterdir()} | {f"hub:{k}": v.decode() for k, v in hub.files.items()
                                                                 if k in ("README.md", "MANIFEST.json")}
    for name, text in written.items():
        for secret in ("s3cr3t-pw", "hunter2-pw", "ss-pw", "alice", "bob:", "carol"):
            assert secret not in text, (name, secret)
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert manifest["knobs"]["roles"]["judge"]["url"] == "https://***@judge.example.org/v1"
    assert manifest["release"]["endpoint"] == hub.url.replace("http://", "http://***@")
    assert "s3cr3t-pw" not in caplog.text and "hunter2-pw" not in caplog.text


def test_a_rerun_finds_its_commit_and_pushes_nothing_again(tiny_model_dir, tmp_path, hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    inputs = make_inputs(tmp_path / "run", tiny_model_dir)
    first = run_release(inputs, tmp_path / "run" / "release", rel={"upload": True, "endpoint": hub.url})
    again = run_release(inputs, tmp_path / "run" / "release", rel={"upload": True, "endpoint": hub.url})
    assert len(commits_posted(hub)) == 1
    assert first["already_uploaded"] is False and again["already_uploaded"] is True
    assert again["commit_oid"] == first["commit_oid"] and again["release_id"] == first["release_id"]
    assert "nothing pushed again" in again["reason"]
    # a changed model is a new release: it is pushed
    from safetensors.torch import load_file, save_file  # other weights of the same architecture

    weights = inputs["merged"] / "model.safetensors"
    save_file({k: v + 1 for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})
    third = run_release(inputs, tmp_path / "run" / "release", rel={"upload": True, "endpoint": hub.url})
    assert third["already_uploaded"] is False and len(commits_posted(hub)) == 2


def test_an_unwritable_release_folder_stops_the_release_before_upload(tiny_model_dir, tmp_path, hub, monkeypatch):
    """Checked before anything is sent (a file stands where the folder should be: root ignores modes)."""
    from llmrnn.errors import InputError

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    inputs = make_inputs(tmp_path / "run", tiny_model_dir)
    blocked = tmp_path / "run" / "release"
    blocked.write_text("not a folder")
    with pytest.raises(InputError, match=r"release: cannot write the release there .*nothing was uploaded"):
        run_release(inputs, blocked, rel={"upload": True, "endpoint": hub.url})
    assert hub.requests == [] and blocked.read_text() == "not a folder"
    assert not list((tmp_path / "run").glob(".bundle.*"))


def test_a_non_utf8_file_name_is_refused_before_the_repo_is_created(tiny_model_dir, tmp_path, hub, monkeypatch):
    import os

    from llmrnn.errors import InputError

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    inputs = make_inputs(tmp_path / "run", tiny_model_dir)
    with open(os.path.join(os.fsencode(inputs["merged"]), b"notes-\xff\xfe.md"), "wb") as fh:
        fh.write(b"# notes\n")
    with pytest.raises(InputError, match=r"merged: entry \d+ of \d+: file name is not UTF-8") as err:
        run_release(inputs, tmp_path / "run" / "release", rel={"upload": True, "endpoint": hub.url})
    assert "\n" not in str(err.value) and "notes" not in str(err.value)  # named by position, not by its name
    assert hub.requests == [] and not (tmp_path / "run" / "release").exists()


def test_a_hub_that_cannot_list_commits_still_gets_the_upload(tiny_model_dir, tmp_path, monkeypatch, caplog):
    """A Hub-like server without the commit list (404) gets the push; the rerun check is skipped, logged."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    server = FakeHub(list_commits=False)
    monkeypatch.setattr(constants, "ENDPOINT", server.url)
    try:
        inputs = make_inputs(tmp_path / "run", tiny_model_dir)
        receipt = run_release(inputs, tmp_path / "run" / "release", rel={"upload": True, "endpoint": server.url})
    finally:
        server.close()
    assert receipt["uploaded"] is True and len(commits_posted(server)) == 1
    assert "pushing without the rerun check" in caplog.text
