"""Failover (issue 30): a real PostgreSQL primary and physical standby, the primary killed with SIGKILL.

On PostgreSQL 17, the first release with failover slots (the reference's failover procedure is written for it), and
on 18: what differs between them (readiness reads a synchronized slot's invalidation from ``conflicting`` on 17 and
from ``invalidation_reason`` on 18: publisher/readiness.py) is run on both, the readiness, the promotion between
runs, the unsynchronized standby, the capture from a standby and the failover switch; the kill points and the
other promotions are shared out between them, each killed mode on each version (:data:`KILLS`).

A pair (tests/e2e/jobs/ha_pair.py) is built once per version for the module; each test creates its own publisher
database on the current primary, a subscription of ours (``filtering: source``, the publisher's
pgoutput judging; ``spark``, the apply judging; or both) and a native subscription made with
``failover = true`` as the referee, all reaching the publisher through one libpq URL of both servers
with ``target_session_attrs=read-write``. The primary is killed at a fault point of one of our runs
(faults.py, reached in the run's own process: the capture mid-read and after its segment, the
apply after staging, mid-transaction and after commit), between runs, or at a random moment of a run
beside a writing workload; the standby is promoted, a new standby cloned, more changes made, and ours
and the referee go on: every table must equal the referee's and the promoted publisher's rows under
the filters, every table in ``r``. Also: a table in ``d`` and one in ``f`` at the promotion, a standby
whose slot was not synchronized (refused clearly, nothing lost), a log holding changes the standby
never received (refused: what ``synchronized_standby_slots`` prevents), table positions taken on the old
primary past the fork (refused, then repaired in place by ``reconcile``), capture from a standby, and
the failover flag switched on an existing slot, with readiness named by ``readiness``, ``status`` and
``validate``. Spark judges only where a ``spark`` subscription has changes (4 batches in the module).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import random
import threading
import time
from dataclasses import dataclass

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter import cli, faults
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply import capture_ahead
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
from airflow_provider_rowfilter.flows.verify.reconcile import reconcile
from airflow_provider_rowfilter.publisher import failover
from airflow_provider_rowfilter.publisher.capture import capture
from airflow_provider_rowfilter.publisher.capture_objects import capture_names
from airflow_provider_rowfilter.publisher.failover import LineageError, StandbyWaitError
from airflow_provider_rowfilter.publisher.readiness import readiness
from airflow_provider_rowfilter.subscriber.state import SlotLostError
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.ha_pair import (
    PUBLICATIONS,
    SUBSCRIBER_TABLES,
    TABLES,
    HaPair,
    Native,
    Workload,
    create_publisher,
    execute,
    filtered_rows,
    query,
)

MODES = ("source", "spark")
ORDERS, ITEMS = TableName("public", "orders"), TableName("public", "items")
_names = itertools.count(1)


VERSIONS = (17, 18)


def on(*versions: int):
    """Run the test on a pair of each of ``versions`` (the ``pair`` fixture's parameter)."""
    return pytest.mark.parametrize("pair", versions, indirect=True, ids=[f"pg{v}" for v in versions])


@pytest.fixture(scope="module")
def pair(local_pg, request):
    """The primary and standby of the module, of PostgreSQL ``request.param`` (17 or 18; a test says which with
    :func:`on`); the shared cluster retries a native subscription's lost connection after 200 ms instead of 5 s
    (wal_retrieve_retry_interval), for the referee."""
    execute(local_pg.dsn(), "ALTER SYSTEM SET wal_retrieve_retry_interval = '200ms'", "SELECT pg_reload_conf()")
    began = time.monotonic()
    built = HaPair(request.param)
    print(f"\nPostgreSQL {request.param} primary and standby built in {time.monotonic() - began:.1f} s")
    yield built
    built.stop()
    execute(local_pg.dsn(), "ALTER SYSTEM RESET wal_retrieve_retry_interval", "SELECT pg_reload_conf()")
    print(f"\n{len(built.failovers)} failovers (promotion and a new standby): "
          + ", ".join(f"{s:.1f} s" for s in built.failovers))


@dataclass
class Scene:
    """One publisher database on the pair, our subscriptions of it and the referee."""

    pair: HaPair
    db: str
    specs: dict[str, SubscriptionSpec]
    native: Native
    workload: Workload
    spark: object

    def publisher(self) -> str:
        return self.pair.primary.dsn(self.db)

    def apply(self, mode: str):
        return apply(self.specs[mode], spark=self.spark)

    def slots(self) -> list[str]:
        return [capture_names(s.subscription)[0] for s in self.specs.values()] + [self.native.name]

    def copied(self, mode: str) -> list[tuple[str, str]]:
        return query(self.specs[mode].subscriber, "SELECT schema_name || '.' || table_name, lsn::text FROM "
                     "rowfilter.subscription_rel WHERE state = 'f' AND subscription = %s",
                     (self.specs[mode].subscription,))

    def wait_ready(self, timeout: float = 60, *, runs: bool = True) -> None:
        """Every slot failover-ready on the standby, as ``readiness`` (PostgreSQL's procedure) says; and the
        standby has replayed the copy position of every table in ``f``.

        A synced slot is kept (no longer temporary) once the primary's slot has moved past the standby's redo
        point; it moves at a running-transactions record, which a busy primary logs every 15 s: here the
        primary logs one and our runs (``runs``) move the slots past it, as the next applies would.
        """
        deadline = time.monotonic() + timeout
        standby = self.pair.standby.dsn(self.db)
        while True:
            if runs:
                execute(self.publisher(), "SELECT pg_log_standby_snapshot()")
                for mode in self.specs:
                    self.apply(mode)
            with psycopg.connect(self.publisher(), autocommit=True) as pub:
                found = [r for slot in self.slots() for r in readiness(
                    pub, slot, [("standby", lambda: psycopg.connect(standby, autocommit=True))],
                    [c for m in self.specs for c in self.copied(m)])]
            if all(r.ready for r in found):
                return
            assert time.monotonic() < deadline, [r.problems for r in found if not r.ready]
            time.sleep(0.2)

    def promoted(self) -> None:
        """After the primary died: promote, then point everything at the new pair (one URL of both servers)."""
        self.pair.promote()
        for mode, spec in self.specs.items():
            self.specs[mode] = dataclasses.replace(spec, publisher=self.pair.url(self.db))
        self.native.reconnect(self.pair.conninfo(self.db))

    def assert_same(self) -> None:
        self.native.wait_caught_up()
        for table in TABLES:
            expected = filtered_rows(self.publisher(), table)
            assert self.native.rows(table) == expected, f"the referee's {table} differs from the publisher's"
            for mode, spec in self.specs.items():
                assert table_rows(spec.subscriber, table) == expected, f"{mode}: {table} differs"
        for spec in self.specs.values():
            states = {s for (s,) in query(spec.subscriber, "SELECT state FROM rowfilter.subscription_rel "
                                          "WHERE subscription = %s", (spec.subscription,))}
            assert states == {"r"}, states


@pytest.fixture
def modes():
    """Our subscriptions of the scene, by filtering mode (a test parametrizes it)."""
    return MODES


@pytest.fixture
def scene(pair, fresh_db, tmp_path, spark, modes):
    n = next(_names)
    db = f"pub_failover_{n}"
    create_publisher(pair, db)
    specs = {}
    for mode in modes:
        subscriber = fresh_db()
        execute(subscriber, SUBSCRIBER_TABLES)
        specs[mode] = SubscriptionSpec(subscription=f"fo_{mode}_{n}", publisher=pair.url(db), subscriber=subscriber,
                                       publications=PUBLICATIONS, change_log=str(tmp_path / mode), filtering=mode)
        refresh(specs[mode])
        assert sync_tables(specs[mode], spark=spark).ok
    native = Native(fresh_db(), f"nat_fo_{n}", pair.conninfo(db), lambda: pair.primary.dsn(db))
    yield Scene(pair, db, specs, native, Workload(seed=n), spark)
    native.drop()
    pair.drop_slots(db)


def killing_at(monkeypatch, point: str, kill) -> list[str]:
    """The first time a run reaches ``point`` (faults.py), ``kill`` runs there; returns what fired."""
    fired: list[str] = []
    original = faults.point

    def at(name: str) -> None:
        if name == point and not fired:
            fired.append(name)
            kill()
        original(name)

    monkeypatch.setattr(faults, "point", at)
    return fired


#: Where the primary dies, whose run reaches that point, and on which version: each of our two modes is killed
#: mid-run at some, and each version sees a kill in a capture and in an apply, of both modes.
KILLS = [("capture-mid-read", "source", 17), ("capture-after-segment", "spark", 18),
         ("apply-after-stage", "source", 18), ("apply-mid-transaction", "spark", 17),
         ("apply-after-commit", "source", 17)]


@pytest.mark.parametrize(("point", "modes", "pair"), [(p, (m,), v) for p, m, v in KILLS], indirect=["pair"],
                         ids=[f"{p}-{m}-pg{v}" for p, m, v in KILLS])
def test_primary_killed_during_a_run_then_it_goes_on_from_the_promoted_standby(scene, monkeypatch, point, modes):
    (killed,) = modes
    scene.wait_ready()
    scene.workload.run(scene.publisher(), 60)
    # Small row groups and fetches, so that the capture writes a row group while its read of the slot is open.
    monkeypatch.setattr(capture_ahead, "capture", functools.partial(capture, row_group_rows=20, fetch_rows=20))
    fired = killing_at(monkeypatch, point, scene.pair.kill_primary)
    try:
        scene.apply(killed)  # a point after the run's last publisher access lets it finish
    except RowFilterError as e:
        assert "connect" in str(e) or "connection" in str(e) or "terminat" in str(e), e
        if point == "capture-mid-read":  # the hint knows the publisher went away (issue 46 item 3)
            assert "the publisher went away while replication slot" in str(e) and "run refresh" not in str(e), e
    monkeypatch.undo()
    assert fired == [point]
    scene.promoted()
    synced = query(scene.publisher(), "SELECT slot_name, synced FROM pg_replication_slots WHERE slot_type = 'logical'")
    assert all(s for _, s in synced), synced  # the slots the runs go on from came from the old primary
    scene.workload.run(scene.publisher(), 30)
    result = scene.apply(killed)
    if point == "capture-after-segment":
        # The log ends where the old primary's slot was to be advanced; the synced slot is behind it: the changes
        # the log has are recognised by position and the slot advanced past them, none read twice.
        assert result.capture["recovered_lsn"] is not None, result.summary()
    scene.assert_same()


@on(*VERSIONS)
def test_primary_killed_between_runs(scene):
    scene.wait_ready()
    scene.workload.run(scene.publisher(), 60)  # waiting in the slots when the primary dies
    scene.pair.kill_primary()
    scene.promoted()
    scene.workload.run(scene.publisher(), 20)
    for mode in MODES:
        scene.apply(mode)
    scene.assert_same()


@on(18)
@pytest.mark.parametrize("modes", [("source",)])
def test_primary_killed_at_a_random_moment_of_a_run_beside_a_writing_workload(scene, modes):
    scene.wait_ready()
    rng = random.Random(30)
    stop, failures = threading.Event(), []

    def applying(mode: str) -> None:
        while not stop.is_set():
            try:
                scene.apply(mode)
            except RowFilterError as e:
                failures.append((mode, e))
                return

    def writing() -> None:
        try:
            while not stop.is_set():
                scene.workload.run(scene.publisher(), 5)
        except psycopg.Error:
            pass

    threads = [threading.Thread(target=writing), threading.Thread(target=applying, args=("source",))]
    for t in threads:
        t.start()
    time.sleep(rng.uniform(0.5, 2.0))
    scene.pair.kill_primary()
    stop.set()
    for t in threads:
        t.join(60)
    scene.promoted()
    scene.workload.run(scene.publisher(), 20)
    scene.apply("source")
    scene.assert_same()


@on(17)
@pytest.mark.parametrize("modes", [("source",)])
def test_promotion_while_tables_are_in_d_and_f(scene, monkeypatch, modes):
    """``f``: copied from the old primary, its position on the standby's history (readiness waited for the replay);
    ``d``: its copy dies with the primary and is made again from the promoted standby."""
    from airflow_provider_rowfilter.flows.table_sync import sync as snapshot
    from airflow_provider_rowfilter.flows.table_sync import table_copy

    scene.wait_ready()
    spec = scene.specs["source"]
    snapshot.resync(spec, [ORDERS, ITEMS])  # both emptied, back in i (the slot and the log kept)
    scene.workload.run(scene.publisher(), 20)
    assert sync_tables(spec, [ORDERS], spark=scene.spark).ok  # orders: f
    scene.wait_ready(runs=False)  # orders stays in f: the standby must have replayed its copy position
    original = table_copy.copy_direct

    def dying(*args, **kwargs):
        scene.pair.kill_primary()  # items is in d: its copy reads from the dying primary
        return original(*args, **kwargs)

    monkeypatch.setattr(table_copy, "copy_direct", dying)
    result = sync_tables(spec, [ITEMS], spark=scene.spark)
    monkeypatch.undo()
    states = dict(query(spec.subscriber, "SELECT table_name, state FROM rowfilter.subscription_rel"))
    assert not result.ok and states == {"orders": "f", "items": "d"}, (result.summary(), states)
    scene.promoted()
    assert sync_tables(scene.specs["source"], spark=scene.spark).ok  # items again, from the promoted standby
    scene.workload.run(scene.publisher(), 20)
    scene.apply("source")
    scene.assert_same()


@on(*VERSIONS)
def test_a_standby_whose_slot_is_not_synced_is_refused_clearly_and_nothing_is_lost(pair, fresh_db, tmp_path, spark,
                                                                                   capsys):
    db = f"pub_failover_{next(_names)}"
    create_publisher(pair, db)
    execute(pair.standby.dsn(), "ALTER SYSTEM SET sync_replication_slots = off", "SELECT pg_reload_conf()")
    subscriber = fresh_db()
    execute(subscriber, SUBSCRIBER_TABLES)
    spec = SubscriptionSpec(subscription=f"fo_unsynced_{next(_names)}", publisher=pair.url(db), subscriber=subscriber,
                            publications=PUBLICATIONS, change_log=str(tmp_path / "log"),
                            standbys=(pair.standby.dsn(db),))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"subscription": spec.subscription, "publisher": spec.publisher,
                                    "subscriber": subscriber, "publications": list(PUBLICATIONS),
                                    "change_log": spec.change_log, "standbys": list(spec.standbys)}))
    refresh(spec)
    assert sync_tables(spec, spark=spark).ok
    workload = Workload(seed=7)
    workload.run(pair.primary.dsn(db), 20)
    apply(spec, spark=spark)
    # Readiness says why, and the fix, before anyone promotes.
    assert cli.main(["status", "--spec", str(path)]) == 0
    out = capsys.readouterr()
    said = " ".join((out.out + out.err).split())
    assert "NOT failover ready" in said and "sync_replication_slots is off on the standby" in said, said
    assert f'replication slot "rowfilter_{spec.subscription}" is not on the standby yet' in said, said
    before = {t: table_rows(subscriber, t) for t in TABLES}
    positions = query(subscriber, "SELECT table_name, state, lsn::text FROM rowfilter.subscription_rel ORDER BY 1")
    workload.run(pair.primary.dsn(db), 20)
    pair.kill_primary()
    pair.promote()
    execute(pair.primary.dsn(), "ALTER SYSTEM RESET sync_replication_slots", "SELECT pg_reload_conf()")
    spec = dataclasses.replace(spec, publisher=pair.url(db), standbys=())
    with pytest.raises(SlotLostError) as refused:
        apply(spec, spark=spark)
    text = str(refused.value)
    assert f'replication slot "rowfilter_{spec.subscription}" no longer exists on the publisher' in text, text
    assert "refresh --recreate-slot" in text, text
    # Nothing lost: the subscriber's rows and positions as they were, the error recorded for status and the sensor.
    assert {t: table_rows(subscriber, t) for t in TABLES} == before
    assert query(subscriber, "SELECT table_name, state, lsn::text FROM rowfilter.subscription_rel ORDER BY 1") == \
        positions
    assert "no longer exists" in query(subscriber, "SELECT last_error FROM rowfilter.subscription")[0][0]
    # The way back today: a new slot and a new copy.
    refresh(spec, recreate_slot=True)
    assert sync_tables(spec, spark=spark).ok
    apply(spec, spark=spark)
    for table in TABLES:
        assert table_rows(subscriber, table) == filtered_rows(pair.primary.dsn(db), table)
    pair.drop_slots(db)


