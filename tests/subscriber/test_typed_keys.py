"""subscriber/typed_keys.py and direct_update.py: a batch reduced in the job's process, applied by one UPDATE from its
rows where it can be or through its keys written once, applies what the way before applied (its rows staged as
text, then read into the keys table): the same rows, counts and conflicts."""

from __future__ import annotations

import json
from dataclasses import replace

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from psycopg import sql

from airflow_provider_rowfilter.flows.apply.reducers import reduce_batch
from airflow_provider_rowfilter.subscriber import direct_update, typed_keys
from airflow_provider_rowfilter.subscriber.apply_target import ConflictError, StagedTable, read_target
from airflow_provider_rowfilter.subscriber.state_migrations import migrate
from tests.change_rows import UNFILTERED, T, arrow_rows, dele, ins, passed_through, plan, rules, upd

KEYS = ['["1"]', '["a,b"]', '[null]', '["null"]', '[""]', '["\\"q\\""]', '["\\\\"]', '["é\\n"]']


@pytest.mark.parametrize("keys", [KEYS[:5], KEYS], ids=["plain", "escaped"])
def test_key_items_are_what_the_json_says(keys):
    assert typed_keys.key_items(pa.array(keys), 1)[0].to_pylist() == [json.loads(k)[0] for k in keys]
    pairs = [f"[{json.dumps(json.loads(a)[0])},{json.dumps(json.loads(b)[0])}]" for a, b in zip(keys, reversed(keys),
                                                                                                  strict=True)]
    assert [a.to_pylist() for a in typed_keys.key_items(pa.array(pairs), 2)] == \
        [list(c) for c in zip(*(json.loads(p) for p in pairs), strict=True)]
    with_null = pa.array([pairs[0], None, pairs[-1]])  # a row without values (a DELETE's): every item NULL
    assert [a.to_pylist() for a in typed_keys.key_items(with_null, 2)] == \
        [[json.loads(pairs[0])[i], None, json.loads(pairs[-1])[i]] for i in range(2)]


# Keys 1-4 exist before the batch: an UPDATE of one, of one that does not exist (5), a DELETE of one and of
# one that does not exist (6), an INSERT of a new key (7) and of an existing one (2: a conflict, or skipped),
# a key changed by several transactions (3), an UPDATE that moves a key (4 → 8: a barrier, phase 1 after it),
# an UPDATE whose text is unchanged TOAST (10: the subscriber's value kept), a value with quotes and a backslash.
CHANGES = [upd(100, 0, ["1", "x", "11"]), upd(100, 1, ["5", "y", "12"]), dele(110, 0, ["1", "x", "11"]),
           dele(110, 1, ["6", None, None]), ins(120, 0, ["7", "new", None]), upd(130, 0, ["3", "a", "1"]),
           upd(140, 0, ["3", "b", "2"]), upd(150, 0, ["8", "moved", "4"], ["4", "old", "4"]),
           ins(160, 0, ["9", 'af"t\\er', "9"]), upd(170, 0, ["8", "again", "5"]),
           upd(175, 0, ["10", None, "7"], unchanged=[False, True, False])]
#: The ways the subscriber's side can write a batch reduced in this process (subscriber/typed_keys.py).
MODES = ("direct", "keys once", "before")


def _apply(dsn: str, rows: pa.Table, policy: str, mode: str) -> tuple[object, list[tuple]]:
    typed_keys.WRITE_KEYS_ONCE, direct_update.DIRECT_UPDATE = mode != "before", mode == "direct"
    try:
        with psycopg.connect(dsn) as conn:
            target = read_target(conn, T, 0)
            stage, key_rows = typed_keys.stage_rows(conn, rows)
            table = StagedTable(conn, "tok", target, policy, None, "the batch", 0, stage)
            table.rows = key_rows.get(0)
            try:
                counts: object = table.apply().as_dict()
            except ConflictError as e:
                counts = str(e)
            found = conn.execute("SELECT * FROM t ORDER BY id").fetchall()
            conn.rollback()
        return counts, found
    finally:
        typed_keys.WRITE_KEYS_ONCE = direct_update.DIRECT_UPDATE = True


def _each_mode(dsn: str, rows: pa.Table, policy: str) -> tuple[object, list[tuple]]:
    """What every mode applied, asserted the same; returns it."""
    results = [_apply(dsn, rows, policy, mode) for mode in MODES]
    assert results[1:] == results[:1] * (len(MODES) - 1), dict(zip(MODES, results, strict=True))
    return results[0]


def _subscriber(fresh_db) -> str:
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        conn.execute("CREATE TABLE t (id integer PRIMARY KEY, a text, n integer DEFAULT 5)")
        conn.execute("INSERT INTO t SELECT g, 'was', g FROM generate_series(1, 4) g UNION ALL SELECT 10, 'kept', 0")
    return dsn


@pytest.mark.parametrize("policy", ["upsert", "error"])
def test_keys_written_once_apply_what_the_stage_applied(fresh_db, policy):
    dsn = _subscriber(fresh_db)
    changes = CHANGES + ([ins(180, 0, ["2", "dup", "2"])] if policy != "error" else [])
    the_plan = passed_through(plan(rules(), policy=policy) if policy != "error" else UNFILTERED)
    facts, rows = reduce_batch([arrow_rows(changes)], the_plan, "tok")
    assert set(rows.column("row_kind").to_pylist()) == {"K", "B"}  # phases: the moved key is a barrier
    once = _each_mode(dsn, rows, policy)
    assert once[0]["update"] >= 2, once
    assert (10, "kept", 7) in once[1] and (9, 'af"t\\er', 9) in once[1], once

    # An INSERT of a key that exists stops the batch with the same conflict both ways.
    conflict = replace(the_plan, policy="error")
    _, rows = reduce_batch([arrow_rows([*CHANGES, ins(180, 0, ["2", "dup", "2"])])], conflict, "tok")
    once = _each_mode(dsn, rows, "error")
    assert "conflict=insert_exists" in str(once[0]), once


