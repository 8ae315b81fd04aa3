"""flows/apply/arrow_fold.py beyond the fold's truth table (tests/apply/test_fold.py): the JSON it writes for any
text, several segments and tables' keys apart, the transaction being skipped, and the batches it leaves to
the change-by-change walk (flows/apply/net_effect.py ``reduce_changes``), which must stage the same rows."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from airflow_provider_rowfilter.flows.apply.arrow_fold import reduce_columns
from airflow_provider_rowfilter.flows.apply.net_effect import reduce_changes
from tests.change_rows import UNFILTERED, arrow_rows, dele, ins, passed_through, plan, rules, upd

# Every character JSON escapes (quote, backslash, control characters), others it does not (U+2028, DEL, é).
TEXTS = ["a", '"', "\\", "\n", "\x01", "é", "\u2028", "\x1f", "/", "'", "\x7f", "\t"]


def _value(r: random.Random) -> str | None:
    return None if r.random() < 0.15 else "".join(r.choice(TEXTS) for _ in range(r.randint(0, 4)))


def _workload(seed: int, updates: float) -> tuple[list[tuple], object]:
    """Random INSERTs, UPDATEs (with and without the old row) and DELETEs of a few keys, in two segments;
    ``updates``: the share of keys changed by UPDATEs alone."""
    r = random.Random(seed)
    rows, keys = [], r.randint(1, 30)
    for commit in range(110, 110 + 10 * r.randint(1, 50), 10):
        k = str(r.randint(1, keys))
        roll = 0.5 if int(k) <= keys * updates else r.random()
        if roll < 0.4:
            rows.append(ins(commit, 0, [k, _value(r), _value(r)]))
        elif roll < 0.8:
            rows.append(upd(commit, 0, [k, _value(r), _value(r)], [k, _value(r), _value(r)] if r.random() < 0.5 else None))
        else:
            rows.append(dele(commit, 0, [k, _value(r), _value(r)]))
    policy = r.choice(["error", "upsert", "skip"])
    the_plan = passed_through(UNFILTERED if policy == "error" else plan(rules(), policy=policy))
    if r.random() < 0.3:
        the_plan = replace(the_plan, skip_lsn=r.choice(rows)[0])  # ALTER SUBSCRIPTION … SKIP
    return rows, the_plan


@pytest.mark.parametrize("updates", [0, 0.5])
def test_columns_stage_what_the_walk_stages(updates):
    for seed in range(150):
        rows, the_plan = _workload(seed, updates)
        segments = [arrow_rows(rows[:len(rows) // 2]), arrow_rows(rows[len(rows) // 2:])]
        reduced = reduce_columns(segments, the_plan, "tok", fold_limit=len(rows))
        assert reduced is not None, seed
        facts, staged = reduced
        walked_facts, walked = reduce_changes(segments, the_plan, "tok")
        assert facts == walked_facts, seed
        assert sorted(staged.to_pylist(), key=repr) == sorted(walked.to_pylist(), key=repr), seed


def test_repeated_keys_past_the_limit_are_left_to_another_reducer():
    rows = [ins(100, 0, ["1", "x", "20"]), upd(200, 0, ["1", "y", "30"], ["1", "x", "20"]), ins(300, 0, ["2", "x", "1"])]
    segments, the_plan = [arrow_rows(rows)], passed_through(UNFILTERED)
    assert reduce_columns(segments, the_plan, "tok", fold_limit=1) is None  # key 1's two changes
    assert reduce_columns(segments, the_plan, "tok", fold_limit=2) is not None
