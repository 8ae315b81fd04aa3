"""One draining run accounted per batch: its phases and every statement the batch sent, with what each cost.

Installed by ``bench/drain.py --phases --account FILE`` around ours in the benchmark's process. Per batch
(flows/apply/drain.py ``_apply_batch``, on the run's thread): the wait for its capture (the one started ahead),
the plan (flows/apply/batch_plan.py), the reduction (flows/apply/reducers.py), the transaction (flows/apply/batch_transaction.py)
and, inside them, each statement by its database and its first words, with the round trips and seconds;
the capture itself (its own thread) by its wall time. Wraps module attributes while active; not a test.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections import defaultdict

import psycopg

_SPACES = re.compile(r"\s+")
_TABLE = re.compile(r'"(pgbench_\w+)"')  # the benchmark's table a statement names, kept
_NAMES = re.compile(r'"[^"]*"|\$\d+|%s|\'[^\']*\'|\b\d+\b')


def statement_kind(query) -> str:
    """A statement's first words, its identifiers and literals folded (what groups the same statement)."""
    if not isinstance(query, (str, bytes)):
        try:
            query = query.as_string(None)
        except Exception:  # a Composed that needs a connection to render
            query = repr(query)
    if isinstance(query, bytes):
        query = query.decode(errors="replace")
    text = _SPACES.sub(" ", query).strip()
    table = _TABLE.search(text)
    return _NAMES.sub("_", text)[:90] + (f" [{table.group(1)}]" if table else "")


