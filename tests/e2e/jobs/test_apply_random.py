"""ApplyChanges against PostgreSQL's own logical replication on a seeded random workload.

Three tables (one REPLICA IDENTITY FULL filtered on nullable non-key columns, one DEFAULT filtered
on its key for UPDATE/DELETE and on nullable columns for INSERT only, one with a composite key and a
column list), four publications with different filters and ``publish`` lists (p4 publishes tc's
UPDATE/DELETE without a filter: the copy takes all of tc, its INSERTs stay filtered), and a few
thousand random INSERT/UPDATE/DELETE (key changes, rows moved in and out of the filters, filtered
columns set to NULL, keys removed and used again, a TRUNCATE) in transactions of random size.

The initial copy runs while the publisher changes: some changes are committed after ``refresh``
created the slot and before the copy (they are in every table's copy: replaying one would be a
duplicate key), some while the copy runs (after one table's snapshot and before the next one's, so
each table's recorded position differs), some after it and before the first apply. Our apply then
catches up in several batches bounded by a small ``max_changes``; after each catch-up, once the
native subscription has confirmed the same position, every table must be equal, row for row.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from contextlib import contextmanager

import psycopg
import pyarrow as pa
import pytest

from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.flows.apply import reducers
from airflow_provider_rowfilter.flows.apply.drain import ApplyResult, apply
from airflow_provider_rowfilter.flows.apply.reducers import reduce_batch
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync import table_copy
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
from airflow_provider_rowfilter.spark import apply_frames
from airflow_provider_rowfilter.spark.apply_frames import DecidedBatch
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.databases import names

TABLES = ("ta", "tb", "tc")
SUBSCRIBER = """
CREATE TABLE ta(id int PRIMARY KEY, grp int, v text, n int);
CREATE TABLE tb(id int PRIMARY KEY, cat text, w int);
CREATE TABLE tc(k1 int, k2 text, payload text, q int DEFAULT -1, PRIMARY KEY (k1, k2));
"""
PUBLISHER = """
CREATE TABLE ta(id int PRIMARY KEY, grp int, v text, n int);
ALTER TABLE ta REPLICA IDENTITY FULL;
CREATE TABLE tb(id int PRIMARY KEY, cat text, w int);
CREATE TABLE tc(k1 int, k2 text, payload text, q int, PRIMARY KEY (k1, k2));
INSERT INTO ta SELECT g, CASE WHEN g % 7 = 0 THEN NULL ELSE g % 5 END,
                      CASE WHEN g % 3 = 0 THEN 'x' || g ELSE 'y' || g END,
                      CASE WHEN g % 11 = 0 THEN NULL ELSE g * 37 % 1000 END FROM generate_series(1, 300) g;
INSERT INTO tb SELECT g, CASE WHEN g % 4 = 0 THEN NULL ELSE (ARRAY['p', 'q', 'r'])[1 + g % 3] END,
                      CASE WHEN g % 13 = 0 THEN NULL ELSE g % 90 END FROM generate_series(1, 300) g;
INSERT INTO tc SELECT k1, k2, 'c' || k1 || k2, k1 FROM generate_series(1, 100) k1, unnest(ARRAY['a', 'b', 'z']) k2;
-- ta (FULL): two publications of every action, ORed, on nullable non-key columns.
CREATE PUBLICATION p1 FOR TABLE ta WHERE (grp IS NOT NULL AND grp % 3 <> 0),
                                tc (k1, k2, payload) WHERE (k1 % 4 <> 0 AND k2 <> 'z');
CREATE PUBLICATION p2 FOR TABLE ta WHERE (n > 500 OR v LIKE 'x%');
-- tb (DEFAULT): INSERT filtered on nullable non-key columns (allowed: p3 publishes no UPDATE/DELETE),
-- UPDATE/DELETE/TRUNCATE on the key.
CREATE PUBLICATION p3 FOR TABLE tb WHERE (cat IS NULL OR w > 40) WITH (publish = 'insert');
-- tc: UPDATE and DELETE without a filter (so the initial copy takes every row too), p1's column list.
CREATE PUBLICATION p4 FOR TABLE tb WHERE (id % 2 = 0), tc (k1, k2, payload)
    WITH (publish = 'update, delete, truncate');
