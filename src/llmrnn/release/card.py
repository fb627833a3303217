"""The model card (README.md of the bundle): huggingface_hub's ModelCard, rendered from one Jinja template per
recipe (templates/memory_head.md, templates/qa.md) whose shared sections are the macros of
templates/sections.md. This module computes the templates' variables from the manifest; the sentences that
depend on reward.mode are its mode object's (llmrnn.reward.modes), read through reward_mode_text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2  # huggingface_hub's ModelCard.from_template renders with it

from llmrnn import io
from llmrnn.configcheck import cohort_is_synthetic
from llmrnn.errors import InputError
from llmrnn.mimic import sections as sec
from llmrnn.qa.data import SYSTEM_PROMPT
from llmrnn.qa.rewards import DEFAULT_WEIGHTS
from llmrnn.reward import asks_judge  # the one place that decides whether a reward asks the judge
from llmrnn.reward.config import reward_settings
from llmrnn.reward.modes import reward_mode
from llmrnn.runconfig import filled

if TYPE_CHECKING:
    from huggingface_hub import ModelCardData

UNKNOWN = "?"  # a count the run's splits.json does not give
TEMPLATES = Path(__file__).with_name("templates")  # package data (pyproject.toml)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value) or "[]"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _flatten(d: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += _flatten(value, f"{name}.")
        else:
            out.append((name, value))
    return out


def _rows(rows: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    """A table's rows as the templates print them: the value formatted for a markdown cell."""
    return [(key, _fmt(value)) for key, value in rows]


def card_data(rel: dict) -> ModelCardData:
    """The card's YAML metadata block (the release section's base_model, license and tags)."""
    from huggingface_hub import ModelCardData

    return ModelCardData(
        base_model=rel.get("base_model") or None,
        library_name="transformers",
        license=rel.get("license"),
        tags=list(rel.get("tags") or []),
        pipeline_tag="text-generation",
        language=["en"],
    )


def render_card(manifest: dict, rel: dict, repo_id: str) -> str:
    """The model card: the recipe's template filled with the variables below."""
    from huggingface_hub import ModelCard

    recipe = "qa" if manifest["knobs"].get("recipe") == "qa" else "memory_head"
    variables = _shared_variables(manifest, repo_id)
    variables |= (_qa_variables if recipe == "qa" else _memory_head_variables)(manifest)
    # from_template renders with a Jinja environment that has no loader, so the shared macros come in as a
    # Template object: the recipe templates `{% import sections as s %}` it
    sections = jinja2.Template((TEMPLATES / "sections.md").read_text(encoding="utf-8"))
    card = ModelCard.from_template(card_data(rel), template_path=str(TEMPLATES / f"{recipe}.md"),
                                   sections=sections, **variables)
    return str(card)


# --- the memory head's judge and training steps as a judged reward words them; every sentence that depends
# on reward.mode (these rows replaced, the reward row, how it was scored, the limit) is its mode object's
# (llmrnn.reward.modes): the templates read them through reward_mode_text alone
JUDGED_STEPS = [
    ("judge_server / preflight", ("the judge named in the rubric file is served on 127.0.0.1; preflight "
     "proves it answers and that rewards vary before any GPU time is spent")),
    ("train_grpo", ("GRPO with a LoRA on the memory model: each prompt is rolled out G times, the judge "
     "scores every rollout, advantages are taken relative to the group")),
]


def reward_mode_text(knobs: dict, own: dict | None = None) -> dict:
    """The memory head's reward sentences for this run, from its reward mode (`own`: manifest `own_reward`,
    which names the file and function of your own reward)."""
    mode = reward_mode(reward_settings(knobs.get("reward") or {}))
    row = mode.card_reward_row
    return {"steps": mode.card_workflow_steps(JUDGED_STEPS),
            "reward": row.format(**own) if row and own else row,
            "how_scored": mode.card_reward_paragraph.rstrip("\n"),
            "limit": mode.card_limit}


# --- the memory head (recipe memory_head) ---
WORKFLOW_STEPS_BEFORE_TRAINING = [
    ("prepare_base_model", "the base model is put on disk as an HF folder (offline)"),
    ("clean_cohort / split_cohort", ("patients with any visit lacking a discharge diagnosis are dropped; "
     "val and train are drawn with a fixed seed, the rest is the test split; overlap is asserted to be zero")),
    ("dump_trajectories", ("the LLM-as-RNN forward pass (prediction, evaluation and memory models) runs over "
     "each training patient; every visit that has two later visits becomes one memory-update row in a "
     "verl-format parquet, carrying what the judge needs about the next visit")),
]
WORKFLOW_STEPS_AFTER_TRAINING = [
    ("merge_model", ("the adapter is folded into the base weights with PEFT merge_and_unload and verified "
     "(merge_check.json)")),
    ("release", ("this card and MANIFEST.json are generated, the bundle is scanned for cohort data, and it "
     "is uploaded only when asked")),
]


