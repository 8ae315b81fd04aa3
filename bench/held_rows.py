"""What the hand-over saves: a segment's rows read back from Parquet against taken from the writer's memory.

A segment of ``--rows`` UPDATEs of a pgbench-accounts-like table (``--fetch-rows`` a fetch, as the capture
appends them) is written by change_log/segment_writer.py with ``Hold`` (the columns the reducers read,
flows/apply/net_effect.py ``CHANGE_COLUMNS``); then, ``--repeat`` times, the reducer's input is made both
ways: read back (``pq.read_table`` of those columns, then ``combine_chunks`` as flows/apply/arrow_fold.py does)
and taken from the writer (``combine_chunks`` of the held table), and the two are compared equal. Not
part of the test suite.

    python bench/held_rows.py                   # 300,000 rows, 3 rounds
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply import ROOT, load_average  # noqa: E402  (bench/apply.py: the shared helpers; puts this checkout on the path)

sys.path.insert(0, str(ROOT))
from airflow_provider_rowfilter.change_log.log import ChangeLog  # noqa: E402
from airflow_provider_rowfilter.change_log.segment_writer import Hold, SegmentWriter  # noqa: E402
from airflow_provider_rowfilter.flows.apply.net_effect import CHANGE_COLUMNS  # noqa: E402
from tests.change_log.test_log import T1, TS_US, fetch, tup, update  # noqa: E402  (the capture's way to ChangeRows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--fetch-rows", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    txn = (10**9, TS_US, 7, None)
    with tempfile.TemporaryDirectory(prefix="rowfilter-bench-held-") as directory:
        log = ChangeLog(directory)
        with log.writing():
            writer = SegmentWriter(log, 50, hold=Hold(args.rows, CHANGE_COLUMNS))
            for first in range(0, args.rows, args.fetch_rows):
                writer.append(fetch([txn], [(0, n, 100 + n, T1, update(tup(str(n), "", " " * 84)))
                                            for n in range(first, min(first + args.fetch_rows, args.rows))]))
            segment = writer.finish(10**9 + 10)
        assert segment is not None and writer.held is not None
        for _ in range(args.repeat):
            began = time.monotonic()
            read = pq.read_table(segment.path, columns=list(CHANGE_COLUMNS)).combine_chunks()
            read_s = time.monotonic() - began
            began = time.monotonic()
            held = writer.held.combine_chunks()
            held_s = time.monotonic() - began
            assert held.equals(read)
            print(f"{args.rows:,} changes: read back {read_s:.3f} s, taken from the writer {held_s:.3f} s (equal); "
                  f"load average {load_average()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