"""
PUBLICATIONS = ("p1", "p2", "p3", "p4")
SEEDS = (20240229, 7)
MAX_CHANGES = 1000  # slot rows (messages) per batch: each round of statements needs two or more
ROUNDS = (1300, 1300)  # statements per round after the initial copy
BEFORE_COPY, DURING_COPY, AFTER_COPY = 100, 60, 120  # statements around the copy (DURING: per table)


class Workload:
    """Random statements that are valid on the publisher, and that keep native replication going.

    The model tracks the keys each table holds. A key comes back (in the same batch or a later one)
    only when the removal of its row certainly reached the subscribers: ta's and tc's always do
    (every action of ta has the same filters, tc's UPDATE and DELETE have none), tb's only for an
    even key (p4). A DELETE or key change of an odd tb row leaves that row in the subscribers, and
    inserting its key again would stop PostgreSQL's own apply with a duplicate key too (the
    documented caveat of row filters), so such a key is retired for good (until the TRUNCATE).

    ``neutral``: around the initial copy, native's copy (made before any change) and ours (made
    later, table by table) must start from the same rows. ta's rows always are exactly the rows its
    filters pass (one filter for every action and the copy), but tb's and tc's are not (the copy
    takes the rows ANY publication passes, INSERT has a narrower filter): a row changed between the
    two copies may then be in one subscriber and not the other, as it would between two native
    subscriptions made at different times. So until our copy is done, tb and tc get only changes
    that keep "the subscriber holds the rows the copy filter passes": rows inserted pass their
    INSERT filter, tb's UPDATE/DELETE touch even keys (p4) only.
    """

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.keys: dict[str, set] = {
            "ta": set(range(1, 301)), "tb": set(range(1, 301)),
            "tc": {(k1, k2) for k1 in range(1, 101) for k2 in "abz"}}
        self.used: dict[str, set] = {t: set(keys) for t, keys in self.keys.items()}
        self.retired: set[int] = set()  # tb keys whose row may still be in the subscribers
        self.statements = 0
        self.truncates = 0
        self.reused = 0
        self.neutral = False

    def _remove(self, table: str, key) -> None:
        self.keys[table].discard(key)
        if table == "tb" and key % 2:  # p4's UPDATE/DELETE filter (id % 2 = 0) on the old key
            self.retired.add(key)

    def _add(self, table: str, key) -> None:
        self.keys[table].add(key)
        self.reused += key in self.used[table]
        self.used[table].add(key)

    # --- values ------------------------------------------------------------------------------------
    def _maybe(self, value, p_null: float = 0.15):
        return None if self.rng.random() < p_null else value

    def _grp(self):
        return self._maybe(self.rng.randint(0, 8), 0.25)

    def _n(self):
        return self._maybe(self.rng.randint(0, 1000))

    def _v(self):
        return self._maybe(self.rng.choice("xyy") + str(self.rng.randint(0, 999)), 0.1)

    def _cat(self):
        return self.rng.choice([None, "p", "q", "r"])

    def _w(self):
        return self._maybe(self.rng.randint(0, 90))

    def _payload(self):
        odd = ["", "tab\there", "new\nline", 'quote " and, comma', "back\\slash \\N", "ünïcødé"]
        return self._maybe(self.rng.choice(odd) if self.rng.random() < 0.2 else f"pl-{self.rng.randint(0, 99999)}",
                           0.1)

    def _free(self, table: str, *, even: bool = False):
        while True:
            if table == "tc":
                key = (self.rng.randint(1, 160), self.rng.choice("abyz"))
                if self.neutral and (key[0] % 4 == 0 or key[1] == "z"):  # p1's INSERT filter
                    continue
            else:  # mostly small keys, so that keys removed earlier (this batch or before) come back
                key = self.rng.randint(1, self.rng.choice([400, 1500]))
                if even and key % 2:
                    continue
            if key not in self.keys[table] and not (table == "tb" and key in self.retired):
                return key

    def _pick(self, table: str):
        keys = self.keys[table]
        if self.neutral and table == "tb":
            keys = {k for k in keys if k % 2 == 0}
        return self.rng.choice(sorted(keys)) if keys else None

    # --- statements --------------------------------------------------------------------------------
    def statement(self) -> tuple[str, tuple]:
        table = self.rng.choice(TABLES)
        if table == "tc":
            return self._tc()
        kind = self.rng.choices(["insert", "update", "key", "delete", "range"], [30, 35, 12, 15, 8])[0]
        key = self._pick(table)
        if key is None:
            kind = "insert"
        if kind == "insert":
            new = self._free(table)
            self._add(table, new)
            if table == "ta":
                return "INSERT INTO ta VALUES (%s, %s, %s, %s)", (new, self._grp(), self._v(), self._n())
            cat, w = self._cat(), self._w()
            if self.neutral and not (w is not None and w > 40):
                cat = None  # p3's INSERT filter: cat IS NULL OR w > 40
            return "INSERT INTO tb VALUES (%s, %s, %s)", (new, cat, w)
        if kind == "delete":
            self._remove(table, key)
            return f"DELETE FROM {table} WHERE id = %s", (key,)
        if kind == "key":  # moves the row to a free key; it may leave or enter the filters
            new = self._free(table, even=self.neutral and table == "tb")
            self._remove(table, key)
            self._add(table, new)
            if table == "ta" and self.rng.random() < 0.5:
                return "UPDATE ta SET id = %s, grp = %s WHERE id = %s", (new, self._grp(), key)
            return f"UPDATE {table} SET id = %s WHERE id = %s", (new, key)
        if kind == "range":
            lo = self.rng.randint(1, 400)
            hi = lo + self.rng.randint(0, 12)
            if table == "ta":
                return self.rng.choice([
                    ("UPDATE ta SET n = coalesce(n, 0) + 300 WHERE id BETWEEN %s AND %s", (lo, hi)),
                    ("UPDATE ta SET grp = NULL WHERE id BETWEEN %s AND %s", (lo, hi)),
                    ("UPDATE ta SET grp = id %% 9, v = 'x' || id WHERE id BETWEEN %s AND %s", (lo, hi))])
            even = " AND id %% 2 = 0" if self.neutral else ""
            return f"UPDATE tb SET w = %s, cat = %s WHERE id BETWEEN %s AND %s{even}", (self._w(), self._cat(), lo, hi)
        if table == "ta":
            return self.rng.choice([
                ("UPDATE ta SET grp = %s WHERE id = %s", (self._grp(), key)),
                ("UPDATE ta SET n = %s, v = %s WHERE id = %s", (self._n(), self._v(), key)),
                ("UPDATE ta SET grp = NULL, n = NULL WHERE id = %s", (key,)),
                ("UPDATE ta SET v = v WHERE id = %s", (key,))])
        return self.rng.choice([
            ("UPDATE tb SET cat = %s WHERE id = %s", (self._cat(), key)),
            ("UPDATE tb SET w = %s, cat = NULL WHERE id = %s", (self._w(), key))])

    def _tc(self) -> tuple[str, tuple]:
        kind = self.rng.choices(["insert", "update", "key", "delete"], [30, 35, 15, 20])[0]
        key = self._pick("tc")
        if key is None:
            kind = "insert"
        if kind == "insert":  # p1's filter: k1 % 4 <> 0 AND k2 <> 'z'
            new = self._free("tc")
            self._add("tc", new)
            return "INSERT INTO tc VALUES (%s, %s, %s, %s)", (*new, self._payload(), self.rng.randint(0, 9))
        if kind == "delete":
            self._remove("tc", key)
            return "DELETE FROM tc WHERE k1 = %s AND k2 = %s", key
        if kind == "key":
            new = self._free("tc")
            self._remove("tc", key)
            self._add("tc", new)
            return "UPDATE tc SET k1 = %s, k2 = %s WHERE k1 = %s AND k2 = %s", (*new, *key)
        if self.rng.random() < 0.6:
            return "UPDATE tc SET payload = %s WHERE k1 = %s AND k2 = %s", (self._payload(), *key)
        return "UPDATE tc SET q = q + 1 WHERE k1 = %s AND k2 = %s", key  # only a column outside the list

    def transactions(self, statements: int, *, truncate: bool = False):
        """Transactions of random size holding ``statements`` statements (a TRUNCATE of tb inside one)."""
        left = statements
        truncate_at = self.rng.randint(1, statements - 1) if truncate else -1
        while left > 0:
            size = min(left, self.rng.choice([1, 1, 2, 3, 5, 8, 13, 40]))
            txn = []
            for _ in range(size):
                if left == truncate_at:  # both subscribers' tb is emptied too: every key is free again
                    self.keys["tb"].clear()
                    self.retired.clear()
                    self.truncates += 1
                    txn.append(("TRUNCATE tb", ()))
                txn.append(self.statement())
                left -= 1
            self.statements += len(txn)
            yield txn

    def commit(self, dsn: str, statements: int, *, truncate: bool = False) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for txn in self.transactions(statements, truncate=truncate):
                with conn.transaction():
                    for text, params in txn:
                        conn.execute(text, params)


def counting(method, calls: Counter, name: str):
    """``method``, counting its calls in ``calls[name]``."""
    def counted(self, *args, **kwargs):
        calls[name] += 1
        return method(self, *args, **kwargs)
    return counted


def catch_up(spec, spark, counts: Counter) -> list[ApplyResult]:
    """Apply bounded batches until the capture says the slot holds nothing more."""
    batches = []
    while True:
        result = apply(spec, max_changes=MAX_CHANGES, spark=spark)
        batches.append(result)
        for table_counts in result.tables.values():
            counts.update(table_counts)
        if not result.capture["more"]:
            return batches
        assert len(batches) < 20, "the batches do not get anywhere"


def same_as_spark(spark, compared: Counter):
    """``reduce_batch`` (flows/apply/reducers.py), held against Spark's reduction of the same batch (the same
    segments' rows, as Arrow tables): the same facts and the same staged rows (keys and values compared as
    the JSON they are)."""
    def both(segments, plan, token, exact=frozenset()):
        segments = list(segments)
        facts, rows = reduce_batch(segments, plan, token, exact)
        decided = apply_frames.decide_frame(spark.createDataFrame(pa.concat_tables(segments)), plan)
        try:
            spark_facts, spark_rows = decided.collected(token, sorted(exact))
        finally:
            decided.release()
        assert facts == spark_facts
        assert _staged(rows) == _staged(spark_rows)
        compared["batches"] += 1
        return facts, rows
    return both


def _staged(rows) -> list:
    parsed = [{**r, "key": json.loads(r["key"] or "null"), "vals": json.loads(r["vals"] or "null")}
              for r in rows.to_pylist()]
    return sorted(parsed, key=repr)


# Judged in Spark: the workload is built to reach every judgement (filtered, transformed, …). Judged by the
# publisher (source), each batch is reduced in the job's process AND by Spark, and both must agree.
@pytest.mark.parametrize("seed, filtering", [(SEEDS[0], "spark"), (SEEDS[1], "spark"), (SEEDS[1], "source")])
def test_random_workload_matches_native(dbs, spark, monkeypatch, seed, filtering):
    dbs.create(PUBLISHER, SUBSCRIBER)
    native = dbs.subscribe_native(PUBLICATIONS)
    spec = dbs.spec(PUBLICATIONS, f"rand_{next(names)}", filtering)
    work = Workload(seed)

    refresh(spec)  # the slot exists from here on: everything after it is captured
    work.neutral = True
    work.commit(dbs.publisher, BEFORE_COPY)  # in every table's copy: must not be applied again

    real = table_copy.exported_snapshot

    @contextmanager
    def changes_during_the_copy(conn):
        with real(conn) as snap:  # after this table's snapshot, before its rows are read
            work.commit(dbs.publisher, DURING_COPY)
            yield snap

    monkeypatch.setattr(table_copy, "exported_snapshot", changes_during_the_copy)
    copied = sync_tables(spec, spark=spark)
    monkeypatch.undo()
    assert copied.ok, copied.summary()
    # Each table's copy saw the changes made during the previous ones: their positions differ.
    lsns = [parse_lsn(t.lsn) for t in sorted(copied.tables, key=lambda t: t.table)]
    assert [t.table for t in sorted(copied.tables, key=lambda t: t.table)] == [f"public.{t}" for t in TABLES]
    assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns), lsns
    work.commit(dbs.publisher, AFTER_COPY)  # after the copy, before the first apply
    work.neutral = False

    # Batches of up to MAX_CHANGES changes: the smaller ones are judged and staged in one action and
    # COPYed from the driver, the others checkpointed and staged from the executors. Both must agree with native.
    monkeypatch.setattr(reducers, "COLLECTED_BATCH_CHANGES", MAX_CHANGES // 2)
    paths: Counter = Counter()
    for name in ("collected", "staged"):
        monkeypatch.setattr(DecidedBatch, name, counting(getattr(DecidedBatch, name), paths, name))
    compared: Counter = Counter()
    monkeypatch.setattr(reducers, "reduce_batch", same_as_spark(spark, compared))
    counts: Counter = Counter()
    batches = catch_up(spec, spark, counts)
    native.wait_caught_up()
    dbs.assert_same(TABLES)
    for number, statements in enumerate(ROUNDS):
        work.commit(dbs.publisher, statements, truncate=number == 0)
        batches = catch_up(spec, spark, counts)
        # A run drains in batches of at most MAX_CHANGES slot rows: a round takes several.
        assert sum(b.batches for b in batches if b.changes) >= 2, "a round fit in one batch: max_changes does not bound it"
        native.wait_caught_up()
        dbs.assert_same(TABLES)
        assert all(state == "r" for state in batches[-1].states.values()), batches[-1].states

    if filtering == "spark":
        assert paths["collected"] >= 1 and paths["staged"] > paths["collected"], paths  # collected() calls staged()
        assert not compared
    else:  # every batch with a change: the two reductions compared
        assert compared["batches"] >= 4 and paths["collected"] == compared["batches"], (compared, paths)
    assert work.statements >= 3000 and work.truncates == 1 and work.reused > 100, (work.statements, work.truncates, work.reused)
    # The workload reached every rule it is meant to exercise (else equality would prove little); judged by the
    # publisher, the apply does not see what was filtered or transformed.
    judged = ("filtered", "update_to_insert", "update_to_delete") if filtering == "spark" else ()
    for kind in ("insert", "update", "delete", "truncate", "missing_update", "missing_delete", *judged):
        assert counts[kind] > 0, (kind, counts)
    assert all(table_rows(dbs.ours, t) for t in TABLES)
