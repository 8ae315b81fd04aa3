"""The ``rowfilter`` commands that run a job in process and say what it did (status and validate have
modules of their own)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from airflow_provider_rowfilter.cli.console import EXIT_BROKEN, err_console, say
from airflow_provider_rowfilter.console.progress import progress_bars, wants_bars
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.humane import batch_lag, counts_text, duration


def refresh(spec: SubscriptionSpec, *, recreate_slot: bool = False, reconcile: bool | None = None) -> int:
    """Run the RefreshPublication job in-process and say what it added and removed."""
    from airflow_provider_rowfilter.flows.refresh import refresh as run_refresh

    result = run_refresh(spec, recreate_slot=recreate_slot, reconcile=reconcile)
    # A table whose copy filter or column list changed: the job's own WARNING line says what and what to do.
    for check in result.reconciled:
        say(f"  reconciled {check['table']}: inserted {check['inserted']:,}, updated {check['updated']:,}, "
            f"deleted {check['deleted']:,}; state f at {check['lsn']}")
    if not result.changed:
        say(f"subscription {spec.subscription}: up to date ({len(result.tables)} tables, at {result.lsn})")
        return 0
    say(f"subscription {spec.subscription}: refreshed at {result.lsn}")
    for name in result.added:
        say("  ", (f"+ {name}", "green"), f"  ({'i: waiting for its initial copy' if spec.copy_data else 'r'})")
    for name in result.removed:
        say("  ", (f"- {name}", "red"), "  (no longer published; its progress is dropped)")
    if result.slot_created:
        say(f"  created replication slot rowfilter_{spec.subscription} (pgoutput{', failover' if result.failover else ''})"
            " on the publisher")
    if result.failover_switched:
        say(f"  replication slot rowfilter_{spec.subscription} is now {'' if result.failover else 'not '}a failover slot")
    if result.definitions_changed and not (result.added or result.removed):
        say("  definitions changed: they apply to changes after this position; rows already copied "
            "are not re-copied (as in PostgreSQL)")
    return 0


def compare(spec: SubscriptionSpec, args: argparse.Namespace) -> int:
    """``verify``, ``reconcile`` (or ``resync --reconcile``), in-process: each table's result, one paragraph each.

    ``verify`` exits 1 when a table differs; ``reconcile`` when a table could not be reconciled.
    """
    from airflow_provider_rowfilter.core.relation import TableName
    from airflow_provider_rowfilter.flows.verify.reconcile import reconcile
    from airflow_provider_rowfilter.flows.verify.verify import MAX_READERS, verify

    tables = [TableName.from_sql(t, "--table") for t in args.table] if args.table else None
    readers = getattr(args, "max_readers", None) or MAX_READERS
    if args.command == "verify":
        checked = verify(spec, tables, max_readers=readers)
        if args.json:
            print(json.dumps(checked.summary()))
        else:
            for t in checked.tables:
                say(t.describe(), err=not t.clean and t.checked)
        if not checked.clean:
            say(("DIFFERENT:", "bold red"), " ", str(checked.error(details=False)), err=True)  # printed above
            return 1
        return 0
    dry_run = bool(getattr(args, "dry_run", False))
    result = reconcile(spec, tables, max_readers=readers, dry_run=dry_run)
    if getattr(args, "json", False):
        print(json.dumps(result.summary()))
    else:
        for t in result.tables:
            if dry_run and t.checked:
                say(f"{t.table}: would insert {t.missing:,}, update {t.different:,}, delete {t.extra:,} "
                    f"(at {t.lsn}; {t.publisher_rows:,} publisher rows, {t.subscriber_rows:,} subscriber rows)")
            else:
                say(t.describe())
    if not result.ok:
        say(("ERROR:", "bold red"), " ", str(result.error()), err=True)
        return 1
    return 0


def apply_batch(spec: SubscriptionSpec, *, max_changes: int | None, time_budget: float | None = None,
                as_json: bool) -> int:
    """Run ApplyChanges in-process: batches until drained (or the budget is spent), each in one transaction."""
    from airflow_provider_rowfilter.flows.apply.drain import apply

    bars = wants_bars(err_console)
    with progress_bars(bars):  # no --max-changes: larger batches while a backlog waits (flows/apply/capture_ahead.py)
        result = apply(_one_bar(spec, bars), max_changes=max_changes, time_budget=time_budget)
    if as_json:
        print(json.dumps(result.summary()))
        return 0
    if result.disabled:
        say(f"subscription {spec.subscription}: ", ("disabled", "yellow"), ": nothing applied (`rowfilter enable` "
            "enables it)")
        return 0
    say(f"subscription {spec.subscription}: applied {result.changes:,} changes in {result.batches} "
        f"batch{'es' if result.batches != 1 else ''} through {result.end_lsn or '-'} in "
        f"{duration(result.duration_ms / 1000)}; {batch_lag(result.lag_bytes, result.lag_seconds)}")
    if result.budget_exhausted:
        say(f"  the time budget ({duration(time_budget or 0)}) stopped the run before {result.target_lsn}: the next "
            "run goes on from there")
    for name, counts in sorted(result.tables.items()):
        say(f"  {name}: {counts_text(counts)}")
    if result.skipped_lsn:
        say(f"  skipped the remote transaction finished at {result.skipped_lsn}")
    return 0


def _one_bar(spec: SubscriptionSpec, bars: bool) -> SubscriptionSpec:
    """With our bars on the terminal, Spark's own console progress bar (``[Stage 5:> (0 + 1) / 1]``, drawn by
    a Spark driver of this process) is turned off, unless the spec's spark_conf sets it. A Spark Connect
    server draws its own in its log: a client may not set it."""
    if not bars or spec.spark_remote or "spark.ui.showConsoleProgress" in spec.spark_conf:
        return spec
    return dataclasses.replace(spec, spark_conf={**spec.spark_conf, "spark.ui.showConsoleProgress": "false"})


def skip(spec: SubscriptionSpec, lsn: str) -> int:
    """``ALTER SUBSCRIPTION … SKIP (lsn = …)``: the next apply drops that one remote transaction."""
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.subscriber.state import StateStore

    with connect(spec.subscriber, "subscriber", spec) as conn:
        value = StateStore(conn, spec.subscription).skip_transaction(lsn)
    say(f"subscription {spec.subscription}: " + (
        f"the remote transaction finished at {value} will be skipped by the next apply" if value
        else "skip-LSN cleared"))
    return 0


def reset_conflicts(spec: SubscriptionSpec) -> int:
    """``pg_stat_reset_subscription_stats``: the subscription's conflict counts back to zero."""
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.subscriber import conflicts
    from airflow_provider_rowfilter.subscriber.state import StateStore, migrate

    with connect(spec.subscriber, "subscriber", spec) as conn:
        migrate(conn)
        StateStore(conn, spec.subscription).require_subscription()
        conflicts.reset(conn, spec.subscription)
    say(f"subscription {spec.subscription}: conflict counts reset to zero")
    return 0