@on(17)
def test_what_the_standby_never_received_is_refused_and_table_positions_are_repaired_in_place(pair, fresh_db,
                                                                                             tmp_path, spark,
                                                                                             monkeypatch):
    """Without synchronized_standby_slots nothing waits for the standby. Two subscriptions, one promotion:
    ``fork``'s capture runs ahead of the standby: after the promotion, what its log (and subscriber) holds past the
    fork was never on the new primary: refused, naming it. ``pos`` captures nothing past the fork, but its orders
    are copied again and its items reconciled on the old primary: their positions (and maybe rows) lie past the
    fork on the old timeline. (Before the primary stops waiting for the standby, a reconcile and a refresh wait for
    it and fail, changing nothing.) Refused, naming both tables and the repair; ``rowfilter reconcile`` repairs them in
    place from the promoted publisher, and the apply goes on."""
    db = f"pub_failover_{next(_names)}"
    create_publisher(pair, db)
    specs = {}
    for name in ("fork", "pos"):
        subscriber = fresh_db()
        execute(subscriber, SUBSCRIBER_TABLES)
        specs[name] = SubscriptionSpec(subscription=f"fo_{name}_{next(_names)}", publisher=pair.url(db),
                                       subscriber=subscriber, publications=PUBLICATIONS,
                                       change_log=str(tmp_path / name))
        refresh(specs[name])
        assert sync_tables(specs[name], spark=spark).ok
    deadline = time.monotonic() + 60
    while len(query(pair.standby.dsn(), "SELECT 1 FROM pg_replication_slots WHERE slot_name = ANY(%s) AND NOT "
                    "temporary", ([f"rowfilter_{s.subscription}" for s in specs.values()],))) < len(specs):
        execute(pair.primary.dsn(db), "SELECT pg_log_standby_snapshot()")
        for spec in specs.values():
            apply(spec, spark=spark)
        assert time.monotonic() < deadline, "the slots were never synchronized"
        time.sleep(0.2)
    # The standby stops receiving. While the primary names it in synchronized_standby_slots, a reconcile and a
    # refresh (a position each) wait for it, then fail, holding and recording nothing.
    execute(pair.standby.dsn(), "ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()")
    time.sleep(0.5)
    Workload(seed=9).run(pair.primary.dsn(db), 30)
    pos = specs["pos"]
    states = query(pos.subscriber, "SELECT table_name, state, lsn::text FROM rowfilter.subscription_rel ORDER BY 1")
    monkeypatch.setattr(failover, "STANDBY_WAIT_SECONDS", 1.0)
    waited = reconcile(pos, [ITEMS], spark=spark)
    assert "the standbys of synchronized_standby_slots have not confirmed the position" in waited.errors[str(ITEMS)]
    with pytest.raises(StandbyWaitError, match=f'"standby_{pair.generation}" \\(at '):
        refresh(pos)
    assert query(pos.subscriber, "SELECT table_name, state, lsn::text FROM rowfilter.subscription_rel ORDER BY 1") \
        == states
    monkeypatch.undo()
    # The primary no longer waits for it.
    execute(pair.primary.dsn(), "ALTER SYSTEM RESET synchronized_standby_slots", "SELECT pg_reload_conf()")
    time.sleep(0.5)
    apply(specs["fork"], spark=spark)  # captured and applied: the standby has none of it
    from airflow_provider_rowfilter.flows.table_sync import sync as snapshot

    assert snapshot.resync(pos, [ORDERS], copy=True, spark=spark).ok  # orders: f, copied past the fork
    assert reconcile(pos, [ITEMS], spark=spark).ok  # items: f, reconciled past the fork
    old = dict(query(pos.subscriber, "SELECT table_name, lsn::text FROM rowfilter.subscription_rel"))
    pair.kill_primary()
    pair.promote()
    specs = {name: dataclasses.replace(spec, publisher=pair.url(db)) for name, spec in specs.items()}
    with pytest.raises(LineageError) as refused:
        apply(specs["fork"], spark=spark)
    text = str(refused.value)
    assert "the subscription holds changes the promoted publisher never received: the change log ends at" in text, text
    assert "forked from timeline" in text and "synchronized_standby_slots" in text, text
    pos = specs["pos"]
    began = time.monotonic()
    with pytest.raises(LineageError) as refused:
        apply(pos, spark=spark)
    text = " ".join(str(refused.value).split())
    assert f"table positions the promoted publisher never had: public.items at {old['items']}" in text, text
    assert f"public.orders at {old['orders']}" in text, text
    assert "`rowfilter reconcile --table public.items --table public.orders` repairs each in place" in text, text
    assert dict(query(pos.subscriber, "SELECT table_name, lsn::text FROM rowfilter.subscription_rel")) == old
    repaired = reconcile(pos, spark=spark)  # both, from the promoted publisher: new positions on its timeline
    assert repaired.ok, repaired.summary()
    # The rows the old primary had past the fork (the workload's) were undone in place, not by emptying the tables.
    assert sum(t.inserted + t.updated + t.deleted for t in repaired.tables) > 0, repaired.summary()
    Workload(seed=10).run(pair.primary.dsn(db), 20)
    apply(pos, spark=spark)
    for table in TABLES:
        assert table_rows(pos.subscriber, table) == filtered_rows(pair.primary.dsn(db), table), table
    assert {s for (s,) in query(pos.subscriber, "SELECT state FROM rowfilter.subscription_rel")} == {"r"}
    print(f"\nrefused, reconciled and applied after the promotion in {time.monotonic() - began:.1f} s")
    pair.drop_slots(db)


