"""Applying a backlog of changes: native logical replication against our ApplyChanges, in one run.

Two published tables with row filters on a throwaway local PostgreSQL:
- ``accounts (id bigint PK, region text, amount numeric(12,2), status text, payload text)``,
  ``REPLICA IDENTITY FULL``, published ``WHERE (region = 'NSW' OR region = 'VIC')`` (half the rows);
- ``events (id bigint PK, kind text, n int, note text)``, default replica identity (the key), published
  ``WHERE (id % 4 <> 0)``.
Both are subscribed natively (``NativeSubscription``, database ``bench_native``) and by us (refresh +
snapshot, database ``bench_ours``). Then, with the native subscription DISABLED, ``--changes`` changes
(default 1,000,000) are made in transactions of about ``--txn-size`` changes: INSERTs, UPDATEs of
``region`` (a row moving into or out of the filter: UPDATE turned into INSERT or DELETE, or dropped),
UPDATEs of other columns, DELETEs, on both tables. Timed apart, one after the other:
- native: ``ALTER SUBSCRIPTION … ENABLE`` until the slot confirmed the publisher's position;
- ours: ``apply(spec, max_changes=--max-changes)`` batches (in process, Spark session already warm)
  until the capture says nothing more is waiting.
Both subscriber databases are then compared whole (tooling/native.table_rows). Also measured: an empty
batch (in process, median of 5, and one ``python -m …jobs.apply`` subprocess with its JVM start),
the time per phase of our batches (capture, Spark judge, Spark reduce + stage, subscriber
transaction), the machine's busy core-seconds during each side (``/proc/stat``), and the slot
function alone on the same backlog (a second slot made before the workload, read server-side with
``count(*)``): what any capture through the SQL interface costs before Python sees a row. Our side's
Spark settings can be changed with ``--conf KEY=VALUE``. Not part of the test suite.

    python bench/apply.py                          # 1M changes
    python bench/apply.py --changes 200000         # smaller
    python bench/apply.py --memory --memory-sizes 1000000,5000000
        # peak RSS of the `rowfilter apply` processes (Python driver and its JVM) draining a backlog
        # of each size in batches of --memory-max-changes (default 100,000) slot rows
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import psycopg
import yaml
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec  # noqa: E402
from airflow_provider_rowfilter.flows.refresh import refresh  # noqa: E402
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables  # noqa: E402
from airflow_provider_rowfilter.publisher.capture_objects import capture_names  # noqa: E402
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres  # noqa: E402
from airflow_provider_rowfilter.tooling.native import NativeSubscription, table_rows  # noqa: E402

TABLES = """
CREATE TABLE accounts (id bigserial PRIMARY KEY, region text NOT NULL, amount numeric(12,2), status text,
                       payload text);
CREATE TABLE events (id bigserial PRIMARY KEY, kind text NOT NULL, n int, note text);
"""
SUBSCRIBER_TABLES = TABLES.replace("bigserial", "bigint")
ACCOUNTS_FILTER = "region = 'NSW' OR region = 'VIC'"
EVENTS_FILTER = "id % 4 <> 0"
PUBLICATION = f"CREATE PUBLICATION bench FOR TABLE accounts WHERE ({ACCOUNTS_FILTER}), events WHERE ({EVENTS_FILTER})"
TABLE_NAMES = ("public.accounts", "public.events")

# One publisher transaction of about `size` changes; returns the rows it changed. Row ids are drawn
# uniformly from each table's id range (a drawn id may be gone: the transaction then changes fewer).
#   accounts (70 %): 15 % INSERT, 25 % UPDATE region (moves in or out of the filter), 20 % UPDATE
#                    amount/status, 10 % DELETE;   events (30 %): 15 % INSERT, 10 % UPDATE, 5 % DELETE.
WORKLOAD = """
CREATE FUNCTION bench_txn(size int) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  total bigint := 0; c bigint; hi_a bigint; hi_e bigint;
  regions text[] := ARRAY['NSW', 'VIC', 'QLD', 'WA'];
