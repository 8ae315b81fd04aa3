"""pgoutput messages as bytes, built from the protocol documentation ("Logical Replication Message
Formats") independently of the decoder, and hypothesis strategies of them: shared by the tests of
core/pgoutput.py and publisher/pgoutput_columns.py."""

from __future__ import annotations

import struct
from datetime import datetime, timedelta, timezone

from hypothesis import strategies as st

from airflow_provider_rowfilter.core.pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    RelationColumn,
    RelationMessage,
    Truncate,
    TupleData,
    TupleKind,
    Type,
    Update,
)
from airflow_provider_rowfilter.core.relation import ReplicaIdentity

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


text_ = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
value_ = st.one_of(st.none(), text_, st.binary(max_size=20))


@st.composite
def tuples(draw, width=None):
    width = draw(st.integers(0, 6)) if width is None else width
    values = draw(st.lists(value_, min_size=width, max_size=width))
    unchanged = draw(st.lists(st.booleans(), min_size=width, max_size=width))
    return TupleData(tuple(None if u else v for v, u in zip(values, unchanged, strict=True)), tuple(unchanged))


oid_ = st.integers(0, 2**32 - 1)
lsn_ = st.integers(0, 2**64 - 1)
ts_ = st.datetimes(datetime(1990, 1, 1), datetime(2200, 1, 1), timezones=st.just(timezone.utc))
name_ = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
messages = st.one_of(
    st.builds(Begin, lsn_, ts_, st.integers(0, 2**32 - 1)),
    st.builds(Commit, st.just(0), lsn_, lsn_, ts_),
    st.builds(Origin, lsn_, name_),
    st.builds(RelationMessage, oid_, name_, name_, st.sampled_from(ReplicaIdentity), st.lists(st.builds(
        RelationColumn, st.integers(0, 1), name_, oid_, st.integers(-(2**31), 2**31 - 1)), max_size=5).map(tuple)),
    st.builds(Type, oid_, name_, name_),
    st.builds(Insert, oid_, tuples()),
    st.builds(Update, oid_, st.none(), st.none(), tuples()),
    st.builds(Update, oid_, st.just(TupleKind.KEY), tuples(), tuples()),
    st.builds(Update, oid_, st.just(TupleKind.OLD), tuples(), tuples()),
    st.builds(Delete, oid_, st.sampled_from([TupleKind.KEY, TupleKind.OLD]), tuples()),
    st.builds(Truncate, st.lists(oid_, max_size=5).map(tuple), st.integers(0, 3)),
    st.builds(Message, st.booleans(), lsn_, name_, st.binary(max_size=30)),
)


BIG = "0123456789" * 1000  # a value as long as a TOASTed one


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
