"""The model card (README.md of the bundle): identity, model, GRPO and reward, data, curve and eval, usage,
limits; for the memory head and the qa recipe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.configcheck import cohort_is_synthetic
from llmrnn.errors import InputError
from llmrnn.mimic import sections as sec
from llmrnn.qa.data import SYSTEM_PROMPT
from llmrnn.qa.rewards import DEFAULT_WEIGHTS
from llmrnn.release.manifest import outcome_reward
from llmrnn.reward import asks_judge  # the one place that decides whether a reward asks the judge
from llmrnn.runconfig import filled

UNKNOWN = "?"  # a count the run's splits.json does not give


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


def _table(rows: list[tuple[str, Any]], head: tuple[str, str] = ("setting", "value")) -> str:
    lines = [f"| {head[0]} | {head[1]} |", "|---|---|"]
    lines += [f"| `{k}` | {_fmt(v)} |" for k, v in rows]
    return "\n".join(lines)


def _metadata(rel: dict) -> str:
    from huggingface_hub import ModelCardData

    data = ModelCardData(
        base_model=rel.get("base_model") or None,
        library_name="transformers",
        license=rel.get("license"),
        tags=list(rel.get("tags") or []),
        pipeline_tag="text-generation",
        language=["en"],
    )
    return data.to_yaml()


WORKFLOW_STEPS = [
    ("prepare_base_model", "the base model is put on disk as an HF folder (offline)"),
    ("clean_cohort / split_cohort", ("patients with any visit lacking a discharge diagnosis are dropped; "
     "val and train are drawn with a fixed seed, the rest is the test split; overlap is asserted to be zero")),
    ("dump_trajectories", ("the LLM-as-RNN forward pass (prediction, evaluation and memory models) runs over "
     "each training patient; every visit that has two later visits becomes one memory-update row in a "
     "verl-format parquet, carrying what the judge needs about the next visit")),
    ("judge_server / preflight", ("the judge named in the rubric file is served on 127.0.0.1; preflight "
     "proves it answers and that rewards vary before any GPU time is spent")),
    ("train_grpo", ("GRPO with a LoRA on the memory model: each prompt is rolled out G times, the judge "
     "scores every rollout, advantages are taken relative to the group")),
    ("merge_model", ("the adapter is folded into the base weights with PEFT merge_and_unload and verified "
     "(merge_check.json)")),
    ("release", ("this card and MANIFEST.json are generated, the bundle is scanned for cohort data, and it "
     "is uploaded only when asked")),
]
# reward.mode outcome: no judge server; preflight and training score with the outcome reward
OUTCOME_STEPS = {
    "judge_server / preflight": ("preflight", (
        "no judge is started (reward.mode outcome); preflight scores reference memories with the outcome "
        "reward and checks that the training run is possible")),
    "train_grpo": ("train_grpo", (
        "GRPO with a LoRA on the memory model: each prompt is rolled out G times, each rollout is scored by "
        "the share of the next visit's diagnoses its memory names, advantages are taken relative to the group")),
}


def workflow_steps(outcome: bool) -> list[tuple[str, str]]:
    if not outcome:
        return WORKFLOW_STEPS
    return [OUTCOME_STEPS.get(rule, (rule, text)) for rule, text in WORKFLOW_STEPS]


# recipe qa (rules/qa.smk); the shared steps keep the memory head's words
QA_STEPS = [
    WORKFLOW_STEPS[0],
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


def render_card(manifest: dict, rel: dict, repo_id: str) -> str:
    """The model card: one section per helper below, in reading order."""
    knobs = manifest["knobs"]
    qa = knobs.get("recipe") == "qa"
    # the data the model learned from: the QA source for recipe qa (its questions may come from elsewhere)
    source = filled("qa", knobs.get("qa")) if qa else knobs.get("cohort", {})
    synthetic = source["source"] == "synthetic" if qa else cohort_is_synthetic(source)
    parts: list[str] = []
    if qa:
        _card_intro_qa(parts, rel, repo_id, knobs.get("qa", {}))
    else:
        _card_intro(parts, rel, repo_id, synthetic)
    _card_identity(parts, manifest)
    _card_model(parts, manifest)
    _card_grpo_and_reward(parts, manifest)
    _card_divergences(parts, manifest)
    _card_data(parts, manifest, synthetic)
    _card_curve_and_eval(parts, manifest)
    if qa:
        _card_usage_qa(parts, repo_id, knobs)
    else:
        _card_usage(parts, repo_id, outcome_reward(knobs))
    _card_limits(parts, manifest, synthetic)
    return "\n".join(parts)


def _card_intro(parts: list[str], rel: dict, repo_id: str, synthetic: bool) -> None:
    parts.append(f"---\n{_metadata(rel)}\n---\n")
    parts.append(f"# {repo_id.split('/')[-1]}\n")
    parts.append(
        "A memory-update model for the LLM-as-RNN clinical pipeline (arXiv 2601.13352). It reads the "
        "previous memory of a patient, the new visit, the prediction made for that visit and its "
        "evaluation, and writes the next memory as `{\"evolving_summary\": \"...\"}`. It was trained with "
        "GRPO on a LoRA adapter and the adapter is already folded into the weights: load it as a plain "
        "transformers causal LM, no PEFT needed. It is a component of that pipeline, not a chat assistant.\n"
    )
    if synthetic:
        parts.append(
            "> **Demo build.** This model was trained on the SYNTHETIC cohort of the embedded llmrnn "
            "config. The run shows that the whole pipeline works end to end; it says nothing about clinical "
            "quality.\n"
        )


def _card_intro_qa(parts: list[str], rel: dict, repo_id: str, qa: dict) -> None:
    """recipe: qa: a question-answering model (SFT warm start + GRPO on verifiable rewards)."""
    qa = filled("qa", qa)
    parts.append(f"---\n{_metadata(rel)}\n---\n")
    parts.append(f"# {repo_id.split('/')[-1]}\n")
    sft = "a LoRA SFT warm start, then " if qa["sft"]["enabled"] else ""
    weights = ", ".join(f"{k} {v}" for k, v in ((qa.get("reward") or {}).get("weights") or {}).items() if v)
    parts.append(
        "A medical question-answering model trained by the llmrnn `qa` recipe: "
        f"{sft}GRPO with verifiable rewards (weights: {weights or 'see the manifest'}). It answers as "
        "`<reasoning>...</reasoning><answer>...</answer>`. The adapters are folded into the weights: load it "
        "as a plain transformers causal LM.\n"
    )
    if qa["source"] == "synthetic":
        parts.append(
            "> **Demo build.** Trained on multiple-choice questions made from the SYNTHETIC cohort of llmrnn; "
            "it shows that the pipeline works end to end and says nothing about medical quality.\n"
        )


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


def _card_divergences(parts: list[str], manifest: dict) -> None:
    """Where this run knowingly differs from the reference run (verl engine only; its settings are the
    reference's otherwise, tests/test_reproduce_fidelity.py)."""
    train_cfg = manifest["knobs"].get("train", {})
    if (train_cfg.get("engine") or manifest["training"].get("engine")) != "verl":
        return
    attn = manifest["training"].get("attention") or {}
    ran = attn.get("ran") or (train_cfg.get("verl") or {}).get("attn_implementation") or "-"
    rows = [
        ("actor attention", (f"{ran}, remove-padding {'on' if attn.get('use_remove_padding') else 'off'} "
                            f"({attn.get('why') or 'train.verl.attn_implementation'}); the reference's verl+vLLM "
                            "image ran flash_attention_2 with remove-padding: the same model, other kernels "
                            "(numerics differ in the last bits)")),
        ("data.seed", (f"{train_cfg.get('seed')} (train.seed): the reference left verl's data.seed unset, so its "
                      "prompt order was an unseeded shuffle that no rerun reproduces; this run's order is fixed")),
    ]
    parts.append("## Differences from the reference run\n")
    parts.append(_table(rows, ("what", "this run")) + "\n")


def _card_identity(parts: list[str], manifest: dict) -> None:
    git, tr = manifest["git"], manifest["training"]
    train_cfg = manifest["knobs"].get("train", {})
    engine = train_cfg.get("engine") or tr.get("engine") or "-"
    dirty = {True: " (uncommitted changes)", False: " (clean)", None: ""}[git.get("dirty")]
    parts.append("## Run identity\n")
    parts.append(_table([
        ("run_name", manifest["run_name"]),
        ("created", manifest["timestamps"]["created_utc"]),
        ("git commit", f"{git.get('sha') or 'unknown'}{dirty}"),
        ("config sha256", manifest["config_sha256"][:16]),
        ("training engine", engine),
        ("training steps logged", tr.get("train_steps")),
        ("last step", tr.get("last_step")),
        *([("checkpoint merged", f"step {ck['step']} (train.select {ck['select']})"), ("why this step", ck["why"])]
          if (ck := tr.get("checkpoint")) else []),
    ], ("field", "value")) + "\n")


def _card_model(parts: list[str], manifest: dict) -> None:
    mc, ad = manifest["merge_check"], manifest["adapter"]
    parts.append("## Base model and LoRA\n")
    targets = ad.get("target_modules")
    alpha_note = (f"{ad.get('alpha')} (the adapter file said {ad.get('original_alpha')!r}; restored from "
                  "train.lora.alpha)" if ad.get("alpha_repaired") else ad.get("alpha"))
    parts.append(_table([
        ("base model", manifest["base_model"]["hub_id"] or Path(manifest["base_model"]["local_dir"] or "-").name),
        ("adapter source", ad.get("source_kind")),
        ("rank r", ad.get("rank")),
        ("alpha", alpha_note),
        ("dropout", ad.get("dropout")),
        ("target modules", sorted(targets) if isinstance(targets, list) else targets),
        ("saved dtype", mc.get("dtype")),
    ]) + "\n")
    parts.append(
        f"Merge verification (merge_check.json): {mc.get('changed_tensors')} of {mc.get('total_tensors')} "
        "weight tensors differ from the base, all of them inside the adapter's target modules; on the probe "
        f"prompts the merged logits differ from base+adapter by at most {_fmt(mc.get('logits_max_abs_diff'))} "
        f"(tolerance {_fmt(mc.get('logits_tolerance'))}), while the adapter itself moves them by "
        f"{_fmt(mc.get('adapter_effect'))}; the folder reloads and generates. verl's own model merger was not "
        "used for the LoRA: it does not fold the adapter in and records lora_alpha as 0.\n"
    )


def _card_grpo_and_reward(parts: list[str], manifest: dict) -> None:
    knobs, judge = manifest["knobs"], manifest["judge"]
    train_cfg = knobs.get("train", {})
    parts.append("## GRPO settings\n")
    parts.append(_table(_flatten({k: v for k, v in train_cfg.items() if k not in ("lora",)}), ("knob", "value")) + "\n")

    parts.append("## Reward\n")
    if knobs.get("recipe") == "qa":
        _card_reward_qa(parts, knobs, judge)
        return
    own = manifest.get("own_reward")
    if own:
        parts.append(_table([
            ("reward", f"your own reward: {own['name']} in {own['path']} (no judge)"),
            ("reward file sha256", own.get("sha256") or "(file not found at release time)"),
        ], ("field", "value")) + "\n")
        parts.append("Every rollout was scored by that function (reward.custom); the manifest holds its file's "
                     "hash. No judge model was asked.\n")
        return
    if outcome_reward(knobs):
        parts.append(_table([
            ("reward", "outcome (no judge): the share of the next visit's diagnoses the memory names"),
            *[(f"reward.{k}", v) for k, v in _flatten(knobs.get("reward", {}))],
        ], ("field", "value")) + "\n")
        parts.append(
            "Each rollout's memory is parsed from the policy output (output without a memory JSON scores 0) "
            "and scored by the share of the next visit's ground-truth diagnoses it names, matched as the "
            "held-out memory recall matches them. No judge model was asked (reward.mode outcome). Every "
            "scored rollout is kept in a private audit log that is never part of a release.\n"
        )
        return
    parts.append(_table([
        *_judge_rows(judge),
        *[(f"reward.{k}", v) for k, v in _flatten(knobs.get("reward", {}))],
    ], ("field", "value")) + "\n")
    parts.append(
        "Each rollout's memory is parsed from the policy output (unparseable JSON gets a small fixed reward) "
        "and shown to the judge together with what happened at the next visit: the prediction made with "
        "that memory, the ground truth and its evaluation. The judge's score is mapped to [0, 1]. Every "
        "judge call is kept in a private audit log that is never part of a release.\n"
    )


def _judge_rows(judge: dict) -> list[tuple[str, Any]]:
    return [
        ("judge model", judge.get("model")),
        ("rubric", judge.get("name")),
        ("rubric file", judge.get("rubric_file")),
        ("rubric sha256", (judge.get("rubric_sha256") or "-")[:16]),
        ("judge serving", judge.get("serving_engine")),
        ("score method", judge.get("score_method")),
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


def _card_reward_qa(parts: list[str], knobs: dict, judge: dict) -> None:
    """recipe qa: the weighted sum of verifiable terms; the judge's rows only when its term is on."""
    weights = qa_weights(knobs)
    terms = " + ".join(f"{weight} x {name}" for name, weight in weights.items() if weight)
    parts.append(_table([
        ("reward", f"QA reward: {terms}"),
        *(_judge_rows(judge) if weights["judge"] else []),
        *[(f"qa.reward.{k}", v) for k, v in _flatten((knobs.get("qa") or {}).get("reward") or {})],
    ], ("field", "value")) + "\n")
    parts.append(" ".join(text for name, text in QA_REWARD_TEXT.items() if weights.get(name)) + "\n")


def _card_data(parts: list[str], manifest: dict, synthetic: bool) -> None:
    splits, knobs = manifest["splits"], manifest["knobs"]
    parts.append("## Data\n")
    sizes = splits.get("sizes") or {}
    sha = splits.get("sha256") or {}
    if knobs.get("recipe") == "qa":  # splits.json of the QA data stage: sizes count questions
        qa_source = str(filled("qa", knobs.get("qa"))["source"])
        source = ("questions made from the synthetic cohort (`llmrnn qa synth`)" if qa_source == "synthetic"
                  else f"`{Path(qa_source.removeprefix('hf:')).name}`")
        field, names, unit = "QA data", ("train", "val", "test", "ood"), "questions"
    else:
        cohort_source = str(knobs.get("cohort", {}).get("source"))
        source = "synthetic cohort (`llmrnn cohort synth`)" if synthetic else f"`{Path(cohort_source).name}`"
        field, names, unit = "cohort", ("train", "val", "test"), "patients"
    shown = _shown_note_text(knobs) if knobs.get("recipe") != "qa" else []
    parts.append(_table([
        (field, source),
        *shown,
        ("split seed", splits.get("seed")),
        *[(f"{name} {unit}", f"{sizes.get(name)} (sha256 {str(sha.get(name, '-'))[:12]})") for name in names
          if name in sizes],
    ], ("field", "value")) + "\n")
    parts.append(
        "Training rows come from the train split only; the val split is used for validation during "
        "training and the test split is left for the held-out evaluation. No patient text or identifier is "
        "included in this repository (the release bundle is scanned for both before upload).\n"
    )


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


QA_EVAL_NOTE = (
    "Not part of this release step. After it, the workflow target `eval_heldout` runs `qa_eval_model`, "
    "`qa_eval_gather` and `qa_report`: greedy_pass@1 and sampling_pass@k of the base model, the SFT model "
    "(when SFT ran) and this model on the test split (and the OOD set, when one is given), with chance "
    "baselines and paired tests, and where a judge is configured (qa.eval.judge) the same outcomes graded "
    "by the judge (`qa_judge_eval`); see results/<run>/eval/.\n"
)


def _card_curve_and_eval(parts: list[str], manifest: dict) -> None:
    tr = manifest["training"]
    rw = tr.get("reward_mean") or {}
    parts.append("## Training curve\n")
    if rw:
        parts.append(
            f"Mean reward per step went from {_fmt(rw['first'])} to {_fmt(rw['last'])} over {rw['n']} logged "
            f"steps (min {_fmt(rw['min'])}, max {_fmt(rw['max'])})."
            + (f" Validation reward: {_fmt(tr['val_reward_mean']['first'])} -> "
               f"{_fmt(tr['val_reward_mean']['last'])}." if tr.get("val_reward_mean") else "")
            + "\n"
        )
        parts.append(_table([(f"step {c['step']}", c["reward_mean"]) for c in tr.get("curve", [])],
                            ("step", "reward_mean")) + "\n")
    else:
        parts.append("No training rewards were logged.\n")

    # The release never waits for (or reruns with) the evaluation, so the card only points at it.
    parts.append("## Held-out evaluation\n")
    if manifest["knobs"].get("recipe") == "qa":
        parts.append(QA_EVAL_NOTE)
        return
    parts.append(
        "Not part of this release step. The workflow target `eval_heldout` compares this model with the "
        "base model (and baselines) as the memory model on the test split; see results/<run>/eval/.\n"
    )


def _numbered(steps: list[tuple[str, str]]) -> str:
    return "\n".join(f"{i}. `{rule}`: {text}." for i, (rule, text) in enumerate(steps, 1))


def _load_code(repo_id: str) -> str:
    return ("from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f"tok = AutoTokenizer.from_pretrained(\"{repo_id}\")\n"
            f"model = AutoModelForCausalLM.from_pretrained(\"{repo_id}\")\n")


def _card_usage(parts: list[str], repo_id: str, outcome: bool = False) -> None:
    parts.append("## How the workflow made it\n")
    parts.append(_numbered(workflow_steps(outcome)) + "\n")

    parts.append("## Intended use\n")
    parts.append(
        "Use it as the memory model of an LLM-as-RNN run, with the same memory-update prompt it was trained "
        "on (config/prompts in llmrnn). In an llmrnn config:\n\n"
        "```yaml\nmodels:\n  memory: <this repo id or a local copy>\n```\n\n"
        "Or directly:\n\n"
        f"```python\n{_load_code(repo_id)}```\n"
    )


def _card_usage_qa(parts: list[str], repo_id: str, knobs: dict) -> None:
    parts.append("## How the workflow made it\n")
    parts.append(_numbered(qa_workflow_steps(knobs)) + "\n")
    parts.append("The evaluation (`qa_eval_model`, `qa_eval_gather`, `qa_report`) runs after the release, not "
                 "before it: see Held-out evaluation.\n")
    system = ((knobs.get("qa") or {}).get("prompt") or {}).get("system") or SYSTEM_PROMPT
    fence = "````" if "```" in system else "```"  # a prompt that holds a fence must not close ours
    parts.append("## Intended use\n")
    parts.append(
        "Ask it medical questions with the system prompt it was trained with; it answers as "
        "`<reasoning>...</reasoning><answer>...</answer>` and the text inside `<answer>` is its answer. "
        f"The system prompt:\n\n{fence}text\n{system}\n{fence}\n\n"
        "The user turn holds the context (if any), the question and, for multiple choice, the options as "
        "`A) ...` lines with \"Answer with the letter of one option.\" (llmrnn.qa.data.user_prompt). With "
        "transformers:\n\n"
        f"```python\n{_load_code(repo_id)}"
        "# system_prompt: the text above; question: the user turn\n"
        "messages = [{\"role\": \"system\", \"content\": system_prompt}, {\"role\": \"user\", \"content\": question}]\n"
        "inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\")\n```\n"
    )


def _card_limits(parts: list[str], manifest: dict, synthetic: bool) -> None:
    tr, sizes = manifest["training"], manifest["splits"].get("sizes") or {}
    parts.append("## Limitations\n")
    limits = [
        "Research artifact. It must not be used for the care of real patients.",
        *(_limits_qa if manifest["knobs"].get("recipe") == "qa" else _limits_memory)(manifest["knobs"], sizes),
        "No safety tuning was added on top of the base model.",
    ]
    if synthetic:
        limits.insert(0, "Synthetic demo data: the model learned nothing clinical; the run checks the mechanics.")
    if not (tr.get("val_reward_mean")):
        limits.append("No validation reward was logged during training.")
    parts.append("\n".join(f"- {line}" for line in limits) + "\n")

    parts.append("## Reproducibility\n")
    parts.append(
        "`MANIFEST.json` beside this card records the git commit, the sha256 of the configuration and every "
        "knob in it, the sha256 of each split, the judge model and rubric hash, package versions, the merge "
        "check and the sha256 of every model file. Re-running `snakemake all --configfile <config>` in llmrnn at "
        "that commit rebuilds the same pipeline.\n"
    )


def _limits_memory(knobs: dict, sizes: dict) -> list[str]:
    return [
        (
            f"Trained on {sizes.get('train', UNKNOWN)} patients; how it behaves on other cohorts, hospitals or "
            "note styles is unknown."
        ),
        (
            "The reward is a text match of the memory against the next visit's diagnoses; a memory that names "
            "them is not necessarily a good clinical summary."
            if outcome_reward(knobs) else
            "The reward is the opinion of one judge model under one rubric; a higher reward is not the same "
            "as better downstream predictions unless the held-out evaluation shows it."
        ),
        (
            "Prompts other than the memory-update template it was trained on are unsupported and may yield "
            "output that is not valid JSON."
        ),
    ]


QA_LIMIT_TERMS = {
    "exact_match": "an exact match of the extracted answer against the reference (a correct answer worded "
                   "differently from the reference scores 0)",
    "format": "a format term (the answer tags, not what is inside them)",
    "fluency": "a fluency term (perplexity under the base model, not correctness)",
    "judge": "a judge term",
}
QA_JUDGE_LIMIT = ("The judge term is the opinion of one judge model under one rubric; a higher judge score is "
                  "not the same as a correct answer unless the held-out evaluation shows it.")


def _limits_qa(knobs: dict, sizes: dict) -> list[str]:
    """recipe qa: what its reward measures (only the terms that were on) and the prompt it needs."""
    weights = qa_weights(knobs)
    terms = ", plus ".join(text for name, text in QA_LIMIT_TERMS.items() if weights.get(name))
    return [
        (f"Trained on {sizes.get('train', UNKNOWN)} questions; how it answers questions from other sources, "
         "specialties or formats is unknown."),
        f"The reward is {terms}; nothing in it checks that the reasoning is right.",
        *([QA_JUDGE_LIMIT] if weights["judge"] else []),
        ("Prompts other than the system prompt it was trained with are unsupported; without it the answer may "
         "not come inside the `<answer>` tags."),
    ]
