# Helpers only: config validation, path builders, the config subsets rules pass as params.
import json
import os
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from llmrnn.errors import LlmrnnError
from llmrnn.provenance import code_identity
from llmrnn.upload import env_problems

# before validate: a schema error would echo a key typed in place of a variable name into the log
if env_problems(config):
    raise WorkflowError(f"config: {env_problems(config)[0]}")
validate(config, schema="../workflow/schemas/config.schema.yaml")

# envs/*.yaml install llmrnn from ${LLMRNN_REPO} (conda's pip expands it): this workflow's own folder
os.environ.setdefault("LLMRNN_REPO", str(Path(workflow.basedir)))

RUN = f"results/{config['run_name']}"
LOGS = f"logs/{config['run_name']}"


def cfg_json(*sections):
    """The exact config subset a rule depends on, as JSON; in params it makes Snakemake rerun the
    rule when (and only when) that subset changes."""
    return json.dumps({s: config[s] for s in sections}, sort_keys=True)


def code_hash(verb, *also):
    """params: the code identity of a job running `llmrnn <verb>` (+ modules `also` its command line
    names): a hash of the package modules the verb can run (llmrnn.provenance, from the imports).
    """
    try:
        return code_identity(verb, *also)
    except (LlmrnnError, ValueError) as exc:
        raise WorkflowError(f"code_hash({verb!r}): {exc}") from exc


def raw_cohort_path(wildcards):
    """The cohort file clean_cohort reads: made by synth_cohort, or the user's own file."""
    source = config["cohort"]["source"]
    if source == "synthetic":
        return "resources/cohort/synthetic.json"
    if "{" in source or "}" in source:
        raise WorkflowError(
            f"cohort.source: {source!r} contains a brace, which Snakemake reads as a wildcard; "
            "rename the file or its folder"
        )
    if not Path(source).exists():
        raise WorkflowError(
            f"cohort.source: {source} does not exist. Expected a JSON list of patients in the LLM-as-RNN "
            "format (see config/README.md). MIMIC-IV is credentialed and never shipped with llmrnn: "
            "build the file from your own PhysioNet copy, or set cohort.source: synthetic."
        )
    return source


def raw_cohort_sha256(wildcards):
    """params of clean_cohort: the user's cohort by content, so a replaced file reruns cleaning (and
    splits) even when its mtime is older; None for the synthetic cohort (synth_cohort's params rerun it).
    """
    from llmrnn.cohort import source_sha256

    return source_sha256(config["cohort"]["source"])


def all_targets():
    if recipe_is("qa"):
        return qa_targets()
    return [
        f"{RUN}/splits/splits.json",
        *trajectory_targets(),
        # rules.X: all_targets is called by rule all, after every rule file is included
        rules.preflight.output.report,
        *rules.train_plots.output,
        *release_targets(),
        *eval_heldout_targets(),
    ]


# ----------------------------------------------------------------------------- eval (held-out evaluation)
EVAL_VARIANT_PATTERN = "base|trained|zero_shot|full_history"
EVAL_ROLES = ("prediction", "evaluation", "memory")


def eval_variants():
    """base + trained memory model, then the configured baselines."""
    return ["base", "trained", *config["eval"]["baselines"]]


def eval_cfg_json(*keys):
    """A subset of the eval section as JSON (params of the grade/gather rules)."""
    return json.dumps({k: config["eval"][k] for k in keys}, sort_keys=True)


def eval_forward_cfg():
    """Everything that changes the forward pass of an eval shard: eval's patient/sampling knobs and the
    roles/prompts sections (models and the prompt file are inputs). Grading and statistics knobs are
    left out, so changing them never reruns the forward pass.
    """
    subset = {
        k: config["eval"][k]
        for k in ("max_patients", "max_visits", "patient_seed", "seed")
    }
    return json.dumps(
        {
            "eval": subset,
            "roles": config.get("roles"),
            "prompts": config.get("prompts"),
        },
        sort_keys=True,
    )


def eval_role_model_inputs(roles):
    """Files of the roles' models: the .ready marker of a configured model name, the folder itself for
    a path; nothing for an openai endpoint."""
    inputs = set()
    for role in roles:
        cfg = config["roles"][role]
        if cfg.get("backend", "transformers") != "openai":
            ref = cfg["model"]
            inputs.add(model_ready(ref) if is_model_name(ref) else ref)
    return sorted(inputs)


def eval_trained_model():
    """The trained memory model: this run's merged model, or the HF folder named by eval.trained_model."""
    return config["eval"]["trained_model"] or f"{RUN}/merged"


