"""The LLM-as-RNN forward pass: batching across patients, fallbacks, memory modes, ground truth parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmrnn import rnn
from llmrnn.backends import make_backend
from llmrnn.cohort import synthesize_cohort
from llmrnn.errors import InputError
from llmrnn.prompts import load_prompts
from llmrnn.rnn import Role, parse_diagnoses, run_forward

REPO = Path(__file__).resolve().parents[1]
PROMPTS = REPO / "config" / "prompts" / "llmrnn.yaml"


class CountingBackend:
    """Wraps a REAL backend and records every generate() call (role, number of prompts)."""

    def __init__(self, inner, log: list, role: str):
        self.inner, self.log, self.role = inner, log, role

    def generate(self, conversations, temperature, top_p, max_tokens, seeds=None):
        self.log.append((self.role, len(conversations)))
        return self.inner.generate(conversations, temperature, top_p, max_tokens, seeds=seeds)


class ScriptedBackend:
    """Returns fixed texts per role (only for testing the parse fallbacks; no model involved)."""

    def __init__(self, text: str):
        self.text, self.calls = text, 0

    def generate(self, conversations, temperature, top_p, max_tokens, seeds=None):
        self.calls += 1
        return [self.text] * len(conversations)


@pytest.fixture(scope="module")
def prompts():
    return load_prompts(PROMPTS)


@pytest.fixture(scope="module")
def tiny_backend(tiny_model_dir):
    return make_backend({"backend": "transformers", "batch_size": 64}, tiny_model_dir, cache=False)


def counting_roles(backend, log, max_tokens=6):
    return {
        name: Role(name, CountingBackend(backend, log, name), temperature=0.7, top_p=0.95, max_tokens=max_tokens)
        for name in rnn.ROLES
    }


@pytest.mark.parametrize("n_patients", [1, 5, 17])
def test_backend_called_once_per_role_per_visit_step(prompts, tiny_backend, n_patients):
    patients = synthesize_cohort(n_patients, seed=3)
    max_visits = max(len(p["visits"]) for p in patients)
    calls: list[tuple[str, int]] = []
    stats: dict = {}
    results = run_forward(patients, counting_roles(tiny_backend, calls), prompts, stats=stats)

    # at most one call per role per visit step, whatever the number of patients
    assert len(calls) <= 3 * max_visits
    assert all(max(step.values()) <= 1 for step in stats["calls_per_step"])
    assert len(stats["calls_per_step"]) == max_visits
    for role in rnn.ROLES:
        assert sum(1 for r, _ in calls if r == role) <= max_visits
    # every step's prediction call carries every patient that has that visit
    pred_sizes = [n for r, n in calls if r == "prediction"]
    assert pred_sizes == [sum(1 for p in patients if len(p["visits"]) > t) for t in range(max_visits)]
    assert sum(pred_sizes) == sum(len(p["visits"]) for p in patients)
    # one record per visit, memory updated at every visit but the last
    for p, res in zip(patients, results):
        assert [v["visit_index"] for v in res["visits"]] == list(range(len(p["visits"])))
        assert all(v["memory_ok"] is not None for v in res["visits"][:-1])
        assert res["visits"][-1]["memory_ok"] is None


def test_unparsable_outputs_fall_back_and_are_counted(prompts):
    patients = synthesize_cohort(3, seed=1)
    roles = {name: Role(name, ScriptedBackend("I am not JSON")) for name in rnn.ROLES}
    stats: dict = {}
    results = run_forward(patients, roles, prompts, stats=stats)
    visits = sum(len(p["visits"]) for p in patients)
    assert stats["unparsable"]["prediction"] == visits
    assert stats["unparsable"]["evaluation"] == visits
    assert stats["unparsable"]["memory"] == visits - len(patients)
    initial = json.dumps({"evolving_summary": prompts.initial_memory})
    for res in results:
        for v in res["visits"]:
            assert v["prediction"] is None and v["prediction_ok"] is False
            assert v["evaluation_source"] == "fallback_match"
            assert v["evaluation"]["missed_diagnoses"] == v["ground_truth"]  # nothing predicted: all missed
            assert v["h_prev"] == initial
        for v in res["visits"][:-1]:
            assert v["memory_fallback"] == "kept_h_prev" and v["h_new"] == v["h_prev"]


def test_parsed_memory_flows_into_the_next_step(prompts):
    patients = synthesize_cohort(2, seed=5)
    roles = {
        "prediction": Role("prediction", ScriptedBackend('{"top_5_diagnoses": ["anemia"], "primary_diagnosis": "anemia"}')),
        "evaluation": Role("evaluation", ScriptedBackend('{"primary_correct": false, "any_top5_correct": false}')),
        "memory": Role("memory", ScriptedBackend('```json\n{"evolving_summary": "MEMO-42"}\n```')),
    }
    results = run_forward(patients, roles, prompts)
    for res in results:
        v0, v1 = res["visits"][0], res["visits"][1]
        assert v0["memory_ok"] and v0["memory_parse"] == "fenced"
        assert json.loads(v0["h_new"]) == {"evolving_summary": "MEMO-42"}
        assert v1["h_prev"] == v0["h_new"]
        if "update_prompt" in v1:
            assert "MEMO-42" in v1["update_prompt"]
        assert v0["evaluation_source"] == "model"


def test_memory_modes(prompts):
    patients = synthesize_cohort(2, seed=5)
    for mode in ("none", "full_history", "memprompt"):
        backend = ScriptedBackend('{"evolving_summary": "SHOULD NOT BE CALLED"}')
        roles = {name: Role(name, backend if name == "memory" else ScriptedBackend("{}")) for name in rnn.ROLES}
        results = run_forward(patients, roles, prompts, memory=mode)
        assert backend.calls == 0
        assert all(v["memory_ok"] is None for r in results for v in r["visits"])
    with pytest.raises(InputError):
        run_forward(patients, roles, prompts, memory="bogus")


def test_full_history_shows_earlier_visits(prompts):
    seen: list[str] = []

    class Spy(ScriptedBackend):
        def generate(self, conversations, temperature, top_p, max_tokens, seeds=None):
            seen.extend(next(m["content"] for m in c if m["role"] == "user") for c in conversations)
            return super().generate(conversations, temperature, top_p, max_tokens, seeds)

    patients = synthesize_cohort(1, seed=11)
    roles = {name: Role(name, Spy("{}") if name == "prediction" else ScriptedBackend("{}")) for name in rnn.ROLES}
    run_forward(patients, roles, prompts, memory="full_history")
    first_dx = parse_diagnoses(patients[0]["visits"][0]["clinical_sections"]["discharge_diagnosis"])[0]
    assert first_dx not in seen[0].split("Current admission")[0]
    assert first_dx in seen[1].split("Current admission")[0]


def test_sampling_does_not_depend_on_batch_composition(prompts, tiny_backend):
    """A patient's outputs are the same alone or batched with others (per-row seeded sampling)."""
    patients = synthesize_cohort(6, seed=2)
    alone = run_forward(patients[:1], counting_roles(tiny_backend, [], max_tokens=8), prompts, seed=9)
    batched = run_forward(patients, counting_roles(tiny_backend, [], max_tokens=8), prompts, seed=9)
    for key in ("prediction_raw", "evaluation_raw", "memory_raw"):
        assert [v.get(key) for v in alone[0]["visits"]] == [v.get(key) for v in batched[0]["visits"]]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1. sepsis\n2. acute kidney injury\n3. sepsis", ["sepsis", "acute kidney injury"]),
        ("Primary:\n- pneumonia\nSecondary:\n- COPD\n- atrial fibrillation", ["pneumonia", "COPD", "atrial fibrillation"]),
        ("pneumonia, copd exacerbation, hypertension", ["pneumonia", "copd exacerbation", "hypertension"]),
        ("Primary diagnosis: NSTEMI; CKD stage 3", ["NSTEMI", "CKD stage 3"]),
        ("  ", []),
        (None, []),
        ("1) hip fracture", ["hip fracture"]),
    ],
)
def test_parse_diagnoses(text, expected):
    assert parse_diagnoses(text) == expected


