"""Change-log segments without a publisher: names, row groups across a transaction, position, lock."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow.parquet as pq
import pytest

from airflow_provider_rowfilter.core.pgoutput import TupleData
from airflow_provider_rowfilter.core.pgoutput_columns import decode_changes, message_buffer
from airflow_provider_rowfilter.pg.change_log import (
    DELETE,
    INSERT,
    SCHEMA,
    TRUNCATE,
    UPDATE,
    ChangeLog,
    ChangeLogError,
    LoggedRelation,
    SegmentWriter,
    image_arrays,
    parse_segment_name,
    read_segments,
    segment_name,
)

T1 = LoggedRelation(16400, "public", "t1", "d", ("a", "b"), ("integer", "text"), (23, 25), (-1, -1), (True, False))
T1_V2 = LoggedRelation(16400, "public", "t1", "d", ("a", "b", "c"), ("integer", "text", "bigint"), (23, 25, 20),
                       (-1, -1, -1), (True, False, False))
TS = datetime(2024, 5, 17, 12, 30, 1, 123456, tzinfo=timezone.utc)
TS_US = 1715949001123456


def new(*values, unchanged=()):
    return TupleData(values, tuple(i in unchanged for i in range(len(values))))


def test_segment_names_sort_in_lsn_order_and_parse_back():
    names = [segment_name(s, e) for s, e in [(0x16B3748, 0x1F00000), (0x1_0000_0000, 0x1_0000_0010), (0x1F00000, 0x2000000)]]
    assert names[0] == "00000000016B3748-0000000001F00000.parquet"
    assert sorted(names) == [names[0], names[2], names[1]]
    assert [parse_segment_name(n) for n in names] == [(0x16B3748, 0x1F00000), (0x1_0000_0000, 0x1_0000_0010),
                                                      (0x1F00000, 0x2000000)]
    assert parse_segment_name(".tmp-00000000016B3748-12.parquet") is None
    assert parse_segment_name("_position.json") is None


def test_rows_of_a_transaction_span_row_groups_with_their_transaction_and_relation(tmp_path):
    log = ChangeLog(tmp_path / "log")
    with log.locked():
        writer = SegmentWriter(log, 100, row_group_rows=2, metadata={"slot": "s"})
        writer.begin(200, TS_US, 7, None)
        writer.origin("upstream")
        writer.change(0, 150, INSERT, T1, new("1", "x"), None, None)
        writer.change(1, 151, UPDATE, T1, new("1", None, unchanged={1}), 0, new("0", None))
        writer.change(2, 152, UPDATE, T1_V2, new("1", "y", "5"), 1, new("1", "x", None))  # after ADD COLUMN
        writer.commit()
        writer.begin(300, TS_US + 1, 8, None)
        writer.change(0, 250, DELETE, T1_V2, None, 0, new("1", None, None))
        writer.change(1, 260, TRUNCATE, T1_V2, None, None, None, 3)
        writer.commit()
        segment = writer.finish(400)
    assert segment.path.name == segment_name(100, 400) and (segment.start_lsn, segment.end_lsn) == (100, 400)
    assert pq.ParquetFile(segment.path).metadata.num_row_groups == 3
    assert sorted(p.name for p in segment.path.parent.iterdir()) == [".lock", segment.path.name]
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


def test_an_empty_batch_writes_nothing(tmp_path):
    log = ChangeLog(tmp_path)
    writer = SegmentWriter(log, 100)
    writer.begin(200, TS_US, 7, None)
    writer.commit()
    assert writer.finish(300) is None and log.segments() == []


def test_a_segment_ends_at_a_commit(tmp_path):
    writer = SegmentWriter(ChangeLog(tmp_path), 100)
    writer.begin(200, TS_US, 7, None)
    writer.change(0, 150, INSERT, T1, new("1", "x"), None, None)
    with pytest.raises(ChangeLogError, match="a segment must end at a transaction commit"):
        writer.finish(300)
    with pytest.raises(ChangeLogError, match="outside a transaction"):
        SegmentWriter(ChangeLog(tmp_path), 100).change(0, 150, INSERT, T1, new("1", "x"), None, None)


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


def test_one_writer_at_a_time_and_leftovers_are_removed(tmp_path):
    log = ChangeLog(tmp_path / "a" / "b")
    with log.locked():
        (log.directory / ".tmp-0000000000000064-1.parquet").write_bytes(b"half")
        with pytest.raises(ChangeLogError, match="another capture holds the change log"):
            with ChangeLog(tmp_path / "a" / "b").locked():
                pass
    with log.locked():
        assert [p.name for p in log.directory.iterdir()] == [".lock"]


def test_text_values_may_arrive_as_the_publishers_utf8_bytes_and_are_checked(tmp_path):
    log = ChangeLog(tmp_path / "log")
    with log.locked():
        writer = SegmentWriter(log, 100)
        writer.begin(200, TS_US, 7, None)
        writer.change(0, 150, INSERT, T1, new(b"1", "é✓".encode()), None, None)
        writer.change(1, 151, UPDATE, T1, new("2", b""), 0, new(b"1", None))
        writer.commit()
        table = read_segments([writer.finish(300)])
    assert table.column("new_values").to_pylist() == [["1", "é✓"], ["2", ""]]
    assert table.column("old_values").to_pylist() == [None, ["1", None]]

    with log.locked():
        writer = SegmentWriter(log, 300)
        writer.begin(400, TS_US, 8, None)
        writer.change(0, 350, INSERT, T1, new(b"1", b"\xff"), None, None)
        writer.commit()
        with pytest.raises(ChangeLogError, match=r"a text value is not valid UTF-8"):
            writer.finish(500)
        writer.abort()
    assert [s.end_lsn for s in log.segments()] == [300]


def test_images_decoded_in_bulk_become_list_columns_and_invalid_text_names_its_value():
    """The capture's path (core/pgoutput_columns.py): the error says which value the capture was writing."""
    messages = [b"I\x00\x00\x40\x10N\x00\x03t\x00\x00\x00\x011t\x00\x00\x00\x02\xc3\xa9n",
                b"D\x00\x00\x40\x10K\x00\x01t\x00\x00\x00\x012",
                b"U\x00\x00\x40\x10N\x00\x02t\x00\x00\x00\x013u"]
    buffer, starts, ends = message_buffer(messages)
    decoded = decode_changes(buffer, starts, ends)
    values, unchanged = image_arrays(buffer, decoded.new)
    assert values.to_pylist() == [["1", "é", None], None, ["3", None]]
    assert unchanged.to_pylist() == [[False, False, False], None, [False, True]]
    assert image_arrays(buffer, decoded.old)[0].to_pylist() == [None, ["2"], None]

    messages[1] = b"I\x00\x00\x40\x10N\x00\x02t\x00\x00\x00\x012t\x00\x00\x00\x02\xc3("
    buffer, starts, ends = message_buffer(messages)
    with pytest.raises(ChangeLogError, match=r"a text value is not valid UTF-8: b'\\xc3\('") as caught:
        image_arrays(buffer, decode_changes(buffer, starts, ends).new, "utf-8", lambda i, c: f"image {i} column {c}")
    assert caught.value.detail == "the value of image 1 column 1"
