"""Fetches of pgoutput messages from a slot turned into change-log rows, keeping what spans fetches.

publisher/capture.py reads the slot a fetch at a time and hands each fetch to a :class:`ChangeReader`.
The INSERT, UPDATE and DELETE messages of a fetch (nearly all) are decoded together, as columns
(publisher/pgoutput_columns.py, in C where built); the Begin and Commit messages together too when
they come in turn; any other message one by one, in order, by
:func:`~airflow_provider_rowfilter.core.pgoutput.decode_message`. The rows go to a
:class:`~airflow_provider_rowfilter.change_log.segment_writer.SegmentWriter` as columns
(:class:`~airflow_provider_rowfilter.change_log.segment_schema.ChangeRows`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import NoReturn

import numpy as np
import psycopg

from airflow_provider_rowfilter.change_log.log import ChangeLogError
from airflow_provider_rowfilter.change_log.segment_schema import (
    DELETE,
    INSERT,
    KINDS,
    TRUNCATE,
    UPDATE,
    ChangeRows,
    LoggedRelation,
)
from airflow_provider_rowfilter.change_log.segment_writer import SegmentWriter
from airflow_provider_rowfilter.core.lsn import format_lsn
from airflow_provider_rowfilter.core.pgoutput import (
    POSTGRES_EPOCH,
    POSTGRES_EPOCH_UNIX_MICROS,
    Begin,
    Commit,
    Origin,
    PgOutputError,
    RelationMessage,
    Truncate,
    Type,
    decode_message,
    pg_timestamp,
)
from airflow_provider_rowfilter.publisher import pgoutput_columns
from airflow_provider_rowfilter.publisher.image_arrays import image_arrays
from airflow_provider_rowfilter.publisher.pgoutput_columns import (
    ChangeColumns,
    Irregular,
    decode_changes,
    join_rows,
)

_CHANGE_CODES = (pgoutput_columns.INSERT, pgoutput_columns.UPDATE, pgoutput_columns.DELETE)
_KIND_OF_CODE = np.zeros(256, np.int8)  # a change message's first byte -> its kind in the log
_KIND_OF_CODE[list(_CHANGE_CODES)] = INSERT, UPDATE, DELETE


@dataclass
class Batch:
    messages: int = 0
    end_lsn: int | None = None
    last_commit_ts: datetime | None = None
    kinds: Counter = field(default_factory=Counter)


class Datas:
    """The messages of a fetch's rows, one by one (for those decoded one by one), without a list of them."""

    def __init__(self, rows: list[tuple[int, bytes]]) -> None:
        self.rows = rows

    def __getitem__(self, i: int) -> bytes:
        return self.rows[i][1]


@dataclass
class Fetch:
    """One fetch of slot rows: the messages joined in one buffer (publisher/pgoutput_columns.py)."""

    datas: Datas | list[bytes]
    lsns: np.ndarray
    buffer: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    @cached_property
    def kinds(self) -> np.ndarray:
        """Each message's first byte (read once no message is empty)."""
        return self.buffer[self.starts]

    @cached_property
    def is_change(self) -> np.ndarray:
        return np.isin(self.kinds, _CHANGE_CODES)

    @cached_property
    def changes(self) -> np.ndarray:
        """Positions of the INSERT, UPDATE and DELETE messages."""
        return np.flatnonzero(self.is_change)


@dataclass
class Walk:
    """What the messages of a fetch other than changes say about the changes between them."""

    #: the fetch's transactions (commit_lsn, commit time in µs, xid, origin); the open one first
    txns: list[tuple[int, int, int, str | None]]
    #: the relations known before the fetch, by oid
    prior: dict[int, LoggedRelation]
    #: runs of changes: first change, length, transaction, first seq, how many Relation messages came before
    runs: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    #: truncated relations: message position, place in the message, relation, seq, transaction, options
    truncates: list[tuple[int, int, LoggedRelation, int, int, int]] = field(default_factory=list)
    #: the fetch's Relation messages by oid, each with its number among them
    announced: dict[int, list[tuple[int, LoggedRelation]]] = field(default_factory=dict)
    transactions: int = 0  # committed in the fetch, with at least one change


