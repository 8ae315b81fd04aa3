"""Schema ``rowfilter`` in the subscriber: its versioned migrations, and :func:`migrate` that applies them.

Part of the state module (subscriber/state.py): the tables described here are read and written only
through subscriber/state.py and subscriber/state_reader.py, except ``apply_stage``, the apply's scratch table
(subscriber/apply_stage.py).
"""

from __future__ import annotations

import logging

import psycopg

from airflow_provider_rowfilter.connection import one
from airflow_provider_rowfilter.subscriber.apply_stage import stage_ddl

log = logging.getLogger(__name__)

SCHEMA = "rowfilter"
_LOCK_KEY = 0x726F7766  # "rowf": serialises migrations of one subscriber database

# Each migration runs once, in order, in its own transaction. Never edit a released one; add more.
MIGRATIONS: list[tuple[int, str]] = [
    (1, """
    CREATE TABLE rowfilter.subscription (
        name                 text PRIMARY KEY,
        publications         text[] NOT NULL,
        slot_name            text NOT NULL,
        capture_publication  text NOT NULL,
        options              jsonb NOT NULL DEFAULT '{}',
        enabled              boolean NOT NULL DEFAULT true,
        last_error           text,
        created_at           timestamptz NOT NULL DEFAULT now(),
        updated_at           timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE rowfilter.subscription_rel (
        subscription  text NOT NULL REFERENCES rowfilter.subscription (name) ON DELETE CASCADE,
        schema_name   text NOT NULL,
        table_name    text NOT NULL,
        state         "char" NOT NULL CHECK (state IN ('i', 'd', 'f', 's', 'r')),
        lsn           pg_lsn,
        rows_copied   bigint,
        last_error    text,
        updated_at    timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (subscription, schema_name, table_name)
    );
    CREATE TABLE rowfilter.refresh_history (
        id            bigserial PRIMARY KEY,
        subscription  text NOT NULL REFERENCES rowfilter.subscription (name) ON DELETE CASCADE,
        lsn           pg_lsn NOT NULL,
        added         text[] NOT NULL,
        removed       text[] NOT NULL,
        definitions   jsonb NOT NULL,
        refreshed_at  timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE rowfilter.batch_history (
        id            bigserial PRIMARY KEY,
        subscription  text NOT NULL REFERENCES rowfilter.subscription (name) ON DELETE CASCADE,
        start_lsn     pg_lsn,
        end_lsn       pg_lsn,
        counts        jsonb NOT NULL DEFAULT '{}',
        duration_ms   bigint,
        finished_at   timestamptz NOT NULL DEFAULT now()
    );
    """),
    # ApplyChanges: the subscription's applied position, the one-shot skip (ALTER SUBSCRIPTION … SKIP),
    # and what each batch moved and how far behind the publisher it was.
    (2, """
    ALTER TABLE rowfilter.subscription
        ADD COLUMN applied_lsn pg_lsn,
        ADD COLUMN skip_lsn pg_lsn;
    ALTER TABLE rowfilter.batch_history
        ADD COLUMN transactions bigint,
        ADD COLUMN changes bigint,
        ADD COLUMN skipped_lsn pg_lsn,
        ADD COLUMN lag_bytes bigint,
        ADD COLUMN lag_seconds double precision;
    CREATE INDEX batch_history_subscription ON rowfilter.batch_history (subscription, id);
    -- The net effect of a batch, written by the Spark executors, read by the one applying transaction
    -- (subscriber/apply_target.py). Unlogged: it is rebuilt from the change log whenever it is lost.
    CREATE UNLOGGED TABLE rowfilter.apply_stage (
        token           text NOT NULL,
        target          int NOT NULL,
        phase           int NOT NULL,
        row_kind        text NOT NULL,
        op              text,
        key             text,
        commit_lsn      bigint,
        xid             bigint,
        restart_identity boolean,
        n_insert        bigint,
        n_update        bigint,
        n_delete        bigint,
        p_present       boolean,
        p_vals          text,
        p_flags         text,
        p_conflict_lsn  bigint,
        p_conflict_xid  bigint,
        p_missing_update bigint,
        p_missing_delete bigint,
        a_present       boolean,
        a_vals          text,
        a_flags         text,
        a_conflict_lsn  bigint,
        a_conflict_xid  bigint,
        a_missing_update bigint,
        a_missing_delete bigint
    );
    CREATE INDEX apply_stage_token ON rowfilter.apply_stage (token, target, row_kind, phase);
    """),
    # One staged copy of a key's values: whenever both outcomes have a row, they agree on every value
    # either one reads (spark/apply_frames.py), so staging them twice only doubled the batch's bytes.
    (3, """
    ALTER TABLE rowfilter.apply_stage RENAME COLUMN p_vals TO vals;
    ALTER TABLE rowfilter.apply_stage DROP COLUMN a_vals;
    """),
    # The change log the subscription is fed from (change_log/log.py LogIdentity): its id and where it
    # was read, so a run reading another log is told where the right one is (docs/change-log.md).
    (4, """
    ALTER TABLE rowfilter.subscription
        ADD COLUMN change_log_id uuid,
        ADD COLUMN change_log_host text,
        ADD COLUMN change_log_path text;
    """),
    # Verify and reconcile (flows/verify/verify.py, flows/verify/reconcile.py): a table held in d by a reconcile says so; the
    # last comparison of each table; a reconcile's counts in the batch history, told from the apply's batches.
    (5, """
    ALTER TABLE rowfilter.subscription_rel ADD COLUMN reconcile_since timestamptz;
    ALTER TABLE rowfilter.batch_history ADD COLUMN kind text NOT NULL DEFAULT 'apply';
    CREATE TABLE rowfilter.table_check (
        subscription  text NOT NULL REFERENCES rowfilter.subscription (name) ON DELETE CASCADE,
        schema_name   text NOT NULL,
        table_name    text NOT NULL,
        kind          text NOT NULL CHECK (kind IN ('verify', 'reconcile')),
        lsn           pg_lsn,
        clean         boolean NOT NULL,
        result        jsonb NOT NULL,
        checked_at    timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (subscription, schema_name, table_name)
    );
    """),
    # DROP SUBSCRIPTION leaves a line: a scheduled apply, status and the Replication page then say the
    # subscription was dropped, and when, instead of "run refresh first" (which would make it anew).
    (6, """
    CREATE TABLE rowfilter.drop_history (
        id            bigserial PRIMARY KEY,
        subscription  text NOT NULL,
        slot_name     text NOT NULL,
        tables        text[] NOT NULL,
        kept_slot     boolean NOT NULL,
        dropped_at    timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX drop_history_subscription ON rowfilter.drop_history (subscription, id);
    """),
    # The stage as subscriber/apply_stage.py declares it (STAGE_COLUMNS), the one declaration both reducers and
    # the applying transaction use: the same columns as migrations 2 and 3 left, so nothing changes where they
    # ran; a change of the declaration adds a migration running stage_ddl() again (STAGE_MIGRATED tells).
    (7, stage_ddl()),
    # The publisher's timeline a table's position was taken on, when it came from the publisher's WAL directly
    # (a copy's or reconcile's snapshot, refresh without copy): after a promotion, such a position past the fork
    # is told from one of the new timeline (publisher/failover.py check_lineage). NULL: a batch end.
    # state_since: when the table entered its state (updated_at moves with every recorded error too): how long
    # it has been in i, d or f, for the lag check (operators/subscription_lag.py).
    (8, """
    ALTER TABLE rowfilter.subscription_rel ADD COLUMN lsn_timeline int;
    ALTER TABLE rowfilter.subscription_rel ADD COLUMN state_since timestamptz;
    UPDATE rowfilter.subscription_rel SET state_since = updated_at;
    ALTER TABLE rowfilter.subscription_rel ALTER COLUMN state_since SET DEFAULT now();
    """),
    # Conflicts as PostgreSQL 18 names them (subscriber/conflicts.py): running counts per subscription and table,
    # written in the batch's transaction (an error's in a transaction of its own, per attempt, as the apply worker
    # counts it), read per subscription like pg_stat_subscription_stats and reset like
    # pg_stat_reset_subscription_stats; the log of skipped conflicts a spec's conflict_log: table keeps.
    (9, """
    CREATE TABLE rowfilter.conflict_stats (
        subscription  text NOT NULL REFERENCES rowfilter.subscription (name) ON DELETE CASCADE,
        schema_name   text NOT NULL,
        table_name    text NOT NULL,
        confl_insert_exists              bigint NOT NULL DEFAULT 0,
        confl_update_origin_differs      bigint NOT NULL DEFAULT 0,
        confl_update_exists              bigint NOT NULL DEFAULT 0,
        confl_update_missing             bigint NOT NULL DEFAULT 0,
        confl_delete_origin_differs      bigint NOT NULL DEFAULT 0,
        confl_delete_missing             bigint NOT NULL DEFAULT 0,
        confl_multiple_unique_conflicts  bigint NOT NULL DEFAULT 0,
        updated_at    timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (subscription, schema_name, table_name)
    );
    CREATE TABLE rowfilter.conflict_stats_reset (
        subscription  text PRIMARY KEY REFERENCES rowfilter.subscription (name) ON DELETE CASCADE,
        stats_reset   timestamptz NOT NULL
    );
    CREATE VIEW rowfilter.subscription_stats AS
        SELECT s.name AS subname,
               coalesce(sum(c.confl_insert_exists), 0)::bigint AS confl_insert_exists,
               coalesce(sum(c.confl_update_origin_differs), 0)::bigint AS confl_update_origin_differs,
               coalesce(sum(c.confl_update_exists), 0)::bigint AS confl_update_exists,
               coalesce(sum(c.confl_update_missing), 0)::bigint AS confl_update_missing,
               coalesce(sum(c.confl_delete_origin_differs), 0)::bigint AS confl_delete_origin_differs,
               coalesce(sum(c.confl_delete_missing), 0)::bigint AS confl_delete_missing,
               coalesce(sum(c.confl_multiple_unique_conflicts), 0)::bigint AS confl_multiple_unique_conflicts,
               r.stats_reset
        FROM rowfilter.subscription s
        LEFT JOIN rowfilter.conflict_stats c ON c.subscription = s.name
        LEFT JOIN rowfilter.conflict_stats_reset r ON r.subscription = s.name
        GROUP BY s.name, r.stats_reset;
    -- pg_stat_reset_subscription_stats(oid): one subscription, or every one for NULL.
    CREATE FUNCTION rowfilter.reset_subscription_stats(subname text DEFAULT NULL) RETURNS void
        LANGUAGE sql VOLATILE AS $$
        DELETE FROM rowfilter.conflict_stats WHERE subname IS NULL OR subscription = subname;
        INSERT INTO rowfilter.conflict_stats_reset (subscription, stats_reset)
            SELECT name, now() FROM rowfilter.subscription WHERE subname IS NULL OR name = subname
            ON CONFLICT (subscription) DO UPDATE SET stats_reset = EXCLUDED.stats_reset;
        $$;
    CREATE TABLE rowfilter.conflict_log (
        id             bigserial PRIMARY KEY,
        subscription   text NOT NULL REFERENCES rowfilter.subscription (name) ON DELETE CASCADE,
        schema_name    text NOT NULL,
        table_name     text NOT NULL,
        conflict_type  text NOT NULL,
        key            jsonb,
        local_row      jsonb,
        remote_row     jsonb,
        changes        bigint NOT NULL DEFAULT 1,
        commit_lsn     pg_lsn,
        xid            bigint,
        batch_start_lsn pg_lsn,
        batch_end_lsn  pg_lsn,
        logged_at      timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX conflict_log_subscription ON rowfilter.conflict_log (subscription, id);
    """),
    # The conflicts a batch that stopped had met before it stopped, counted then (subscriber/conflicts.py
    # count_stopped): kept per table with the batch's start, so its retry does not count them twice.
    (10, """
    CREATE TABLE rowfilter.conflict_stopped (
        subscription  text NOT NULL REFERENCES rowfilter.subscription (name) ON DELETE CASCADE,
        schema_name   text NOT NULL,
        table_name    text NOT NULL,
        start_lsn     pg_lsn,
        counted       jsonb NOT NULL,
        PRIMARY KEY (subscription, schema_name, table_name)
    );
    -- A reset forgets them too: the retry that commits then counts what it meets in full.
    CREATE OR REPLACE FUNCTION rowfilter.reset_subscription_stats(subname text DEFAULT NULL) RETURNS void
        LANGUAGE sql VOLATILE AS $$
        DELETE FROM rowfilter.conflict_stats WHERE subname IS NULL OR subscription = subname;
        DELETE FROM rowfilter.conflict_stopped WHERE subname IS NULL OR subscription = subname;
        INSERT INTO rowfilter.conflict_stats_reset (subscription, stats_reset)
            SELECT name, now() FROM rowfilter.subscription WHERE subname IS NULL OR name = subname
            ON CONFLICT (subscription) DO UPDATE SET stats_reset = EXCLUDED.stats_reset;
        $$;
    """),
    # pg_stat_subscription_stats' error counts, with PostgreSQL 19's names (its release notes: sync_error_count
    # renamed sync_table_error_count, sync_seq_error_count added): an apply run that failed (flows/apply/drain.py), a table's
    # copy that failed (flows/table_sync/table_copy.py), a sync-sequences run that could not move every sequence
    # (flows/sync_sequences.py). sync_error_count, PostgreSQL 18's name of sync_table_error_count, stays as a column of the
    # view (the same value) for one release (docs/operations.md). The view is made anew for the columns' order,
    # PostgreSQL 19's; a reset sets these back to zero too.
    (11, """
    CREATE TABLE rowfilter.error_stats (
        subscription            text PRIMARY KEY REFERENCES rowfilter.subscription (name) ON DELETE CASCADE,
        apply_error_count       bigint NOT NULL DEFAULT 0,
        sync_seq_error_count    bigint NOT NULL DEFAULT 0,
        sync_table_error_count  bigint NOT NULL DEFAULT 0
    );
    DROP VIEW rowfilter.subscription_stats;
    CREATE VIEW rowfilter.subscription_stats AS
        SELECT s.name AS subname,
               coalesce(e.apply_error_count, 0)::bigint AS apply_error_count,
               coalesce(e.sync_seq_error_count, 0)::bigint AS sync_seq_error_count,
               coalesce(e.sync_table_error_count, 0)::bigint AS sync_table_error_count,
               coalesce(sum(c.confl_insert_exists), 0)::bigint AS confl_insert_exists,
               coalesce(sum(c.confl_update_origin_differs), 0)::bigint AS confl_update_origin_differs,
               coalesce(sum(c.confl_update_exists), 0)::bigint AS confl_update_exists,
               coalesce(sum(c.confl_update_missing), 0)::bigint AS confl_update_missing,
               coalesce(sum(c.confl_delete_origin_differs), 0)::bigint AS confl_delete_origin_differs,
               coalesce(sum(c.confl_delete_missing), 0)::bigint AS confl_delete_missing,
               coalesce(sum(c.confl_multiple_unique_conflicts), 0)::bigint AS confl_multiple_unique_conflicts,
               r.stats_reset,
               coalesce(e.sync_table_error_count, 0)::bigint AS sync_error_count
        FROM rowfilter.subscription s
        LEFT JOIN rowfilter.conflict_stats c ON c.subscription = s.name
        LEFT JOIN rowfilter.conflict_stats_reset r ON r.subscription = s.name
        LEFT JOIN rowfilter.error_stats e ON e.subscription = s.name
        GROUP BY s.name, r.stats_reset, e.apply_error_count, e.sync_seq_error_count, e.sync_table_error_count;
    COMMENT ON COLUMN rowfilter.subscription_stats.sync_error_count IS
        'PostgreSQL 18''s name of sync_table_error_count, kept for one release';
    CREATE OR REPLACE FUNCTION rowfilter.reset_subscription_stats(subname text DEFAULT NULL) RETURNS void
        LANGUAGE sql VOLATILE AS $$
        DELETE FROM rowfilter.conflict_stats WHERE subname IS NULL OR subscription = subname;
        DELETE FROM rowfilter.conflict_stopped WHERE subname IS NULL OR subscription = subname;
        DELETE FROM rowfilter.error_stats WHERE subname IS NULL OR subscription = subname;
        INSERT INTO rowfilter.conflict_stats_reset (subscription, stats_reset)
            SELECT name, now() FROM rowfilter.subscription WHERE subname IS NULL OR name = subname
            ON CONFLICT (subscription) DO UPDATE SET stats_reset = EXCLUDED.stats_reset;
        $$;
    """),
    # schema_changes: follow (apply/schema_follow.py): the DDL a batch ran on the subscriber's tables, committed with it.
    (12, """
    ALTER TABLE rowfilter.batch_history ADD COLUMN schema_changes jsonb;
    """),
]
#: stage_fingerprint() of the declaration the last migration running stage_ddl() was written for.
STAGE_MIGRATED = "68882da0365c2814"


