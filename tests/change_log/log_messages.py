"""pgoutput messages and one fetch's change rows built as the capture builds them, for the change-log tests."""

from __future__ import annotations

import struct
from datetime import datetime, timezone

import numpy as np

from airflow_provider_rowfilter.change_log.segment_schema import DELETE, INSERT, TRUNCATE, UPDATE, ChangeRows, LoggedRelation
from airflow_provider_rowfilter.publisher.image_arrays import image_arrays
from airflow_provider_rowfilter.publisher.pgoutput_columns import decode_changes, message_buffer

T1 = LoggedRelation(16400, "public", "t1", "d", ("a", "b"), ("integer", "text"), (23, 25), (-1, -1), (True, False))
T1_V2 = LoggedRelation(16400, "public", "t1", "d", ("a", "b", "c"), ("integer", "text", "bigint"), (23, 25, 20),
                       (-1, -1, -1), (True, False, False))
TS = datetime(2024, 5, 17, 12, 30, 1, 123456, tzinfo=timezone.utc)
TS_US = 1715949001123456


def tup(*values, unchanged=()):
    """A pgoutput TupleData: ``t`` text (str, or the publisher's bytes), ``n`` NULL, ``u`` unchanged TOAST."""
    out = struct.pack("!h", len(values))
    for i, value in enumerate(values):
        if i in unchanged:
            out += b"u"
        elif value is None:
            out += b"n"
        else:
            data = value.encode() if isinstance(value, str) else value
            out += b"t" + struct.pack("!i", len(data)) + data
    return out


def insert(new):
    return b"I" + struct.pack("!I", 16400) + b"N" + new


def update(new, old_kind=None, old=None):
    return b"U" + struct.pack("!I", 16400) + (old_kind.encode() + old if old_kind else b"") + b"N" + new


def delete(old_kind, old):
    return b"D" + struct.pack("!I", 16400) + old_kind.encode() + old


KIND_OF_MESSAGE = {ord("I"): INSERT, ord("U"): UPDATE, ord("D"): DELETE}


def fetch(txns, changes, where=None):
    """:class:`ChangeRows` of one fetch, built as the capture builds them (publisher/change_reader.py ``ChangeReader._write``).

    ``changes``: ``(txn index, seq, lsn, relation, message)`` in slot order; a message is an encoded
    INSERT/UPDATE/DELETE, or the options of a TRUNCATE of ``relation``. The images go the capture's
    way: one buffer, decoded together (publisher/pgoutput_columns.py), gathered by :func:`image_arrays`.
    """
    relations = list(dict.fromkeys(c[3] for c in changes))
    positions = np.array([i for i, c in enumerate(changes) if isinstance(c[4], bytes)], np.int64)
    buffer, starts, ends = message_buffer([c[4] for c in changes if isinstance(c[4], bytes)])
    decoded = decode_changes(buffer, starts, ends)
    old_kind = np.full(len(changes), -1, np.int8)
    old_kind[positions] = decoded.old_kind
    return ChangeRows(
        list(zip(*txns, strict=True)), [c[0] for c in changes], relations,
        [relations.index(c[3]) for c in changes], [c[1] for c in changes], [c[2] for c in changes],
        [KIND_OF_MESSAGE[c[4][0]] if isinstance(c[4], bytes) else TRUNCATE for c in changes], old_kind,
        [-1 if isinstance(c[4], bytes) else c[4] for c in changes],
        image_arrays(buffer, decoded.new.placed(positions, len(changes)), "utf-8", where),
        image_arrays(buffer, decoded.old.placed(positions, len(changes)), "utf-8", where))
