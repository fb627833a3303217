"""Whether the longest prompt each role can render fits its context window (`llmrnn check`).

vLLM validates a whole `LLM.chat` batch before running any of it: one prompt longer than the role's
`max_model_len` minus its `max_tokens` fails the shard, then every rule after it. This check renders, per
role, the longest prompt the configured prompts file can produce (prompts.PromptSet):

- the visit x_t: the cohort's longest rendered visit (when the cohort file is here), else every configured
  section at `max_section_chars` (an estimate, said so);
- the memory h_{t-1}: `roles.memory.max_tokens` tokens (an update is at most that long); full_history (and memprompt) is
  capped at run time to what fits (rnn.fit_history), so it needs room for the visit alone;
- the prediction shown to the evaluator (`roles.prediction.max_tokens`), the evaluation shown to the memory
  update (`roles.evaluation.max_tokens`),

and counts its tokens with the role model's own tokenizer and chat template (the one `LLM.chat` uses), when
the model folder is here; otherwise the role is skipped and the report says why. The memory update prompt
is also the policy's training prompt: it must fit `train.max_prompt_length` (verl's data.max_prompt_length).
"""

from __future__ import annotations

from llmrnn.models import resolve_model
from llmrnn.prompts import TARGET_SECTION, PromptSet, chat_tokens, load_prompts

# a clinical-looking filler for an estimated visit (no cohort file yet): ~4.5 characters per token
FILLER = "patient admitted with worsening shortness of breath, chest pain and fever; treated with antibiotics. "
__all__ = ["chat_tokens", "check", "longest_visits", "role_prompts"]
ROLE_PROMPT = {"prediction": "prediction", "evaluation": "evaluation", "memory": "memory update"}


def _tokens_text(tok, n: int) -> str:
    """Text of about n tokens for this tokenizer (a placeholder filled to its configured maximum)."""
    ids = tok(FILLER, add_special_tokens=False)["input_ids"]
    reps = -(-n // max(1, len(ids)))
    return tok.decode((ids * reps)[:n], skip_special_tokens=True)


def longest_visits(prompts: PromptSet, patients: list[dict] | None, keep: int = 3) -> tuple[list[str], str]:
    """The longest rendered visits of the cohort (by characters), or the estimated worst case."""
    if patients:
        texts = sorted((prompts.render_visit(v) for p in patients for v in p.get("visits") or []), key=len)
        return texts[-keep:], "the cohort's longest visits"
    sections = {s: (FILLER * (prompts.max_section_chars // len(FILLER) + 2))[: prompts.max_section_chars + 10]
                for s in prompts.visit_sections if s != TARGET_SECTION}
    return [prompts.render_visit({"sex": "F", "clinical_sections": sections})], (
        f"every section at max_section_chars {prompts.max_section_chars} (estimated: no cohort file here)")


def role_prompts(prompts: PromptSet, tok_of: dict, roles: dict, visits: list[str]) -> dict:
    """role -> the longest conversations it can be sent (one per candidate visit)."""
    def n(role: str) -> int:
        return int((roles.get(role) or {}).get("max_tokens") or 0)

    out: dict[str, list] = {}
    if "prediction" in tok_of:
        tok = tok_of["prediction"]
        # h at its longest; full_history and memprompt (eval baselines) are capped to fit at run time (rnn.fit_history)
        memory = _tokens_text(tok, n("memory"))
        out["prediction"] = [prompts.prediction.messages({"memory": memory, "visit": v, "visit_number": 99})
                             for v in visits]
    if "evaluation" in tok_of:
        tok = tok_of["evaluation"]
        out["evaluation"] = [prompts.evaluation.messages({
            "prediction": _tokens_text(tok, n("prediction")), "ground_truth": _tokens_text(tok, 200),
            "visit_number": 99})]
    if "memory" in tok_of:
        tok = tok_of["memory"]
        out["memory"] = [prompts.memory_update.policy_messages({
            "memory": _tokens_text(tok, n("memory")), "visit": v, "prediction": _tokens_text(tok, n("prediction")),
            "evaluation": _tokens_text(tok, n("evaluation")), "missed_diagnoses": _tokens_text(tok, 60),
            "visit_number": 99}) for v in visits]
    return out


def check(config: dict, patients: list[dict] | None = None) -> tuple[list[str], list[str]]:
    """(problems, notes): one line per role whose longest prompt exceeds its limit; notes for skipped roles."""
    from transformers import AutoTokenizer


    roles = config.get("roles") or {}
    prompts = load_prompts((config.get("prompts") or {}).get("file") or "config/prompts/llmrnn.yaml")
    problems, notes, tok_of = [], [], {}
    for role in ROLE_PROMPT:
        rcfg = roles.get(role) or {}
        if not rcfg.get("model"):
            continue
        path = resolve_model(str(rcfg["model"]))
        if not (path / "tokenizer_config.json").is_file():
            notes.append(f"prompt length of roles.{role}: not checked, its model folder {path} is not here yet "
                         "(rerun `llmrnn check` once the models are prepared: "
                         "`snakemake --until prepare_base_model prepare_judge_model` "
                         "(with the run's --configfile/--profile); or trust the run-time cap)")
            continue
        tok_of[role] = AutoTokenizer.from_pretrained(str(path))
    visits, where = longest_visits(prompts, patients)
    for role, convs in role_prompts(prompts, tok_of, roles, visits).items():
        rcfg = roles[role]
        longest = max(chat_tokens(tok_of[role], c) for c in convs)
        limits = []
        if rcfg.get("max_model_len"):
            limits.append((int(rcfg["max_model_len"]) - int(rcfg.get("max_tokens") or 0),
                           f"roles.{role}.max_model_len {rcfg['max_model_len']} - max_tokens {rcfg.get('max_tokens')}",
                           (f"raise roles.{role}.max_model_len, or lower prompts max_section_chars / the "
                            "max_tokens of the roles whose output it shows")))
        train = config.get("train") or {}
        if role == "memory" and train.get("max_prompt_length"):
            limits.append((int(train["max_prompt_length"]), f"train.max_prompt_length {train['max_prompt_length']}",
                           ("raise train.max_prompt_length (verl data.max_prompt_length), or lower "
                            "max_section_chars / roles.memory.max_tokens")))
        for limit, what, knob in limits:
            if longest > limit:
                problems.append(f"roles.{role}: the longest {ROLE_PROMPT[role]} prompt ({where}) is {longest} tokens, "
                                f"over {limit} ({what}): {knob}")
    return problems, notes
