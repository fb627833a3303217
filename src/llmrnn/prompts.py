"""Prompt templates of the LLM-as-RNN roles (config/prompts/*.yaml, read with omegaconf).

A template file holds `initial_memory` (h_0, no model call), `visit_sections` + `max_section_chars`
(how a visit x_t is shown; discharge_diagnosis is the target and never shown) and, per role
(prediction, evaluation, memory_update), `system` (optional) and `user` with {{placeholders}}, and for
prediction/evaluation an optional `response_prefix`: the start of the answer (e.g. '{"top_5_diagnoses": ["'),
sent as a final assistant message that the engine continues; small models then keep to the JSON format.
memory_update takes no prefix: its prompt is the policy's training prompt. Any role may give `examples`:
worked examples as earlier chat turns [{user, assistant}, ...] (literal text, no placeholders). A 135M
instruct model follows a format shown as a previous answer far more often than one described in the
same turn (measured in config/prompts/demo.yaml).
Rendering fills exactly the placeholders a role is allowed; an unknown one is an InputError naming the
file and role.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmrnn.errors import InputError
from llmrnn.io import read_yaml

ROLE_PLACEHOLDERS = {
    "prediction": {"memory", "visit", "visit_number"},
    "evaluation": {"prediction", "ground_truth", "visit_number"},
    "memory_update": {"memory", "visit", "prediction", "evaluation", "missed_diagnoses", "visit_number"},
}
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
TARGET_SECTION = "discharge_diagnosis"


@dataclass(frozen=True)
class Template:
    user: str
    system: str | None = None
    response_prefix: str | None = None  # the answer starts with this text (the model continues it)
    examples: tuple[tuple[str, str], ...] = ()  # (user, assistant) turns shown before the real question

    def _example_turns(self) -> list[dict[str, str]]:
        return [{"role": role, "content": text.strip()}
                for user, answer in self.examples for role, text in (("user", user), ("assistant", answer))]

    def messages(self, values: dict[str, Any], with_prefix: bool = True) -> list[dict[str, str]]:
        def fill(text: str) -> str:
            return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)

        msgs = [{"role": "system", "content": fill(self.system)}] if self.system else []
        msgs += self._example_turns()
        msgs.append({"role": "user", "content": fill(self.user).strip()})
        if self.response_prefix and with_prefix:
            msgs.append({"role": "assistant", "content": self.response_prefix})
        return msgs

    def policy_messages(self, values: dict[str, Any]) -> list[dict[str, str]]:
        """The memory head's prompt (a training row's `prompt`): the example turns, then the question;
        the system text is folded into the first user turn, so the policy prompt has no system message
        (as before examples existed: one user turn when there are none)."""
        msgs = self.messages(values, with_prefix=False)
        if msgs and msgs[0]["role"] == "system":
            system = msgs.pop(0)["content"]
            msgs[0] = {"role": "user", "content": "\n\n".join(t for t in (system, msgs[0]["content"]) if t.strip())}
        return msgs


@dataclass(frozen=True)
class PromptSet:
    initial_memory: str
    prediction: Template
    evaluation: Template
    memory_update: Template
    visit_sections: tuple[str, ...] = field(default=())
    max_section_chars: int = 600
    source: str = "<prompts>"

    def render_visit(self, visit: dict) -> str:
        """x_t as text: the configured sections that are present and non-empty; never the diagnosis."""
        sections = dict(visit.get("clinical_sections") or {})
        if visit.get("allergies") and not sections.get("allergies"):
            sections["allergies"] = visit["allergies"]
        lines = []
        if visit.get("sex"):
            lines.append(f"Sex: {visit['sex']}")
        for name in self.visit_sections:
            text = sections.get(name)
            if name == TARGET_SECTION or not text or not str(text).strip():
                continue
            text = " ".join(str(text).split())
            if len(text) > self.max_section_chars:
                text = text[: self.max_section_chars].rstrip() + " ..."
            lines.append(f"{name.replace('_', ' ').upper()}: {text}")
        return "\n".join(lines)


def _template(data: dict, role: str, source: str) -> Template:
    node = data.get(role)
    if not isinstance(node, dict) or not isinstance(node.get("user"), str) or not node["user"].strip():
        raise InputError(f"{source}: {role}.user: missing (each role needs a user template)")
    system = node.get("system")
    if system is not None and not isinstance(system, str):
        raise InputError(f"{source}: {role}.system: expected text")
    prefix = node.get("response_prefix")
    if prefix is not None and (not isinstance(prefix, str) or not prefix.strip()):
        raise InputError(f"{source}: {role}.response_prefix: expected non-empty text")
    if prefix is not None and role == "memory_update":
        raise InputError(
            f"{source}: memory_update.response_prefix: not allowed; the memory prompt is the policy's training "
            "prompt and the policy must write the whole JSON itself"
        )
    examples = _examples(node.get("examples"), role, source)
    for part in (node["user"], system or ""):
        for name in PLACEHOLDER.findall(part):
            if name not in ROLE_PLACEHOLDERS[role]:
                raise InputError(
                    f"{source}: {role}: unknown placeholder {{{{{name}}}}}; allowed: "
                    f"{', '.join(sorted(ROLE_PLACEHOLDERS[role]))}"
                )
    return Template(user=node["user"], system=system, response_prefix=prefix, examples=examples)


def _examples(value: Any, role: str, source: str) -> tuple[tuple[str, str], ...]:
    """`examples`: a list of {user, assistant} texts, literal (a placeholder there is a mistake)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InputError(f"{source}: {role}.examples: expected a list of {{user, assistant}} turns")
    out = []
    for i, ex in enumerate(value):
        texts = [ex.get(k) if isinstance(ex, dict) else None for k in ("user", "assistant")]
        if not isinstance(ex, dict) or set(ex) != {"user", "assistant"} or not all(
                isinstance(t, str) and t.strip() for t in texts):
            raise InputError(f"{source}: {role}.examples[{i}]: expected exactly a non-empty user and assistant text")
        for text in texts:
            if PLACEHOLDER.search(text):
                raise InputError(f"{source}: {role}.examples[{i}]: placeholders are not filled in examples "
                                 f"({PLACEHOLDER.search(text).group(0)}); write the example out")
        out.append((texts[0], texts[1]))
    return tuple(out)