def workflow_steps(knobs: dict) -> list[tuple[str, str]]:
    """The memory head's steps: the judge and training steps as its reward.mode words them."""
    return [*WORKFLOW_STEPS_BEFORE_TRAINING, *reward_mode_text(knobs)["steps"], *WORKFLOW_STEPS_AFTER_TRAINING]


def memory_reward(manifest: dict) -> dict:
    """The memory head's Reward section: its table's rows and its reward.mode sentences."""
    knobs = manifest["knobs"]
    own = manifest.get("own_reward")
    mode = reward_mode_text(knobs, own)
    if own:
        rows = [("reward", mode["reward"]),
                ("reward file sha256", own.get("sha256") or "(file not found at release time)")]
    else:
        rows = [*([("reward", mode["reward"])] if mode["reward"] else _judge_rows(manifest["judge"])),
                *[(f"reward.{k}", v) for k, v in _flatten(knobs.get("reward", {}))]]
    return {"reward_rows": _rows(rows), "reward_mode": mode}


def _memory_head_variables(manifest: dict) -> dict:
    knobs = manifest["knobs"]
    cohort = knobs.get("cohort", {})
    synthetic = cohort_is_synthetic(cohort)
    source = "synthetic cohort (`llmrnn cohort synth`)" if synthetic else f"`{Path(str(cohort.get('source'))).name}`"
    return {
        "synthetic": synthetic,
        **memory_reward(manifest),
        "data_rows": _data_rows(manifest, ("cohort", source), _shown_note_text(knobs), ("train", "val", "test"),
                                "patients"),
        "steps": workflow_steps(knobs),
    }


def _shown_note_text(knobs: dict) -> list[tuple[str, str]]:
    """A cohort built from MIMIC-IV notes: which note text the models were shown, leakage named."""
    cohort = filled("cohort", knobs.get("cohort"))
    if cohort["source"] != "mimic_iv":
        return []

    mimic = cohort["mimic_iv"]
    shown = [s for s in sec.KEPT if s in (mimic["sections"] or sec.MODES[mimic["mode"]])]
    high = [s for s in shown if sec.RISK[s].startswith("HIGH")]
    if mimic["mode"] == "reference":
        high += ["physical_exam and pertinent_results whole"]
    rows = [("note text shown", f"{mimic['mode']}: {', '.join(shown)}")]
    rows.append(("leakage", "LEAKAGE of discharge-time text: " + ", ".join(high) if high
                 else "none by design (admission-time text only; see build_report.json leak_audit)"))
    return rows


# --- recipe qa (rules/qa.smk); the shared steps keep the memory head's words ---
QA_STEPS = [
    WORKFLOW_STEPS_BEFORE_TRAINING[0],
    ("qa_synth", "one multiple-choice question per visit of the synthetic cohort is written (qa.source synthetic)"),
    ("qa_data", ("the QA records are filtered, de-duplicated and split by group with a fixed seed into train, "
     "val and test (plus an optional OOD set); overlap is asserted to be zero; train and val become "
     "verl-format parquet rows and SFT chat rows")),
    ("qa_sft / qa_merge_sft", ("a LoRA SFT warm start on the train answers, folded into the base model and "
     "verified like the final merge; GRPO starts from it")),
    ("judge_server", "the judge named in the rubric file is served on 127.0.0.1 for the reward's judge term"),
    ("qa_preflight", ("batch geometry, prompt lengths, the learning-rate schedule, GPUs and free disk are "
     "checked before any GPU time is spent")),
    ("qa_train_grpo", ("GRPO with a LoRA on the policy: each question is rolled out G times, each rollout is "
     "scored by the QA reward (see Reward), advantages are taken relative to the group")),
    ("merge_model", ("the GRPO adapter is folded into the weights it was trained on (the SFT-merged model when "
     "SFT ran) with PEFT merge_and_unload and verified (merge_check.json)")),
    ("release", ("this card and MANIFEST.json are generated, the bundle is scanned for the QA data's text and "
     "identifiers, and it is uploaded only when asked")),
]