def eval_shard_inputs(wildcards):
    """Models of an eval shard; the trained variant's memory model is the merged one (and the merge
    check must have passed) or eval.trained_model."""
    if wildcards.variant != "trained":
        return eval_role_model_inputs(EVAL_ROLES)
    inputs = eval_role_model_inputs(("prediction", "evaluation"))
    if config["eval"]["trained_model"]:
        return inputs + [f"{config['eval']['trained_model']}/config.json"]
    return inputs + [f"{RUN}/merged", f"{RUN}/merge_check.json"]


def eval_memory_arg(wildcards):
    """Arguments as a list, so `{params.memory:q}` quotes each one."""
    if wildcards.variant == "trained":
        return ["--memory-model", eval_trained_model()]
    return []


def eval_shard_files(kind):
    """All shard files of every variant: kind is "shard" (forward pass) or "graded"."""
    return [
        f"{RUN}/eval/{variant}/{kind}_{k}.jsonl"
        for variant in eval_variants()
        for k in range(config["eval"]["shards"])
    ]


def eval_heldout_targets():
    if recipe_is("qa"):
        return qa_eval_targets()
    plots = f"{RUN}/eval/plots"
    return [
        f"{RUN}/eval/metrics.json",
        f"{RUN}/eval/comparison.json",
        f"{plots}/acc_bars.png",
        f"{plots}/acc_by_visit.png",
        f"{plots}/memory_recall.png",
        f"{plots}/summary.tsv",
    ]


# ----------------------------------------------------------------------------- judge / reward / preflight
def judge_rubric():
    """The rubric named by judge.rubric, parsed by the same code the server and the reward use."""
    from llmrnn.rubric import load_rubric

    return load_rubric(config["judge"]["rubric"])


def judge_model_input(wildcards):
    """The .ready marker of the judge model's local copy (the server loads only that copy, offline):
    prepare_base_model for `source: local`, prepare_judge_model for `source: hub`; none for a `path`.
    """
    rubric = judge_rubric()
    if rubric.model_source == "local":
        return model_ready(rubric.model)
    if rubric.model_source == "path":
        return []
    from llmrnn.judge.launcher import judge_model_dir

    return str(judge_model_dir(rubric) / ".ready")


def judge_model_cfg_json():
    """What the judge model's download depends on: its hub id (not the rubric's prompts)."""
    rubric = judge_rubric()
    return json.dumps(
        {"model": rubric.model, "source": rubric.model_source}, sort_keys=True
    )


def judge_gpus():
    return 1 if judge_rubric().needs_gpu else 0


def judge_needed():
    """Whether the reward asks the judge (llmrnn.reward.asks_judge: not when reward.mode is outcome);
    without it judge_server (and the judge model's download) is never planned."""
    from llmrnn.reward import asks_judge

    return asks_judge(config)


def judge_endpoint_input(wildcards):
    """The judge service's endpoint for preflight and train_grpo, when the reward asks the judge."""
    return {"endpoint": rules.judge_server.output.endpoint} if judge_needed() else {}


def preflight_judge_input(wildcards):
    """Preflight's judge inputs: the endpoint and the rubric it checks, when the reward asks the judge."""
    if not judge_needed():
        return {}
    return {**judge_endpoint_input(wildcards), "rubric": config["judge"]["rubric"]}


def input_flag(flag, name):
    """A params function: [flag, the job's input `name`] when the job has that optional (unpacked) input,
    else [] (e.g. --endpoint only when the reward asks the judge); a list, so `{params.x:q}` quotes it.
    """

    def arg(wildcards, input):
        return [flag, input[name]] if name in input.keys() else []

    return arg


def train_judge_gpus():
    """GPUs a judge holds beside train_grpo on its node (taken last); 0 without a judge."""
    return judge_gpus() if judge_needed() else 0


# ----------------------------------------------------------------------------- train
def train_gpus():
    """GPUs of train_grpo: train.resources.gpu, else n_gpus_per_node for verl (per node), 0 for TRL."""
    t = config["train"]
    if t["resources"].get("gpu") is not None:
        return t["resources"]["gpu"]
    return t["n_gpus_per_node"] if t["engine"] == "verl" else 0


def train_threads():
    """TRL on CPU uses train.trl.num_threads (1 thread: 0.13-0.17 s per tiny GRPO step; 2: 0.14-9.7 s)."""
    t = config["train"]
    if t["engine"] == "trl":
        return t["trl"]["num_threads"]
    return t["resources"]["cpus_per_task"]