BEGIN
  SELECT last_value INTO hi_a FROM accounts_id_seq;
  SELECT last_value INTO hi_e FROM events_id_seq;
  INSERT INTO accounts (region, amount, status, payload)
    SELECT regions[1 + floor(random() * 4)::int], round((random() * 10000)::numeric, 2), 'new', md5(random()::text)
    FROM generate_series(1, greatest(1, size * 15 / 100));
  GET DIAGNOSTICS c = ROW_COUNT; total := total + c;
  UPDATE accounts SET region = regions[1 + floor(random() * 4)::int]
    WHERE id = ANY (ARRAY(SELECT 1 + floor(random() * hi_a)::bigint FROM generate_series(1, size * 25 / 100)));
  GET DIAGNOSTICS c = ROW_COUNT; total := total + c;
  UPDATE accounts SET amount = round((random() * 10000)::numeric, 2), status = 'upd'
    WHERE id = ANY (ARRAY(SELECT 1 + floor(random() * hi_a)::bigint FROM generate_series(1, size * 20 / 100)));
  GET DIAGNOSTICS c = ROW_COUNT; total := total + c;
  DELETE FROM accounts
    WHERE id = ANY (ARRAY(SELECT 1 + floor(random() * hi_a)::bigint FROM generate_series(1, size * 10 / 100)));
  GET DIAGNOSTICS c = ROW_COUNT; total := total + c;
  INSERT INTO events (kind, n, note)
    SELECT (ARRAY['click', 'view', 'buy'])[1 + floor(random() * 3)::int], floor(random() * 1000)::int, md5(random()::text)
    FROM generate_series(1, greatest(1, size * 15 / 100));
  GET DIAGNOSTICS c = ROW_COUNT; total := total + c;
  UPDATE events SET n = n + 1, note = md5(random()::text)
    WHERE id = ANY (ARRAY(SELECT 1 + floor(random() * hi_e)::bigint FROM generate_series(1, size * 10 / 100)));
  GET DIAGNOSTICS c = ROW_COUNT; total := total + c;
  DELETE FROM events
    WHERE id = ANY (ARRAY(SELECT 1 + floor(random() * hi_e)::bigint FROM generate_series(1, size * 5 / 100)));
  GET DIAGNOSTICS c = ROW_COUNT; total := total + c;
  RETURN total;
END $$;
-- The whole workload server-side: one COMMIT per bench_txn; done = changes made.
CREATE PROCEDURE bench_workload(target bigint, size int, INOUT done bigint DEFAULT 0, INOUT txns bigint DEFAULT 0)
LANGUAGE plpgsql AS $$
BEGIN
  WHILE done < target LOOP
    done := done + bench_txn(size);
    txns := txns + 1;
    COMMIT;
  END LOOP;
END $$;
"""

SPARK_CONF = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}


# --- set-up -------------------------------------------------------------------------------------------
def create_database(admin: str, name: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def publisher_setup(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLES)
        conn.execute("""INSERT INTO accounts SELECT g, (ARRAY['NSW', 'VIC', 'QLD', 'WA'])[1 + g %% 4],
                               (g %% 100000) / 100.0, 'init', md5(g::text)
                        FROM generate_series(1, %s) g""", (rows,))
        conn.execute("""INSERT INTO events SELECT g, (ARRAY['click', 'view', 'buy'])[1 + g %% 3], g %% 1000, md5(g::text)
                        FROM generate_series(1, %s) g""", (max(rows // 5, 1),))
        conn.execute("SELECT setval('accounts_id_seq', %s), setval('events_id_seq', %s)", (rows, max(rows // 5, 1)))
        conn.execute("ALTER TABLE accounts REPLICA IDENTITY FULL")
        conn.execute("VACUUM ANALYZE accounts")
        conn.execute("VACUUM ANALYZE events")
        conn.execute(PUBLICATION)
        conn.execute(WORKLOAD)


def subscriber_setup(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SUBSCRIBER_TABLES)


def workload(pub: str, changes: int, txn_size: int) -> tuple[int, int, float]:
    """Make about ``changes`` changes; return (changes, transactions, seconds)."""
    began = time.monotonic()
    with psycopg.connect(pub, autocommit=True) as conn:
        done, txns = conn.execute("CALL bench_workload(%s, %s)", (changes, txn_size)).fetchone()
    return int(done), int(txns), time.monotonic() - began


def set_native(native: NativeSubscription, enabled: bool) -> None:
    with psycopg.connect(native.subscriber, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER SUBSCRIPTION {} {}").format(
            sql.Identifier(native.name), sql.SQL("ENABLE" if enabled else "DISABLE")))
    if not enabled:  # wait for the apply worker to leave (the slot is released)
        with psycopg.connect(native.publisher, autocommit=True) as conn:
            deadline = time.monotonic() + 60
            while conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                               (native.name,)).fetchone()[0]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"slot {native.name} still active after DISABLE")
                time.sleep(0.05)


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


class CpuMeter:
    """Core-seconds the whole machine spent busy (``/proc/stat``: everything but idle and iowait) while active.

    Both sides run alone on this machine in turn, so the busy time during each is what that side costs:
    the walsender and the apply worker for native; PostgreSQL, Python and the JVM for ours.
    """

    def __enter__(self) -> CpuMeter:
        self.seconds = 0.0
        self._began = self._busy()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = self._busy() - self._began

    @staticmethod
    def _busy() -> float:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle, iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


READ_ALONE_SLOT = "bench_read_alone"


def create_read_alone_slot(pub: str) -> None:
    """A second pgoutput slot at the workload's start, read once by :func:`slot_read_alone`."""
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (READ_ALONE_SLOT,))


