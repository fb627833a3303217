"""Fail closed: a release bundle is a fixed set of file kinds, and each file is accounted for against what it
must be, not searched for what it might hide.

- weights (`model.safetensors`, `model-00001-of-00002.safetensors`, their index): the header must describe
  the file's bytes exactly, its metadata must equal the base model's, and its tensor names, shapes and dtypes
  must be the base model's (the dtype may be the one the merge saved at);
- tokenizer files: byte-identical to the base model's prepared copy (the merge copies them verbatim);
- config.json and generation_config.json: every key and value the base's, or what transformers writes again
  from the base's config, or what a setting made (the dtype the merge saved at, the transformers version),
  or what the writer the merge check names set (`written_by`: verl's model merger, for a full fine-tune,
  sets config.json's token ids from the base's tokenizer as verl loads it, a Gemma-2 base's eos as
  <end_of_turn>, and writes the base's generation config as it is, a list of eos ids in its order); a value
  nobody set is refused;
- the card (README.md) and manifest (MANIFEST.json): byte-identical to what the release stage writes from the
  run's records (`expected`);
- anything else (another name, a folder, a link, a fifo) is refused.

Findings name the file by its kind's fixed name, which holds nothing of the user's; a file whose name is not
one of those is named by its position in the bundle only (its name may be the identifier)."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

from llmrnn.constants import VERL_MERGER
from llmrnn.phi_guard.formats import ST_DTYPES, _safetensors_layout
from llmrnn.rope import base_rope

WEIGHTS = re.compile(r"model(?:-\d{5}-of-\d{5})?\.safetensors")
WEIGHTS_INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
    "chat_template.jinja", "chat_template.json",
})
CONFIG, GENERATION = "config.json", "generation_config.json"
CARD, MANIFEST = "README.md", "MANIFEST.json"
# dtype names a merge may save at (merge.dtype), as config.json writes them
DTYPE_KEYS = ("torch_dtype", "dtype")
DTYPES = frozenset({"float32", "float16", "bfloat16"})
ST_DTYPE_OF = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
# transformers writes its own version; bounded parts, so no identifier fits in it
VERSION = re.compile(r"\d{1,2}\.\d{1,3}\.\d{1,3}(?:\.dev\d{1,2}|rc\d{1,2})?")
NOT_ALLOWED = ("a file whose name is not one the bundle may hold (a release holds weights, tokenizer files, "
               "config.json, generation_config.json, the card and the manifest only); refused")


def kind_of(rel: str) -> str | None:
    """The kind of a bundle path (relative, `/`-separated), None for a name the bundle may not hold."""
    if "/" in rel:
        return None
    if WEIGHTS.fullmatch(rel):
        return "weights"
    if rel == WEIGHTS_INDEX:
        return "weights index"
    if rel in TOKENIZER_FILES:
        return "tokenizer"
    return {CONFIG: "config", GENERATION: "generation config", CARD: "card", MANIFEST: "manifest"}.get(rel)


def where(rel: str, n: int, total: int) -> str:
    """How a finding names a file: its fixed name when it is one the bundle may hold, else its position."""
    return rel if kind_of(rel) else f"bundle entry {n} of {total}"


# ----------------------------------------------------------------------------- weights
def safetensors_header(path: Path) -> dict:
    """The header of a safetensors file that describes the file's bytes exactly (ValueError otherwise): tensors
    contiguous from 0 to the end, each entry exactly dtype/shape/data_offsets, only spaces after the JSON."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        try:
            _, layout = _safetensors_layout(fh, size)
        except (UnicodeDecodeError, struct.error, RecursionError, json.JSONDecodeError):
            raise ValueError("its header is not valid") from None
        fh.seek(0)
        (n,) = struct.unpack("<Q", fh.read(8))
        raw = fh.read(n)
    body = raw.rstrip(b" ")  # safetensors pads its header with spaces, nothing else
    if not (body.startswith(b"{") and body.endswith(b"}")):
        raise ValueError("bytes in its header outside the header's JSON")
    try:
        json.loads(body, object_pairs_hook=_no_repeated_keys)
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    header = layout["header"]
    for name, info in header.items():
        if name != "__metadata__" and (set(info) != {"dtype", "shape", "data_offsets"} or info["dtype"] not in ST_DTYPES):
            raise ValueError("a tensor entry with keys other than dtype, shape and data_offsets")
    return header


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key repeated in its header")
    return dict(pairs)