def preflight_cfg():
    """Preflight depends on the judge (when the reward asks it), reward and preflight sections (+ train:
    its training checks)."""
    sections = ("judge", "reward", "preflight", "train")
    return cfg_json(
        *[s for s in sections if s in config and (s != "judge" or judge_needed())]
    )


# ----------------------------------------------------------------------------- models / trajectories
MODELS = "resources/models"
TRAJECTORY_SPLITS = ("train", "val")


def is_model_name(ref):
    """A role's `model` is a configured model name (prepared under MODELS) unless it looks like a path."""
    return not (os.sep in ref or os.altsep and os.altsep in ref or ref.startswith("."))


def model_ready(name):
    if name not in config["models"]:
        raise WorkflowError(
            f"model {name!r} is used but not configured: add models.{name} (source: pypi_gguf | hub | local)"
        )
    return f"{MODELS}/{name}/.ready"


def model_cfg_json(wildcards):
    """params of prepare_base_model: exactly the models.<name> entry it builds."""
    if wildcards.name not in config["models"]:
        raise WorkflowError(f"models.{wildcards.name}: not configured")
    return json.dumps(config["models"][wildcards.name], sort_keys=True)


def model_mem_mb(wildcards):
    source = config["models"].get(wildcards.name, {}).get("source")
    return 16000 if source == "pypi_gguf" else 4000


def role_model_markers():
    """.ready markers of the local models the forward-pass roles load (openai roles load none)."""
    names = {
        role["model"]
        for role in config["roles"].values()
        if role.get("backend", "transformers") != "openai"
        and is_model_name(role["model"])
    }
    return [model_ready(n) for n in sorted(names)]


def trajectories_cfg_json():
    """params of trajectory_shard: roles, the models they use, the trajectories knobs (not resources)."""
    used = {r["model"] for r in config["roles"].values()}
    return json.dumps(
        {
            "roles": config["roles"],
            "models": {n: m for n, m in config["models"].items() if n in used},
            "trajectories": {
                k: v
                for k, v in config["trajectories"].items()
                if k not in ("resources", "threads")
            },
        },
        sort_keys=True,
    )


def conda_env(stage):
    """The conda env file (--sdm conda) of every job, chosen in this one place. Stages: data (cohort,
    report), cpu (models, merge, release, preflight), forward (trajectory and eval shards; vllm when a
    role uses the vLLM backend), judge (vllm for a `vllm serve` judge), train (verl or cpu), sft (the qa
    recipe's LoRA SFT: the GPU stack, whose lock holds TRL and PEFT, when the job gets a GPU).
    """
    if stage == "forward":
        vllm = any(r.get("backend") == "vllm" for r in config["roles"].values())
        name = "vllm" if vllm else "cpu"
    elif stage == "judge":
        name = "vllm" if judge_gpus() else "cpu"
    elif stage == "train":
        name = "verl" if config["train"]["engine"] == "verl" else "cpu"
    elif stage == "sft":
        name = "verl" if config["qa"]["sft"]["resources"]["gpu"] else "cpu"
    elif stage in ("data", "cpu"):
        name = stage
    else:
        raise WorkflowError(f"conda_env: unknown stage {stage!r}")
    return f"../envs/{name}.yaml"


def trajectory_shard_files(split, ext):
    return [
        f"{RUN}/trajectories/shards/{split}/part_{k}.{ext}"
        for k in range(config["trajectories"]["shards"])
    ]


def trajectory_targets():
    return [
        f"{RUN}/trajectories/{s}.{ext}"
        for s in TRAJECTORY_SPLITS
        for ext in ("parquet", "summary.json")
    ]


# ----------------------------------------------------------------------------- merge / release
# Sections whose knobs shaped the released model (recorded in MANIFEST.json); eval/report/slurm/check are
# not among them, so an eval knob never reruns the release.
RELEASE_KNOB_SECTIONS = (
    "cohort",
    "split",
    "models",
    "roles",
    "prompts",
    "trajectories",
    "judge",
    "reward",
    "preflight",
    "train",
    "merge",
)
NOT_A_KNOB = ("resources", "threads")


def memory_model_input():
    """The base memory model (roles.memory.model) as an input of rules; its .ready marker (a configured name)
    or its folder (a path); the CLI takes either (llmrnn.models.model_folder). It is the policy GRPO
    trains, the base the adapter is merged into and eval's `base` variant."""
    ref = config["roles"]["memory"]["model"]
    return model_ready(ref) if is_model_name(ref) else ref