def test_fallback_evaluation_matches_normalised_text():
    ev = rnn.fallback_evaluation(
        {"top_5_diagnoses": ["Acute Kidney Injury", "x"], "primary_diagnosis": "Sepsis."}, ["sepsis", "acute kidney injury", "copd"]
    )
    assert ev["primary_correct"] and ev["any_top5_correct"]
    assert ev["missed_diagnoses"] == ["copd"]


def test_shipped_templates_put_fixed_text_before_patient_data(prompts, tiny_backend):
    """The batched engine prefills the prompt prefix a pass shares once: prediction and memory-update
    prompts of different patients must share their instructions, not diverge at the first placeholder."""
    import os

    patients = synthesize_cohort(3, seed=4)
    records = run_forward(patients, counting_roles(tiny_backend, [], max_tokens=4), prompts, seed=1)
    update_prompts = [r["visits"][0]["update_prompt"] for r in records]
    assert len(set(update_prompts)) == 3
    assert len(os.path.commonprefix(update_prompts)) > 400  # the rewrite instructions and the JSON form
    predictions = [
        tiny_backend.render([prompts.prediction.messages({"memory": "m", "visit": prompts.render_visit(p["visits"][0]),
                                                          "visit_number": 1})])[0]
        for p in patients
    ]
    assert len(os.path.commonprefix(predictions)) > 200 + len(prompts.prediction.system)