def _tensors(folder: Path) -> tuple[dict[str, tuple[str, list[int]]], list[dict]]:
    """(tensor name -> (dtype, shape), the metadata of each file) of every weights file of a folder."""
    tensors: dict[str, tuple[str, list[int]]] = {}
    metadata = []
    for path in sorted(folder.iterdir()):
        if WEIGHTS.fullmatch(path.name) and path.is_file():
            header = safetensors_header(path)
            metadata.append(header.get("__metadata__") or {})
            for name, info in header.items():
                if name != "__metadata__":
                    tensors[name] = (info["dtype"], info["shape"])
    return tensors, metadata


def check_weights(path: Path, saved_dtype: str | None, base_tensors: dict, base_meta: list) -> str | None:
    """Why a weights file is not the base model's architecture (None when it is)."""
    try:
        header = safetensors_header(path)
    except ValueError as exc:
        return f"not a safetensors file that describes its own bytes ({exc}); refused"
    meta = header.get("__metadata__") or {}
    if meta and meta not in base_meta:
        return "its header metadata is not the base model's; refused"
    allowed_dtype = ST_DTYPE_OF.get(saved_dtype or "")
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if name not in base_tensors:
            return "a tensor whose name is not one of the base model's; refused"
        dtype, shape = base_tensors[name]
        if info["shape"] != shape:
            return "a tensor whose shape is not the base model's; refused"
        if info["dtype"] not in (dtype, allowed_dtype):
            return "a tensor whose dtype is neither the base model's nor the one the merge saved at; refused"
    return None


def check_all_weights(bundle: Path, rels: list[str], base: Path, saved_dtype: str | None) -> list[tuple[str, str]]:
    """(file, why) for each weights file that is not the base's architecture, and for the tensors of the base
    that no weights file holds (a bundle of the base's architecture holds every one, once)."""
    try:
        base_tensors, base_meta = _tensors(base)
    except (OSError, ValueError):
        return [(rels[0], "the base model's weights cannot be read to compare with; refused")]
    out, seen = [], {}
    for rel in rels:
        why = check_weights(bundle / rel, saved_dtype, base_tensors, base_meta)
        if why:
            out.append((rel, why))
            continue
        for name in safetensors_header(bundle / rel):
            if name != "__metadata__":
                if name in seen:
                    out.append((rel, "a tensor another weights file holds too; refused"))
                seen[name] = rel
    if not out and set(seen) != set(base_tensors):
        out.append((rels[0], f"{len(set(base_tensors) - set(seen))} of the base model's tensors are missing; refused"))
    return out


