"""The pgoutput decoder (core/pgoutput.py) on bytes PostgreSQL produced.

The bytes come from a slot in a fresh database of the run's cluster, read with
``pg_logical_slot_get_binary_changes(…, 'proto_version', '1', 'publication_names', …)``, the same call
(but consuming) as the capture's. Hand-built bytes for the edge cases: tests/core/test_pgoutput.py.
"""

from __future__ import annotations

from datetime import datetime, timezone

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_rowfilter.core.lsn import format_lsn
from airflow_provider_rowfilter.core.pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    RelationMessage,
    Truncate,
    TupleData,
    Type,
    Update,
    decode_message,
)

SLOT = "decoder_test"
_ts = st.datetimes(datetime(1990, 1, 1), datetime(2200, 1, 1), timezones=st.just(timezone.utc))
BIG = "0123456789" * 1000  # 10 kB: stored out of line with STORAGE EXTERNAL

SCHEMA = f"""
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE t1 (a int PRIMARY KEY, b text);
CREATE TABLE full_t (id int PRIMARY KEY, v int, note text);
ALTER TABLE full_t REPLICA IDENTITY FULL;
CREATE TABLE idx_t (id int NOT NULL, code text NOT NULL, v int);
CREATE UNIQUE INDEX idx_t_code ON idx_t (code);
ALTER TABLE idx_t REPLICA IDENTITY USING INDEX idx_t_code;
CREATE TABLE docs (id int PRIMARY KEY, body text, n int);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE TABLE docs_full (id int PRIMARY KEY, body text, n int);
ALTER TABLE docs_full ALTER COLUMN body SET STORAGE EXTERNAL;
ALTER TABLE docs_full REPLICA IDENTITY FULL;
CREATE TABLE parent (id int, r text, PRIMARY KEY (id, r)) PARTITION BY LIST (r);
CREATE TABLE parent_a PARTITION OF parent FOR VALUES IN ('a');
CREATE TABLE parent_b PARTITION OF parent FOR VALUES IN ('b');
CREATE TABLE typed (id int PRIMARY KEY, m mood, price numeric(10,2), name varchar(20), flag boolean,
                    at timestamptz, raw bytea, doc jsonb, tags text[]);
CREATE TABLE quiet (x int);
INSERT INTO docs VALUES (1, '{BIG}', 0);
INSERT INTO docs_full VALUES (1, '{BIG}', 0);
CREATE PUBLICATION cap FOR TABLE t1, full_t, idx_t, docs, docs_full, parent_a, parent_b, typed;
"""



# --- real bytes ---------------------------------------------------------------------------------------

@pytest.fixture
def publisher(fresh_db):
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    return dsn


def consume(conn: psycopg.Connection, *options: str) -> list[tuple[int, object]]:
    """Decode and consume everything the slot has: (row LSN, message) pairs."""
    rows = conn.execute(
        "SELECT (lsn - '0/0'::pg_lsn)::bigint, data FROM pg_logical_slot_get_binary_changes("
        f"%s, NULL, NULL, 'proto_version', '1', 'publication_names', 'cap'{''.join(', %s' for _ in options)})",
        (SLOT, *options)).fetchall()
    return [(lsn, decode_message(data, lsn)) for lsn, data in rows]


def describe(messages: list[tuple[int, object]]) -> list[tuple]:
    """The messages without LSNs, times, xids and OIDs (checked separately), tables by name."""
    names = {m.oid: m.name for _, m in messages if isinstance(m, RelationMessage)}
    out = []
    for _, m in messages:
        if isinstance(m, Begin):
            out.append(("B",))
        elif isinstance(m, Commit):
            out.append(("C",))
        elif isinstance(m, RelationMessage):
            out.append(("R", m.namespace, m.name, m.replica_identity.value,
                        tuple((c.name, c.is_key) for c in m.columns)))
        elif isinstance(m, Type):
            out.append(("Y", m.namespace, m.name))
        elif isinstance(m, Origin):
            out.append(("O", m.name, format_lsn(m.commit_lsn)))
        elif isinstance(m, Insert):
            out.append(("I", names[m.relation_oid], _image(m.new)))
        elif isinstance(m, Update):
            out.append(("U", names[m.relation_oid], m.old_kind and m.old_kind.value, m.old and _image(m.old),
                        _image(m.new)))
        elif isinstance(m, Delete):
            out.append(("D", names[m.relation_oid], m.old_kind.value, _image(m.old)))
        elif isinstance(m, Truncate):
            out.append(("T", tuple(names[o] for o in m.relation_oids), m.cascade, m.restart_identity))
        elif isinstance(m, Message):
            out.append(("M", m.transactional, m.prefix, m.content))
    return out


def _image(data: TupleData) -> tuple:
    """Values, with an unchanged TOASTed value shown as 'u', and BIG shortened."""
    return tuple("u" if u else ("BIG" if v == BIG else v) for v, u in zip(data.values, data.unchanged, strict=True))


