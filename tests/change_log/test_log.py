"""Change-log segments without a publisher: names, row groups across a transaction, position, lock."""

from __future__ import annotations

import json
import os
import socket
import stat

import pyarrow.parquet as pq
import pytest

from airflow_provider_rowfilter.change_log.identity import LogIdentity, LogNeeds
from airflow_provider_rowfilter.change_log.log import ChangeLog, ChangeLogError, parse_segment_name, segment_name
from airflow_provider_rowfilter.change_log.segment_reader import read_segments
from airflow_provider_rowfilter.change_log.segment_schema import (
    SCHEMA,
)
from airflow_provider_rowfilter.change_log.segment_writer import Hold, SegmentWriter
from tests.attacker import as_root_only, reachable_directory, run_as_nobody
from tests.change_log.log_messages import (
    T1,
    T1_V2,
    TS,
    TS_US,
    delete,
    fetch,
    insert,
    tup,
    update,
)


def test_segment_names_sort_in_lsn_order_and_parse_back():
    names = [segment_name(s, e) for s, e in [(0x16B3748, 0x1F00000), (0x1_0000_0000, 0x1_0000_0010), (0x1F00000, 0x2000000)]]
    assert names[0] == "00000000016B3748-0000000001F00000.parquet"
    assert sorted(names) == [names[0], names[2], names[1]]
    assert [parse_segment_name(n) for n in names] == [(0x16B3748, 0x1F00000), (0x1_0000_0000, 0x1_0000_0010),
                                                      (0x1F00000, 0x2000000)]
    assert parse_segment_name(".tmp-00000000016B3748-12.parquet") is None
    assert parse_segment_name("_position.json") is None


def test_rows_of_a_transaction_span_row_groups_and_fetches_with_their_transaction_and_relation(tmp_path):
    log = ChangeLog(tmp_path / "log")
    first, second = (200, TS_US, 7, "upstream"), (300, TS_US + 1, 8, None)
    with log.writing():
        writer = SegmentWriter(log, 100, row_group_rows=2, metadata={"slot": "s"})
        # Transaction 7 (with its origin) spans two fetches; the second fetch starts with it.
        writer.append(fetch([first], [
            (0, 0, 150, T1, insert(tup("1", "x"))),
            (0, 1, 151, T1, update(tup("1", None, unchanged={1}), "K", tup("0", None)))]))
        writer.append(fetch([first, second], [
            (0, 2, 152, T1_V2, update(tup("1", "y", "5"), "O", tup("1", "x", None))),  # after ADD COLUMN
            (1, 0, 250, T1_V2, delete("K", tup("1", None, None))),
            (1, 1, 260, T1_V2, 3)]))  # TRUNCATE … RESTART IDENTITY CASCADE
        writer.end_transactions(2)
        segment = writer.finish(400)
    assert segment.path.name == segment_name(100, 400) and (segment.start_lsn, segment.end_lsn) == (100, 400)
    assert pq.ParquetFile(segment.path).metadata.num_row_groups == 3
    assert sorted(p.name for p in segment.path.parent.iterdir()) == [segment.path.name]
    table = read_segments([segment])
    assert table.schema == SCHEMA
    rows = [(r["commit_lsn"], r["commit_ts"], r["xid"], r["origin"], r["seq"], r["lsn"], r["kind"],
             r["column_names"], r["key_columns"], r["new_values"], r["new_unchanged"], r["old_kind"],
             r["old_values"], r["truncate_cascade"], r["truncate_restart_identity"]) for r in table.to_pylist()]
    ab, abc = ["a", "b"], ["a", "b", "c"]
    assert rows == [
        (200, TS, 7, "upstream", 0, 150, "insert", ab, [True, False], ["1", "x"], [False, False], None, None,
         None, None),
        (200, TS, 7, "upstream", 1, 151, "update", ab, [True, False], ["1", None], [False, True], "K", ["0", None],
         None, None),
        (200, TS, 7, "upstream", 2, 152, "update", abc, [True, False, False], ["1", "y", "5"], [False] * 3, "O",
         ["1", "x", None], None, None),
        (300, TS.replace(microsecond=123457), 8, None, 0, 250, "delete", abc, [True, False, False], None, None, "K",
         ["1", None, None], None, None),
        (300, TS.replace(microsecond=123457), 8, None, 1, 260, "truncate", abc, [True, False, False], None, None,
         None, None, True, True),
    ]