def check_weights_index(path: Path, bundle_weights: list[str]) -> str | None:
    """The shard index: only `metadata.total_size` and a `weight_map` of exactly the bundle's tensors to the
    bundle's shard files."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return "not valid JSON; refused"
    if not isinstance(data, dict) or set(data) != {"metadata", "weight_map"} or not isinstance(data["weight_map"], dict):
        return "keys other than metadata and weight_map; refused"
    meta = data["metadata"]
    if not isinstance(meta, dict) or set(meta) - {"total_size", "total_parameters"} or \
            not all(isinstance(v, int) and not isinstance(v, bool) for v in meta.values()):
        return "metadata other than total_size; refused"
    held, size, params = {}, 0, 0
    for rel in bundle_weights:
        try:
            header = safetensors_header(path.parent / rel)
        except ValueError:
            return "names a weights file that is not valid; refused"
        for name, info in header.items():
            if name != "__metadata__":
                held[name] = rel
                n = 1
                for d in info["shape"]:
                    n *= d
                params += n
                size += n * ST_DTYPES[info["dtype"]]
    if data["weight_map"] != held:
        return "its weight_map is not the bundle's tensors and files; refused"
    # the totals are the tensors' own (a number nobody set is refused, an identifier as a size among them)
    if meta.get("total_size", size) != size or meta.get("total_parameters", params) != params:
        return "its metadata totals are not the bundle's tensors'; refused"
    return None


# ----------------------------------------------------------------------------- configs
def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


# verl's hf_tokenizer (0.7.1 verl/utils/tokenizer.py, 0.9.1 verl/utils/tokenizer/tokenizer.py): for a model path
# that names gemma-2-2b-it it loads the tokenizer with eos_token <end_of_turn> (id 107 in Gemma-2), not the
# tokenizer's own <eos> (1), and its actor sets that eos id on the model config
VERL_GEMMA2_PATH = "gemma-2-2b-it"
VERL_GEMMA2_EOS = {"eos_token": "<end_of_turn>", "eos_token_id": 107}


def writer_token_ids(base: Path, written_by: str | None) -> list[dict[str, Any]]:
    """The config values the bundle's writer sets beyond transformers' rewrite of the base's, one dict per way
    the writer may have set them ([] for any other writer): verl's actor sets bos/eos/pad_token_id on the
    model config from the tokenizer verl.utils.hf_tokenizer loads from the base (verl 0.7.1 fsdp_workers,
    0.9.1 workers/config/model.py; it pads with the eos token where the tokenizer has no pad token), its
    checkpoint saves that config and its model merger writes it again (base_model_merger.py
    save_hf_model_and_tokenizer). Where the base's path names gemma-2-2b-it, hf_tokenizer's Gemma-2 correction
    may have made the eos <end_of_turn> (VERL_GEMMA2_EOS): both are the writer's (the path training named may
    be spelled otherwise than the release's, relative or resolved), nothing else is."""
    if written_by != VERL_MERGER:
        return []
    from transformers import AutoTokenizer

    spellings = [{}]
    if any(VERL_GEMMA2_PATH in str(p) for p in (base, base.resolve())):
        spellings.append(VERL_GEMMA2_EOS)
    out: list[dict[str, Any]] = []
    for kwargs in spellings:
        try:
            tok = AutoTokenizer.from_pretrained(base, local_files_only=True, **kwargs)
        except Exception:  # noqa: BLE001, S112 - a tokenizer that does not load sets nothing we can account for
            continue
        eos = tok.eos_token_id
        ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": eos,
               "pad_token_id": eos if tok.pad_token_id is None else tok.pad_token_id}
        if ids not in out:
            out.append(ids)
    return out


def _rewritten_configs(base: Path, made: dict[str, Any] | None = None) -> tuple[dict, dict]:
    """What transformers writes again from the base's config.json and generation config (a merge loads the
    base and saves it: keys it adds or spells otherwise are its, not anybody's); with `made` (the writer's
    values, writer_token_ids) set on the config first, as the writer's model had them: a base without a
    generation config gets the one transformers derives from that config."""
    from transformers import AutoConfig, GenerationConfig

    try:
        config = AutoConfig.from_pretrained(base, local_files_only=True)
        for key, value in (made or {}).items():
            setattr(config, key, value)
        config_dict = json.loads(config.to_json_string(use_diff=True))
    except Exception:  # noqa: BLE001 - a base transformers cannot read adds nothing to compare with
        return {}, {}
    try:
        gen = (GenerationConfig.from_pretrained(base, local_files_only=True) if (base / GENERATION).is_file()
               else GenerationConfig.from_model_config(config))
        gen_dict = json.loads(gen.to_json_string(use_diff=True))
    except Exception:  # noqa: BLE001
        gen_dict = {}
    return config_dict, gen_dict


