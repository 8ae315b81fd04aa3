"""Capture against a real publisher: the change-log segment, the slot, the heartbeat, crashes and bounds."""

from __future__ import annotations

import gc
import json
import shutil
import time
import tracemalloc
from datetime import datetime, timezone
from itertools import groupby
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
import pytest
import yaml

from airflow_provider_rowfilter.change_log import log as change_log
from airflow_provider_rowfilter.change_log.log import ChangeLog, segment_name
from airflow_provider_rowfilter.change_log.segment_reader import read_segments, segment_relations
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.jobs import capture as capture_job
from airflow_provider_rowfilter.publisher import capture as capture_module
from airflow_provider_rowfilter.publisher.capture import capture
from airflow_provider_rowfilter.publisher.capture_objects import capture_publication_names
from airflow_provider_rowfilter.publisher.pgoutput_columns import DECODER

BIG = "0123456789" * 1000  # 10 kB, stored out of line (STORAGE EXTERNAL)

SCHEMA = f"""
CREATE TABLE t1 (a int PRIMARY KEY, b text);
CREATE TABLE t2 (id int PRIMARY KEY, v int, note varchar(10), amount numeric(10,2));
ALTER TABLE t2 REPLICA IDENTITY FULL;
CREATE TABLE parent (id int, r text, PRIMARY KEY (id, r)) PARTITION BY LIST (r);
CREATE TABLE parent_a PARTITION OF parent FOR VALUES IN ('a');
CREATE TABLE parent_b PARTITION OF parent FOR VALUES IN ('b');
CREATE TABLE docs (id int PRIMARY KEY, body text, n int);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE TABLE docs_full (id int PRIMARY KEY, body text, n int);
ALTER TABLE docs_full ALTER COLUMN body SET STORAGE EXTERNAL;
ALTER TABLE docs_full REPLICA IDENTITY FULL;
CREATE TABLE unpublished (x int);
INSERT INTO docs VALUES (1, '{BIG}', 0);
INSERT INTO docs_full VALUES (1, '{BIG}', 0);
CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 5), t2, docs, docs_full;
CREATE PUBLICATION p2 FOR TABLE parent WITH (publish_via_partition_root = true);
"""

# table -> (replica identity, column names, format_type names, type OIDs, typmods, key flags)
RELATIONS = {
    "t1": ("d", ["a", "b"], ["integer", "text"], [23, 25], [-1, -1], [True, False]),
    "t2": ("f", ["id", "v", "note", "amount"], ["integer", "integer", "character varying(10)", "numeric(10,2)"],
           [23, 23, 1043, 1700], [-1, -1, 14, 655366], [True, True, True, True]),
    "parent_a": ("d", ["id", "r"], ["integer", "text"], [23, 25], [-1, -1], [True, True]),
    "parent_b": ("d", ["id", "r"], ["integer", "text"], [23, 25], [-1, -1], [True, True]),
    "docs": ("d", ["id", "body", "n"], ["integer", "text", "integer"], [23, 25, 23], [-1, -1, -1],
             [True, False, False]),
    "docs_full": ("f", ["id", "body", "n"], ["integer", "text", "integer"], [23, 25, 23], [-1, -1, -1],
                  [True, True, True]),
}
VOLATILE = ("commit_lsn", "commit_ts", "lsn")


@pytest.fixture
def env(fresh_db, tmp_path):
    """A publisher with the schema, a subscriber, a spec file, and a refreshed subscription."""
    pub, sub = fresh_db(), fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute(SCHEMA)
    path = tmp_path / "s1.yaml"
    # The capture's decoding of everything the tables publish: through the unfiltered capture publications
    # (filtering: spark). filtering: source is the same decoding of what pgoutput lets through
    # (tests/e2e/jobs/test_apply_source_filtering.py).
    path.write_text(yaml.safe_dump({"subscription": "s1", "publisher": pub, "subscriber": sub,
                                    "publications": ["p1", "p2"], "filtering": "spark"}))
    spec = SubscriptionSpec.load(path)
    refresh(spec)
    return pub, path, spec


def run_job(capsys, path: Path, *args: str) -> dict:
    assert capture_job.main(["--spec", str(path), *args]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def slot_position(pub: str) -> int:
    with psycopg.connect(pub) as conn:
        return parse_lsn(conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                      "WHERE slot_name = 'rowfilter_s1'").fetchone()[0])