def test_a_held_segment_is_in_memory_exactly_what_its_file_holds_and_nothing_past_the_limit(tmp_path):
    """What a capture hands a reducer of its own process instead of the file read back (change_log/segment_writer.py
    ``Hold``): the same rows, columns and order as the published segment; nothing held past the limit or on abort."""
    log, txn = ChangeLog(tmp_path), (200, TS_US, 7, None)
    columns = ("commit_lsn", "seq", "lsn", "kind", "column_names", "new_values", "new_unchanged", "old_kind",
               "old_values", "truncate_restart_identity")
    rows = [(0, i, 150 + i, T1, insert(tup(str(i), "x"))) for i in range(5)]
    held = {}
    for limit in (5, 4):
        writer = SegmentWriter(log, 100 + limit, row_group_rows=2, hold=Hold(limit, columns))
        writer.append(fetch([txn], rows[:3]))
        writer.append(fetch([txn], rows[3:] + [(0, 5, 160, T1, 3)]))  # past a limit of 4 once this fetch is in
        segment = writer.finish(400)
        held[limit] = writer.held
    assert held[4] is None
    assert held[5] is None  # 6 rows: the TRUNCATE is a row too
    writer = SegmentWriter(log, 50, row_group_rows=2, hold=Hold(6, columns))
    writer.append(fetch([txn], rows[:3]))
    writer.append(fetch([txn], rows[3:] + [(0, 5, 160, T1, 3)]))
    segment = writer.finish(100)
    assert writer.held.schema == pq.read_schema(segment.path).empty_table().select(list(columns)).schema
    assert writer.held.combine_chunks().equals(pq.read_table(segment.path, columns=list(columns)).combine_chunks())
    aborted = SegmentWriter(log, 400, hold=Hold(6, columns))
    aborted.append(fetch([txn], rows[:1]))
    aborted.abort()
    assert aborted.held is None


def test_an_empty_range_gets_an_empty_segment_and_no_range_gets_none(tmp_path):
    log = ChangeLog(tmp_path)
    writer = SegmentWriter(log, 100, metadata={"subscription": "s1"})
    writer.end_transactions(0)  # the capture read a transaction with no change of ours
    segment = writer.finish(300)  # a heartbeat: the slot moves, nothing was ours
    assert log.segments() == [segment] and (segment.start_lsn, segment.end_lsn) == (100, 300)
    footer = pq.read_metadata(segment.path)
    assert footer.num_rows == 0 and footer.schema.to_arrow_schema() == SCHEMA
    assert json.loads(footer.metadata[b"rowfilter.change_log"]) == {
        "subscription": "s1", "format_version": 1, "start_lsn": "0/64", "end_lsn": "0/12C", "transactions": 0,
        "changes": 0, "relations": []}
    assert read_segments([segment]).num_rows == 0
    assert SegmentWriter(log, 300).finish(300) is None and log.segments() == [segment]  # the slot did not move
    assert [p.name for p in tmp_path.iterdir()] == [segment.path.name]  # no temporary file left


def chain(tmp_path, *ranges):
    tmp_path.mkdir(parents=True, exist_ok=True)
    for start, end in ranges:
        (tmp_path / segment_name(start, end)).write_bytes(b"")
    return ChangeLog(tmp_path)


def test_the_log_is_continuous_when_its_segments_chain_from_the_start_to_the_end(tmp_path):
    log = chain(tmp_path, (100, 200), (200, 300), (300, 400))
    assert [s.end_lsn for s in log.continuous(100, 400)] == [200, 300, 400]
    assert [s.end_lsn for s in log.continuous(250, 400)] == [300, 400]  # starts inside the first one needed
    assert [s.end_lsn for s in log.continuous(200, 300)] == [300, 400]  # through the log's own end
    assert log.continuous(400, 400) == [] and log.continuous(900, 400) == []  # nothing needed
    (tmp_path / segment_name(100, 200)).unlink()  # pruned: every table is past it
    assert [s.end_lsn for s in log.continuous(200, 400)] == [300, 400]
    log.record_position(400, "rowfilter_s1")
    for segment in log.segments():
        segment.path.unlink()
    assert log.continuous(400, 400) == []  # all pruned: the position file says where the log ends