class BatchAccount:
    """Per batch: phases on the run's thread and its statements; the captures' wall times."""

    def __init__(self) -> None:
        self.batches: list[dict] = []
        self.current: dict | None = None
        self.captures: list[float] = []
        self.restart_behind: list[int] = []  # bytes of WAL from the slot's restart_lsn to its confirmed position
        self.captured_wal: list[int] = []  # bytes of WAL each capture moved the slot by
        self._last_confirmed: str | None = None
        self.capture_statements: dict[str, list] = defaultdict(lambda: [0, 0.0])
        self._undo: list = []
        self._thread = threading.get_ident()

    def _wrap(self, owner, attr: str, record) -> None:
        original = getattr(owner, attr)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            began = time.monotonic()
            try:
                return original(*args, **kwargs)
            finally:
                record(time.monotonic() - began, args)

        setattr(owner, attr, timed)
        self._undo.append((owner, attr, original))

    def _phase(self, name: str):
        def record(seconds: float, _args) -> None:
            if self.current is not None and threading.get_ident() == self._thread:
                self.current["phases"][name] = self.current["phases"].get(name, 0.0) + seconds
        return record

    def _statement(self, seconds: float, args) -> None:
        cursor, query = args[0], args[1] if len(args) > 1 else ""
        if threading.get_ident() != self._thread:  # the capture ahead's thread
            entry = self.capture_statements[f"{cursor.connection.info.dbname}: {statement_kind(query)}"]
        elif self.current is None:
            return
        else:
            entry = self.current["statements"][f"{cursor.connection.info.dbname}: {statement_kind(query)}"]
        entry[0] += 1
        entry[1] += seconds

    def install(self) -> BatchAccount:
        from airflow_provider_rowfilter.flows.apply import capture_ahead, drain, reducers

        account = self

        original_batch = drain._apply_batch

        @functools.wraps(original_batch)
        def batch(*args, **kwargs):
            account.current = {"phases": {}, "statements": defaultdict(lambda: [0, 0.0])}
            began = time.monotonic()
            try:
                return original_batch(*args, **kwargs)
            finally:
                account.current["wall"] = time.monotonic() - began
                account.current["changes"] = args[4].changes
                account.batches.append(account.current)
                account.current = None

        drain._apply_batch = batch
        self._undo.append((drain, "_apply_batch", original_batch))
        self._wrap(drain, "plan_batch", self._phase("plan"))
        self._wrap(drain, "reduce", self._phase("reduce (and the stage's clear)"))
        self._wrap(reducers, "reduce_here", self._phase("reduce: in this process"))
        self._wrap(drain, "commit_batch", self._phase("transaction"))
        self._wrap(capture_ahead.CaptureAhead, "take", lambda s, a: self._wait(s))
        self._wrap(capture_ahead, "capture", self._captured)
        self._wrap(psycopg.Cursor, "execute", self._statement)
        self._wrap(psycopg.Cursor, "executemany", self._statement)
        self._wrap(psycopg.Cursor, "copy", self._statement)  # opening the COPY (its rows are written after)
        from airflow_provider_rowfilter.subscriber import apply_stage, typed_keys

        self._wrap(typed_keys, "write_keys", self._phase("transaction: keys written (COPY, ANALYZE, existed)"))
        self._wrap(apply_stage, "copy_csv", self._phase("transaction: COPY rows"))
        return self

    def _captured(self, seconds: float, args) -> None:
        """The capture's seconds, and how far the slot's restart_lsn is behind its confirmed position after it:
        the WAL the next capture's slot function and advance decode again before the batch's first change."""
        self.captures.append(seconds)
        from airflow_provider_rowfilter.connection import connect
        from airflow_provider_rowfilter.publisher.capture_objects import capture_names

        spec = args[0]
        with connect(spec.publisher, "publisher", spec) as pub:
            behind, wal = pub.execute("SELECT pg_wal_lsn_diff(confirmed_flush_lsn, restart_lsn)::bigint, "
                                      "pg_wal_lsn_diff(confirmed_flush_lsn, %s::pg_lsn)::bigint "
                                      "FROM pg_replication_slots WHERE slot_name = %s",
                                      (self._last_confirmed or "0/0", capture_names(spec.subscription)[0])).fetchone()
            self._last_confirmed = pub.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                               "WHERE slot_name = %s", (capture_names(spec.subscription)[0],)
                                               ).fetchone()[0]
        self.restart_behind.append(behind)
        self.captured_wal.append(wal)

    def _wait(self, seconds: float) -> None:
        self.waits = getattr(self, "waits", [])
        self.waits.append(seconds)

    def uninstall(self) -> None:
        for owner, attr, original in reversed(self._undo):
            setattr(owner, attr, original)
        self._undo.clear()

    def report(self) -> dict:
        """Totals and per-batch figures, statements summed over the batches (count, seconds), heaviest first."""
        statements: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for b in self.batches:
            for k, (n, s) in b["statements"].items():
                statements[k][0] += n
                statements[k][1] += s
        n = max(len(self.batches), 1)
        return {
            "batches": len(self.batches),
            "changes_per_batch": [b["changes"] for b in self.batches],
            "batch_seconds": [round(b["wall"], 3) for b in self.batches],
            "capture_seconds": [round(s, 3) for s in self.captures],
            "capture_wait_seconds": [round(s, 3) for s in getattr(self, "waits", [])],
            "restart_lsn_behind_bytes": self.restart_behind,
            "captured_wal_bytes": self.captured_wal[1:],  # (the first from 0/0)
            "phases_per_batch": {k: round(sum(b["phases"].get(k, 0.0) for b in self.batches) / n, 4)
                                 for k in sorted({k for b in self.batches for k in b["phases"]})},
            "statements_per_batch": round(sum(v[0] for v in statements.values()) / n, 1),
            "statement_seconds_per_batch": round(sum(v[1] for v in statements.values()) / n, 4),
            "statements": {k: {"count": v[0], "per_batch": round(v[0] / n, 2), "seconds": round(v[1], 4),
                               "ms_each": round(1000 * v[1] / v[0], 3)}
                           for k, v in sorted(statements.items(), key=lambda kv: -kv[1][1])},
            "capture_statements": {k: {"count": v[0], "seconds": round(v[1], 4), "ms_each": round(1000 * v[1] / v[0], 3)}
                                   for k, v in sorted(self.capture_statements.items(), key=lambda kv: -kv[1][1])},
        }
