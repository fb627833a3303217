"""Names that modules of different layers share, kept in a leaf so sharing one imports nothing else
(verl's reward workers load llmrnn.reward: the forward pass must not come with the row tag)."""

import re

# `data_source` of the memory-update rows: trajectories writes it, the reward and verl dispatch on it
DATA_SOURCE = "llm_as_rnn_memory_update"

# a token-shaped secret (Hub, OpenAI, GitHub, GitLab, Slack, AWS, Google keys): the release scanner
# (phi_guard) and the config check (configcheck) refuse the same shapes
# (one digit at least, so that a name such as sk-learn-preprocessing is none); a Hub token is recognised by its
# exact shape, hf_ and 34 letters or digits, with or without a digit (about 1 in 400 has none)
CREDENTIAL = re.compile(r"(?<![A-Za-z0-9])(?:(hf_|sk-|sk_|ghp_|gho_|ghs_|github_pat_|glpat-|xox[abprs]-|AKIA|AIza)"
                        r"(?=[A-Za-z_-]*[0-9])[A-Za-z0-9_-]{16,}|hf_[A-Za-z0-9]{34}(?![A-Za-z0-9_-]))")

# scheme://user:password@host: the userinfo of a URL is a credential wherever the URL came from (greedy up
# to the last @ before the path: a password may hold a raw @). The config check refuses it, the release
# redacts it (llmrnn.upload.redact_credentials)
URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/?#\s]*)@")

# who wrote a merged folder other than our own PEFT merge: verl's model merger, on a full fine-tune (a verl
# checkpoint without lora_adapter/). merge_check.json records it (`written_by`); the release's bundle
# accounting (phi_guard.accounting) accepts what that writer sets, and nothing else
VERL_MERGER = "verl.model_merger"
