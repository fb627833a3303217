"""llmrnn.kept: a shard's finished chunks survive a failure, a rerun continues after them, and a file of
another fingerprint or a torn last write is never trusted."""

from __future__ import annotations

import json

import pytest

from llmrnn import kept


class Boom(RuntimeError):
    pass


def _work(log: list, fail_at: int | None = None):
    def work(chunk):
        if fail_at is not None and chunk[0] >= fail_at:
            raise Boom(chunk)
        log.append(list(chunk))
        return [{"item": i, "sq": i * i} for i in chunk], {"calls": {"m": 1}, "per_step": [len(chunk)]}

    return work


def test_a_failed_shard_continues_after_its_finished_chunks(tmp_path):
    out = tmp_path / "shard_0.jsonl"
    items = list(range(7))
    whole, whole_stats = kept.run_kept(items, _work([]), tmp_path / "whole.jsonl", "fp", "t", chunk=2)
    first: list = []
    with pytest.raises(Boom):
        kept.run_kept(items, _work(first, fail_at=4), out, "fp", "t", chunk=2)
    assert first == [[0, 1], [2, 3]]
    with open(kept.partial_path(out), "a") as fh:  # a write the failure tore in half
        fh.write('{"chunk": 2, "rows": [{"it')
    again: list = []
    rows, stats = kept.run_kept(items, _work(again), out, "fp", "t", chunk=2)
    assert again == [[4, 5], [6]]  # only what was not kept
    assert rows == whole and [r["item"] for r in rows] == items  # nothing lost, nothing twice
    assert stats == whole_stats == {"calls": {"m": 4}, "per_step": [2, 2, 2, 1]}
    kept.finish(out)
    assert not kept.partial_path(out).exists()


def test_another_fingerprint_starts_over(tmp_path):
    out = tmp_path / "shard.jsonl"
    kept.run_kept([1, 2, 3], _work([]), out, "old", "t", chunk=1)
    header = json.loads(kept.partial_path(out).read_text().splitlines()[0])
    assert header == {"fingerprint": "old"}
    redo: list = []
    kept.run_kept([1, 2, 3], _work(redo), out, "new", "t", chunk=1)
    assert redo == [[1], [2], [3]]
    assert json.loads(kept.partial_path(out).read_text().splitlines()[0]) == {"fingerprint": "new"}
