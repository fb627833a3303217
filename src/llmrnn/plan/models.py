"""The models stage's plan: each configured model's .ready marker, its download params and memory, and
the role models a stage reads."""

from __future__ import annotations

from llmrnn.errors import InputError
from llmrnn.models import READY
from llmrnn.plan.common import PlanBase, is_model_name, to_json
from llmrnn.settings.workflow import Role


class ModelsPlan(PlanBase):
    """The models stage's decisions over the config (it depends on no other stage)."""

    def ready(self, name: str) -> str:
        """The .ready marker of a configured model (prepare_base_model makes it)."""
        if name not in self.config["models"]:
            raise InputError(
                f"model {name!r} is used but not configured: add models.{name} (source: pypi_gguf | hub | local)"
            )
        return f"{self.paths.models}/{name}/{READY}"

    def input_of(self, ref: str) -> str:
        """A model as an input of rules: its .ready marker (a configured name) or its folder (a path)."""
        return self.ready(ref) if is_model_name(ref) else ref

    def prepare_cfg(self, wildcards) -> str:
        """params of prepare_base_model: exactly the models.<name> entry it builds."""
        if wildcards.name not in self.config["models"]:
            raise InputError(f"models.{wildcards.name}: not configured")
        return to_json(self.config["models"][wildcards.name])

    def prepare_threads(self) -> int:
        """threads of prepare_base_model: one (a download, or one GGUF conversion)."""
        return 1

    def prepare_mem_mb(self, wildcards) -> int:
        """mem_mb of prepare_base_model: a GGUF conversion holds the whole model in memory."""
        source = self.config["models"].get(wildcards.name, {}).get("source")
        return 16000 if source == "pypi_gguf" else 4000

    def local_roles(self, roles) -> list[dict]:
        """The roles' sections that load a model here (an openai role calls a server instead)."""
        return [r for r in roles if r.get("backend", Role.model_fields["backend"].default) != "openai"]

    def role_markers(self) -> list[str]:
        """.ready markers of the local models the forward-pass roles load (openai roles load none)."""
        roles = self.local_roles(self.config["roles"].values())
        names = {r["model"] for r in roles if is_model_name(r["model"])}
        return [self.ready(n) for n in sorted(names)]

    def memory_model_input(self) -> str:
        """The base memory model (roles.memory.model) as an input of rules; the CLI takes either form
        (llmrnn.models.model_folder). It is the policy GRPO trains, the base the adapter is merged into
        and eval's `base` variant."""
        return self.input_of(self.config["roles"]["memory"]["model"])