def merge_cfg_json():
    """params of merge_model: the merge knobs (not resources) + the LoRA rank/alpha training asked for
    (the adapter is checked against them; an alpha of 0 is repaired from them)."""
    merge = {k: v for k, v in config["merge"].items() if k not in NOT_A_KNOB}
    # the values training really uses: its section with the train stage's own defaults filled in
    from llmrnn.train.config import normalize

    lora = normalize(config.get("train"))["lora"]
    wanted = {k: lora.get(k) for k in ("rank", "alpha")}
    return json.dumps({"merge": merge, "train": {"lora": wanted}}, sort_keys=True)


def release_cfg_json():
    """params of release: its own section + every model-shaping knob (for the manifest and card)."""
    knobs = {
        s: (
            {k: v for k, v in config[s].items() if k not in NOT_A_KNOB}
            if isinstance(config[s], dict)
            else config[s]
        )
        for s in RELEASE_KNOB_SECTIONS
        if s in config
    }
    if recipe_is(
        "qa"
    ):  # only then: the memory head's manifest (and params) stay as they were
        knobs["recipe"] = config["recipe"]
        knobs["qa"] = {k: v for k, v in config["qa"].items() if k != "eval"}
        knobs["qa"]["sft"] = {
            k: v for k, v in config["qa"]["sft"].items() if k not in NOT_A_KNOB
        }
    return json.dumps(
        {"run_name": config["run_name"], "release": config["release"], "knobs": knobs},
        sort_keys=True,
    )


def release_targets():
    return [
        f"{RUN}/release/README.md",
        f"{RUN}/release/MANIFEST.json",
        f"{RUN}/release/upload_receipt.json",
    ]


def check_configfiles():
    """The config files of this run in layering order (the Snakefile's, then --configfile
    ones), for `llmrnn check` (rule check).
    A list, so `{params.configfiles:q}` quotes each one."""
    cli = [str(f) for f in workflow.overwrite_configfiles or []]
    own = [str(f) for f in workflow.configfiles if str(f) not in cli]
    return own + cli


def workflow_container():
    """Image all jobs run in under `--sdm apptainer`: $LLMRNN_CONTAINER (e.g. an image built
    from profiles/slurm/llmrnn-verl.def over the reference verl image); None: on the host.
    """
    return os.environ.get("LLMRNN_CONTAINER") or None


# ----------------------------------------------------------------------------- recipes / qa
# recipe: memory_head (the LLM-as-RNN DAG above) | qa (rules/qa.smk). Both share cohort, models, judge,
# merge (merge_model, whose base is the recipe's policy) and release.
QA = f"{RUN}/qa"
QA_EVAL = f"{RUN}/eval"
QA_VARIANT_PATTERN = "base|sft|grpo"
QA_SYNTH = "resources/qa"


def recipe_is(name):
    return config["recipe"] == name


def model_dir_of(path):
    """The HF folder of a model input (its .ready marker or the folder itself), for a value in params."""
    return os.path.dirname(path) if os.path.basename(path) == ".ready" else path


def qa_model_input():
    """The qa base model as an input: its .ready marker (a configured name) or its folder."""
    ref = config["qa"]["model"]
    return model_ready(ref) if is_model_name(ref) else ref


def qa_sft_enabled():
    return config["qa"]["sft"]["enabled"]


def grpo_rule():
    """The GRPO job of this recipe (train_grpo or qa_train_grpo): merge_model and release read its
    outputs through it. Called from rule bodies, after every rule file is included."""
    return rules.qa_train_grpo if recipe_is("qa") else rules.train_grpo


def release_reference(wildcards):
    """Inputs of release that say what must not leak from the bundle (its PHI guard's reference): the
    cohort's splits (memory_head), or the QA data stage's records (recipe qa: its questions, contexts and
    answers came from the user's data, for ECG QA from patients), with the splits.json the manifest records.
    """
    if recipe_is("qa"):
        out = rules.qa_data.output
        return {
            "splits": out.summary,
            "split_files": [out.train, out.val, out.test, out.ood],
        }
    out = rules.split_cohort.output
    return {"splits": out.summary, "split_files": [out.train, out.val, out.test]}


def release_rubric_input(wildcards):
    """The rubric the card and manifest describe: none for a memory head whose reward asks no judge
    (reward.mode outcome), so they do not name a judge that scored nothing."""
    if recipe_is("qa") or judge_needed():
        return {"rubric": config["judge"]["rubric"]}
    return {}