def in_transaction(conn: psycopg.Connection, *statements: str) -> int:
    """Run statements in one transaction; return its xid."""
    with conn.transaction():
        for statement in statements:
            conn.execute(statement)
        return int(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0])


def change(oids, xid, seq, kind, table, new=None, new_unchanged=None, old_kind=None, old=None, truncate=None):
    identity, names, types, type_oids, typmods, keys = RELATIONS[table]
    return {
        "xid": xid, "origin": None, "seq": seq, "kind": kind, "relation_oid": oids[table], "schema": "public",
        "table": table, "replica_identity": identity, "column_names": names, "column_types": types,
        "column_type_oids": type_oids, "column_typmods": typmods, "key_columns": keys,
        "new_values": new, "new_unchanged": None if new is None else (new_unchanged or [False] * len(new)),
        "old_kind": old_kind, "old_values": old, "old_unchanged": None if old is None else [False] * len(old),
        "truncate_cascade": None if truncate is None else truncate[0],
        "truncate_restart_identity": None if truncate is None else truncate[1],
    }


def check_positions(rows: list[dict], start: int, end: int, before: datetime, after: datetime) -> None:
    """Whole transactions in commit order; LSNs inside the segment's range; times inside the test's."""
    commits = []
    for (commit_lsn, _xid), group in groupby(rows, key=lambda r: (r["commit_lsn"], r["xid"])):
        group = list(group)
        assert [r["seq"] for r in group] == list(range(len(group)))
        assert [r["lsn"] for r in group] == sorted(r["lsn"] for r in group)
        assert len({r["commit_ts"] for r in group}) == 1
        assert start < group[0]["lsn"] and group[-1]["lsn"] < commit_lsn < end
        commits.append((commit_lsn, group[0]["commit_ts"]))
    assert commits == sorted(commits) and len({c for c, _ in commits}) == len(commits)
    assert all(before <= ts <= after for _, ts in commits)