def slot_read_alone(pub: str, publication: str) -> tuple[float, int, int]:
    """Seconds the SQL interface alone takes to hand over the backlog (server-side decoding, nothing kept).

    The same call our capture makes (publisher/capture.py), through ``count(*)`` so nothing crosses the wire
    or is decoded in Python: what any capture through the SQL interface pays before its first row.
    Returns (seconds, slot rows, bytes); the slot is dropped afterwards.
    """
    with psycopg.connect(pub, autocommit=True) as conn:
        began = time.monotonic()
        rows, size = conn.execute(
            "SELECT count(*), coalesce(sum(octet_length(data)), 0) FROM pg_logical_slot_peek_binary_changes("
            "%s, NULL, NULL, 'proto_version', '1', 'publication_names', %s)",
            (READ_ALONE_SLOT, f'"{publication}"')).fetchone()
        seconds = time.monotonic() - began
        conn.execute("SELECT pg_drop_replication_slot(%s)", (READ_ALONE_SLOT,))
    return seconds, int(rows), int(size)


# --- timing of our phases (wrappers installed from here: the product code is not changed) ------------
class PhaseTimer:
    """Wall time spent in the apply job's steps, per batch; wraps module attributes while active."""

    STEPS = ("capture", "decide", "facts", "stage", "reduce", "stage_copy", "subscriber")

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self._undo: list = []

    def _wrap(self, owner, attr: str, step: str) -> None:
        original = getattr(owner, attr)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            began, cpu = time.monotonic(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.current[step] += time.monotonic() - began
                # the calling thread's own CPU (a capture ahead runs in a thread of its own): robust to a busy machine
                self.current[f"{step} cpu"] += time.thread_time() - cpu

        setattr(owner, attr, timed)
        self._undo.append((owner, attr, original))

    def install(self) -> PhaseTimer:
        from airflow_provider_rowfilter.flows.apply import capture_ahead
        from airflow_provider_rowfilter.spark import apply_frames
        from airflow_provider_rowfilter.subscriber.apply_target import StagedTable

        self._wrap(capture_ahead, "capture", "capture")
        self._wrap(apply_frames, "decide", "decide")  # imported by name inside flows/apply/reducers.py reduce: looked up per call
        self._wrap(apply_frames.DecidedBatch, "facts", "facts")  # first action: read, judge, persist, count
        self._wrap(apply_frames, "write_stage", "stage")  # reduce per key + COPY into apply_stage
        self._wrap(StagedTable, "apply", "subscriber")  # per-table SQL in the subscriber transaction
        # A batch the publisher judged: reduced in the process, its rows COPYed from it (flows/apply/net_effect.py).
        from airflow_provider_rowfilter.flows.apply import reducers

        # reading the segments and reducing them (net_effect.py or arrow_fold.py), looked up per call
        self._wrap(reducers, "reduce_here", "reduce")
        self._wrap(reducers, "copy_stage_rows", "stage_copy")  # (a batch Spark judged, collected)

        from airflow_provider_rowfilter.subscriber import apply_target, typed_keys

        self._wrap(typed_keys, "stage_locally", "stage_copy")  # into the batch transaction's own stage
        # Inside the subscriber's statements: the keys of rows reduced in the process COPYed into their typed table.
        self._wrap(apply_target, "write_keys", "subscriber: keys")
        # ... or, a table's batch of UPDATEs of existing rows, its one statement (subscriber/direct_update.py).
        self._wrap(apply_target, "update_directly", "subscriber: direct")
        # Inside the capture: the slot's rows turned into the segment's columns (the decoder), the Parquet
        # row groups written; the rest of the capture is the wait for the slot function and the fetches.
        from airflow_provider_rowfilter.change_log import segment_writer
        from airflow_provider_rowfilter.publisher import capture as capture_module
        from airflow_provider_rowfilter.publisher import change_reader

        self._wrap(change_reader.ChangeReader, "read", "capture: decode")
        self._wrap(segment_writer.SegmentWriter, "_write", "capture: parquet")
        # the slot read whole (the server's decoding, the fetches, decode and Parquet), then the segment's close,
        # fsync and rename, and the slot's advance: what the capture spends beyond them is its checks
        self._wrap(capture_module, "_read_slot", "capture: read")
        self._wrap(segment_writer.SegmentWriter, "finish", "capture: finish")
        self._wrap(capture_module, "_advance", "capture: advance")
        return self

    def uninstall(self) -> None:
        for owner, attr, original in reversed(self._undo):
            setattr(owner, attr, original)
        self._undo.clear()

    def take(self) -> dict[str, float]:
        taken, self.current = dict(self.current), defaultdict(float)
        return taken


# --- the measurements ---------------------------------------------------------------------------------
def apply_until_done(spec: SubscriptionSpec, spark, max_changes: int, timer: PhaseTimer | None = None,
                     verbose: bool = False) -> tuple[float, list[dict]]:
    from airflow_provider_rowfilter.flows.apply.drain import apply

    batches = []
    began = time.monotonic()
    while True:
        t0 = time.monotonic()
        result = apply(spec, max_changes=max_changes, spark=spark)
        wall = time.monotonic() - t0
        phases = timer.take() if timer else {}
        capture = result.capture or {}
        batch = {"wall": wall, "captured": capture.get("changes", 0), "decided": result.changes,
                 "transactions": capture.get("transactions", 0), "more": capture.get("more", False),
                 "tables": result.tables, "phases": phases}
        batches.append(batch)
        if verbose:
            shown = " ".join(f"{k} {v:.2f}" for k, v in phases.items())
            print(f"  batch {len(batches)}: {batch['captured']:,} changes captured in {batch['transactions']:,} "
                  f"txns, {wall:.2f} s ({shown}); more={batch['more']}", flush=True)
        if not batch["more"]:
            return time.monotonic() - began, batches


def phase_breakdown(batches: list[dict], total: float) -> dict[str, float]:
    sums: dict[str, float] = defaultdict(float)
    for b in batches:
        for k, v in b["phases"].items():
            sums[k] += v
    sums["decide"] = sums.get("decide", 0.0)
    # facts and stage run inside flows/apply/reducers.py reduce after decide returned; "other": the rest of apply()
    # (migrate, state reads, segment footers, batch_history, commit, prune) and the loop itself.
    accounted = sum(sums.get(k, 0.0) for k in PhaseTimer.STEPS if k != "capture")  # the capture runs ahead
    sums["other"] = max(total - accounted, 0.0)
    return dict(sums)


def empty_batches(spec: SubscriptionSpec, spark, repeat: int) -> list[float]:
    from airflow_provider_rowfilter.flows.apply.drain import apply

    times = []
    for _ in range(repeat):
        began = time.monotonic()
        result = apply(spec, spark=spark)
        times.append(time.monotonic() - began)
        if result.capture and result.capture.get("changes"):
            raise SystemExit(f"the empty batch was not empty: {result.capture}")
    return times


def write_spec(spec: SubscriptionSpec, directory: Path) -> Path:
    path = directory / f"{spec.subscription}.yaml"
    data = {"subscription": spec.subscription, "publications": list(spec.publications),
            "publisher": spec.publisher, "subscriber": spec.subscriber, "change_log": spec.change_log,
            "spark_master": spec.spark_master, "spark_conf": dict(spec.spark_conf)}
    if spec.spark_remote:  # a Spark Connect client: the server has the master
        data["spark_remote"] = spec.spark_remote
        del data["spark_master"]
    if spec.filtering != "auto":  # bench/drain.py --filtering
        data["filtering"] = spec.filtering
    path.write_text(yaml.safe_dump(data))
    return path


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (from /proc)."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children[ppid].append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _hwm(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        return status["Name"].strip(), int(status["VmHWM"].split()[0])
    except (OSError, KeyError, ValueError):
        return None


CLI = "airflow_provider_rowfilter.cli"  # `rowfilter`: one process per scheduled run, as a task runs it


def run_job(args: list[str], cwd: Path) -> dict:
    """Run ``python -m <args>`` (this checkout first on its path) and watch its process tree's peak RSS.

    Peak RSS per process name (VmHWM from /proc, every 0.2 s): the Python driver and the JVM pyspark
    starts under it. The process must print its summary as the last line of its stdout (``--json``).
    """
    command = [sys.executable, "-m", *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    began = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(cwd), env=env)
    peaks: dict[int, tuple[str, int]] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for pid in _tree(proc.pid):
                seen = _hwm(pid)
                if seen and seen[1] >= peaks.get(pid, ("", 0))[1]:
                    peaks[pid] = seen
            stop.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    wall = time.monotonic() - began
    stop.set()
    watcher.join()
    if proc.returncode:
        saved = Path(tempfile.gettempdir()) / f"rowfilter-bench-apply-failed-{proc.pid}.log"
        saved.write_text(err)
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}); its whole stderr is in {saved}:\n"
                         f"{err[-4000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    by_name: dict[str, int] = {}
    for name, kb in peaks.values():
        by_name[name] = max(by_name.get(name, 0), kb)
    summary = json.loads(out.strip().splitlines()[-1])
    return {"wall": wall, "summary": summary, "peak_kb_by_process": by_name,
            "rusage_children_maxrss_kb": after if after > before else None}