@on(*VERSIONS)
def test_capture_from_a_standby_keeps_the_primary_free_of_our_objects(pair, fresh_db, tmp_path, spark):
    db = f"pub_standby_{next(_names)}"
    create_publisher(pair, db)
    subscriber = fresh_db()
    execute(subscriber, SUBSCRIBER_TABLES)
    spec = SubscriptionSpec(subscription=f"sb_{next(_names)}", publisher=pair.standby.dsn(db), subscriber=subscriber,
                            publications=PUBLICATIONS, change_log=str(tmp_path / "log"))
    nudging = threading.Event()

    def nudge() -> None:  # slot creation on a standby waits for the primary's next running-transactions record
        while not nudging.wait(0.2):
            execute(pair.primary.dsn(db), "SELECT pg_log_standby_snapshot()")

    helper = threading.Thread(target=nudge)
    helper.start()
    try:
        time.sleep(0.5)  # the database and its tables replayed on the standby
        result = refresh(spec)
        assert result.slot_created and not result.failover
        with pytest.raises(RowFilterError, match="the publisher is a standby, and filtering is spark"):
            refresh(dataclasses.replace(spec, subscription=f"sb_spark_{next(_names)}", filtering="spark"))
        assert sync_tables(spec, spark=spark).ok  # the copy's snapshot exported on the standby
    finally:
        nudging.set()
        helper.join()
    Workload(seed=11).run(pair.primary.dsn(db), 40)
    target = query(pair.primary.dsn(db), "SELECT pg_current_wal_lsn()::text")[0][0]
    deadline = time.monotonic() + 30
    while not query(pair.standby.dsn(db), "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,))[0][0]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    apply(spec, spark=spark)
    for table in TABLES:
        assert table_rows(subscriber, table) == filtered_rows(pair.primary.dsn(db), table)
    assert query(pair.primary.dsn(db), "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'rowfilter%%'") \
        == []
    assert query(pair.primary.dsn(db), "SELECT pubname FROM pg_publication WHERE pubname LIKE 'rowfilter%%'") == []
    execute(pair.standby.dsn(db), f"SELECT pg_drop_replication_slot('rowfilter_{spec.subscription}')")
    pair.drop_slots(db)


@on(*VERSIONS)
def test_refresh_switches_an_existing_slot_to_failover_and_readiness_names_what_is_missing(pair, fresh_db, tmp_path,
                                                                                            capsys):
    db = f"pub_switch_{next(_names)}"
    create_publisher(pair, db)
    subscriber = fresh_db()
    execute(subscriber, SUBSCRIBER_TABLES)
    spec = SubscriptionSpec(subscription=f"fo_switch_{next(_names)}", publisher=pair.url(db), subscriber=subscriber,
                            publications=PUBLICATIONS, change_log=str(tmp_path / "log"), failover=False)
    slot = f"rowfilter_{spec.subscription}"
    assert not refresh(spec).failover
    standby = [("standby", lambda: psycopg.connect(pair.standby.dsn(), autocommit=True))]
    with psycopg.connect(pair.primary.dsn(db), autocommit=True) as pub:
        (found,) = readiness(pub, slot, standby)
    assert not found.ready and f'replication slot "{slot}" is not a failover slot' in found.problems[0], found
    path = tmp_path / "spec.yaml"  # validate says the same, per standby
    path.write_text(yaml.safe_dump({"subscription": spec.subscription, "publisher": spec.publisher,
                                    "publications": list(PUBLICATIONS), "standbys": [pair.standby.dsn(db)],
                                    "failover": False}))
    capsys.readouterr()
    assert cli.main(["validate", "--spec", str(path), "--json"]) == 0
    (said,) = json.loads(capsys.readouterr().out)["standbys"]
    assert said["standby"] == f"127.0.0.1:{pair.standby.port}" and not said["ready"], said
    assert any("is not a failover slot" in p for p in said["problems"]), said
    result = refresh(dataclasses.replace(spec, failover=None))  # the default: on, where the server can
    assert result.failover and result.failover_switched and result.changed
    assert query(pair.primary.dsn(db), "SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (slot,)) == \
        [(True,)]
    assert not refresh(dataclasses.replace(spec, failover=None)).failover_switched  # twice: nothing more
    execute(pair.primary.dsn(), "ALTER SYSTEM SET synchronized_standby_slots = ''", "SELECT pg_reload_conf()")
    try:
        with psycopg.connect(pair.primary.dsn(db), autocommit=True) as pub:
            (found,) = readiness(pub, slot, standby)
        said = " ".join(found.problems)
        assert "synchronized_standby_slots on the primary does not name the standby's slot" in said, said
        assert f"ALTER SYSTEM SET synchronized_standby_slots = 'standby_{pair.generation}'" in said, said
    finally:
        execute(pair.primary.dsn(), f"ALTER SYSTEM SET synchronized_standby_slots = 'standby_{pair.generation}'",
                "SELECT pg_reload_conf()")
    pair.drop_slots(db)
