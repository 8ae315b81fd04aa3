"""Decode the pgoutput logical replication protocol (PostgreSQL's "Logical Replication Message Formats").

One call of :func:`decode_message` turns one message, as returned in the ``data`` column of
``pg_logical_slot_peek_binary_changes(slot, …, 'proto_version', '1', 'publication_names', …)``,
into a frozen dataclass. Protocol version 1 is decoded, and version 2 without streaming (the same
bytes: the transaction id that version 2 puts in front of a message only appears inside a streamed
transaction). Streamed and two-phase transactions (``streaming``/``two_phase`` options, versions 2 to
4) are refused with :class:`PgOutputError`, as is any message type this module does not know.

Column values keep PostgreSQL's text form (``t``), or raw bytes when the ``binary`` option was on
(``b``); ``n`` is NULL and ``u`` an unchanged TOASTed value that the publisher did not send
(``logicalrep_write_tuple`` in src/backend/replication/logical/proto.c).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn
from airflow_provider_rowfilter.core.relation import ReplicaIdentity

# PostgreSQL timestamps count microseconds from 2000-01-01 00:00:00 UTC.
POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)
POSTGRES_EPOCH_UNIX_MICROS = 946_684_800_000_000

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">BQQq")
_COLUMN_TAIL = struct.Struct(">Ii")
_TRUNCATE_HEAD = struct.Struct(">iB")

# LOGICALREP_IS_REPLICA_IDENTITY in proto.c: the column is part of the replica identity key.
COLUMN_FLAG_KEY = 1
# TRUNCATE_CASCADE / TRUNCATE_RESTART_SEQS in proto.c.
TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2
# Message flag of pg_logical_emit_message(transactional => true).
MESSAGE_TRANSACTIONAL = 1


class MessageType(str, enum.Enum):
    """The first byte of a pgoutput message."""

    BEGIN = "B"
    COMMIT = "C"
    ORIGIN = "O"
    RELATION = "R"
    TYPE = "Y"
    INSERT = "I"
    UPDATE = "U"
    DELETE = "D"
    TRUNCATE = "T"
    MESSAGE = "M"
    # Streaming (protocol 2+) and two-phase (3+): recognised so that the error can name them.
    STREAM_START = "S"
    STREAM_STOP = "E"
    STREAM_COMMIT = "c"
    STREAM_ABORT = "A"
    BEGIN_PREPARE = "b"
    PREPARE = "P"
    COMMIT_PREPARED = "K"
    ROLLBACK_PREPARED = "r"
    STREAM_PREPARE = "p"


class TupleKind(str, enum.Enum):
    """What a tuple of an UPDATE or DELETE is: the old key, the old full row, or the new row."""

    KEY = "K"  # old replica-identity key (DEFAULT/INDEX identity; other columns are NULL)
    OLD = "O"  # old full row (REPLICA IDENTITY FULL)
    NEW = "N"


class PgOutputError(RowFilterError):
    """A pgoutput message that cannot be decoded: unknown type, unsupported feature, or malformed bytes."""

    def __init__(self, message: str, *, type_byte: str | None = None, lsn: int | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.type_byte = type_byte
        self.lsn = lsn


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # LSN of the transaction's commit record
    commit_ts: datetime
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int  # unused by PostgreSQL, always 0
    commit_lsn: int  # LSN of the commit record (the Begin's final_lsn)
    end_lsn: int  # end of the commit record: where a subscriber confirms to
    commit_ts: datetime


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: int  # the commit LSN on the origin server
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    flags: int
    name: str
    type_oid: int
    typmod: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & COLUMN_FLAG_KEY)


@dataclass(frozen=True, slots=True)
class RelationMessage:
    """pgoutput's Relation message: a table as the publisher describes it before its changes (the catalog's
    tables are core/relation.py's
    :class:`~airflow_provider_rowfilter.core.relation.Relation`)."""

    oid: int
    namespace: str  # "pg_catalog" is sent as ""
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class Type:
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class TupleData:
    """One row image: a value per column (str, or bytes with the binary option; None for NULL and
    for an unchanged TOASTed value) and, in parallel, whether the value was left unchanged."""

    values: tuple[str | bytes | None, ...]  # bytes: a binary value, or text kept raw (decode_message raw_text)
    unchanged: tuple[bool, ...]

    @property
    def has_unchanged(self) -> bool:
        return True in self.unchanged


@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    relation_oid: int
    old_kind: TupleKind | None  # None: no old tuple (identity unchanged and not TOASTed)
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    relation_oid: int
    old_kind: TupleKind
    old: TupleData


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_oids: tuple[int, ...]
    options: int

    @property
    def cascade(self) -> bool:
        return bool(self.options & TRUNCATE_CASCADE)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & TRUNCATE_RESTART_IDENTITY)


@dataclass(frozen=True, slots=True)
class Message:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


PgOutputMessage = Begin | Commit | Origin | RelationMessage | Type | Insert | Update | Delete | Truncate | Message

_FALSES: dict[int, tuple[bool, ...]] = {}


def pg_timestamp(micros: int) -> datetime:
    """Return the UTC datetime of a PostgreSQL timestamp (microseconds since 2000-01-01)."""
    return POSTGRES_EPOCH + timedelta(microseconds=micros)


def decode_message(data: bytes, lsn: int | None = None, *, encoding: str = "utf-8",
                   raw_text: bool = False) -> PgOutputMessage:
    """Decode one pgoutput message.

    :param data: the message bytes (the ``data`` column of the slot functions).
    :param lsn: the message's LSN, only used to say where a failing message was.
    :param encoding: the Python codec of the publisher's server encoding, for names and text values.
    :param raw_text: keep the tuples' text values as the publisher's bytes, undecoded (capture
        validates them a row group at a time, far faster than value by value); a binary value
        (the ``binary`` option) is then refused, since it would pass for text.
    :raises PgOutputError: on an unknown or unsupported message type, or malformed bytes.
    """
    if not data:
        raise PgOutputError(f"empty pgoutput message{_at(lsn)}", lsn=lsn)
    decoder = _DECODERS.get(data[0])
    if decoder is None:
        raise _refusal(data[0], lsn)
    try:
        tuple_decoder = _TUPLE_DECODERS.get(data[0]) if raw_text else None
        if tuple_decoder is not None:
            return tuple_decoder(data, None)
        return decoder(data, encoding)
    except _BinaryValue as e:
        kind = chr(data[0])
        raise PgOutputError(f"pgoutput message {kind!r} ({MessageType(kind).name}){_at(lsn)}: {e}",
                            type_byte=kind, lsn=lsn, hint="read the slot without the 'binary' option: the change "
                            "log keeps PostgreSQL's text form of every value") from e
    except (struct.error, IndexError, ValueError) as e:
        # ValueError covers UnicodeDecodeError and a missing string terminator.
        kind = chr(data[0])
        raise PgOutputError(f"malformed pgoutput message {kind!r} ({MessageType(kind).name}){_at(lsn)}: {e}",
                            type_byte=kind, lsn=lsn) from e


def _at(lsn: int | None) -> str:
    return "" if lsn is None else f" at LSN {format_lsn(lsn)}"


def _refusal(byte: int, lsn: int | None) -> PgOutputError:
    kind = chr(byte)
    try:
        known = MessageType(kind)
    except ValueError:
        return PgOutputError(f"unknown pgoutput message type {kind!r} (byte 0x{byte:02X}){_at(lsn)}",
                             type_byte=kind, lsn=lsn,
                             hint="read the slot with proto_version '1' (or '2' without streaming)")
    return PgOutputError(f"unsupported pgoutput message {kind!r} ({known.name}){_at(lsn)}", type_byte=kind, lsn=lsn,
                         hint="streamed and two-phase transactions are not decoded: read the slot without the "
                         "'streaming' and 'two_phase' options")


class _BinaryValue(ValueError):
    """A binary value (the ``binary`` option) where ``raw_text`` asked for text as bytes."""


def _string(data: bytes, pos: int, encoding: str) -> tuple[str, int]:
    end = data.index(0, pos)
    return data[pos:end].decode(encoding), end + 1


def _tuple(data: bytes, pos: int, encoding: str | None, unpack=_I32.unpack_from) -> tuple[TupleData, int]:
    # The hot path of a capture: local names, no per-value bounds check (a value running past the end
    # leaves ``pos`` beyond the message, which _end reports). ``encoding`` None keeps text values as
    # the publisher's bytes (decode_message's ``raw_text``).
    count = data[pos] << 8 | data[pos + 1]
    pos += 2
    values: list[str | bytes | None] = []
    append = values.append
    unchanged: list[int] | None = None
    for i in range(count):
        kind = data[pos]
        if kind == 0x74:  # 't'
            end = pos + 5 + unpack(data, pos + 1)[0]
            append(data[pos + 5:end] if encoding is None else data[pos + 5:end].decode(encoding))
            pos = end
        elif kind == 0x6E:  # 'n'
            append(None)
            pos += 1
        elif kind == 0x75:  # 'u'
            append(None)
            pos += 1
            if unchanged is None:
                unchanged = []
            unchanged.append(i)
        elif kind == 0x62:  # 'b'
            if encoding is None:  # as bytes, it would pass for text
                raise _BinaryValue(f"binary value in column {i + 1}, but text values were asked for as bytes")
            end = pos + 5 + unpack(data, pos + 1)[0]
            append(bytes(data[pos + 5:end]))
            pos = end
        else:
            raise ValueError(f"unknown column kind {chr(kind)!r} (byte 0x{kind:02X}) in column {i + 1}")
    if unchanged is None:
        flags = _FALSES.get(count)
        if flags is None:
            flags = _FALSES.setdefault(count, (False,) * count)
    else:
        marked = set(unchanged)
        flags = tuple(i in marked for i in range(count))
    return TupleData(tuple(values), flags), pos


def _end(data: bytes, pos: int) -> None:
    if pos > len(data):
        raise ValueError(f"the message ends {pos - len(data)} bytes early")
    if pos < len(data):
        raise ValueError(f"{len(data) - pos} trailing bytes")


def _begin(data: bytes, encoding: str) -> Begin:
    final_lsn, ts, xid = _BEGIN.unpack_from(data, 1)
    _end(data, 1 + _BEGIN.size)
    return Begin(final_lsn, pg_timestamp(ts), xid)


def _commit(data: bytes, encoding: str) -> Commit:
    flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(data, 1)
    _end(data, 1 + _COMMIT.size)
    return Commit(flags, commit_lsn, end_lsn, pg_timestamp(ts))


def _origin(data: bytes, encoding: str) -> Origin:
    (lsn,) = _U64.unpack_from(data, 1)
    name, pos = _string(data, 9, encoding)
    _end(data, pos)
    return Origin(lsn, name)


def _relation(data: bytes, encoding: str) -> RelationMessage:
    (oid,) = _U32.unpack_from(data, 1)
    namespace, pos = _string(data, 5, encoding)
    name, pos = _string(data, pos, encoding)
    identity = ReplicaIdentity(chr(data[pos]))
    (count,) = _I16.unpack_from(data, pos + 1)
    pos += 3
    columns = []
    for _ in range(count):
        flags = data[pos]
        column, pos = _string(data, pos + 1, encoding)
        type_oid, typmod = _COLUMN_TAIL.unpack_from(data, pos)
        pos += _COLUMN_TAIL.size
        columns.append(RelationColumn(flags, column, type_oid, typmod))
    _end(data, pos)
    return RelationMessage(oid, namespace, name, identity, tuple(columns))


def _type(data: bytes, encoding: str) -> Type:
    (oid,) = _U32.unpack_from(data, 1)
    namespace, pos = _string(data, 5, encoding)
    name, pos = _string(data, pos, encoding)
    _end(data, pos)
    return Type(oid, namespace, name)


def _insert(data: bytes, encoding: str | None) -> Insert:
    (oid,) = _U32.unpack_from(data, 1)
    if data[5] != 0x4E:  # 'N'
        raise ValueError(f"expected 'N' before the new tuple, found {chr(data[5])!r}")
    new, pos = _tuple(data, 6, encoding)
    _end(data, pos)
    return Insert(oid, new)


def _update(data: bytes, encoding: str | None) -> Update:
    (oid,) = _U32.unpack_from(data, 1)
    pos = 5
    old_kind: TupleKind | None = None
    old: TupleData | None = None
    if data[pos] in (0x4B, 0x4F):  # 'K', 'O'
        old_kind = TupleKind(chr(data[pos]))
        old, pos = _tuple(data, pos + 1, encoding)
    if data[pos] != 0x4E:
        raise ValueError(f"expected 'N' before the new tuple, found {chr(data[pos])!r}")
    new, pos = _tuple(data, pos + 1, encoding)
    _end(data, pos)
    return Update(oid, old_kind, old, new)


def _delete(data: bytes, encoding: str | None) -> Delete:
    (oid,) = _U32.unpack_from(data, 1)
    if data[5] not in (0x4B, 0x4F):
        raise ValueError(f"expected 'K' or 'O' before the old tuple, found {chr(data[5])!r}")
    old, pos = _tuple(data, 6, encoding)
    _end(data, pos)
    return Delete(oid, TupleKind(chr(data[5])), old)


def _truncate(data: bytes, encoding: str) -> Truncate:
    count, options = _TRUNCATE_HEAD.unpack_from(data, 1)
    pos = 1 + _TRUNCATE_HEAD.size
    oids = struct.unpack_from(f">{count}I", data, pos)
    _end(data, pos + 4 * count)
    return Truncate(tuple(oids), options)


def _message(data: bytes, encoding: str) -> Message:
    flags = data[1]
    (lsn,) = _U64.unpack_from(data, 2)
    prefix, pos = _string(data, 10, encoding)
    (length,) = _I32.unpack_from(data, pos)
    pos += 4
    content = bytes(data[pos:pos + length])
    if len(content) != length:
        raise ValueError(f"content claims {length} bytes, {len(content)} left")
    _end(data, pos + length)
    return Message(bool(flags & MESSAGE_TRANSACTIONAL), lsn, prefix, content)


#: The decoders of the messages that carry tuples: given no encoding, they keep text values as bytes.
_TUPLE_DECODERS: dict[int, Callable[[bytes, str | None], PgOutputMessage]] = {
    ord("I"): _insert,
    ord("U"): _update,
    ord("D"): _delete,
}
_DECODERS: dict[int, Callable[[bytes, str], PgOutputMessage]] = {
    ord("B"): _begin,
    ord("C"): _commit,
    ord("O"): _origin,
    ord("R"): _relation,
    ord("Y"): _type,
    **_TUPLE_DECODERS,
    ord("T"): _truncate,
    ord("M"): _message,
}