# what each QA reward term pays (llmrnn.qa.rewards); only the terms with a weight > 0 are described
QA_REWARD_TEXT = {
    "exact_match": ("exact_match is 1 when the answer extracted from the response (the last `<answer>` tag, "
                    "else the last `Answer:` line, else the last line) equals the reference after normalisation "
                    "(case, punctuation, articles; numbers compared exactly; an option's text counts as its "
                    "letter), else 0."),
    "format": ("format is 1 when each required tag pair opens and closes exactly once, in order, around "
               "non-blank text, with nothing after the last closing tag, else 0."),
    "fluency": ("fluency is 1 - ln(perplexity) / ln(max perplexity) of the response under the base model, "
                "clipped to [0, 1]."),
    "judge": ("judge is the score the judge named in the rubric file gives the extracted answer against the "
              "reference, mapped to [0, 1]; every judge call is kept in a private audit log that is never part "
              "of a release."),
}
# what each term measures, for Limitations (the terms that were on)
QA_LIMIT_TERMS = {
    "exact_match": "an exact match of the extracted answer against the reference (a correct answer worded "
                   "differently from the reference scores 0)",
    "format": "a format term (the answer tags, not what is inside them)",
    "fluency": "a fluency term (perplexity under the base model, not correctness)",
    "judge": "a judge term",
}


def qa_weights(knobs: dict) -> dict:
    """The QA reward's weights as training used them (qa.rewards fills in the ones not configured)."""
    return {**DEFAULT_WEIGHTS, **((((knobs.get("qa") or {}).get("reward") or {}).get("weights")) or {})}


def qa_workflow_steps(knobs: dict) -> list[tuple[str, str]]:
    """The QA steps this config ran: qa_synth, the SFT warm start and the judge only where configured."""
    qa = filled("qa", knobs.get("qa"))
    skipped = {"qa_synth": qa["source"] != "synthetic",
               "qa_sft / qa_merge_sft": not qa["sft"]["enabled"],
               "judge_server": not asks_judge(knobs)}
    return [(rule, text) for rule, text in QA_STEPS if not skipped.get(rule)]


def _qa_variables(manifest: dict) -> dict:
    """recipe qa: a question-answering model (SFT warm start + GRPO on verifiable rewards)."""
    knobs = manifest["knobs"]
    qa = filled("qa", knobs.get("qa"))
    weights = qa_weights(knobs)  # as training used them
    terms = " + ".join(f"{weight} x {name}" for name, weight in weights.items() if weight)
    source = str(qa["source"])
    system = ((knobs.get("qa") or {}).get("prompt") or {}).get("system") or SYSTEM_PROMPT
    return {
        "synthetic": source == "synthetic",
        "sft": qa["sft"]["enabled"],
        "configured_weights": ", ".join(f"{k} {v}" for k, v in ((qa.get("reward") or {}).get("weights") or {}).items()
                                        if v),
        "reward_rows": _rows([
            ("reward", f"QA reward: {terms}"),
            *(_judge_rows(manifest["judge"]) if weights["judge"] else []),
            *[(f"qa.reward.{k}", v) for k, v in _flatten((knobs.get("qa") or {}).get("reward") or {})],
        ]),
        "reward_terms_text": " ".join(text for name, text in QA_REWARD_TEXT.items() if weights.get(name)),
        "reward_limit_terms": ", plus ".join(text for name, text in QA_LIMIT_TERMS.items() if weights.get(name)),
        "judge_term": bool(weights["judge"]),
        # splits.json of the QA data stage: sizes count questions
        "data_rows": _data_rows(manifest, ("QA data", "questions made from the synthetic cohort (`llmrnn qa synth`)"
                                           if source == "synthetic" else f"`{Path(source.removeprefix('hf:')).name}`"),
                                [], ("train", "val", "test", "ood"), "questions"),
        "steps": qa_workflow_steps(knobs),
        "system_prompt": system,
        "fence": "````" if "```" in system else "```",  # a prompt that holds a fence must not close ours
    }


# --- the sections both recipes share ---
def _shared_variables(manifest: dict, repo_id: str) -> dict:
    tr, mc = manifest["training"], manifest["merge_check"]
    return {
        "name": repo_id.split("/")[-1],
        "repo_id": repo_id,
        "identity_rows": _identity_rows(manifest),
        "model_rows": _model_rows(manifest),
        "merge": {"changed_tensors": mc.get("changed_tensors"), "total_tensors": mc.get("total_tensors"),
                  **{k: _fmt(mc.get(k)) for k in ("logits_max_abs_diff", "logits_tolerance", "adapter_effect")}},
        "grpo_rows": _rows(_flatten({k: v for k, v in manifest["knobs"].get("train", {}).items() if k != "lora"})),
        "divergence_rows": _divergence_rows(manifest),
        "reward_mean": _formatted_stats(tr.get("reward_mean")),
        "val_reward_mean": _formatted_stats(tr.get("val_reward_mean")),
        "curve_rows": _rows([(f"step {c['step']}", c["reward_mean"]) for c in tr.get("curve", [])]),
        "train_size": (manifest["splits"].get("sizes") or {}).get("train", UNKNOWN),
        "val_logged": bool(tr.get("val_reward_mean")),
    }


def _formatted_stats(stats: dict | None) -> dict | None:
    """A reward summary (first, last, min, max: formatted; n: as is), or None when none was logged."""
    return {k: v if k == "n" else _fmt(v) for k, v in stats.items()} if stats else None