#: The owner of schema ``rowfilter``, and whether it may hold the state: the session's role, a role it is a member of
#: (pg_auth_members, through any chain: a superuser's implicit membership in every role does not count), or a
#: superuser. The owner of a schema may drop and replace every object in it.
_OWNER = """
WITH RECURSIVE mine(oid) AS (
    SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user
    UNION SELECT m.roleid FROM pg_catalog.pg_auth_members m JOIN mine ON m.member = mine.oid)
SELECT r.rolname::text, r.oid IN (SELECT oid FROM mine) OR r.rolsuper, current_user::text
FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_roles r ON r.oid = n.nspowner WHERE n.nspname = %s
"""


def migrate(conn: psycopg.Connection) -> int:
    """Create or upgrade schema ``rowfilter``; return the schema version now in place.

    :raises StateError: the schema exists and its owner is not one to trust with the state (:data:`_OWNER`): a role
        with CREATE on the database made it first (say before the first run), and could drop or replace the tables
        the state lives in, and with them what the apply writes. Nothing is created in it.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        owner, trusted, me = one(conn.execute(_OWNER, (SCHEMA,)))
        if not trusted:
            from airflow_provider_rowfilter.subscriber.state_reader import StateError

            raise StateError(f'schema "{SCHEMA}" of the subscriber is owned by role "{owner}", which is neither role '
                             f'"{me}" nor a role it belongs to nor a superuser: its owner may drop or replace the '
                             "subscription's state in it. Nothing was created or changed",
                             hint=f"if {owner} made it for you, ALTER SCHEMA {SCHEMA} OWNER TO {me} (as its owner or a "
                             f"superuser); if nobody knows why it is there, DROP SCHEMA {SCHEMA} CASCADE and run again")
        conn.execute(f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.schema_version (
            version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())""")
        done = {r[0] for r in conn.execute(f"SELECT version FROM {SCHEMA}.schema_version")}
        for version, ddl in MIGRATIONS:
            if version in done:
                continue
            log.info("migrating schema %s to version %d", SCHEMA, version)
            conn.execute(ddl)
            conn.execute(f"INSERT INTO {SCHEMA}.schema_version (version) VALUES (%s)", (version,))
    return max(v for v, _ in MIGRATIONS)