def set_enabled(spec: SubscriptionSpec, enabled: bool) -> int:
    """``ALTER SUBSCRIPTION … ENABLE`` / ``DISABLE``."""
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.subscriber.state import StateStore

    with connect(spec.subscriber, "subscriber", spec) as conn:
        was = StateStore(conn, spec.subscription).set_enabled(enabled)
    if was == enabled:
        say(f"subscription {spec.subscription}: already {'enabled' if enabled else 'disabled'}")
    elif enabled:
        say(f"subscription {spec.subscription}: enabled; the next apply goes on from where it stopped")
    else:
        say(f"subscription {spec.subscription}: disabled; the apply applies nothing until `rowfilter enable` (the "
            "slot keeps the changes, and the WAL they need, meanwhile)")
    return 0


def sync_sequences(spec: SubscriptionSpec, args: argparse.Namespace) -> int:
    """Run SyncSequences in-process and say, per sequence, what it set (or would)."""
    from airflow_provider_rowfilter.core.relation import TableName
    from airflow_provider_rowfilter.flows.sync_sequences import sync_sequences as run_sync

    tables = [TableName.from_sql(t, "--table") for t in args.table] if args.table else None
    result = run_sync(spec, tables, dry_run=args.dry_run)
    if args.json:
        print(json.dumps(result.summary()))
        if not result.ok:
            raise result.error()  # said on stderr by main, exit 1
        return 0
    if result.published is not None:
        say(f"subscription {spec.subscription}: its publications are FOR ALL SEQUENCES: {len(result.published)} "
            "sequence" + ("" if len(result.published) == 1 else "s") + " published")
    elif not result.sequences:
        say(f"subscription {spec.subscription}: no subscribed table owns a sequence on the publisher")
    for s in result.sequences:
        moved = f": next value {s.before} -> {s.after}" if s.action in ("set", "would set") else ""
        owner = f"{s.table}.{s.column}" if s.column else s.table  # a sequence no column owns: its own name
        say(f"  {owner}: {s.subscriber_sequence or '-'} {s.action}{moved} (publisher's "
            f"{s.publisher_sequence} at {'-' if s.publisher_last_value is None else s.publisher_last_value})")
    say(f"subscription {spec.subscription}: {result.changed} sequence{'' if result.changed == 1 else 's'} set"
        + (" (dry run: nothing was set)" if args.dry_run else ""))
    if not result.ok:
        raise result.error()  # said by main, exit 1
    return 0