@pytest.mark.parametrize(("ranges", "since", "through", "missing"), [
    (((100, 200), (300, 400)), 100, 400, "from 0/C8 to 0/12C"),  # the middle segment deleted
    (((100, 400),), 50, 400, "from 0/32 to 0/64"),  # the log starts after what a table needs
    (((100, 200), (200, 400)), 100, 500, "from 0/190 to 0/1F4"),  # the slot is past the log
])
def test_a_gap_is_refused_naming_the_missing_range_the_log_and_the_fix(tmp_path, ranges, since, through, missing):
    log = chain(tmp_path / "log", *ranges)
    needs = LogNeeds("s1", since, (("public.t", since), ("public.u", 600)))
    with pytest.raises(ChangeLogError) as refused:
        log.continuous(since, through, needs)
    text = str(refused.value)
    assert f"the change log '{tmp_path / 'log'}' is missing the changes {missing}" in text, text
    assert "restore the missing segments" in text and "rowfilter resync --table T --copy" in text, text
    assert "(public.t)" in text, text  # the table that needs them; public.u is past the gap


def test_a_deleted_last_segment_is_a_gap_though_the_position_file_is_ahead(tmp_path):
    log = chain(tmp_path, (100, 200), (200, 300))
    log.record_position(300, "rowfilter_s1")
    (tmp_path / segment_name(200, 300)).unlink()
    with pytest.raises(ChangeLogError, match="missing the changes from 0/C8 to 0/12C"):
        log.continuous(150, 200)


def test_overlapping_segments_are_refused(tmp_path):
    log = chain(tmp_path, (100, 200), (150, 300))
    with pytest.raises(ChangeLogError, match="overlap"):
        log.continuous(100, 300)


def test_the_log_gets_an_id_on_its_first_position_and_keeps_it(tmp_path):
    log = ChangeLog(tmp_path / "log")
    log.directory.mkdir()
    assert log.identity() is None
    log.record_position(100, "rowfilter_s1")
    first = log.identity()
    log.record_position(200, "rowfilter_s1")
    assert log.identity() == first and first.path == str(log.directory.resolve()) and first.host
    assert json.loads((log.directory / "_position.json").read_text())["id"] == first.id
    other = ChangeLog(tmp_path / "other")
    other.directory.mkdir()
    other.record_position(100, "rowfilter_s1")
    assert other.identity().id != first.id


def test_a_gap_in_another_directory_than_the_recorded_one_names_the_recorded_one(tmp_path):
    recorded = LogIdentity("6f1c0f7e-0000-4000-8000-000000000000", "airflow-worker", "/data/s1/changes")
    log = chain(tmp_path, (300, 400))
    with pytest.raises(ChangeLogError) as refused:
        log.continuous(100, 400, LogNeeds("s1", 100, (("public.t", 100),), recorded))
    text = str(refused.value)
    assert text.startswith("subscription s1's change log is at airflow-worker:/data/s1/changes (id "
                           f"{recorded.id}); this run reads {socket.gethostname()}:{tmp_path}: set change_log in the spec "
                           "to that directory")
    assert "missing the changes from 0/64 to 0/12C" in text, text


def test_a_segment_of_changes_cannot_end_at_or_before_its_start(tmp_path):
    writer = SegmentWriter(ChangeLog(tmp_path), 100)
    writer.append(fetch([(200, TS_US, 7, None)], [(0, 0, 150, T1, insert(tup("1", "x")))]))
    with pytest.raises(ChangeLogError, match="a segment of 1 changes cannot end at 0/64"):
        writer.finish(100)
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_position_is_the_furthest_of_the_position_file_and_the_segments(tmp_path):
    log = ChangeLog(tmp_path)
    assert log.captured_through() is None
    (tmp_path / segment_name(100, 400)).write_bytes(b"")
    assert log.captured_through() == 400
    log.record_position(500, "rowfilter_s1")
    assert log.captured_through() == 500
    (tmp_path / "_position.json").write_text("{")
    with pytest.raises(ChangeLogError, match="position file .* is unreadable"):
        log.captured_through()


def test_what_a_crashed_writer_left_is_removed_when_the_next_writes(tmp_path):
    """The one writer (its lock is in the database: publisher/writer_lock.py) removes temporary files and an old
    release's flock file."""
    log = ChangeLog(tmp_path / "a" / "b")
    with log.writing():
        (log.directory / ".tmp-0000000000000064-1.parquet").write_bytes(b"half")
        (log.directory / ".lock").write_bytes(b"")
    with log.writing():
        assert [p.name for p in log.directory.iterdir()] == []


