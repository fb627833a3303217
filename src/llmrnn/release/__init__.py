"""Stage `release`: model card + MANIFEST.json for the merged model, PHI guard, optional Hub upload.

`llmrnn release build` reads only its inputs (merged folder, merge_check.json, splits, training metrics,
the rubric file; eval metrics only when passed explicitly, the DAG keeps release independent of eval) and
writes RUN/release/{README.md, MANIFEST.json, upload_receipt.json}.

The bundle (merged model files + card + manifest, nothing else) is COPIED into a private (0700) temp folder
beside the run's folders, each file read-only and hashed as it is copied; the manifest records those hashes,
the PHI guard accounts for exactly that copy (fail closed: each file against the base model's
prepared copy or against the card and manifest written again; only user-supplied text is scanned), and exactly those bytes are uploaded after every hash is checked
again (a file changed since the scan, in the copy or in merged/, stops the release). Links and other
non-regular files are refused, never followed; so are file names that are not plain UTF-8. The release
folder's files are opened before anything is uploaded (an unwritable folder stops the release first), and
the receipt is written last: it says what was uploaded, or that nothing was and why. A rerun finds its own
commit on the Hub (same release id) and does not push a second one.
"""

from __future__ import annotations

import argparse
import json

from llmrnn import phi_guard
from llmrnn.constants import VERL_MERGER
from llmrnn.release.bundle import build_release
from llmrnn.release.manifest import metrics_summary, rubric_info

__all__ = [
    "build_release",
    "metrics_summary",
    "rubric_info",
]


# ----------------------------------------------------------------------------- CLI
def _cmd_build(args: argparse.Namespace) -> None:
    build_release(
        merged=args.merged, merge_check=args.merge_check, splits=args.splits, split_files=args.split_files,
        metrics=args.metrics, rubric=args.rubric or None, cfg=args.cfg,
        card_out=args.card, manifest_out=args.manifest, receipt_out=args.receipt, split_format=args.split_format,
        train_summary=args.train_summary,
    )


def _cmd_guard(args: argparse.Namespace) -> None:
    report = phi_guard.scan_bundle(args.bundle, args.split_files, args.min_words, args.min_id_digits,
                                   args.min_line_words, split_format=args.split_format, base=args.base,
                                   saved_dtype=args.saved_dtype, written_by=args.written_by)
    print(json.dumps(report, indent=2))
    phi_guard.enforce(report, args.bundle)


def register(sub: argparse._SubParsersAction) -> None:
    from llmrnn.cli import json_arg

    release = sub.add_parser("release", help="model card, manifest, PHI guard and optional Hub upload")
    rsub = release.add_subparsers(dest="release_command", required=True)
    p = rsub.add_parser("build", help="write README.md (card), MANIFEST.json, upload_receipt.json")
    p.add_argument("--merged", required=True)
    p.add_argument("--merge-check", required=True)
    p.add_argument("--splits", required=True, help="splits.json (sizes, seed, sha256)")
    p.add_argument("--split-files", nargs="+", required=True,
                   help="what must not leak (PHI guard): the cohort's train/val/test split JSONs, or the QA "
                        "data stage's train/val/test/ood JSONL (--split-format qa)")
    p.add_argument("--split-format", choices=sorted(phi_guard.SPLIT_FORMATS), default="cohort")
    p.add_argument("--metrics", help="RUN/train/metrics.jsonl")
    p.add_argument("--train-summary", default=None,
                   help="RUN/train/summary.json (names the checkpoint merged and why)")
    p.add_argument("--rubric", help="the rubric YAML (judge model)")
    p.add_argument("--cfg", type=json_arg, required=True, help='JSON: {"run_name", "release", "knobs"}')
    p.add_argument("--card", required=True)
    p.add_argument("--manifest", required=True)
    p.add_argument("--receipt", required=True)
    p.set_defaults(func=_cmd_build)

    p = rsub.add_parser("guard", help="account for a folder's files against the base model and scan its card and "
                                      "manifest for cohort or QA identifiers/text (exit 3 on a finding)")
    p.add_argument("bundle")
    p.add_argument("--split-files", nargs="+", required=True)
    p.add_argument("--split-format", choices=sorted(phi_guard.SPLIT_FORMATS), default="cohort")
    p.add_argument("--min-words", type=int, default=8)
    p.add_argument("--min-id-digits", type=int, default=5)
    p.add_argument("--min-line-words", type=int, default=3, help="a whole cohort line/list item this long is a finding")
    p.add_argument("--base", default=None,
                   help="the base model's prepared folder: the bundle's weights, tokenizer and configs are compared "
                        "with it (without it they cannot be accounted for and are refused)")
    p.add_argument("--saved-dtype", choices=["float32", "float16", "bfloat16"], default=None,
                   help="the dtype the merge saved the weights at (merge.dtype), when not the base's")
    p.add_argument("--written-by", choices=[VERL_MERGER], default=None,
                   help="the merged folder's writer when not llmrnn's PEFT merge (merge_check.json's written_by): "
                        "verl's model merger, for a full fine-tune")
    p.set_defaults(func=_cmd_guard)