def load_prompts(path: str | Path) -> PromptSet:
    """Read and check a prompt file; every problem is one InputError line naming file and key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: prompt file not found (config prompts.file)")
    try:  # the one YAML policy (llmrnn.io.read_yaml), then OmegaConf for ${...} interpolation
        data = OmegaConf.to_container(OmegaConf.create(read_yaml(path, "prompt file") or {}), resolve=True)
    except (OmegaConfBaseException, ValueError) as exc:
        raise InputError(f"{path}: not a valid prompt YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: top level: expected a mapping")
    initial = data.get("initial_memory")
    if not isinstance(initial, str) or not initial.strip():
        raise InputError(f"{path}: initial_memory: missing (the memory text before the first visit)")
    sections = data.get("visit_sections") or []
    if not isinstance(sections, list) or not all(isinstance(s, str) for s in sections) or not sections:
        raise InputError(f"{path}: visit_sections: expected a non-empty list of clinical section names")
    return PromptSet(
        initial_memory=initial.strip(),
        prediction=_template(data, "prediction", str(path)),
        evaluation=_template(data, "evaluation", str(path)),
        memory_update=_template(data, "memory_update", str(path)),
        visit_sections=tuple(sections),
        max_section_chars=int(data.get("max_section_chars", 600)),
        source=str(path),
    )


def show_json(obj: Any) -> str:
    """Compact JSON for placing a parsed object inside a prompt."""
    return json.dumps(obj, ensure_ascii=False)


def chat_tokens(tok, conv: list[dict]) -> int:
    """Tokens of a chat prompt as vLLM's LLM.chat renders it: the tokenizer's chat template, a final assistant
    message continued (a response prefix). transformers 5 returns a BatchEncoding for tokenize=True, whose len()
    is its number of keys, not of tokens: count its input_ids."""
    cont = conv[-1]["role"] == "assistant"
    ids = tok.apply_chat_template(list(conv), tokenize=True, add_generation_prompt=not cont,
                                  continue_final_message=cont)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)