def test_text_values_are_the_publishers_utf8_bytes_checked_before_a_segment_is_written(tmp_path):
    log = ChangeLog(tmp_path / "log")
    with log.writing():
        writer = SegmentWriter(log, 100)
        writer.append(fetch([(200, TS_US, 7, None)], [
            (0, 0, 150, T1, insert(tup("1", "é✓"))),
            (0, 1, 151, T1, update(tup("2", ""), "K", tup("1", None)))]))
        writer.end_transactions(1)
        table = read_segments([writer.finish(300)])
    assert table.column("new_values").to_pylist() == [["1", "é✓"], ["2", ""]]
    assert table.column("old_values").to_pylist() == [None, ["1", None]]

    with log.writing():
        writer = SegmentWriter(log, 300)
        with pytest.raises(ChangeLogError, match=r"a text value is not valid UTF-8"):
            writer.append(fetch([(400, TS_US, 8, None)], [(0, 0, 350, T1, insert(tup("1", b"\xff")))]))
        writer.abort()
    assert [s.end_lsn for s in log.segments()] == [300]


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask-022", "umask-000"])
def test_what_the_log_writes_is_its_owner_s_alone_whatever_the_umask(tmp_path, umask):
    """Issue 28, item 6: segments were 0644 in a 0755 folder (by default inside the DAGs folder), and another user
    read replicated rows out of them. Now every directory the log makes is 0700 and every file 0600."""
    before = os.umask(umask)
    try:
        log = ChangeLog(tmp_path / "dags" / ".rowfilter" / "s1" / "changes")
        with log.writing():
            writer = SegmentWriter(log, 100)
            writer.append(fetch([(200, TS_US, 7, None)], [(0, 0, 150, T1, insert(tup("1", "secret row")))]))
            writer.end_transactions(1)
            segment = writer.finish(400)
            log.record_position(400, "slot")
    finally:
        os.umask(before)
    made = [tmp_path / "dags", *(p for p in segment.path.parents if tmp_path / "dags" in p.parents)]
    assert {str(d): oct(stat.S_IMODE(d.stat().st_mode)) for d in made} == {str(d): "0o700" for d in made}
    files = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in log.directory.iterdir()}
    assert files == {"_position.json": "0o600", segment.path.name: "0o600"}


def test_a_log_directory_opened_to_a_group_gets_files_its_group_may_read(tmp_path):
    """A cluster's executors may run as another user of a shared group: a directory its owner made g+rx (say 2750)
    gets 0640 files; never more."""
    (tmp_path / "changes").mkdir(mode=0o750)
    os.chmod(tmp_path / "changes", 0o2750)
    log = ChangeLog(tmp_path / "changes")
    with log.writing():
        segment = SegmentWriter(log, 100).finish(200)
        log.record_position(200, "slot")
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in log.directory.iterdir()} == {
        "_position.json": "0o640", segment.path.name: "0o640"}


@as_root_only
def test_another_os_user_reads_nothing_of_the_log():
    """As found: uid 65534 read replicated row values out of a segment. The log's directory is 0700 (and, should it
    have been made by hand with a looser mode, each file is 0600)."""
    with reachable_directory() as base:
        log = ChangeLog(base / "changes")
        with log.writing():
            writer = SegmentWriter(log, 100)
            writer.append(fetch([(200, TS_US, 7, None)], [(0, 0, 150, T1, insert(tup("1", "secret row")))]))
            writer.end_transactions(1)
            segment = writer.finish(400)
            log.record_position(400, "slot")
        attack = f"""
            import os
            print(os.listdir({str(base)!r}))  # it reaches the log's folder
            for path in ({str(log.directory)!r}, {str(segment.path)!r}, {str(log.directory / '_position.json')!r}):
                try:
                    print("READ", os.listdir(path) if os.path.isdir(path) else len(open(path, "rb").read()))
                except OSError as e:
                    print(type(e).__name__)
        """
        done = run_as_nobody(attack)
        assert done.stdout.split() == ["['changes']", *["PermissionError"] * 3], done.stdout + done.stderr
        os.chmod(log.directory, 0o755)  # opened by hand: the names show, the files stay closed
        done = run_as_nobody(attack)
        assert "READ" in done.stdout.splitlines()[1] and done.stdout.split()[-2:] == ["PermissionError"] * 2, \
            done.stdout + done.stderr