def drop(spec: SubscriptionSpec, *, keep_slot: bool) -> int:
    """``DROP SUBSCRIPTION``: run the drop in-process and say what went; nothing left to drop is not an error."""
    from airflow_provider_rowfilter.flows.drop import drop as run_drop

    result = run_drop(spec, keep_slot=keep_slot)
    if not result.dropped:
        say(f"subscription {spec.subscription}: nothing to drop")
    else:
        say(f"subscription {spec.subscription}: dropped")
    if result.slot_dropped:
        say("  ", (f"- replication slot {result.slot}", "red"), f" on the publisher{result.slot_note()}")
    if result.publication_dropped:
        say("  ", (f"- publication {result.publication}", "red"), " on the publisher")
    if result.state_dropped:
        counted = [f"{n} {word}{'' if n == 1 else plural}" for n, word, plural in (
            (len(result.tables), "table", "s"), (result.refreshes, "refresh", "es"), (result.batches, "batch", "es"))]
        say("  ", ("- state in the subscriber", "red"), f": {counted[0]} ({', '.join(result.tables)}), "
            f"{counted[1]} and {counted[2]} of history")
    if result.change_log_moved_to:
        say(f"  change log moved to {result.change_log_moved_to} (delete it when you no longer need it)")
    for note in result.left_alone:
        say(("left alone:", "yellow"), " ", note, err=True)
    if keep_slot:
        say(f"  --keep-slot: the publisher was not contacted; if replication slot {result.slot} still exists there, "
            f"it retains WAL until it is dropped: run `rowfilter drop` again without --keep-slot once the publisher "
            f"is reachable, or SELECT pg_drop_replication_slot('{result.slot}') and DROP PUBLICATION "
            f"{result.publication} on it")
    if result.state_dropped:
        say("  the subscriber's tables and their data are kept")
    return 0


def sync_tables(spec: SubscriptionSpec, args: argparse.Namespace) -> int:
    """Run the SnapshotCopy job in-process (``snapshot``, or ``resync`` first); say what each table got."""
    from airflow_provider_rowfilter.core.relation import TableName
    from airflow_provider_rowfilter.flows.table_sync.sync import CopyOptions, sync_tables
    from airflow_provider_rowfilter.flows.table_sync.sync import resync as run_resync

    tables = [TableName.from_sql(t, "--table") for t in args.table] if args.table else None
    bars = wants_bars(err_console)
    every = args.progress_interval if args.progress_interval is not None else 1.0 if bars else None
    options = CopyOptions(max_partitions=args.max_partitions) if every is None else \
        CopyOptions(max_partitions=args.max_partitions, progress_interval=every)
    with progress_bars(bars):
        if args.command == "resync":
            result = run_resync(_one_bar(spec, bars), tables or [], copy=args.copy, options=options)
        else:
            result = sync_tables(_one_bar(spec, bars), tables, options=options)
    if not result.tables:
        say(f"subscription {spec.subscription}: no table waits for its initial copy")
    for t in result.tables:
        if t.error:
            continue
        done = f"{t.rows_copied:,} rows, consistent with {t.lsn}" if t.rows_copied is not None and t.lsn else ""
        say(f"  {t.table}: state {t.state}" + (f" ({done})" if done else "") + (f" — {t.note}" if t.note else ""))
    if not result.ok:
        say(("ERROR:", "bold red"), " ", str(result.error()), err=True)
        return 1
    return 0


def spark_server(args: argparse.Namespace) -> int:
    """``rowfilter spark-server start|stop|status``: the local Spark Connect server (spark/connect_server.py).

    ``status`` exits 3 when no server of this state directory runs.
    """
    from pathlib import Path

    from airflow_provider_rowfilter.core.errors import SpecError
    from airflow_provider_rowfilter.spark import connect_server

    state = Path(args.state_dir) if args.state_dir else None
    if args.action == "start":
        conf = {}
        for item in args.conf:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise SpecError(f"--conf {item!r} is not KEY=VALUE", hint="write --conf spark.driver.memory=4g")
            conf[key.strip()] = value
        info = connect_server.start(state, port=args.port, master=args.master, conf=conf)
        say(f"Spark Connect server running (pid {info.pid}): spark_remote: {info.url}  (log {info.log}; its token, "
            f"which this user's jobs read from there, in {info.token_file})")
        return 0
    if args.action == "stop":
        stopped = connect_server.stop(state)
        say(f"stopped the Spark Connect server (pid {stopped.pid})" if stopped else "no Spark Connect server was running")
        return 0
    running = connect_server.status(state)
    if running is None:
        say("no Spark Connect server is running")
        return EXIT_BROKEN
    info = running
    say(f"Spark Connect server running (pid {info.pid}): spark_remote: {info.url}  (log {info.log}; token in "
        f"{info.token_file})")
    return 0
