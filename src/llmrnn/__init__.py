"""llmrnn: train, merge, evaluate and publish an LLM-as-RNN memory head with GRPO."""

__version__ = "0.1.0"