class ChangeReader:
    """Turns fetches of slot rows into change-log rows, keeping what spans fetches (relations, open transaction).

    INSERT, UPDATE and DELETE messages (nearly all) are decoded together, as columns
    (publisher/pgoutput_columns.py); the others one by one, in order, by
    :func:`~airflow_provider_rowfilter.core.pgoutput.decode_message`. Between two of those others
    lies a *run* of changes: one transaction, one set of relations.
    """

    def __init__(self, writer: SegmentWriter, types: TypeNames, encoding: str) -> None:
        self.writer = writer
        self.types = types
        self.encoding = encoding
        self.relations: dict[int, LoggedRelation] = {}
        self.txn: tuple[int, int, int, str | None] | None = None  # commit_lsn, commit time (µs), xid, origin
        self.seq = 0  # changes so far in the open transaction
        self.batch = Batch()

    def read(self, rows: list[tuple[int, bytes]]) -> None:
        buffer, lsns, starts, ends = join_rows(rows)
        fetch = Fetch(Datas(rows), lsns, buffer, starts, ends)
        self.batch.messages += len(rows)
        if (ends == starts).any():
            self._refuse(fetch, np.flatnonzero(ends == starts))
        walk = self._walk(fetch)
        self.writer.end_transactions(walk.transactions)
        if len(fetch.changes) == 0 and not walk.truncates:
            return
        try:
            decoded = decode_changes(buffer, starts[fetch.changes], ends[fetch.changes])
        except Irregular:
            self._refuse(fetch, fetch.changes)
        self._write(fetch, walk, decoded)

    def _walk(self, fetch: Fetch) -> Walk:
        """Decode the messages other than changes in order; each stretch of changes between two of them is a run."""
        return self._walk_transactions(fetch) or self._walk_each(fetch)

    def _walk_transactions(self, fetch: Fetch) -> Walk | None:
        """:meth:`_walk_each`'s result for the usual fetch, whose only other messages are the transactions'
        Begin and Commit, well formed and in turn: decoded together, as columns (nearly half a pgbench
        fetch's messages; one by one they were a fifth of the capture's time). None for any other fetch,
        which is left to :meth:`_walk_each` (it names what is wrong), with nothing changed."""
        others = np.flatnonzero(~fetch.is_change)
        kinds, sizes = fetch.kinds[others], fetch.ends[others] - fetch.starts[others]
        is_begin = kinds == pgoutput_columns.BEGIN
        # In turn: Commit first when a transaction is open, then Begin, Commit, Begin, …
        if not ((is_begin == (np.arange(len(others)) % 2 == (self.txn is not None))).all()
                and (kinds[~is_begin] == pgoutput_columns.COMMIT).all()
                and (sizes[is_begin] == pgoutput_columns.BEGIN_SIZE).all()
                and (sizes[~is_begin] == pgoutput_columns.COMMIT_SIZE).all()):
            return None
        starts = fetch.starts[others]
        try:
            b = pgoutput_columns.decode_bounds(fetch.buffer, starts[is_begin], starts[~is_begin])
        except Irregular:
            return None
        opened = [] if self.txn is None else [self.txn]
        if not opened and not len(others):
            return None  # changes and no transaction at all
        txns = opened + list(zip(b.final_lsn.tolist(), (b.begin_ts + POSTGRES_EPOCH_UNIX_MICROS).tolist(), b.xid.tolist(),
                                 [None] * len(b.xid), strict=True))
        if [t[0] for t in txns[:len(b.commit_lsn)]] != b.commit_lsn.tolist():
            return None  # a Commit that does not close the open transaction
        # The changes between two of these messages (and before the first, after the last): inside a
        # transaction when the message before them is a Begin (or, for the first, one is open).
        cuts = np.searchsorted(fetch.changes, others)
        firsts = np.concatenate([[0], cuts])
        counts = np.diff(np.concatenate([firsts, [len(fetch.changes)]]))
        inside = np.arange(len(counts)) % 2 == (0 if opened else 1)
        if counts[~inside].any():
            return None  # a change outside a transaction
        walk = Walk(txns=txns, prior=dict(self.relations))
        in_txn = counts[inside].tolist()  # changes per transaction, in order
        seq0 = [self.seq if opened else 0] + [0] * (len(in_txn) - 1)
        walk.runs = [(first, n, t, s, 0) for t, (first, n, s) in
                     enumerate(zip(firsts[inside].tolist(), in_txn, seq0, strict=True)) if n]
        totals = [n + s for n, s in zip(in_txn, seq0, strict=True)]
        walk.transactions = sum(1 for n in totals[:len(b.commit_lsn)] if n)
        if len(b.commit_lsn):
            self.batch.end_lsn, self.batch.last_commit_ts = int(b.end_lsn[-1]), pg_timestamp(int(b.commit_ts[-1]))
        self.seq = totals[-1]
        self.txn = txns[-1] if len(txns) > len(b.commit_lsn) else None
        return walk

    def _walk_each(self, fetch: Fetch) -> Walk:
        """Decode the messages other than changes one by one, in order."""
        changes, lsns = fetch.changes, fetch.lsns
        walk = Walk(txns=[] if self.txn is None else [self.txn], prior=dict(self.relations))
        current = None if self.txn is None else 0
        others = np.flatnonzero(~fetch.is_change)
        changes_before = [*np.searchsorted(changes, others).tolist(), len(changes)]
        version = done = 0
        for position, before in zip([*others.tolist(), len(lsns)], changes_before, strict=True):
            run = before - done
            if run:
                if current is None:
                    raise ChangeLogError(f"change at LSN {format_lsn(int(lsns[changes[done]]))} outside a transaction")
                walk.runs.append((done, run, current, self.seq, version))
                self.seq += run
                done += run
            if position == len(lsns):
                break
            lsn = int(lsns[position])
            message = decode_message(fetch.datas[position], lsn, encoding=self.encoding)
            cls = type(message)
            if cls is Begin:
                if self.txn is not None:
                    raise PgOutputError(f"transaction {message.xid} begins inside transaction {self.txn[2]}", lsn=lsn)
                self.txn = (message.final_lsn, _unix_micros(message.commit_ts), message.xid, None)
                walk.txns.append(self.txn)
                current, self.seq = len(walk.txns) - 1, 0
            elif cls is Commit:
                if self.txn is None or message.commit_lsn != self.txn[0]:
                    raise PgOutputError(f"commit at {format_lsn(message.commit_lsn)} does not close the open "
                                        "transaction", lsn=lsn)
                walk.transactions += self.seq > 0
                self.batch.end_lsn, self.batch.last_commit_ts = message.end_lsn, message.commit_ts
                self.txn = current = None
            elif cls is RelationMessage:
                self.relations[message.oid] = logged = self.types.logged(message)
                version += 1
                walk.announced.setdefault(message.oid, []).append((version, logged))
            elif cls is Type:
                self.types.announce(message)
            elif cls is Truncate:
                if current is None:
                    raise ChangeLogError(f"change at LSN {format_lsn(lsn)} outside a transaction")
                for n, oid in enumerate(message.relation_oids):
                    walk.truncates.append((position, n, _relation(self.relations, oid, lsn), self.seq, current,
                                           message.options))
                    self.seq += 1
            elif cls is Origin:
                if current is None:
                    raise ChangeLogError(f"origin {message.name!r} outside a transaction")
                walk.txns[current] = self.txn = (*walk.txns[current][:3], message.name)
            # else Message: only sent with the 'messages' option, which we do not ask for
        return walk

    def _write(self, fetch: Fetch, walk: Walk, decoded: ChangeColumns) -> None:
        """Hand the fetch's changes and truncated relations to the writer, as columns in slot order."""
        runs, truncates, announced, prior = walk.runs, walk.truncates, walk.announced, walk.prior
        positions, lsns, buffer = fetch.changes, fetch.lsns, fetch.buffer
        kinds = fetch.kinds[positions]
        n = len(positions)
        first, length, txn_index, seq0, version = (np.array(c, np.int64) for c in zip(*runs, strict=True)) \
            if runs else (np.zeros(0, np.int64),) * 5
        txn = np.repeat(txn_index, length)
        seq = np.repeat(seq0 - first, length) + np.arange(n)
        # Each change's relation: the last Relation message for its oid before its run, else the one known before.
        relations: list[LoggedRelation] = []
        numbered: dict[int, int] = {}

        def number(relation: LoggedRelation) -> int:
            if id(relation) not in numbered:
                numbered[id(relation)] = len(relations)
                relations.append(relation)
            return numbered[id(relation)]

        width = int(version.max(initial=0)) + 1
        pairs, inverse = np.unique(decoded.relation_oid * width + np.repeat(version, length), return_inverse=True)
        resolved = []
        for k, pair in enumerate(pairs.tolist()):
            oid, seen = divmod(pair, width)
            relation = next((r for v, r in reversed(announced.get(oid, [])) if v <= seen), prior.get(oid))
            if relation is None:
                raise PgOutputError(f"change for relation {oid} before its Relation message",
                                    lsn=int(lsns[positions[np.flatnonzero(inverse == k)[0]]]))
            resolved.append(number(relation))
        rel = np.array(resolved, np.int64)[inverse] if n else np.zeros(0, np.int64)
        kind = _KIND_OF_CODE[kinds]
        counts = np.bincount(kind, minlength=len(KINDS))
        old_kind, truncate, lsn = decoded.old_kind, np.full(n, -1, np.int16), lsns[positions]
        new, old = decoded.new, decoded.old
        if truncates:
            t_pos, t_n, t_rel, t_seq, t_txn, t_options = zip(*truncates, strict=True)
            order = np.lexsort((np.concatenate([np.zeros(n, np.int64), t_n]),
                                np.concatenate([positions, t_pos])))
            total = n + len(truncates)
            txn = np.concatenate([txn, t_txn])[order]
            seq = np.concatenate([seq, t_seq])[order]
            rel = np.concatenate([rel, [number(r) for r in t_rel]])[order]
            kind = np.concatenate([kind, np.full(len(truncates), TRUNCATE, np.int8)])[order]
            old_kind = np.concatenate([old_kind, np.full(len(truncates), -1, np.int8)])[order]
            truncate = np.concatenate([truncate, np.array(t_options, np.int16)])[order]
            lsn = np.concatenate([lsn, lsns[list(t_pos)]])[order]
            placed = np.flatnonzero(order < n)
            new, old = new.placed(placed, total), old.placed(placed, total)
            counts[TRUNCATE] += len(truncates)
        for k, c in enumerate(counts.tolist()):
            if c:
                self.batch.kinds[k] += c

        def where(row: int, column: int) -> str:
            r = relations[rel[row]]
            return (f'column "{r.column_names[column]}" of table "{r.schema}"."{r.table}" in the change at LSN '
                    f"{format_lsn(int(lsn[row]))}")

        self.writer.append(ChangeRows(
            list(zip(*walk.txns, strict=True)), txn, relations, rel, seq, lsn, kind, old_kind, truncate,
            image_arrays(buffer, new, self.encoding, where), image_arrays(buffer, old, self.encoding, where)))

    def _refuse(self, fetch: Fetch, which: np.ndarray) -> NoReturn:
        """Decode ``which`` messages one by one: the first that is wrong raises, naming itself and its LSN."""
        for i in which.tolist():
            decode_message(fetch.datas[i], int(fetch.lsns[i]), encoding=self.encoding, raw_text=True)
        raise PgOutputError("the slot sent a change this capture cannot decode in bulk",
                            lsn=int(fetch.lsns[which[0]]) if len(which) else None)


