"""The reward function a training run calls, named once (`llmrnn train run --reward-func module:function`).

Either engine reads the same object: TRL calls `function` of `module`; verl imports the module as a package
(`verl_path`, pkg://...) and calls its `compute_score`. The recipe names its reward (llmrnn.plan.recipe:
the memory head's llmrnn.reward, recipe qa's llmrnn.qa.rewards); your own reward (reward.custom) is a file
and a function, called through llmrnn.reward.custom's child-process contract instead."""

from __future__ import annotations

from dataclasses import dataclass

from llmrnn.errors import InputError

TRL_FUNCTION = "trl_reward_func"


@dataclass(frozen=True)
class RewardFunction:
    module: str  # an importable module, or (your own reward) a .py file
    function: str = TRL_FUNCTION

    @classmethod
    def parse(cls, text: str) -> RewardFunction:
        """'module:function' (argparse's type for --reward-func): one line when either half is missing."""
        module, sep, function = str(text).rpartition(":")
        if not sep or not module or not function:
            raise InputError(f"--reward-func {text!r}: expected 'module:function' (e.g. {BUILTIN_REWARD})")
        return cls(module, function)

    @classmethod
    def custom(cls, custom: dict) -> RewardFunction:
        """Your own reward (reward.custom {"path", "name"})."""
        return cls(str(custom["path"]), str(custom["name"]))

    def __str__(self) -> str:
        return f"{self.module}:{self.function}"

    @property
    def is_builtin(self) -> bool:
        """The memory reward of this package (llmrnn.reward: reward.mode's scorer, which may ask the judge)."""
        return self.module == BUILTIN_REWARD.module

    @property
    def verl_path(self) -> str:
        """verl's reward.custom_reward_function.path: the module as a package import. A FILE path would be
        exec'd under a made-up name that is not in sys.modules, and `@dataclass` in the module then fails
        to load (checked in tests/verl against verl 0.7.1 and 0.9.1)."""
        return f"pkg://{self.module}"


BUILTIN_REWARD = RewardFunction("llmrnn.reward")