def release_split_format():
    """--split-format of `llmrnn release build`: [] (cohort, the CLI's default) or qa; a list for :q."""
    return ["--split-format", "qa"] if recipe_is("qa") else []


def merge_base_input():
    """The base merge_model folds the GRPO adapter into: the memory model, or (recipe qa) the model GRPO
    started from."""
    return qa_policy_input() if recipe_is("qa") else memory_model_input()


def qa_policy_input():
    """The model GRPO starts from: the merged SFT model when the warm start is on, else the base."""
    return f"{QA}/sft/merged" if qa_sft_enabled() else qa_model_input()


def qa_source_path(wildcards):
    source = config["qa"]["source"]
    if source == "synthetic":
        return f"{QA_SYNTH}/synthetic.jsonl"
    if source.startswith("hf:"):
        return (
            []
        )  # a datasets name/path: resolved by the CLI, not a file Snakemake tracks
    if not Path(source).exists():
        raise WorkflowError(
            f"qa.source: {source} does not exist (a JSON/JSONL QA file, hf:<dataset>, or synthetic)"
        )
    return source


def qa_ood_path(wildcards):
    ood = config["qa"]["ood"]
    if ood == "synthetic":
        return f"{QA_SYNTH}/synthetic_ood.jsonl"
    return [] if not ood or ood.startswith("hf:") else ood


def qa_source_param(wildcards, input):
    """--source of `llmrnn qa data`: the tracked file, or the hf: name as configured."""
    return getattr(input, "source", None) or config["qa"]["source"]


def qa_ood_param(wildcards, input):
    """--ood of `llmrnn qa data`: the tracked file, an hf: name, or "" (no OOD set)."""
    return getattr(input, "ood", None) or config["qa"]["ood"] or ""


def qa_data_cfg():
    return json.dumps(
        {
            k: config["qa"][k]
            for k in ("fields", "dataset", "filter", "split", "prompt")
        },
        sort_keys=True,
    )


def qa_sft_cfg():
    return json.dumps({"sft": config["qa"]["sft"]}, sort_keys=True)


def qa_sft_merge_cfg():
    """params of qa_merge_sft: the merge knobs + the SFT LoRA rank/alpha the adapter is checked against."""
    merge = {k: v for k, v in config["merge"].items() if k not in NOT_A_KNOB}
    lora = config["qa"]["sft"]["lora"]
    return json.dumps(
        {"merge": merge, "train": {"lora": {k: lora[k] for k in ("rank", "alpha")}}},
        sort_keys=True,
    )


def qa_train_cfg():
    """params of qa_train_grpo: the shared train section + the qa reward (the fluency reward scores
    under the qa base model; the judge reward reads qa.reward.rubric or judge.rubric).
    """
    reward = dict(config["qa"]["reward"])
    reward["fluency_model"] = model_dir_of(qa_model_input())
    reward["rubric"] = reward.get("rubric") or config["judge"]["rubric"]
    return json.dumps({"train": config["train"], "reward": reward}, sort_keys=True)


def qa_variants():
    return ["base", *(["sft"] if qa_sft_enabled() else []), "grpo"]


def qa_eval_splits():
    return ["test", *(["ood"] if config["qa"]["ood"] else [])]


def qa_eval_model(wildcards):
    """Inputs of qa_eval_model: the variant's model (and the merge check it must have passed)."""
    if wildcards.variant == "base":
        return {"model": qa_model_input()}
    if wildcards.variant == "sft":
        return {"model": f"{QA}/sft/merged", "check": f"{QA}/sft/merge_check.json"}
    return {"model": f"{RUN}/merged", "check": f"{RUN}/merge_check.json"}


def qa_eval_files():
    return [
        f"{QA_EVAL}/{variant}/{split}.jsonl"
        for variant in qa_variants()
        for split in qa_eval_splits()
    ]


def qa_eval_cfg():
    return json.dumps(
        {"eval": {k: v for k, v in config["qa"]["eval"].items() if k != "resources"}},
        sort_keys=True,
    )


def qa_eval_targets():
    return [
        f"{QA_EVAL}/metrics.json",
        f"{QA_EVAL}/comparison.json",
        f"{QA_EVAL}/plots/pass_at_k.png",
        f"{QA_EVAL}/plots/summary.tsv",
        f"{QA_EVAL}/plots/questions.tsv",
    ]


def qa_targets():
    return [f"{QA}/splits.json", *release_targets(), *qa_eval_targets()]
