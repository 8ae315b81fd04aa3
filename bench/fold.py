"""The in-process fold's CPU per change, on a pgbench-shaped batch the publisher judged, no database.

A batch of ``--changes`` changes shaped like pgbench's TPC-B transaction (an UPDATE of an account, of a
teller, of a branch, an INSERT into history; ``--scale`` sets the tellers and branches, so their keys
repeat) in one table, reduced by flows/apply/net_effect.py ``reduce_batch`` (on the Arrow columns:
flows/apply/arrow_fold.py) and ``reduce_changes`` (change by change, the walk, which folds the repeated keys
in Python), ``--repeat`` times; the best CPU time of each, per change. Not part of the test suite.

    python bench/fold.py                      # 300,000 changes, scale 10, 3 rounds
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply import ROOT, load_average  # noqa: E402  (bench/apply.py: the shared helpers; puts this checkout on the path)

sys.path.insert(0, str(ROOT))
from airflow_provider_rowfilter.flows.apply.net_effect import reduce_batch, reduce_changes  # noqa: E402
from tests.change_rows import UNFILTERED, arrow_rows, ins, passed_through, upd  # noqa: E402


def pgbench_batch(changes: int, scale: int, seed: int = 1) -> list[tuple]:
    """TPC-B's four changes per transaction (keys: a/t/b/h and a number), in commit order."""
    r, rows = random.Random(seed), []
    for n in range(changes // 4):
        commit = 1000 + 10 * n
        delta = str(r.randint(-5000, 5000))
        aid, tid, bid = r.randint(1, 100_000 * scale), r.randint(1, 10 * scale), r.randint(1, scale)
        rows += [upd(commit, 0, [f"a{aid}", delta, "1"]), upd(commit, 1, [f"t{tid}", delta, "2"]),
                 upd(commit, 2, [f"b{bid}", delta, "3"]), ins(commit, 3, [f"h{n}", delta, "4"])]
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--changes", type=int, default=300_000)
    p.add_argument("--scale", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    segments = [arrow_rows(pgbench_batch(args.changes, args.scale))]
    the_plan = passed_through(UNFILTERED)
    n = segments[0].num_rows
    for name, reduce in (("columns (reduce_batch)", reduce_batch), ("walk (reduce_changes)", reduce_changes)):
        best = float("inf")
        for _ in range(args.repeat):
            began = time.process_time()
            _, staged = reduce(segments, the_plan, "tok")
            best = min(best, time.process_time() - began)
        print(f"{name}: {n:,} changes, {staged.num_rows:,} staged rows, best CPU {best:.3f} s, "
              f"{best / n * 1e6:.2f} µs per change; load average {load_average()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