def check_config(path: Path, base: Path, name: str, saved_dtype: str | None,
                 made: dict[str, Any] | None = None) -> str | None:
    """Why config.json / generation_config.json is not the base's (None when it is): every key must be one
    the base's file (or transformers' rewrite of it) has, with the same value, except the dtype the merge
    saved at, transformers' version and, in config.json, the values the writer set (`made`:
    writer_token_ids). Keys not the base's are not named (a key may be the identifier)."""
    made = made or {}
    try:
        got = _read_json(path)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return "not valid JSON; refused"
    if not isinstance(got, dict):
        return "not a JSON object; refused"
    base_file = base / name
    try:
        raw = _read_json(base_file) if base_file.is_file() else {}
    except (ValueError, UnicodeDecodeError, RecursionError):
        raw = {}
    rewritten = _rewritten_configs(base, made)[0 if name == CONFIG else 1]
    if name == CONFIG and isinstance(raw, dict):
        # the merge writes the base's RoPE in transformers 4.x's spelling too (llmrnn.rope.keep_base_rope)
        rewritten = {**base_rope(raw), **rewritten}
    if name == GENERATION and not raw and not rewritten:
        return "the base model has no generation config to compare with; refused"
    for key in sorted(got, key=str):
        value = got[key]
        if name == CONFIG and key in made and value == made[key] and type(value) is type(made[key]):
            continue  # the writer set it, to this value
        known = key in raw or key in rewritten
        if not known:
            return f"a key the base model's {name} does not have; refused"
        if key == "transformers_version" and isinstance(value, str) and VERSION.fullmatch(value):
            continue
        if key in DTYPE_KEYS and value in DTYPES and value in (raw.get(key), rewritten.get(key), saved_dtype):
            continue
        if value != raw.get(key, rewritten.get(key)) and value != rewritten.get(key, raw.get(key)):
            return f"the value of `{key}` is not the base model's and no setting made it; refused"
    return None


# ----------------------------------------------------------------------------- the bundle
def account(bundle: Path, entries: list[tuple[int, str]], total: int, base: Path | None,
            expected: dict[str, bytes] | None, saved_dtype: str | None,
            written_by: str | None = None) -> tuple[list[tuple[str, str]], list[str]]:
    """(findings as (where, what), the card/manifest files left to scan as text because no expected bytes were
    given) for the regular files `entries` ((position, relative path)) of the `total` entries of `bundle`;
    `written_by`: the writer of the merged folder other than our PEFT merge (VERL_MERGER), whose own values
    are accounted for (writer_token_ids: any one of the ways it may have set them, the same for both configs)."""
    findings: list[tuple[str, str]] = []
    to_scan: list[str] = []
    weights = [rel for _, rel in entries if kind_of(rel) == "weights"]
    if base is not None and not (base / CONFIG).is_file():
        return [("base model", "the base model folder to compare the bundle with has no config.json; refused")], []
    # the ways the writer may have set the token ids ([{}]: none): config.json and generation_config.json
    # (sorted, config.json first) are accounted for together, under a way both agree with
    ways = (writer_token_ids(base, written_by) if base is not None else []) or [{}]
    for n, rel in entries:
        kind = kind_of(rel)
        if kind is None:
            findings.append((where(rel, n, total), NOT_ALLOWED))
            continue
        path = bundle / rel
        if kind in ("card", "manifest"):
            if expected is None:
                to_scan.append(rel)
            elif expected.get(rel) is None or path.read_bytes() != expected[rel]:
                findings.append((rel, f"differs from the {kind} the release writes from the run's records; refused"))
            continue
        if base is None:
            findings.append((rel, f"a {kind} file, and no base model to compare it with (--base); refused"))
            continue
        if kind == "tokenizer":
            ref = base / rel
            if not ref.is_file():
                findings.append((rel, "a tokenizer file the base model's prepared copy does not have; refused"))
            elif ref.read_bytes() != path.read_bytes():
                findings.append((rel, "not byte-identical to the base model's prepared copy; refused"))
        else:
            why = None  # weights: all files together, below
            if kind == "weights index":
                why = check_weights_index(path, weights)
            elif kind in ("config", "generation config"):
                whys = [check_config(path, base, rel, saved_dtype, made) for made in ways]
                agree = [made for made, w in zip(ways, whys, strict=True) if w is None]
                ways, why = (agree, None) if agree else (ways, whys[0])
            if why:
                findings.append((rel, why))
    if base is not None and weights:
        findings += check_all_weights(bundle, weights, base, saved_dtype)
    return findings, to_scan
