"""The pgoutput decoder (core/pgoutput.py, publisher/pgoutput_columns.py) on hand-built bytes.

The bytes come from :func:`encode`, written from the protocol documentation ("Logical Replication
Message Formats"), independent of the decoder. The same decoder on bytes PostgreSQL produced is
tested in tests/pg/test_pgoutput.py.
"""

from __future__ import annotations

import struct
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputError,
    RelationColumn,
    RelationMessage,
    Truncate,
    TupleData,
    TupleKind,
    Type,
    Update,
    decode_message,
    pg_timestamp,
)
from airflow_provider_rowfilter.core.relation import ReplicaIdentity
from airflow_provider_rowfilter.publisher.pgoutput_columns import Irregular, decode_changes, message_buffer

BIG = "0123456789" * 1000  # a value as long as a TOASTed one

# --- hand-built bytes -------------------------------------------------------------------------------

def _s(text: str) -> bytes:
    return text.encode() + b"\0"


def _micros(ts: datetime) -> int:
    return (ts - datetime(2000, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)


def _tuple(data: TupleData) -> bytes:
    out = struct.pack(">h", len(data.values))
    for value, unchanged in zip(data.values, data.unchanged, strict=True):
        if unchanged:
            out += b"u"
        elif value is None:
            out += b"n"
        elif isinstance(value, bytes):
            out += b"b" + struct.pack(">i", len(value)) + value
        else:
            raw = value.encode()
            out += b"t" + struct.pack(">i", len(raw)) + raw
    return out


def encode(message) -> bytes:
    """Build the bytes of one pgoutput message (protocol version 1) from its dataclass."""
    if isinstance(message, Begin):
        return b"B" + struct.pack(">QqI", message.final_lsn, _micros(message.commit_ts), message.xid)
    if isinstance(message, Commit):
        return b"C" + struct.pack(">BQQq", message.flags, message.commit_lsn, message.end_lsn,
                                  _micros(message.commit_ts))
    if isinstance(message, Origin):
        return b"O" + struct.pack(">Q", message.commit_lsn) + _s(message.name)
    if isinstance(message, RelationMessage):
        out = b"R" + struct.pack(">I", message.oid) + _s(message.namespace) + _s(message.name)
        out += message.replica_identity.value.encode() + struct.pack(">h", len(message.columns))
        for c in message.columns:
            out += struct.pack(">B", c.flags) + _s(c.name) + struct.pack(">Ii", c.type_oid, c.typmod)
        return out
    if isinstance(message, Type):
        return b"Y" + struct.pack(">I", message.oid) + _s(message.namespace) + _s(message.name)
    if isinstance(message, Insert):
        return b"I" + struct.pack(">I", message.relation_oid) + b"N" + _tuple(message.new)
    if isinstance(message, Update):
        old = b"" if message.old is None else message.old_kind.value.encode() + _tuple(message.old)
        return b"U" + struct.pack(">I", message.relation_oid) + old + b"N" + _tuple(message.new)
    if isinstance(message, Delete):
        return (b"D" + struct.pack(">I", message.relation_oid) + message.old_kind.value.encode()
                + _tuple(message.old))
    if isinstance(message, Truncate):
        return (b"T" + struct.pack(">iB", len(message.relation_oids), message.options)
                + struct.pack(f">{len(message.relation_oids)}I", *message.relation_oids))
    if isinstance(message, Message):
        return (b"M" + struct.pack(">BQ", int(message.transactional), message.lsn) + _s(message.prefix)
                + struct.pack(">i", len(message.content)) + message.content)
    raise TypeError(message)


def row(*values, unchanged=()) -> TupleData:
    return TupleData(tuple(values), tuple(i in unchanged for i in range(len(values))))


TS = datetime(2024, 5, 17, 12, 30, 1, 123456, tzinfo=timezone.utc)

EDGE_CASES = {
    "unchanged-toast-in-new-row": Update(16400, None, None, row("1", None, "7", unchanged={1})),
    "unchanged-toast-with-old-full-row": Update(16400, TupleKind.OLD, row("1", BIG, "6"),
                                                row("1", None, "7", unchanged={1})),
    "old-key-only": Update(16400, TupleKind.KEY, row("1", None, None), row("2", "x", "7")),
    "old-full-row": Update(16400, TupleKind.OLD, row("1", "x", "6"), row("1", "x", "7")),
    "delete-old-key": Delete(16400, TupleKind.KEY, row("1", None, None)),
    "delete-old-full-row": Delete(16400, TupleKind.OLD, row("1", "x", None)),
    "insert-nulls-and-empty-text": Insert(16400, row(None, "", "é✓\t\n\\")),
    "insert-binary-value": Insert(16400, row("1", b"\x00\xff")),
    "insert-zero-columns": Insert(16400, row()),
    "truncate-plain": Truncate((16400,), 0),
    "truncate-cascade": Truncate((16400, 16401), 1),
    "truncate-restart-identity": Truncate((16400,), 2),
    "truncate-cascade-restart-identity": Truncate((16400, 16401, 16402), 3),
    "relation-every-identity": RelationMessage(16400, "s p", "t ä", ReplicaIdentity.INDEX, (
        RelationColumn(1, "id", 23, -1), RelationColumn(0, "price", 1700, 655366))),
    "relation-pg-catalog-namespace-is-empty": RelationMessage(1259, "", "pg_class", ReplicaIdentity.NOTHING, ()),
    "type": Type(16390, "public", "mood"),
    "origin": Origin(0xFFFFFFFF00000010, "node one"),
    "message-transactional": Message(True, 0x1_0000_0000, "pfx", b"\x00payload"),
    "message-not-transactional": Message(False, 42, "", b""),
    "begin": Begin(0x16B3748, TS, 4_294_967_295),
    "commit": Commit(0, 0x16B3748, 0x16B3778, TS),
}


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


_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
_value = st.one_of(st.none(), _text, st.binary(max_size=20))


@st.composite
def _tuples(draw, width=None):
    width = draw(st.integers(0, 6)) if width is None else width
    values = draw(st.lists(_value, min_size=width, max_size=width))
    unchanged = draw(st.lists(st.booleans(), min_size=width, max_size=width))
    return TupleData(tuple(None if u else v for v, u in zip(values, unchanged, strict=True)), tuple(unchanged))


_oid = st.integers(0, 2**32 - 1)
_lsn = st.integers(0, 2**64 - 1)
_ts = st.datetimes(datetime(1990, 1, 1), datetime(2200, 1, 1), timezones=st.just(timezone.utc))
_name = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
_messages = st.one_of(
    st.builds(Begin, _lsn, _ts, st.integers(0, 2**32 - 1)),
    st.builds(Commit, st.just(0), _lsn, _lsn, _ts),
    st.builds(Origin, _lsn, _name),
    st.builds(RelationMessage, _oid, _name, _name, st.sampled_from(ReplicaIdentity), st.lists(st.builds(
        RelationColumn, st.integers(0, 1), _name, _oid, st.integers(-(2**31), 2**31 - 1)), max_size=5).map(tuple)),
    st.builds(Type, _oid, _name, _name),
    st.builds(Insert, _oid, _tuples()),
    st.builds(Update, _oid, st.none(), st.none(), _tuples()),
    st.builds(Update, _oid, st.just(TupleKind.KEY), _tuples(), _tuples()),
    st.builds(Update, _oid, st.just(TupleKind.OLD), _tuples(), _tuples()),
    st.builds(Delete, _oid, st.sampled_from([TupleKind.KEY, TupleKind.OLD]), _tuples()),
    st.builds(Truncate, st.lists(_oid, max_size=5).map(tuple), st.integers(0, 3)),
    st.builds(Message, st.booleans(), _lsn, _name, st.binary(max_size=30)),
)


@given(_messages)
def test_every_message_round_trips(message):
    assert decode_message(encode(message)) == message


@given(_messages, st.data())
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


# --- many change messages at once (publisher/pgoutput_columns.py) -------------------------------------------

_text_tuples = _tuples().filter(lambda t: not any(isinstance(v, bytes) for v in t.values))
_changes = st.one_of(
    st.builds(Insert, _oid, _text_tuples),
    st.builds(Update, _oid, st.none(), st.none(), _text_tuples),
    st.builds(Update, _oid, st.sampled_from([TupleKind.KEY, TupleKind.OLD]), _text_tuples, _text_tuples),
    st.builds(Delete, _oid, st.sampled_from([TupleKind.KEY, TupleKind.OLD]), _text_tuples),
)


def _columns(messages: list[bytes]):
    buffer, starts, ends = message_buffer(messages)
    return buffer, decode_changes(buffer, starts, ends)


def _image_at(buffer, images, i):
    """Image ``i`` of decode_changes' output, as decode_message(raw_text=True) gives it."""
    if not images.present[i]:
        return None
    cells = range(images.offsets[i], images.offsets[i + 1])
    return TupleData(
        tuple(bytes(buffer[images.starts[c]:images.starts[c] + images.lengths[c]]) if images.kinds[c] == ord("t")
              else None for c in cells),
        tuple(bool(images.kinds[c] == ord("u")) for c in cells))


@given(st.lists(_changes, max_size=25))
def test_changes_decoded_together_equal_each_decoded_alone(messages):
    raw = [encode(m) for m in messages]
    buffer, columns = _columns(raw)
    for i, data in enumerate(raw):
        alone = decode_message(data, raw_text=True)
        assert columns.relation_oid[i] == alone.relation_oid
        old_kind = getattr(alone, "old_kind", None)
        assert columns.old_kind[i] == (-1 if old_kind is None else "KO".index(old_kind.value))
        assert _image_at(buffer, columns.new, i) == getattr(alone, "new", None)
        assert _image_at(buffer, columns.old, i) == getattr(alone, "old", None)


@given(st.lists(_changes, min_size=1, max_size=5), st.data())
def test_a_cut_or_padded_change_among_others_is_irregular(messages, data):
    raw = [encode(m) for m in messages]
    i = data.draw(st.integers(0, len(raw) - 1))
    cut = data.draw(st.integers(0, len(raw[i]) - 1))
    for bad in (raw[i][:cut], raw[i] + b"\x00"):
        with pytest.raises(Irregular):
            _columns([*raw[:i], bad, *raw[i + 1:]])


@pytest.mark.parametrize("data", [
    encode(EDGE_CASES["insert-binary-value"]),
    encode(EDGE_CASES["begin"]),
    b"I\x00\x00\x40\x10N\x00\x01x",
    b"I\x00\x00\x40\x10N\x00\x01t\xff\xff\xff\xff",
    b"I\x00\x00\x40\x10K\x00\x00",
    b"U\x00\x00\x40\x10K\x00\x00X\x00\x00",
], ids=["binary-value", "not-a-change", "unknown-column-kind", "negative-length", "insert-without-new",
        "update-without-new-after-old"])
def test_what_decode_changes_does_not_know_is_irregular(data):
    good = encode(EDGE_CASES["old-full-row"])
    with pytest.raises(Irregular):
        _columns([good, data, good])