def current_lsn(pub: str) -> str:
    with psycopg.connect(pub, autocommit=True) as conn:
        return conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


def slot_behind(pub: str, slot: str, target: str | None = None) -> int:
    """Bytes from ``slot``'s confirmed_flush_lsn to ``target`` (default the publisher's current position)."""
    with psycopg.connect(pub, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(%s::pg_lsn, pg_current_wal_lsn()) - confirmed_flush_lsn "
                           "FROM pg_replication_slots WHERE slot_name = %s", (target, slot)).fetchone()
    if row is None:
        raise SystemExit(f"slot {slot} does not exist on the publisher")
    return int(row[0])


def drain_processes(spec_file: Path, pub: str, slot: str, target: str, extra: tuple[str, ...] | list[str] = (),
                    verbose: bool = False, limit: int = 10_000) -> list[dict]:
    """``rowfilter apply --spec … --json`` processes back to back until ``slot`` confirmed ``target``.

    One process per run, as a scheduler runs them. Works whether a run applies one batch (it stops at
    its ``--max-changes`` bound) or drains in consecutive batches (``batches``, ``drained``,
    ``budget_exhausted`` in its summary, read with .get()): the loop only asks the slot. A run that
    moves neither the slot nor any change while the slot is short of ``target`` stops the benchmark.
    """
    runs: list[dict] = []
    while slot_behind(pub, slot, target) > 0:
        if len(runs) >= limit:
            raise SystemExit(f"slot {slot} still short of {target} after {limit} runs")
        before = slot_behind(pub, slot, target)
        job = run_job([CLI, "apply", "--spec", str(spec_file), "--json", *extra], spec_file.parent)
        s = job["summary"]
        run = {"wall": job["wall"], "peak_kb_by_process": job["peak_kb_by_process"],
               "changes": s.get("changes", 0), "transactions": s.get("transactions", 0),
               "captured": (s.get("capture") or {}).get("changes"), "batches": s.get("batches", 1),
               "drained": s.get("drained"), "budget_exhausted": s.get("budget_exhausted"),
               "more": (s.get("capture") or {}).get("more"), "end_lsn": s.get("end_lsn"),
               "lag_bytes": s.get("lag_bytes"), "lag_seconds": s.get("lag_seconds"),
               "duration_ms": s.get("duration_ms")}
        runs.append(run)
        if verbose:
            print(f"  run {len(runs)}: {run['changes']:,} changes in {run['transactions']:,} txns, "
                  f"{run['batches']} batch(es), {run['wall']:.1f} s", flush=True)
        if not run["changes"] and slot_behind(pub, slot, target) >= before:
            raise SystemExit(f"run {len(runs)} neither applied a change nor moved slot {slot}: {s}")
    return runs


