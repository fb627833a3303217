"""Names that modules of different layers share, kept in a leaf so sharing one imports nothing else
(verl's reward workers load llmrnn.reward: the forward pass must not come with the row tag)."""

# `data_source` of the memory-update rows: trajectories writes it, the reward and verl dispatch on it
DATA_SOURCE = "llm_as_rnn_memory_update"