R_T1 = ("R", "public", "t1", "d", (("a", True), ("b", False)))
R_FULL = ("R", "public", "full_t", "f", (("id", True), ("v", True), ("note", True)))
R_IDX = ("R", "public", "idx_t", "i", (("id", False), ("code", True), ("v", False)))
R_DOCS = ("R", "public", "docs", "d", (("id", True), ("body", False), ("n", False)))
R_DOCS_FULL = ("R", "public", "docs_full", "f", (("id", True), ("body", True), ("n", True)))

CASES = {
    "insert-null-empty-and-escapes": (
        ["INSERT INTO t1 VALUES (1, NULL), (2, ''), (3, E'tab\\there \"q\" é✓ \\\\')"],
        [("B",), R_T1, ("I", "t1", ("1", None)), ("I", "t1", ("2", "")), ("I", "t1", ("3", 'tab\there "q" é✓ \\')),
         ("C",)]),
    "update-non-key-default-identity-sends-no-old-row": (
        ["INSERT INTO t1 VALUES (1, 'a')", "UPDATE t1 SET b = 'b' WHERE a = 1"],
        [("B",), R_T1, ("I", "t1", ("1", "a")), ("C",), ("B",), ("U", "t1", None, None, ("1", "b")), ("C",)]),
    "update-key-default-identity-sends-old-key": (
        ["INSERT INTO t1 VALUES (1, 'a')", "UPDATE t1 SET a = 2 WHERE a = 1"],
        [("B",), R_T1, ("I", "t1", ("1", "a")), ("C",), ("B",), ("U", "t1", "K", ("1", None), ("2", "a")), ("C",)]),
    "update-full-identity-sends-old-row": (
        ["INSERT INTO full_t VALUES (1, 10, NULL)", "UPDATE full_t SET v = 11"],
        [("B",), R_FULL, ("I", "full_t", ("1", "10", None)), ("C",),
         ("B",), ("U", "full_t", "O", ("1", "10", None), ("1", "11", None)), ("C",)]),
    "update-index-identity-sends-old-index-key": (
        ["INSERT INTO idx_t VALUES (1, 'x', 5)", "UPDATE idx_t SET v = 6", "UPDATE idx_t SET code = 'y'"],
        [("B",), R_IDX, ("I", "idx_t", ("1", "x", "5")), ("C",), ("B",), ("U", "idx_t", None, None, ("1", "x", "6")),
         ("C",), ("B",), ("U", "idx_t", "K", (None, "x", None), ("1", "y", "6")), ("C",)]),
    "delete-sends-old-key-or-old-row": (
        ["INSERT INTO t1 VALUES (1, 'a'); INSERT INTO full_t VALUES (1, 10, 'n')",
         "DELETE FROM t1; DELETE FROM full_t"],
        [("B",), R_T1, ("I", "t1", ("1", "a")), R_FULL, ("I", "full_t", ("1", "10", "n")), ("C",),
         ("B",), ("D", "t1", "K", ("1", None)), ("D", "full_t", "O", ("1", "10", "n")), ("C",)]),
    "toast-unchanged-default-identity": (
        ["UPDATE docs SET n = 1"],
        [("B",), R_DOCS, ("U", "docs", None, None, ("1", "u", "1")), ("C",)]),
    "toast-unchanged-full-identity-old-row-is-complete": (
        ["UPDATE docs_full SET n = 1"],
        [("B",), R_DOCS_FULL, ("U", "docs_full", "O", ("1", "BIG", "0"), ("1", "u", "1")), ("C",)]),
    "toast-changed-is-sent": (
        ["UPDATE docs SET body = body || '!'"],
        [("B",), R_DOCS, ("U", "docs", None, None, ("1", BIG + "!", "0")), ("C",)]),
    "truncate-one-message-for-several-tables": (
        ["TRUNCATE t1, full_t RESTART IDENTITY", "TRUNCATE t1 CASCADE", "TRUNCATE t1"],
        # A truncated table gets a new relfilenode, so pgoutput announces it again each time.
        [("B",), R_T1, R_FULL, ("T", ("t1", "full_t"), False, True), ("C",),
         ("B",), R_T1, ("T", ("t1",), True, False), ("C",), ("B",), R_T1, ("T", ("t1",), False, False), ("C",)]),
    "partitioned-table-changes-come-from-the-leaves": (
        ["INSERT INTO parent VALUES (1, 'a'), (2, 'b')", "UPDATE parent SET r = 'b' WHERE id = 1"],
        [("B",), ("R", "public", "parent_a", "d", (("id", True), ("r", True))), ("I", "parent_a", ("1", "a")),
         ("R", "public", "parent_b", "d", (("id", True), ("r", True))), ("I", "parent_b", ("2", "b")), ("C",),
         ("B",), ("D", "parent_a", "K", ("1", "a")), ("I", "parent_b", ("1", "b")), ("C",)]),
    "unpublished-and-rolled-back-transactions-send-nothing": (
        ["INSERT INTO quiet VALUES (1)", "BEGIN; INSERT INTO t1 VALUES (9, 'x'); ROLLBACK"],
        []),
    "user-type-is-announced-before-its-relation": (
        ["INSERT INTO typed VALUES (1, 'ok', 12.5, 'n', true, '2024-01-02 03:04:05+00', '\\x00ff',"
         " '{\"b\": 1, \"a\": [1, 2]}', '{x,\"y z\"}')"],
        [("B",), ("Y", "public", "mood"),
         ("R", "public", "typed", "d", tuple((c, c == "id") for c in
                                             ("id", "m", "price", "name", "flag", "at", "raw", "doc", "tags"))),
         ("I", "typed", ("1", "ok", "12.50", "n", "t", "2024-01-02 03:04:05+00", "\\x00ff",
                         '{"a": [1, 2], "b": 1}', '{x,"y z"}')), ("C",)]),
}


