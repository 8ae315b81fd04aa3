"""The stage's one declaration (subscriber/apply_stage.py) and the table the migrations make of it."""

from __future__ import annotations

import psycopg
import pytest

from airflow_provider_rowfilter.subscriber import state_migrations
from airflow_provider_rowfilter.subscriber.apply_stage import STAGE_COLUMNS, stage_ddl, stage_fingerprint
from airflow_provider_rowfilter.subscriber.state_migrations import STAGE_MIGRATED, migrate

_COLUMNS = """SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull FROM pg_attribute a
              WHERE a.attrelid = 'rowfilter.apply_stage'::regclass AND a.attnum > 0 AND NOT a.attisdropped
              ORDER BY a.attname"""


def _declared() -> list[tuple[str, str, bool]]:
    return sorted((c.name, c.sql, not c.nullable) for c in STAGE_COLUMNS)


def test_a_changed_declaration_comes_with_a_migration() -> None:
    """A database migrated before a change of STAGE_COLUMNS keeps the old table until a migration runs
    stage_ddl() again: subscriber/state_migrations.py STAGE_MIGRATED names the declaration it was written for."""
    assert stage_fingerprint() == STAGE_MIGRATED, "add a migration (n, stage_ddl()) and set STAGE_MIGRATED"


def test_every_database_gets_the_declared_stage(fresh_db) -> None:
    with psycopg.connect(fresh_db(), autocommit=True) as conn:
        migrate(conn)
        assert conn.execute(_COLUMNS).fetchall() == _declared()


def test_a_stage_of_an_earlier_shape_is_replaced_while_empty_and_refused_while_it_holds_a_batch(fresh_db) -> None:
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        # The last migration that made the stage (later ones change other tables).
        last = next(v for v, ddl in reversed(state_migrations.MIGRATIONS) if ddl == stage_ddl())
        # As an earlier version left it (migration 2 alone: two copies of the values), holding a batch.
        conn.execute("ALTER TABLE rowfilter.apply_stage RENAME COLUMN vals TO p_vals")
        conn.execute("ALTER TABLE rowfilter.apply_stage ADD COLUMN a_vals text")
        conn.execute("INSERT INTO rowfilter.apply_stage (token, target, phase, row_kind) VALUES ('s1:x', 0, 0, 'K')")
        conn.execute("DELETE FROM rowfilter.schema_version WHERE version = %s", (last,))
        with pytest.raises(psycopg.errors.LockNotAvailable, match="holds a batch staged by an apply of an earlier"):
            migrate(conn)
        assert conn.execute("SELECT count(*) FROM rowfilter.apply_stage").fetchone()[0] == 1  # nothing lost
        conn.execute("DELETE FROM rowfilter.apply_stage")  # that apply finished
        migrate(conn)
        assert conn.execute(_COLUMNS).fetchall() == _declared()


def test_a_database_main_migrated_to_6_migrates_to_7_and_a_fresh_one_gets_every_version(fresh_db, monkeypatch) -> None:
    """Issue 31's stage migration came after main's 5 (verify/reconcile) and 6 (drop_history): a subscriber
    at 6, with a batch staged by a running apply, keeps the batch and every table; a fresh one gets 1 to 7."""
    released = [m for m in state_migrations.MIGRATIONS if m[0] <= 6]
    latest = state_migrations.MIGRATIONS[-1][0]  # the newest: 8 (positions' timelines), 9 (conflicts)
    with psycopg.connect(fresh_db(), autocommit=True) as conn:
        monkeypatch.setattr(state_migrations, "MIGRATIONS", released)
        assert migrate(conn) == 6
        monkeypatch.undo()
        assert conn.execute(_COLUMNS).fetchall() == _declared()  # migrations 2 and 3 left the declared stage
        conn.execute("INSERT INTO rowfilter.apply_stage (token, target, phase, row_kind) VALUES ('s1:x', 0, 0, 'K')")
        conn.execute("INSERT INTO rowfilter.drop_history (subscription, slot_name, tables, kept_slot) "
                     "VALUES ('gone', 'rowfilter_gone', '{}', false)")
        assert migrate(conn) == latest
        assert [v for (v,) in conn.execute("SELECT version FROM rowfilter.schema_version ORDER BY 1")] == [*range(1, latest + 1)]
        assert conn.execute(_COLUMNS).fetchall() == _declared()
        assert conn.execute("SELECT count(*) FROM rowfilter.apply_stage").fetchone()[0] == 1  # the batch kept
        assert conn.execute("SELECT count(*) FROM rowfilter.drop_history").fetchone()[0] == 1
    with psycopg.connect(fresh_db(), autocommit=True) as conn:
        assert migrate(conn) == latest
        assert [v for (v,) in conn.execute("SELECT version FROM rowfilter.schema_version ORDER BY 1")] == [*range(1, latest + 1)]
        assert conn.execute(_COLUMNS).fetchall() == _declared()
        tables = {t for (t,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'rowfilter'")}
        assert {"table_check", "drop_history", "apply_stage", "batch_history"} <= tables
        columns = {c for (c,) in conn.execute("SELECT attname FROM pg_attribute WHERE attnum > 0 AND attrelid IN "
                                              "('rowfilter.subscription_rel'::regclass, 'rowfilter.batch_history'::regclass)")}
        assert {"reconcile_since", "kind", "lsn_timeline"} <= columns