# --- main ---------------------------------------------------------------------------------------------
def build_spark(master: str):
    from airflow_provider_rowfilter.spark.session import build_session

    began = time.monotonic()
    spark = build_session("rowfilter-bench-apply", master=master, conf=SPARK_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    return spark, time.monotonic() - began


def setup_ours(pub: str, target: str, name: str, change_log: Path, master: str, spark) -> SubscriptionSpec:
    spec = SubscriptionSpec(subscription=name, publisher=pub, subscriber=target, publications=("bench",),
                            change_log=str(change_log), spark_master=master, spark_conf=dict(SPARK_CONF))
    refresh(spec)
    copied = sync_tables(spec, spark=spark)
    if not copied.ok:
        raise SystemExit(f"our copy failed: {copied.error()}")
    return spec


def compare(native_db: str, ours_db: str, tables: tuple[str, ...] = TABLE_NAMES) -> dict[str, int]:
    """Every row of each table, native's against ours (tooling/native.table_rows); stop on a difference."""
    rows = {}
    for table in tables:
        theirs, ours = table_rows(native_db, table), table_rows(ours_db, table)
        if theirs != ours:
            missing, extra = len(set(theirs) - set(ours)), len(set(ours) - set(theirs))
            raise SystemExit(f"{table} differs: native {len(theirs):,} rows, ours {len(ours):,} "
                             f"({missing:,} only in native, {extra:,} only in ours)")
        rows[table] = len(ours)
    return rows


def throughput(args, admin: str, base: str, workdir: Path) -> dict:
    pub, native_db, ours_db = f"{base}/bench_pub", f"{base}/bench_native", f"{base}/bench_ours"
    for name in ("bench_pub", "bench_native", "bench_ours"):
        create_database(admin, name)
    began = time.monotonic()
    publisher_setup(pub, args.rows)
    subscriber_setup(native_db)
    subscriber_setup(ours_db)
    print(f"publisher: accounts {args.rows:,} rows (FULL, {ACCOUNTS_FILTER}), events {args.rows // 5:,} rows "
          f"(key identity, {EVENTS_FILTER}) in {time.monotonic() - began:.1f} s", flush=True)

    spark, startup = build_spark(args.master)
    print(f"Spark {spark.version} on {spark.sparkContext.master}: started in {startup:.1f} s (not counted); "
          f"{os.cpu_count()} CPUs; load average {load_average()}", flush=True)

    began = time.monotonic()
    native = NativeSubscription(pub, native_db, "bench_native", ("bench",)).create(timeout=1800)
    native_copy = time.monotonic() - began
    began = time.monotonic()
    spec = setup_ours(pub, ours_db, "bench_ours", workdir / "changes", args.master, spark)
    our_copy = time.monotonic() - began
    print(f"initial copies: native {native_copy:.1f} s, ours {our_copy:.1f} s", flush=True)

    try:
        # Warm-up: a small workload applied by both (JIT, caches, the f → r move of our tables).
        if args.warmup:
            done, txns, _ = workload(pub, args.warmup, args.txn_size)
            apply_until_done(spec, spark, args.max_changes)
            native.wait_caught_up(timeout=600)
            compare(native_db, ours_db)
            print(f"warm-up: {done:,} changes in {txns:,} transactions applied by both; subscribers equal", flush=True)

        set_native(native, False)
        create_read_alone_slot(pub)
        done, txns, generated = workload(pub, args.changes, args.txn_size)
        with psycopg.connect(pub, autocommit=True) as conn:
            wal = conn.execute("SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM pg_replication_slots "
                               "WHERE slot_name = %s", (native.name,)).fetchone()[0]
        print(f"workload: {done:,} changes in {txns:,} transactions ({done / txns:.1f} per transaction) in "
              f"{generated:.1f} s ({done / generated:,.0f}/s); {int(wal) / 2**20:,.0f} MiB of WAL behind; "
              f"load average {load_average()}", flush=True)

        # What any capture through the SQL interface pays first: the slot function alone, same backlog.
        read_s, read_rows, read_bytes = slot_read_alone(pub, capture_names(spec.subscription)[1])
        print(f"slot read alone (pg_logical_slot_peek_binary_changes, server-side, counted not fetched): "
              f"{read_s:.2f} s for {read_rows:,} slot rows, {read_bytes / 2**20:,.0f} MiB", flush=True)

        # (a) native: enable, until the slot confirmed everything written so far
        load_native = load_average()
        began = time.monotonic()
        with CpuMeter() as native_cpu:
            set_native(native, True)
            native.wait_caught_up(timeout=7200)
        native_s = time.monotonic() - began
        print(f"native apply: {native_s:.2f} s ({done / native_s:,.0f} changes/s), {native_cpu.seconds:.1f} "
              f"core-seconds busy; load average {load_native}", flush=True)

        # (a) ours: batches until the capture says nothing more
        load_ours = load_average()
        timer = PhaseTimer().install()
        try:
            with CpuMeter() as our_cpu:
                our_s, batches = apply_until_done(spec, spark, args.max_changes, timer, verbose=True)
        finally:
            timer.uninstall()
        captured = sum(b["captured"] for b in batches)
        print(f"our apply: {our_s:.2f} s ({done / our_s:,.0f} changes/s) in {len(batches)} batches, "
              f"{captured:,} changes captured, {our_cpu.seconds:.1f} core-seconds busy; load average {load_ours}",
              flush=True)
        if captured != done:
            print(f"  note: captured {captured:,} ≠ made {done:,}", flush=True)

        native.wait_caught_up(timeout=600)
        rows = compare(native_db, ours_db)
        print("subscribers equal: " + ", ".join(f"{t} {n:,} rows" for t, n in rows.items()), flush=True)

        # (b) the fixed cost of an empty batch
        empty = empty_batches(spec, spark, 5)
        spec_file = write_spec(spec, workdir)
        job = run_job(["airflow_provider_rowfilter.jobs.apply", "--spec", str(spec_file)], workdir)
        if job["summary"].get("capture", {}).get("changes"):
            raise SystemExit(f"the subprocess batch was not empty: {job['summary']}")
        print(f"empty batch: in process median {statistics.median(empty) * 1000:.0f} ms "
              f"({', '.join(f'{t * 1000:.0f}' for t in empty)}); subprocess (python -m, JVM start) "
              f"{job['wall']:.2f} s", flush=True)
    finally:
        spark.stop()
        with contextlib.suppress(Exception):
            native.drop()

    phases = phase_breakdown(batches, our_s)
    return {"changes": done, "transactions": txns, "txn_size": args.txn_size, "rows": args.rows,
            "max_changes": args.max_changes, "generate_seconds": generated,
            "native_seconds": native_s, "ours_seconds": our_s,
            "native_changes_per_s": done / native_s, "ours_changes_per_s": done / our_s,
            "ratio": native_s / our_s, "batches": len(batches), "phases_seconds": phases,
            "native_cpu_seconds": native_cpu.seconds, "ours_cpu_seconds": our_cpu.seconds,
            "slot_read_seconds": read_s, "slot_read_rows": read_rows, "slot_read_bytes": read_bytes,
            "empty_batch_ms_median": statistics.median(empty) * 1000,
            "empty_batch_ms": [t * 1000 for t in empty], "empty_subprocess_seconds": job["wall"],
            "empty_subprocess_peak_kb": job["peak_kb_by_process"], "tables_equal": True, "table_rows": rows,
            "spark_startup_seconds": startup, "load_average_native": load_native, "load_average_ours": load_ours,
            "cpus": os.cpu_count()}


def memory(args, admin: str, base: str, workdir: Path) -> dict:
    """Peak RSS of the ``rowfilter apply`` processes draining a backlog of each size, batch by batch.

    Each backlog is drained by :func:`drain_processes` with ``--max-changes`` bounding the batch: one
    process when a run drains in consecutive batches, one process per batch when a run applies one.
    Either way the peak is the largest any process reached, per process name (Python, JVM).
    """
    pub, ours_db = f"{base}/bench_pub", f"{base}/bench_ours"
    for name in ("bench_pub", "bench_ours"):
        create_database(admin, name)
    publisher_setup(pub, args.rows)
    subscriber_setup(ours_db)
    spark, _ = build_spark(args.master)
    spec = setup_ours(pub, ours_db, "bench_mem", workdir / "changes", args.master, spark)
    apply_until_done(spec, spark, args.max_changes)  # f → r
    spark.stop()
    spec_file = write_spec(spec, workdir)
    slot = capture_names(spec.subscription)[0]
    bound = args.memory_max_changes
    results = []
    for size in args.memory_sizes:
        done, txns, generated = workload(pub, size, args.txn_size)
        target = current_lsn(pub)
        print(f"memory: {done:,} changes in {txns:,} transactions made in {generated:.1f} s; draining with "
              + (f"--max-changes {bound:,}" if bound else "the CLI's batches") + f"; load average {load_average()}",
              flush=True)
        runs = drain_processes(spec_file, pub, slot, target, ["--max-changes", str(bound)] if bound else [],
                               verbose=True)
        peak: dict[str, int] = {}
        for run in runs:
            for name, kb in run["peak_kb_by_process"].items():
                peak[name] = max(peak.get(name, 0), kb)
        applied = sum(r["changes"] for r in runs)
        wall = sum(r["wall"] for r in runs)
        print(f"  {applied:,} changes applied by {len(runs)} process(es) in {sum(r['batches'] for r in runs)} "
              f"batches, {wall:.1f} s; peak RSS: "
              + ", ".join(f"{n} {kb / 1024:,.0f} MiB" for n, kb in sorted(peak.items())), flush=True)
        results.append({"changes": done, "applied": applied, "runs": len(runs),
                        "batches": sum(r["batches"] for r in runs), "seconds": wall, "max_changes": bound,
                        "peak_kb_by_process": peak, "load_average": load_average(), "processes": runs})
    return {"memory": results}


def _sizes(text: str) -> list[int]:
    return [int(s.replace("_", "")) for s in text.split(",") if s]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--changes", type=int, default=1_000_000, help="changes made while the subscribers wait")
    p.add_argument("--txn-size", type=int, default=50, help="changes per publisher transaction (about)")
    p.add_argument("--rows", type=int, default=1_000_000, help="initial rows of accounts (events: a fifth)")
    p.add_argument("--max-changes", type=int, default=300_000, help="slot rows per apply batch")
    p.add_argument("--warmup", type=int, default=5_000, help="changes applied by both before the timed run")
    p.add_argument("--memory", action="store_true", help="measure the peak RSS of apply subprocesses instead")
    p.add_argument("--memory-sizes", type=_sizes, default=[1_000_000, 5_000_000],
                   help="backlog sizes for --memory, comma separated (default 1000000,5000000)")
    p.add_argument("--memory-max-changes", type=int, default=100_000,
                   help="slot rows per batch in --memory (default 100,000: memory bounded by the batch; 0: the "
                   "CLI's own, larger while a backlog waits)")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for our side (repeatable), e.g. to compare settings in one harness")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON line too")
    args = p.parse_args(argv)
    for setting in args.conf:
        key, sep, value = setting.partition("=")
        if not sep:
            p.error(f"--conf {setting!r}: expected KEY=VALUE")
        SPARK_CONF[key] = value
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(LocalPostgres.start())
        os.environ["PGPASSFILE"] = str(cluster.passfile)  # its superuser's password, for every database URL below
        admin = cluster.dsn()
        base = admin.partition("?")[0].rsplit("/", 1)[0]
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rowfilter-bench-apply-")))
        with psycopg.connect(admin) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
        print(f"PostgreSQL {version}; load average {load_average()}", flush=True)
        if args.memory:
            figures = memory(args, admin, base, workdir)
        else:
            figures = throughput(args, admin, base, workdir)

    if not args.memory:
        f = figures
        ph = f["phases_seconds"]
        print()
        print(f"{'':28}{'seconds':>10}{'changes/s':>12}")
        print(f"{'native apply':28}{f['native_seconds']:>10.2f}{f['native_changes_per_s']:>12,.0f}")
        print(f"{'rowfilter apply':28}{f['ours_seconds']:>10.2f}{f['ours_changes_per_s']:>12,.0f}")
        print(f"ratio ours/native (changes/s): {f['ratio']:.2f}  (goal >= 1.0); subscribers equal")
        print(f"busy core-seconds: native {f['native_cpu_seconds']:.1f}, ours {f['ours_cpu_seconds']:.1f} "
              f"({f['ours_cpu_seconds'] / f['native_cpu_seconds']:.1f}x)")
        print(f"the SQL interface's slot read alone: {f['slot_read_seconds']:.2f} s "
              f"({f['slot_read_seconds'] / f['native_seconds']:.2f}x the whole native apply)")
        print(f"our time by phase ({f['batches']} batches): "
              + ", ".join(f"{k} {v:.1f} s ({v / f['ours_seconds']:.0%})" for k, v in ph.items()))
        print(f"empty batch: {f['empty_batch_ms_median']:.0f} ms in process (median of 5), "
              f"{f['empty_subprocess_seconds']:.2f} s as a subprocess")
    else:
        print()
        print(f"{'changes':>12}{'runs':>6}{'batches':>9}{'seconds':>10}  peak RSS (MiB) by process")
        for m in figures["memory"]:
            print(f"{m['changes']:>12,}{m['runs']:>6}{m['batches']:>9}{m['seconds']:>10.1f}  "
                  + ", ".join(f"{n} {kb / 1024:,.0f}" for n, kb in sorted(m["peak_kb_by_process"].items())))
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