# However the slot's rows are fetched (a transaction, a run of changes, cut anywhere), the log is the same.
@pytest.mark.parametrize("fetch", [(), ("--fetch-rows", "1"), ("--fetch-rows", "4")], ids=["default", "1", "4"])
def test_capture_writes_whole_transactions_in_commit_order_and_advances_the_slot(env, capsys, fetch, tmp_path):
    pub, path, spec = env
    start = slot_position(pub)
    before = datetime.now(timezone.utc)
    with psycopg.connect(pub, autocommit=True) as conn:
        oids = {t: conn.execute("SELECT %s::regclass::oid", (t,)).fetchone()[0] for t in RELATIONS}
        x1 = in_transaction(conn, "INSERT INTO t1 VALUES (1, 'one'), (7, NULL)",
                            "INSERT INTO t2 VALUES (1, 10, 'x', 1.5)", "INSERT INTO parent VALUES (1, 'a'), (2, 'b')")
        in_transaction(conn, "INSERT INTO unpublished VALUES (1)")
        conn.execute("BEGIN; INSERT INTO t1 VALUES (99, 'rolled back'); ROLLBACK")
        x2 = in_transaction(conn, "UPDATE t1 SET b = 'seven' WHERE a = 7", "UPDATE t1 SET a = 8 WHERE a = 7",
                            "UPDATE t2 SET v = 11 WHERE id = 1", "UPDATE docs SET n = 1",
                            "UPDATE docs_full SET n = 1")
        x3 = in_transaction(conn, "DELETE FROM t1 WHERE a = 1", "DELETE FROM t2",
                            "UPDATE parent SET r = 'b' WHERE id = 1")
        x4 = in_transaction(conn, "TRUNCATE t1, t2 RESTART IDENTITY")
        x5 = in_transaction(conn, "TRUNCATE docs CASCADE")
        x6 = in_transaction(conn, "INSERT INTO t1 VALUES (20, 'a')", "TRUNCATE t1", "INSERT INTO t1 VALUES (21, 'b')")
    after = datetime.now(timezone.utc)

    summary = run_job(capsys, path, *fetch)

    c = lambda *a, **k: change(oids, *a, **k)  # noqa: E731
    expected = [
        c(x1, 0, "insert", "t1", ["1", "one"]),
        c(x1, 1, "insert", "t1", ["7", None]),
        c(x1, 2, "insert", "t2", ["1", "10", "x", "1.50"]),
        c(x1, 3, "insert", "parent_a", ["1", "a"]),
        c(x1, 4, "insert", "parent_b", ["2", "b"]),
        c(x2, 0, "update", "t1", ["7", "seven"]),  # identity unchanged: no old row
        c(x2, 1, "update", "t1", ["8", "seven"], old_kind="K", old=["7", None]),  # key changed: old key
        c(x2, 2, "update", "t2", ["1", "11", "x", "1.50"], old_kind="O", old=["1", "10", "x", "1.50"]),
        c(x2, 3, "update", "docs", ["1", None, "1"], new_unchanged=[False, True, False]),
        c(x2, 4, "update", "docs_full", ["1", None, "1"], new_unchanged=[False, True, False],
          old_kind="O", old=["1", BIG, "0"]),
        c(x3, 0, "delete", "t1", old_kind="K", old=["1", None]),
        c(x3, 1, "delete", "t2", old_kind="O", old=["1", "11", "x", "1.50"]),
        c(x3, 2, "delete", "parent_a", old_kind="K", old=["1", "a"]),  # a row moving between partitions
        c(x3, 3, "insert", "parent_b", ["1", "b"]),
        c(x4, 0, "truncate", "t1", truncate=(False, True)),
        c(x4, 1, "truncate", "t2", truncate=(False, True)),
        c(x5, 0, "truncate", "docs", truncate=(True, False)),
        c(x6, 0, "insert", "t1", ["20", "a"]),
        c(x6, 1, "truncate", "t1", truncate=(False, False)),
        c(x6, 2, "insert", "t1", ["21", "b"]),
    ]
    end = parse_lsn(summary["end_lsn"])
    segments = ChangeLog(spec.change_log).segments()
    assert [s.path.name for s in segments] == [segment_name(start, end)]
    assert Path(spec.change_log) == path.parent / ".rowfilter" / "s1" / "changes"
    rows = read_segments(segments).to_pylist()
    check_positions(rows, start, end, before, after)
    assert [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows] == expected

    assert slot_position(pub) == end
    assert ChangeLog(spec.change_log).captured_through() == end
    assert summary | {"seconds": 0, "changes_per_second": 0, "lag_seconds": 0, "lag_bytes": 0} == {
        "subscription": "s1", "slot": "rowfilter_s1", "start_lsn": format_lsn(start), "end_lsn": format_lsn(end),
        "segment": str(segments[0].path), "transactions": 6, "changes": 20, "messages": summary["messages"],
        "changes_by_kind": {"insert": 8, "update": 5, "delete": 3, "truncate": 4}, "more": False,
        "heartbeat": False, "filtering": "spark", "decoder": DECODER, "recovered_lsn": None, "lag_bytes": 0,
        "lag_seconds": 0, "seconds": 0, "changes_per_second": 0}
    assert 0 <= summary["lag_seconds"] < 600 and summary["lag_bytes"] >= 0
    metadata = json.loads(pq.read_metadata(segments[0].path).metadata[b"rowfilter.change_log"])
    relations = metadata.pop("relations")
    origin = metadata.pop("publisher")  # which server, for the log's continuity across a promotion
    assert set(origin) == {"system_identifier", "timeline"} and origin["timeline"] >= 1, origin
    assert metadata == {"format_version": 1, "subscription": "s1", "slot": "rowfilter_s1",
                        "publication": ",".join(capture_publication_names("s1").values()), "filtering": "spark",
                        "start_lsn": format_lsn(start),
                        "end_lsn": format_lsn(end),
                        "transactions": 6, "changes": 20}
    # The relations the metadata lists are exactly those the rows carry, with where each first and last appears.
    recorded = segment_relations(segments[0].path)
    assert [r.to_document() for r in recorded] == relations
    pq.write_table(pq.read_table(segments[0].path).replace_schema_metadata({}), tmp_path / "bare.parquet")
    assert segment_relations(tmp_path / "bare.parquet") == recorded

    # Nothing new: success, and the slot stays (no segment) or moves on as a heartbeat (an empty one).
    again = run_job(capsys, path)
    assert again["changes"] == 0 and again["start_lsn"] == format_lsn(end)
    after = ChangeLog(spec.change_log).segments()
    if again["heartbeat"]:
        assert after[:1] == segments and len(after) == 2, after
        assert (after[1].start_lsn, after[1].end_lsn) == (end, parse_lsn(again["end_lsn"]))
        assert again["segment"] == str(after[1].path) and pq.read_metadata(after[1].path).num_rows == 0
    else:
        assert again["segment"] is None and after == segments


