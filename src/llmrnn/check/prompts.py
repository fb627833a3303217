"""The longest prompt each role can render fits its context window (llmrnn.promptfit)."""

from __future__ import annotations

import logging
from pathlib import Path

from llmrnn import promptfit
from llmrnn.check.skips import skip
from llmrnn.cohort import load_cohort
from llmrnn.errors import LlmrnnError
from llmrnn.prompts import load_prompts
from llmrnn.runconfig import filled
from llmrnn.settings.workflow import ADMISSION_TIME, MODES

log = logging.getLogger(__name__)


def check_prompt_lengths(config: dict) -> list[str]:
    """The longest prompt each role can render fits its max_model_len (and the policy's prompt
    train.max_prompt_length), counted with the role model's tokenizer (llmrnn.promptfit)."""
    if config.get("recipe") == "qa":
        return []

    source = filled("cohort", config.get("cohort"))["source"]
    try:
        patients = load_cohort(source) if source != "synthetic" and Path(source).is_file() else None
    except LlmrnnError:  # check_cohort names the bad record without its ids; the visits are estimated here
        patients = None

    problems, notes = promptfit.check(config, patients)
    roles = [r for r in promptfit.ROLE_PROMPT if ((config.get("roles") or {}).get(r) or {}).get("model")]
    for note in notes:
        log.warning("check: %s", note)
    if notes and len(notes) >= len(roles):  # no role's prompt was counted: nothing of it was checked
        skip("all: no role's model folder is here yet (rerun `llmrnn check` after `snakemake --until prepare_base_model prepare_judge_model`)")
    else:
        for note in notes:
            skip(note.replace(": not checked, its model folder", ": its model folder").split(" (rerun")[0])
    return problems


def check_shown_sections(config: dict) -> list[str]:
    """A cohort built from notes shows its sections only where the prompts file lists them: reference
    mode exists to show the hospital course, procedures and every result (the reference's leak), and a
    `sections` list is a choice; either silently dropped by `visit_sections` would measure nothing."""
    if config.get("recipe") == "qa":
        return []
    cohort = filled("cohort", config.get("cohort"))
    if cohort["source"] != "mimic_iv":
        return []
    mimic = cohort["mimic_iv"]
    if mimic.get("sections") is not None:
        why, wanted = "cohort.mimic_iv.sections lists", list(mimic["sections"])
    elif mimic.get("mode") == "reference":
        why = "cohort.mimic_iv.mode reference shows"
        wanted = [s for s in MODES["reference"] if s not in ADMISSION_TIME] + ["pertinent_results"]
    else:
        return []
    file = filled("prompts", config.get("prompts"))["file"]
    try:
        listed = load_prompts(file).visit_sections
    except LlmrnnError:
        return []  # the prompt-length check names the bad file
    if missing := [s for s in wanted if s not in listed]:
        return [(f"prompts.file: {file}: visit_sections lacks {', '.join(missing)}, which {why}: the prompts would "
                f"not show {'it' if len(missing) == 1 else 'them'}; add {'it' if len(missing) == 1 else 'them'} "
                "to visit_sections")]
    return []
