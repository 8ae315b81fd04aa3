"""subscriber/typed_keys.py: a batch reduced in the job's process, its keys written once, applies what the way
before applied (its rows staged as text, then read into the keys table): the same rows, counts and conflicts."""

from __future__ import annotations

import json
from dataclasses import replace

import psycopg
import pyarrow as pa
import pytest

from airflow_provider_rowfilter.apply.net_effect import reduce_batch
from airflow_provider_rowfilter.subscriber import typed_keys
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


# Keys 1-4 exist before the batch: an UPDATE of one, of one that does not exist (5), a DELETE of one and of
# one that does not exist (6), an INSERT of a new key (7) and of an existing one (2: a conflict, or skipped),
# a key changed by several transactions (3), an UPDATE that moves a key (4 → 8: a barrier, phase 1 after it).
CHANGES = [upd(100, 0, ["1", "x", "11"]), upd(100, 1, ["5", "y", "12"]), dele(110, 0, ["1", "x", "11"]),
           dele(110, 1, ["6", None, None]), ins(120, 0, ["7", "new", None]), upd(130, 0, ["3", "a", "1"]),
           upd(140, 0, ["3", "b", "2"]), upd(150, 0, ["8", "moved", "4"], ["4", "old", "4"]),
           ins(160, 0, ["9", "after", "9"]), upd(170, 0, ["8", "again", "5"])]


def _apply(dsn: str, rows: pa.Table, policy: str, once: bool) -> tuple[object, list[tuple]]:
    typed_keys.WRITE_KEYS_ONCE = once
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
        typed_keys.WRITE_KEYS_ONCE = True


def _subscriber(fresh_db) -> str:
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        conn.execute("CREATE TABLE t (id integer PRIMARY KEY, a text, n integer DEFAULT 5)")
        conn.execute("INSERT INTO t SELECT g, 'was', g FROM generate_series(1, 4) g")
    return dsn


@pytest.mark.parametrize("policy", ["upsert", "error"])
def test_keys_written_once_apply_what_the_stage_applied(fresh_db, policy):
    dsn = _subscriber(fresh_db)
    changes = CHANGES + ([ins(180, 0, ["2", "dup", "2"])] if policy != "error" else [])
    the_plan = passed_through(plan(rules(), policy=policy) if policy != "error" else UNFILTERED)
    facts, rows = reduce_batch([arrow_rows(changes)], the_plan, "tok")
    assert set(rows.column("row_kind").to_pylist()) == {"K", "B"}  # phases: the moved key is a barrier
    once, before = _apply(dsn, rows, policy, True), _apply(dsn, rows, policy, False)
    assert once == before
    assert once[0]["update"] >= 2, once

    # An INSERT of a key that exists stops the batch with the same conflict both ways.
    conflict = replace(the_plan, policy="error")
    _, rows = reduce_batch([arrow_rows([*CHANGES, ins(180, 0, ["2", "dup", "2"])])], conflict, "tok")
    once, before = _apply(dsn, rows, "error", True), _apply(dsn, rows, "error", False)
    assert once == before
    assert "conflict=insert_exists" in str(once[0]), once


def test_guesses_that_hold_send_only_the_statements_that_can_find_a_row(fresh_db):
    """Every key guessed right (INSERTs of new keys, UPDATEs and DELETEs of existing ones): the same result, and
    an INSERT-only batch sends no UPDATE, DELETE or conflict lookup."""
    dsn = _subscriber(fresh_db)
    mixed = [ins(100, 0, ["7", "new", "1"]), upd(110, 0, ["1", "x", "2"]), dele(120, 0, ["2", "was", "2"]),
             upd(130, 0, ["3", "a", "3"]), upd(140, 0, ["3", "b", "4"])]
    _, rows = reduce_batch([arrow_rows(mixed)], UNFILTERED, "tok")
    once, before = _apply(dsn, rows, "error", True), _apply(dsn, rows, "error", False)
    assert once == before
    assert once[0] == {"insert": 1, "update": 3, "delete": 1}, once
    _, inserts = reduce_batch([arrow_rows([ins(100, 0, ["7", "new", "1"]), ins(100, 1, ["8", None, None])])],
                              UNFILTERED, "tok")
    assert typed_keys.statements_needed(inserts, 0, 3) == {"conflict", "update", "insert"}  # existed not known
    assert typed_keys.statements_needed(inserts, 0, 3, pa.array([False, False])) == {"insert"}
