"""`llmrnn check` refuses a plan whose longest prompt per role exceeds the role's context window, counted with
the role model's own tokenizer and chat template (llmrnn.promptfit); a role whose model is not here yet is
skipped with a note."""

from __future__ import annotations

from llmrnn import check, cohort, promptfit

PROMPTS = "config/prompts/llmrnn.yaml"


def config(model: str, max_model_len: int, max_prompt_length: int = 100_000) -> dict:
    role = {"model": model, "backend": "vllm", "max_tokens": 256, "max_model_len": max_model_len}
    return {"roles": {r: dict(role) for r in ("prediction", "evaluation", "memory")}, "prompts": {"file": PROMPTS},
            "cohort": {"source": "synthetic"}, "train": {"max_prompt_length": max_prompt_length}}


def test_check_names_role_prompt_tokens_limit_and_knob(tiny_model_dir):
    patients = cohort.synthesize_cohort(4, 1)
    problems, notes = promptfit.check(config(str(tiny_model_dir), 600), patients)
    assert notes == []
    assert {p.split(":", 1)[0] for p in problems} == {"roles.prediction", "roles.evaluation", "roles.memory"}
    pred = next(p for p in problems if p.startswith("roles.prediction"))
    assert "the longest prediction prompt (the cohort's longest visits) is " in pred
    assert "over 344 (roles.prediction.max_model_len 600 - max_tokens 256): raise roles.prediction.max_model_len" in pred
    # the reference's window holds them all; the policy prompt alone can still exceed train.max_prompt_length
    problems, _ = promptfit.check(config(str(tiny_model_dir), 8192, max_prompt_length=300), patients)
    (only,) = problems
    assert only.startswith("roles.memory: the longest memory update prompt") and "train.max_prompt_length 300" in only


def test_check_without_the_model_folder_skips_and_says_why(tmp_path, caplog):
    problems, notes = promptfit.check(config(str(tmp_path / "absent"), 600))
    assert problems == [] and len(notes) == 3
    assert notes[0].startswith("prompt length of roles.prediction: not checked, its model folder")
    # llmrnn check runs it: a too small window is one line in its report
    assert "prompt length" in dict(check.CHECKS)  and check.check_prompt_lengths(config(str(tmp_path / "x"), 600)) == []


def test_estimated_visit_when_no_cohort_file_is_here(tiny_model_dir):
    problems, _ = promptfit.check(config(str(tiny_model_dir), 700))
    assert any("every section at max_section_chars" in p and "(estimated: no cohort file here)" in p for p in problems)