def test_guesses_that_hold_send_only_the_statements_that_can_find_a_row(fresh_db):
    """Every key guessed right (INSERTs of new keys, UPDATEs and DELETEs of existing ones): the same result, and
    an INSERT-only batch sends no UPDATE, DELETE or conflict lookup."""
    dsn = _subscriber(fresh_db)
    mixed = [ins(100, 0, ["7", "new", "1"]), upd(110, 0, ["1", "x", "2"]), dele(120, 0, ["2", "was", "2"]),
             upd(130, 0, ["3", "a", "3"]), upd(140, 0, ["3", "b", "4"])]
    _, rows = reduce_batch([arrow_rows(mixed)], UNFILTERED, "tok")
    once = _each_mode(dsn, rows, "error")
    assert once[0] == {"insert": 1, "update": 3, "delete": 1}, once
    _, inserts = reduce_batch([arrow_rows([ins(100, 0, ["7", "new", "1"]), ins(100, 1, ["8", None, None])])],
                              UNFILTERED, "tok")
    assert typed_keys.statements_needed(inserts, 0, 3) == {"conflict", "update", "insert"}  # existed not known
    assert typed_keys.statements_needed(inserts, 0, 3, pa.array([False, False])) == {"insert"}


def test_updates_of_existing_rows_are_one_statement_that_applies_what_the_keys_table_applied(fresh_db, monkeypatch):
    """subscriber/direct_update.py: a batch of UPDATEs carrying every column, each of a row the subscriber has, is one
    UPDATE from the rows (quotes, a backslash, NULL and non-ASCII values included) with the keys table's result; one
    key without its row sends the batch the general way, which counts and logs it (``update_missing``)."""
    dsn = _subscriber(fresh_db)
    updates = [upd(100, 0, ["1", 'q"u\\o', "11"]), upd(100, 1, ["2", None, "12"]), upd(110, 0, ["3", "é", "13"]),
               upd(120, 0, ["3", "again", "14"])]
    _, rows = reduce_batch([arrow_rows(updates)], UNFILTERED, "tok")
    assert direct_update.updates_only(rows.filter(pc.equal(rows.column("row_kind"), "K")), 3)
    direct = _each_mode(dsn, rows, "error")
    assert direct[0] == {"update": 4}, direct
    assert direct[1][:3] == [(1, 'q"u\\o', 11), (2, None, 12), (3, "again", 14)], direct
    with psycopg.connect(dsn) as conn:  # the one statement, not the general way
        keyed = rows.filter(pc.equal(rows.column("row_kind"), "K"))
        table = StagedTable(conn, "tok", read_target(conn, T, 0), "error", None, "the batch", 0, sql.SQL("s"))
        conn.execute("SET work_mem = '1MB'")
        assert direct_update.update_directly(table, keyed) == 4
        assert conn.execute("SHOW work_mem").fetchone()[0] == "1MB"  # raised for the statement alone
        monkeypatch.setattr(direct_update, "MAX_PARAMETER_BYTES", 10)  # values past PostgreSQL's 1 GB: not sent
        assert direct_update.update_directly(table, keyed) is None
    _, missing = reduce_batch([arrow_rows([*updates, upd(130, 0, ["5", "none", "15"])])], UNFILTERED, "tok")
    assert _each_mode(dsn, missing, "error")[0] == {"update": 4, "missing_update": 1}
    # A value the column refuses: PostgreSQL's error either way (flows/apply/batch_transaction.py then names the column).
    _, refused = reduce_batch([arrow_rows([*updates, upd(130, 0, ["4", "x", "abc"])])], UNFILTERED, "tok")
    for mode in MODES:
        with pytest.raises(psycopg.errors.InvalidTextRepresentation, match='type integer: "abc"'):
            _apply(dsn, refused, "error", mode)
    # Not sent at all for an INSERT, a DELETE or an unchanged TOAST value among the rows.
    for other in (ins(140, 0, ["7", "new", "1"]), dele(140, 0, ["4", "was", "4"]),
                  upd(140, 0, ["4", None, "1"], unchanged=[False, True, False])):
        _, mixed = reduce_batch([arrow_rows([*updates, other])], UNFILTERED, "tok")
        assert not direct_update.updates_only(mixed.filter(pc.equal(mixed.column("row_kind"), "K")), 3), other


def test_text_array_binary_is_what_postgresql_reads(fresh_db):
    values = pa.array(["1", None, "", 'é"\\', "x" * 84, "null"])
    with psycopg.connect(fresh_db()) as conn:
        conn.adapters.register_dumper(direct_update.TextArray, direct_update._TextArrayDumper)
        row = conn.execute("SELECT %b::text[]", [direct_update.TextArray(values)]).fetchone()
        assert row[0] == values.to_pylist()
        assert conn.execute("SELECT cardinality(%b::text[])", [direct_update.TextArray(pa.array([], pa.string()))]
                            ).fetchone()[0] == 0