EXAMPLE_PROMPTS = """
version: 1
initial_memory: none
visit_sections: [chief_complaint]
prediction: {system: "Answer with JSON only.", user: "Visit: {{visit}}"}
evaluation: {user: "Predicted {{prediction}}; truth {{ground_truth}}"}
memory_update:
  system: Keep a list of conditions.
  examples:
    - user: "Old list: asthma"
      assistant: '{"evolving_summary": "asthma"}'
  user: "Old list: {{memory}} | {{visit}}"
"""


def test_example_turns_come_before_the_question_and_reach_the_memory_model(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(EXAMPLE_PROMPTS)
    prompts = load_prompts(path)
    sent = []

    class Recording(ScriptedBackend):
        def generate(self, conversations, temperature, top_p, max_tokens, seeds=None):
            sent.extend(conversations)
            return super().generate(conversations, temperature, top_p, max_tokens, seeds)

    roles = {
        "prediction": Role("prediction", ScriptedBackend('{"top_5_diagnoses": ["x"], "primary_diagnosis": "x"}')),
        "evaluation": Role("evaluation", ScriptedBackend('{"primary_correct": false, "any_top5_correct": false}')),
        "memory": Role("memory", Recording('{"evolving_summary": "copd"}')),
    }
    results = run_forward(synthesize_cohort(1, seed=5), roles, prompts)
    rec = results[0]["visits"][0]
    # the system text joins the FIRST user turn (the policy prompt has no system message), the example
    # answer is an assistant turn, the real question is the last user turn
    assert [m["role"] for m in rec["update_messages"]] == ["user", "assistant", "user"]
    assert rec["update_messages"][0]["content"] == "Keep a list of conditions.\n\nOld list: asthma"
    assert rec["update_messages"][1]["content"] == '{"evolving_summary": "asthma"}'
    assert rec["update_prompt"] == rec["update_messages"][-1]["content"]
    assert rec["update_prompt"].startswith("Old list: none | ")
    assert sent[0] == rec["update_messages"]
    # the other roles keep their system message; examples of one role do not leak into another
    assert [m["role"] for m in prompts.prediction.messages({"visit": "v"})] == ["system", "user"]


def test_without_examples_the_policy_prompt_is_one_user_turn(prompts):
    msgs = prompts.memory_update.policy_messages(
        {"memory": "m", "visit": "v", "prediction": "p", "evaluation": "e", "missed_diagnoses": "none",
         "visit_number": 1})
    assert len(msgs) == 1 and msgs[0]["role"] == "user"
    system = prompts.memory_update.system
    assert msgs[0]["content"].startswith(system.strip() if system else prompts.memory_update.user.strip()[:40])


@pytest.mark.parametrize("examples, problem", [
    ('[{user: "Old list: {{memory}}", assistant: "{}"}]', r"memory_update.examples\[0\]: placeholders are not filled"),
    ('[{user: "Old list: asthma"}]', r"memory_update.examples\[0\]: expected exactly a non-empty user and assistant"),
    ('[{user: "a", assistant: "b", system: "c"}]', r"memory_update.examples\[0\]: expected exactly"),
    ('{user: "a", assistant: "b"}', r"memory_update.examples: expected a list"),
    ('[{user: "a", assistant: "  "}]', r"memory_update.examples\[0\]"),
])
def test_bad_examples_are_one_line_naming_file_and_key(tmp_path, examples, problem):
    path = tmp_path / "bad.yaml"
    path.write_text(EXAMPLE_PROMPTS.replace(
        """  examples:
    - user: "Old list: asthma"
      assistant: '{"evolving_summary": "asthma"}'
""", f"  examples: {examples}\n"))
    with pytest.raises(InputError, match=problem) as err:
        load_prompts(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_memprompt_shows_the_models_own_recent_errors_with_their_corrections(prompts):
    """MemPrompt: after each visit whose prediction missed diagnoses, 'predicted X; the visit's diagnoses were
    Y' is stored; the prediction model sees the most recent few, never the current visit's, and no memory
    model is called."""
    seen: list[str] = []

    class Spy(ScriptedBackend):
        def generate(self, conversations, temperature, top_p, max_tokens, seeds=None):
            seen.extend(next(m["content"] for m in c if m["role"] == "user") for c in conversations)
            return super().generate(conversations, temperature, top_p, max_tokens, seeds)

    patients = [p for p in synthesize_cohort(8, seed=3) if len(p["visits"]) >= 5][:1]
    assert patients
    memory = ScriptedBackend('{"evolving_summary": "SHOULD NOT BE CALLED"}')
    wrong = '{"top_5_diagnoses": ["hip fracture", "gout"], "primary_diagnosis": "hip fracture"}'
    roles = {"prediction": Role("prediction", Spy(wrong)), "evaluation": Role("evaluation", ScriptedBackend("{}")),
             "memory": Role("memory", memory)}
    visits = run_forward(patients, roles, prompts, memory="memprompt")[0]["visits"]
    truths = [parse_diagnoses(v["clinical_sections"]["discharge_diagnosis"]) for v in patients[0]["visits"]]
    assert memory.calls == 0 and all(v["memory_ok"] is None for v in visits)
    assert visits[0]["memory_shown"] == prompts.initial_memory  # no errors yet
    first = f"Visit 1: predicted hip fracture (top 5: hip fracture; gout); the visit's diagnoses were {'; '.join(truths[0])}"
    assert visits[1]["memory_shown"] == first
    assert visits[1]["memory_shown"] in seen[1]  # what the prediction model was shown
    # visit 5 shows the errors of visits 2, 3 and 4 (the most recent three), not visit 1's nor its own
    shown = visits[4]["memory_shown"]
    assert [line.split(":")[0] for line in shown.split("\n\n")] == ["Visit 2", "Visit 3", "Visit 4"]
    assert "Visit 1:" not in shown and "Visit 5:" not in shown
    assert all(v["history_omitted"] == 0 for v in visits)


def test_memprompt_stores_only_the_visits_whose_prediction_missed_diagnoses():
    truth = ["congestive heart failure", "type 2 diabetes mellitus"]
    assert rnn.error_correction(0, {"primary_diagnosis": "CHF", "top_5_diagnoses": ["CHF", "T2DM"]}, truth) is None
    partial = rnn.error_correction(2, {"primary_diagnosis": "CHF", "top_5_diagnoses": ["CHF"]}, truth)
    assert partial == ("Visit 3: predicted CHF (top 5: CHF); the visit's diagnoses were congestive heart failure; "
                       "type 2 diabetes mellitus")
    assert rnn.error_correction(1, None, truth) == (
        "Visit 2: predicted nothing; the visit's diagnoses were congestive heart failure; type 2 diabetes mellitus")
    assert rnn.error_correction(1, None, []) is None  # no diagnoses: nothing to correct


def test_memprompt_with_the_tiny_model_keeps_within_the_prediction_context(prompts, tiny_backend):
    """The real tiny model predicts (mostly wrong); the errors it makes are the ones shown later, and with a
    context window the earliest shown errors are left out until the prompt fits."""
    calls: list[tuple[str, int]] = []
    patients = synthesize_cohort(4, seed=3)
    roles = counting_roles(tiny_backend, calls, max_tokens=8)
    results = run_forward(patients, roles, prompts, memory="memprompt")
    assert not [r for r, _ in calls if r == "memory"]
    for p, res in zip(patients, results):
        errors = [rnn.error_correction(t, v["prediction"], v["ground_truth"]) for t, v in enumerate(res["visits"])]
        for t, v in enumerate(res["visits"]):
            expected = [e for e in errors[:t] if e][-rnn.MEMPROMPT_ERRORS_SHOWN:]
            assert v["memory_shown"] == ("\n\n".join(expected) or prompts.initial_memory)
    assert any(v["memory_shown"].startswith("Visit ") for res in results for v in res["visits"])

    class Measured:
        prompt_lengths = staticmethod(tiny_backend.prompt_lengths)

        def generate(self, conversations, temperature, top_p, max_tokens, seeds=None):
            assert max(tiny_backend.prompt_lengths(conversations)) + 8 <= context
            return tiny_backend.generate(conversations, temperature, top_p, max_tokens, seeds=seeds)

    longest = max(tiny_backend.prompt_lengths([prompts.prediction.messages(
        {"memory": v["memory_shown"], "visit": prompts.render_visit(p["visits"][t]), "visit_number": t + 1})
        for p, res in zip(patients, results) for t, v in enumerate(res["visits"])]))
    context = longest + 8 - 40  # the longest prompt no longer fits
    capped_roles = dict(roles, prediction=Role("prediction", Measured(), temperature=0.7, top_p=0.95, max_tokens=8,
                                                context=context))
    capped = run_forward(patients, capped_roles, prompts, memory="memprompt")
    omitted = [v for res in capped for v in res["visits"] if v["history_omitted"]]
    assert omitted and all(v["memory_shown"].startswith(f"({v['history_omitted']} earlier error") for v in omitted)


def test_full_history_keeps_the_latest_visits_that_fit_the_prediction_context(prompts, tiny_backend):
    """Every earlier visit appended without a cap passed max_model_len from about the 6th visit of a real
    cohort, and vLLM refuses the whole LLM.chat batch for one long prompt. The baseline keeps the most recent
    visits whose prediction prompt fits (counted with the engine's tokenizer), says how many it left out,
    and records it; a role without a context window keeps them all."""
    prompt_tokens: list[int] = []

    class Measured:
        prompt_lengths = staticmethod(tiny_backend.prompt_lengths)

        def generate(self, conversations, temperature, top_p, max_tokens, seeds=None):
            prompt_tokens.extend(tiny_backend.prompt_lengths(conversations))
            return ["{}"] * len(conversations)

    patients = [p for p in synthesize_cohort(6, seed=3) if len(p["visits"]) >= 4][:1]
    assert patients
    n = len(patients[0]["visits"])
    free = {name: Role(name, ScriptedBackend("{}")) for name in rnn.ROLES}
    full = run_forward(patients, dict(free, prediction=Role("prediction", Measured(), max_tokens=32)), prompts,
                       memory="full_history")[0]["visits"]
    assert [v["history_omitted"] for v in full] == [0] * n  # no context window: nothing left out
    longest = max(prompt_tokens)
    context = longest - 80 + 32  # the longest prompt no longer fits with its 32 new tokens
    prompt_tokens.clear()
    role = Role("prediction", Measured(), max_tokens=32, context=context)
    capped = run_forward(patients, dict(free, prediction=role), prompts, memory="full_history")[0]["visits"]
    assert max(prompt_tokens) + 32 <= context, (max(prompt_tokens), context)
    omitted = [v["history_omitted"] for v in capped]
    assert omitted[-1] > 0 and omitted[0] == 0, omitted
    last = capped[-1]["memory_shown"]
    assert last.startswith(f"({omitted[-1]} earlier visit") and f"Visit {n - 1}:" in last and "Visit 1:" not in last


def test_a_role_without_sampling_keys_gets_the_models_defaults():
    """A library caller naming only the engine gets what a workflow run gets (llmrnn.settings): rnn.py used
    to read max_tokens 256 and temperature 0.7 where the schema says 96 (memory 128; evaluation T 0.3)."""
    from llmrnn.settings import section_defaults

    cfg = {"backend": "openai", "url": "http://127.0.0.1:9/v1", "model": "m"}
    roles = rnn.make_roles({name: dict(cfg) for name in rnn.ROLES}, cache=False)
    got = {name: (r.temperature, r.top_p, r.max_tokens) for name, r in roles.items()}
    assert got == {name: tuple(section_defaults(f"roles.{name}")[k] for k in ("temperature", "top_p", "max_tokens"))
                   for name in rnn.ROLES}
    assert got["memory"][2] == 128 and got["prediction"][2] == 96 and got["evaluation"][0] == 0.3


def test_replayed_calls_give_the_outputs_the_calls_give(prompts, tiny_backend):
    """The trained eval shard's replay of the base shard: the calls whose prompts are all the base run's (the
    first visit step's prediction and evaluation) are not made, and every record is the one a run making
    them writes; the memory model's calls are always made."""
    patients = synthesize_cohort(5, seed=4)
    base = run_forward(patients, counting_roles(tiny_backend, [], max_tokens=8), prompts, seed=3)

    def trained_roles(log):  # another memory model (one that writes a memory): the same prediction/evaluation roles
        roles = counting_roles(tiny_backend, log, max_tokens=8)
        memory = ScriptedBackend('{"evolving_summary": "asthma; gout"}')
        roles["memory"] = Role("memory", CountingBackend(memory, log, "memory"), max_tokens=8)
        return roles

    made, replaying = [], []
    fresh = run_forward(patients, trained_roles(made), prompts, seed=3)
    stats: dict = {}
    replayed = run_forward(patients, trained_roles(replaying), prompts, seed=3, stats=stats, replay=base)
    assert json.dumps(replayed, sort_keys=True) == json.dumps(fresh, sort_keys=True)
    assert [v["h_new"] for v in fresh[0]["visits"][:-1]] != [v["h_new"] for v in base[0]["visits"][:-1]]
    # the first visit step's prediction and evaluation came from the base run, and later calls only where all
    # their prompts were the base's too (the tiny model's predictions, whatever its memory, can be); the
    # memory model's calls were all made
    assert made[:2] == [("prediction", 5), ("evaluation", 5)] and replaying[0] == ("memory", 5)
    rest = iter(made[2:])
    assert all(call in rest for call in replaying)  # the calls made are those of the fresh run, less some
    assert [c for c in replaying if c[0] == "memory"] == [c for c in made if c[0] == "memory"]
    def rows(calls, role):
        return sum(n for r, n in calls if r == role)

    for role in rnn.ROLES:
        assert stats["replayed"][role] + rows(replaying, role) == rows(made, role)
    assert stats["replayed"]["prediction"] >= 5 and stats["replayed"]["evaluation"] >= 5
    assert stats["replayed"]["memory"] == 0
    with pytest.raises(InputError, match="not of these patients"):
        run_forward(patients[::-1], trained_roles([]), prompts, seed=3, replay=base)
    with pytest.raises(InputError, match="replay needs memory 'rnn'"):
        run_forward(patients, trained_roles([]), prompts, seed=3, memory="none", replay=base)
