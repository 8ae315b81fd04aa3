"""The pgoutput decoder (core/pgoutput.py, publisher/pgoutput_columns.py) on hand-built bytes.

The bytes come from :func:`encode`, written from the protocol documentation ("Logical Replication
Message Formats"), independent of the decoder. The same decoder on bytes PostgreSQL produced is
tested in tests/publisher/test_pgoutput_from_a_slot.py.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.pgoutput import (
    Begin,
    Delete,
    Insert,
    PgOutputError,
    Truncate,
    TupleData,
    Update,
    decode_message,
    pg_timestamp,
)
from tests.pgoutput_messages import EDGE_CASES, TS, encode, messages, row


@pytest.mark.parametrize("message", EDGE_CASES.values(), ids=EDGE_CASES.keys())
def test_hand_built_message_decodes_to_what_was_encoded(message):
    assert decode_message(encode(message), 1) == message


def test_unchanged_toast_is_marked_and_has_no_value():
    decoded = decode_message(b"I\x00\x00\x40\x10N\x00\x03t\x00\x00\x00\x011ut\x00\x00\x00\x017", 0)
    assert decoded == Insert(0x4010, TupleData(("1", None, "7"), (False, True, False)))
    assert decoded.new.has_unchanged and not row("1").has_unchanged


def test_truncate_flags():
    assert [(m.cascade, m.restart_identity) for m in (Truncate((1,), o) for o in range(4))] == [
        (False, False), (True, False), (False, True), (True, True)]


def test_timestamps_are_microseconds_since_2000_utc():
    assert pg_timestamp(0) == datetime(2000, 1, 1, tzinfo=timezone.utc)
    assert decode_message(encode(Begin(1, TS, 2))).commit_ts == TS


@pytest.mark.parametrize(("data", "error"), [
    (b"Z\x00", r"unknown pgoutput message type 'Z' \(byte 0x5A\) at LSN 0/16B3748"),
    (b"\x00", r"unknown pgoutput message type '\\x00' \(byte 0x00\) at LSN 0/16B3748"),
    (b"S\x00\x00\x00\x01\x01", r"unsupported pgoutput message 'S' \(STREAM_START\) at LSN 0/16B3748"),
    (b"b", r"unsupported pgoutput message 'b' \(BEGIN_PREPARE\)"),
    (b"", r"empty pgoutput message at LSN 0/16B3748"),
    (b"B\x00\x00", r"malformed pgoutput message 'B' \(BEGIN\) at LSN 0/16B3748"),
    (encode(EDGE_CASES["begin"]) + b"\x00", r"malformed .* 1 trailing bytes"),
    (b"I\x00\x00\x40\x10N\x00\x01t\x00\x00\x00\x09ab", r"malformed pgoutput message 'I' .* ends 7 bytes early"),
    (b"I\x00\x00\x40\x10N\x00\x01x", r"unknown column kind 'x' \(byte 0x78\) in column 1"),
    (b"I\x00\x00\x40\x10K\x00\x00", r"expected 'N' before the new tuple, found 'K'"),
    (b"D\x00\x00\x40\x10N\x00\x00", r"expected 'K' or 'O' before the old tuple, found 'N'"),
    (b"R\x00\x00\x40\x10public\x00t\x00x\x00\x00", r"malformed pgoutput message 'R' \(RELATION\)"),
    (b"R\x00\x00\x40\x10public", r"malformed pgoutput message 'R'"),
    (b"I\x00\x00\x40\x10N\x00\x01t\x00\x00\x00\x01\xff", r"malformed .*can't decode byte 0xff"),
], ids=["unknown-type", "nul-type", "streaming", "two-phase", "empty", "short-begin", "trailing-bytes",
        "value-past-the-end", "unknown-column-kind", "insert-without-new", "delete-without-old",
        "unknown-replica-identity", "unterminated-string", "invalid-utf8"])
def test_undecodable_messages_raise_with_the_byte_and_the_lsn(data, error):
    with pytest.raises(PgOutputError, match=error) as caught:
        decode_message(data, 0x16B3748)
    assert isinstance(caught.value, RowFilterError)
    if data:
        assert caught.value.type_byte == chr(data[0]) and caught.value.lsn == 0x16B3748




@given(messages)
def test_every_message_round_trips(message):
    assert decode_message(encode(message)) == message


@given(messages, st.data())
def test_a_cut_message_raises_a_decoding_error(message, data):
    raw = encode(message)
    cut = data.draw(st.integers(1, len(raw) - 1)) if len(raw) > 1 else 0
    if cut:
        with pytest.raises(PgOutputError):
            decode_message(raw[:cut], 7)


TEXT_ROW_CASES = {k: m for k, m in EDGE_CASES.items() if isinstance(m, Insert | Update | Delete)
                  and k != "insert-binary-value"}


@pytest.mark.parametrize("message", TEXT_ROW_CASES.values(), ids=TEXT_ROW_CASES.keys())
def test_raw_text_keeps_the_publishers_bytes_of_every_text_value(message):
    raw = decode_message(encode(message), 1, raw_text=True)

    def as_bytes(data):
        return None if data is None else TupleData(
            tuple(v.encode() if isinstance(v, str) else v for v in data.values), data.unchanged)
    expected = {f: getattr(message, f) for f in message.__slots__}
    for side in ("new", "old"):
        if side in expected:
            expected[side] = as_bytes(expected[side])
    assert raw == type(message)(**expected)
    assert all(isinstance(v, bytes | None) for t in (getattr(raw, "new", None), getattr(raw, "old", None))
               if t is not None for v in t.values)


def test_raw_text_refuses_a_binary_value_that_would_pass_for_text():
    data = b"I\x00\x00\x40\x10N\x00\x01b\x00\x00\x00\x02\x00\x01"
    assert decode_message(data, 0) == Insert(0x4010, TupleData((b"\x00\x01",), (False,)))
    with pytest.raises(PgOutputError, match=r"binary value in column 1, but text values were asked for as bytes") as e:
        decode_message(data, 0, raw_text=True)
    assert "without the 'binary' option" in e.value.hint