def _chosen_checkpoint(train_summary: str | Path | None) -> dict | None:
    """The checkpoint the merged adapter came from (train summary.json `checkpoint`: step, select, why)."""
    if not train_summary:
        return None
    if not Path(train_summary).is_file():
        raise InputError(f"{train_summary}: training summary not found")
    chosen = io.read_json(train_summary).get("checkpoint") or {}
    return {k: chosen.get(k) for k in ("step", "select", "why", "val_reward")} if chosen else None


def _ran_attention(train_summary: str | Path | None) -> dict | None:
    """The actor attention verl ran with (train summary.json `attention`, verl_attention.resolve_attention)."""
    if not train_summary or not Path(train_summary).is_file():
        return None
    return io.read_json(train_summary).get("attention")


def _divergence_rows(manifest: dict) -> list[tuple[str, str]]:
    """Where this run knowingly differs from the reference run (verl engine only, else none; its settings are
    the reference's otherwise, tests/test_reproduce_fidelity.py)."""
    train_cfg = manifest["knobs"].get("train", {})
    if (train_cfg.get("engine") or manifest["training"].get("engine")) != "verl":
        return []
    attn = manifest["training"].get("attention") or {}
    ran = attn.get("ran") or (train_cfg.get("verl") or {}).get("attn_implementation") or "-"
    return _rows([
        ("actor attention", (f"{ran}, remove-padding {'on' if attn.get('use_remove_padding') else 'off'} "
                            f"({attn.get('why') or 'train.verl.attn_implementation'}); the reference's verl+vLLM "
                            "image ran flash_attention_2 with remove-padding: the same model, other kernels "
                            "(numerics differ in the last bits)")),
        ("data.seed", (f"{train_cfg.get('seed')} (train.seed): the reference left verl's data.seed unset, so its "
                      "prompt order was an unseeded shuffle that no rerun reproduces; this run's order is fixed")),
    ])


def _identity_rows(manifest: dict) -> list[tuple[str, str]]:
    git, tr = manifest["git"], manifest["training"]
    engine = manifest["knobs"].get("train", {}).get("engine") or tr.get("engine") or "-"
    dirty = {True: " (uncommitted changes)", False: " (clean)", None: ""}[git.get("dirty")]
    return _rows([
        ("run_name", manifest["run_name"]),
        ("created", manifest["timestamps"]["created_utc"]),
        ("git commit", f"{git.get('sha') or 'unknown'}{dirty}"),
        ("config sha256", manifest["config_sha256"][:16]),
        ("training engine", engine),
        ("training steps logged", tr.get("train_steps")),
        ("last step", tr.get("last_step")),
        *([("checkpoint merged", f"step {ck['step']} (train.select {ck['select']})"), ("why this step", ck["why"])]
          if (ck := tr.get("checkpoint")) else []),
    ])


def _model_rows(manifest: dict) -> list[tuple[str, str]]:
    mc, ad = manifest["merge_check"], manifest["adapter"]
    targets = ad.get("target_modules")
    alpha_note = (f"{ad.get('alpha')} (the adapter file said {ad.get('original_alpha')!r}; restored from "
                  "train.lora.alpha)" if ad.get("alpha_repaired") else ad.get("alpha"))
    return _rows([
        ("base model", manifest["base_model"]["hub_id"] or Path(manifest["base_model"]["local_dir"] or "-").name),
        ("adapter source", ad.get("source_kind")),
        ("rank r", ad.get("rank")),
        ("alpha", alpha_note),
        ("dropout", ad.get("dropout")),
        ("target modules", sorted(targets) if isinstance(targets, list) else targets),
        ("saved dtype", mc.get("dtype")),
    ])


def _judge_rows(judge: dict) -> list[tuple[str, Any]]:
    return [
        ("judge model", judge.get("model")),
        ("rubric", judge.get("name")),
        ("rubric file", judge.get("rubric_file")),
        ("rubric sha256", (judge.get("rubric_sha256") or "-")[:16]),
        ("judge serving", judge.get("serving_engine")),
        ("score method", judge.get("score_method")),
    ]


def _data_rows(manifest: dict, source: tuple[str, str], shown: list[tuple[str, str]], names: tuple[str, ...],
               unit: str) -> list[tuple[str, str]]:
    """The Data table: where the data came from, what text was shown, the split seed and each split's size
    and hash (`unit`: what a split counts)."""
    splits = manifest["splits"]
    sizes, sha = splits.get("sizes") or {}, splits.get("sha256") or {}
    return _rows([
        source,
        *shown,
        ("split seed", splits.get("seed")),
        *[(f"{name} {unit}", f"{sizes.get(name)} (sha256 {str(sha.get(name, '-'))[:12]})") for name in names
          if name in sizes],
    ])
