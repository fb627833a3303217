import json

from llmrnn.jsonparse import parse_memory
from llmrnn.matching import anticipated_share


def compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs):
    step = json.loads(ground_truth)
    memory, _ = parse_memory(solution_str)
    return anticipated_share(memory, step["next_ground_truth_diagnoses"]) if memory else 0.0