@pytest.mark.parametrize(("statements", "expected"), CASES.values(), ids=CASES.keys())
def test_real_messages_decode_as_postgresql_sent_them(publisher, statements, expected):
    with psycopg.connect(publisher, autocommit=True) as conn:
        conn.execute("SET timezone = 'UTC'")
        for statement in statements:
            conn.execute(statement)
        assert describe(consume(conn)) == expected


def test_begin_and_commit_frame_each_transaction_with_its_lsns_xid_and_time(publisher):
    with psycopg.connect(publisher, autocommit=True) as conn:
        xids = []
        before = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        for value in (1, 2):
            with conn.transaction():
                conn.execute("INSERT INTO t1 VALUES (%s, 'x')", (value,))
                xids.append(int(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0]))
        after = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        messages = consume(conn)
    begins = [(lsn, m) for lsn, m in messages if isinstance(m, Begin)]
    commits = [(lsn, m) for lsn, m in messages if isinstance(m, Commit)]
    assert [m.xid for _, m in begins] == xids
    for (_, begin), (commit_row_lsn, commit) in zip(begins, commits, strict=True):
        assert commit.commit_lsn == begin.final_lsn < commit.end_lsn == commit_row_lsn
        assert commit.commit_ts == begin.commit_ts and before <= commit.commit_ts <= after
        assert commit.flags == 0
    assert commits[0][1].end_lsn <= begins[1][1].final_lsn


def test_origin_and_logical_messages(publisher):
    with psycopg.connect(publisher, autocommit=True) as conn:
        conn.execute("SELECT pg_replication_origin_create('upstream one')")
        conn.execute("SELECT pg_replication_origin_session_setup('upstream one')")
        with conn.transaction():
            conn.execute("SELECT pg_replication_origin_xact_setup('0/AB', now())")
            conn.execute("INSERT INTO t1 VALUES (1, 'from upstream')")
            conn.execute("SELECT pg_logical_emit_message(true, 'pfx', 'in txn'::bytea)")
        conn.execute("SELECT pg_replication_origin_session_reset()")
        # Outside a transaction with an xid nothing flushes the WAL: ask for it (PostgreSQL 17+).
        conn.execute("SELECT pg_logical_emit_message(false, 'hb', ''::bytea, true)")
        assert describe(consume(conn, "messages", "true")) == [
            ("B",), ("O", "upstream one", "0/AB"), R_T1, ("I", "t1", ("1", "from upstream")),
            ("M", True, "pfx", b"in txn"), ("C",), ("M", False, "hb", b"")]


_pg_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)


def test_values_keep_postgresql_text_form(publisher):
    """Random rows: every decoded value is the publisher's output function's text, NULL as None."""
    with psycopg.connect(publisher, autocommit=True) as conn:
        conn.execute("SET timezone = 'UTC'")
        consume(conn)

        @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(st.lists(st.tuples(
            st.one_of(st.none(), _pg_text),
            st.one_of(st.none(), st.decimals(min_value=-10**7, max_value=10**7, places=2, allow_nan=False)),
            st.one_of(st.none(), st.booleans()),
            st.one_of(st.none(), _ts),
            st.one_of(st.none(), st.binary(max_size=8)),
            st.one_of(st.none(), st.lists(st.one_of(st.none(), _pg_text), max_size=3)),
        ), min_size=1, max_size=8))
        def check(rows):
            conn.execute("TRUNCATE typed")
            consume(conn)
            with conn.transaction():
                for i, (text, price, flag, at, raw, tags) in enumerate(rows):
                    conn.execute("INSERT INTO typed (id, name, price, flag, at, raw, tags, doc)"
                                 " VALUES (%s, left(%s, 20), %s, %s, %s, %s, %s, to_jsonb(%s::text))",
                                 (i, text, price, flag, at, raw, tags, text))
            # format('%s', …) runs the type's output function (a cast to text of a boolean gives 'true').
            texts = ", ".join(f"CASE WHEN {c} IS NOT NULL THEN format('%s', {c}) END"
                              for c in ("id", "m", "price", "name", "flag", "at", "raw", "doc", "tags"))
            expected = conn.execute(f"SELECT ARRAY[{texts}] FROM typed ORDER BY id").fetchall()
            inserted = [m.new.values for _, m in consume(conn) if isinstance(m, Insert)]
            assert inserted == [tuple(e) for (e,) in expected]

        check()