@pytest.mark.parametrize("fetch", ["1", "3", "1000"])
def test_a_table_altered_between_changes_is_logged_with_its_columns_at_each_change(env, capsys, fetch):
    """pgoutput sends a new Relation message after a schema change; each change keeps the one before it."""
    pub, path, spec = env
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("INSERT INTO t1 VALUES (1, 'one')")
        conn.execute("ALTER TABLE t1 ADD COLUMN c int")
        conn.execute("INSERT INTO t1 VALUES (2, 'two', 3)")
        in_transaction(conn, "INSERT INTO t2 VALUES (5, 1, 'x', 1)", "UPDATE t1 SET c = 4 WHERE a = 2",
                       "ALTER TABLE t1 DROP COLUMN b", "INSERT INTO t1 VALUES (6, 7)", "INSERT INTO t2 VALUES (6, 1)")
    summary = run_job(capsys, path, "--fetch-rows", fetch)
    rows = read_segments(ChangeLog(spec.change_log).segments()).to_pylist()
    assert [(r["seq"], r["table"], r["column_names"], r["new_values"]) for r in rows] == [
        (0, "t1", ["a", "b"], ["1", "one"]),
        (0, "t1", ["a", "b", "c"], ["2", "two", "3"]),
        (0, "t2", ["id", "v", "note", "amount"], ["5", "1", "x", "1.00"]),
        (1, "t1", ["a", "b", "c"], ["2", "two", "4"]),
        (2, "t1", ["a", "c"], ["6", "7"]),
        (3, "t2", ["id", "v", "note", "amount"], ["6", "1", None, None]),
    ]
    assert (summary["transactions"], summary["changes"]) == (3, 6)