def _relation(relations: dict[int, LoggedRelation], oid: int, lsn: int) -> LoggedRelation:
    try:
        return relations[oid]
    except KeyError:
        raise PgOutputError(f"change for relation {oid} before its Relation message", lsn=lsn) from None


class TypeNames:
    """``format_type(oid, typmod)`` on the publisher, asked once per pair and run."""

    def __init__(self, pub: psycopg.Connection) -> None:
        self.pub = pub
        self.names: dict[tuple[int, int], str] = {}
        self.announced: dict[int, Type] = {}

    def announce(self, message: Type) -> None:
        self.announced[message.oid] = message

    def logged(self, relation: RelationMessage) -> LoggedRelation:
        pairs = [(c.type_oid, c.typmod) for c in relation.columns]
        missing = sorted({p for p in pairs if p not in self.names})
        if missing:
            rows = self.pub.execute(
                "SELECT format_type(o, m) FROM unnest(%s::oid[], %s::int4[]) WITH ORDINALITY AS u(o, m, i) "
                "ORDER BY i", ([o for o, _ in missing], [m for _, m in missing])).fetchall()
            for (oid, typmod), (name,) in zip(missing, rows, strict=True):
                announced = self.announced.get(oid)
                if (name is None or name == "???") and announced is not None:
                    # The type is gone from today's catalog: keep the name decoding saw.
                    name = f'"{announced.namespace}"."{announced.name}"'
                self.names[oid, typmod] = name or f"oid {oid}"
        return LoggedRelation(
            oid=relation.oid, schema=relation.namespace or "pg_catalog", table=relation.name,
            replica_identity=relation.replica_identity.value,
            column_names=tuple(c.name for c in relation.columns),
            column_types=tuple(self.names[p] for p in pairs),
            column_type_oids=tuple(c.type_oid for c in relation.columns),
            column_typmods=tuple(c.typmod for c in relation.columns),
            key_columns=tuple(c.is_key for c in relation.columns))


def _unix_micros(ts: datetime) -> int:
    delta = ts - POSTGRES_EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds + POSTGRES_EPOCH_UNIX_MICROS