def test_heartbeat_moves_an_idle_slot_with_the_publishers_wal(env, capsys):
    pub, path, spec = env
    run_job(capsys, path)
    with psycopg.connect(pub, autocommit=True) as conn:
        for i in range(50):
            conn.execute("INSERT INTO unpublished VALUES (%s)", (i,))
        flushed = parse_lsn(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
    assert slot_position(pub) < flushed
    start = slot_position(pub)
    summary = run_job(capsys, path)
    assert summary["heartbeat"] and summary["changes"] == 0
    assert slot_position(pub) == parse_lsn(summary["end_lsn"]) >= flushed
    # The advance leaves an empty segment, so the log's names alone prove it continuous.
    segments = ChangeLog(spec.change_log).segments()
    assert (segments[-1].start_lsn, segments[-1].end_lsn) == (start, slot_position(pub))
    assert summary["segment"] == str(segments[-1].path)
    footer = pq.read_metadata(segments[-1].path)
    assert footer.num_rows == 0
    assert json.loads(footer.metadata[b"rowfilter.change_log"])["transactions"] == 0
    assert ChangeLog(spec.change_log).captured_through() == slot_position(pub)


def test_a_busy_publisher_moves_the_slot_past_a_batch_of_ours(env, capsys):
    """Changes of other tables after ours: the segment ends where decoding ended, not at our last commit."""
    pub, path, spec = env
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("INSERT INTO t1 VALUES (1, 'one')")
        last_commit = parse_lsn(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
        conn.execute("INSERT INTO unpublished SELECT generate_series(1, 100)")
        flushed = parse_lsn(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
    summary = run_job(capsys, path)
    assert summary["changes"] == 1 and parse_lsn(summary["end_lsn"]) >= flushed > last_commit
    assert slot_position(pub) == parse_lsn(summary["end_lsn"])


def _crash_before_rename(kept: Path):
    def publish(temp: Path, final: Path) -> None:
        shutil.copyfile(temp, kept)
        raise OSError("simulated crash before the rename")
    return publish


def test_a_crash_before_the_rename_leaves_the_slot_and_the_rerun_writes_the_same_segment(env, capsys, tmp_path,
                                                                                         monkeypatch):
    pub, path, spec = env
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("INSERT INTO t1 SELECT g, 'v' || g FROM generate_series(1, 500) g")
        conn.execute("UPDATE t2 SET v = 1")
        conn.execute("DELETE FROM t1 WHERE a < 100")
        # Both runs end at this position: without it a segment ends where the publisher's WAL is flushed
        # when it is read, which the cluster's other databases move between the two runs.
        upto = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
    start = slot_position(pub)
    kept = tmp_path / "would-have-been.parquet"
    with monkeypatch.context() as m:
        m.setattr(change_log, "publish", _crash_before_rename(kept))
        with pytest.raises(OSError, match="simulated crash before the rename"):
            capture_job.main(["--spec", str(path), "--row-group-rows", "100", "--upto-lsn", upto])
    assert slot_position(pub) == start
    assert sorted(p.name for p in Path(spec.change_log).iterdir()) == []  # no segment, no temporary file
    summary = run_job(capsys, path, "--row-group-rows", "100", "--upto-lsn", upto)
    segment = Path(summary["segment"])
    assert segment.read_bytes() == kept.read_bytes()
    assert summary["changes"] == 599 and slot_position(pub) == parse_lsn(summary["end_lsn"])


def test_a_crash_after_the_rename_is_finished_by_the_rerun_without_reading_twice(env, capsys, monkeypatch):
    pub, path, spec = env
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("INSERT INTO t1 VALUES (1, 'one'), (2, 'two')")
    start = slot_position(pub)

    def crash(*args) -> None:
        raise RowFilterError("simulated crash before the slot advance")

    with monkeypatch.context() as m:
        m.setattr(capture_module, "_advance", crash)
        with pytest.raises(RowFilterError, match="simulated crash"):
            capture(spec)
    segments = ChangeLog(spec.change_log).segments()
    assert len(segments) == 1 and slot_position(pub) == start < segments[0].end_lsn
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("INSERT INTO t1 VALUES (3, 'three')")
    summary = run_job(capsys, path)
    assert summary["recovered_lsn"] == format_lsn(segments[0].end_lsn)
    assert summary["start_lsn"] == summary["recovered_lsn"] and summary["changes"] == 1
    after = ChangeLog(spec.change_log).segments()
    assert after[0] == segments[0] and after[1].start_lsn == segments[0].end_lsn
    assert [r["new_values"] for r in read_segments(after).to_pylist()] == [["1", "one"], ["2", "two"], ["3", "three"]]
    assert slot_position(pub) == after[1].end_lsn


def test_a_slot_advanced_by_someone_else_stops_the_capture(env, capsys):
    pub, path, spec = env
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("INSERT INTO t1 VALUES (1, 'one')")
        run_job(capsys, path)
        conn.execute("INSERT INTO t1 VALUES (2, 'two')")
        conn.execute("SELECT pg_replication_slot_advance('rowfilter_s1', pg_current_wal_flush_lsn())")
    advanced = slot_position(pub)
    with pytest.raises(RowFilterError, match="is missing the changes from") as refused:
        capture(spec)  # no subscriber known: the log may not be behind the slot
    assert 'replication slot "rowfilter_s1" is at' in str(refused.value)
    assert slot_position(pub) == advanced
    # The job reads the spec's subscriber: every table still waits for its copy, so nobody needs the
    # changes in between (the copy starts past them) and the capture goes on from the slot.
    assert run_job(capsys, path)["start_lsn"] == format_lsn(advanced)


def test_max_changes_bounds_the_batch_to_whole_transactions(env, capsys):
    pub, path, spec = env
    with psycopg.connect(pub, autocommit=True) as conn:
        xids = [in_transaction(conn, f"INSERT INTO t1 SELECT g, 't{t}' FROM generate_series({t * 10}, {t * 10 + 9}) g")
                for t in range(5)]
        big = in_transaction(conn, "INSERT INTO t1 SELECT g, 'big' FROM generate_series(100, 129) g")
    # 15 slot rows: the first transaction is 13 rows (Begin, Relation, 10 Inserts, Commit), the second
    # passes 15, and the batch ends at its commit.
    time.sleep(1.2)  # the transactions left waiting by a cut batch have waited this long
    first = run_job(capsys, path, "--max-changes", "15")
    assert first["more"] and (first["transactions"], first["changes"]) == (2, 20)
    assert first["lag_seconds"] >= 1.0, first
    assert slot_position(pub) == parse_lsn(first["end_lsn"])
    second = run_job(capsys, path, "--max-changes", "5")  # a transaction larger than the bound comes whole
    assert (second["transactions"], second["changes"]) == (1, 10) and second["start_lsn"] == first["end_lsn"]
    rest = run_job(capsys, path)
    # Caught up: nothing waits, so no lag, however long ago the publisher committed (issue 46 item 4).
    assert not rest["more"] and (rest["transactions"], rest["changes"]) == (3, 50) and rest["lag_seconds"] == 0
    segments = ChangeLog(spec.change_log).segments()
    assert [(s.start_lsn, s.end_lsn) for s in segments] == [
        (parse_lsn(r["start_lsn"]), parse_lsn(r["end_lsn"])) for r in (first, second, rest)]
    rows = read_segments(segments).to_pylist()
    assert [(xid, len(list(g))) for xid, g in groupby(r["xid"] for r in rows)] == [
        *((x, 10) for x in xids), (big, 30)]
    assert sorted(int(r["new_values"][0]) for r in rows) == [*range(50), *range(100, 130)]


def _traced_capture(spec: SubscriptionSpec) -> tuple[int, int, float]:
    gc.collect()
    tracemalloc.start()
    began = time.perf_counter()
    try:
        result = capture(spec, max_changes=10_000_000, row_group_rows=1_000, fetch_rows=1_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result.changes, peak, time.perf_counter() - began


def test_driver_memory_does_not_grow_with_the_batch(env, capsys):
    """50k then 200k changes in one batch each: the driver's peak (Python allocations) stays flat."""
    pub, path, spec = env
    peaks = {}
    for count in (50_000, 200_000):
        with psycopg.connect(pub, autocommit=True) as conn:
            conn.execute("TRUNCATE t1")
            conn.execute(f"INSERT INTO t1 SELECT g, 'value ' || g FROM generate_series(1, {count}) g")
        changes, peak, seconds = _traced_capture(spec)
        assert changes == count + 1  # with the TRUNCATE
        peaks[count] = peak
        print(f"{count} changes: peak {peak / 2**20:.1f} MiB, {seconds:.1f} s under tracemalloc")
    assert peaks[200_000] / peaks[50_000] < 1.5, peaks
    rows = pq.ParquetFile(ChangeLog(spec.change_log).segments()[-1].path)
    assert rows.metadata.num_rows == 200_001 and rows.metadata.num_row_groups == 201


def test_upto_lsn_ends_the_batch_at_that_position(env, capsys):
    pub, path, spec = env
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("INSERT INTO t1 VALUES (1, 'one')")
        upto = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
        conn.execute("INSERT INTO t1 VALUES (2, 'two')")
    first = run_job(capsys, path, "--upto-lsn", upto)
    assert first["changes"] == 1 and first["end_lsn"] == upto and not first["more"]
    second = run_job(capsys, path)
    assert second["changes"] == 1 and second["start_lsn"] == upto
    assert [r["new_values"] for r in read_segments(ChangeLog(spec.change_log).segments()).to_pylist()] == [
        ["1", "one"], ["2", "two"]]


@pytest.mark.parametrize(("args", "error"), [
    (["--max-changes", "0"], "0 is not a positive number"),
    (["--upto-lsn", "16B3748"], "invalid input syntax for type pg_lsn: '16B3748'"),
], ids=["max-changes-zero", "upto-lsn-not-an-lsn"])
def test_bad_bounds_are_refused(tmp_path, capsys, args, error):
    path = tmp_path / "s1.yaml"
    path.write_text("subscription: s1\npublications: [p1]\npublisher: postgresql://u@127.0.0.1:1/x\n")
    try:
        code = capture_job.main(["--spec", str(path), *args])
    except SystemExit as e:  # argparse's refusal
        code = e.code
    assert code in (1, 2)  # 1: ours (jobs/exit_status.py), 2: argparse's; never 75, which Airflow would retry
    assert error in capsys.readouterr().err


def test_a_missing_slot_says_to_run_refresh(fresh_db, tmp_path):
    spec = SubscriptionSpec(subscription="s9", publications=("p1",), publisher=fresh_db(),
                            change_log=str(tmp_path / "log"))
    with pytest.raises(RowFilterError, match='replication slot "rowfilter_s9" does not exist') as caught:
        capture(spec)
    assert "run `rowfilter refresh` first" in str(caught.value)
