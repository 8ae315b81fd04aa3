"""``rowfilter wait``: read-your-writes, until every table of the subscription has applied past a publisher LSN.

The judge is the sensor's (subscriber/applied_position.py); ``--at`` is resolved on the publisher
(publisher/wal_position.py). Exit 0 once every table holds the changes; 1 on an error a wait cannot fix
(recorded by the subscription or a table, or bad input); :data:`EXIT_TIMEOUT` when ``--timeout`` ran out first.
"""

from __future__ import annotations

import json
import time

from airflow_provider_rowfilter.cli.console import say
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.humane import duration

#: ``rowfilter wait`` ran out of ``--timeout`` before every table was there.
EXIT_TIMEOUT = 4


def wait(spec: SubscriptionSpec, *, lsn: str | None, at: str | None, timeout: float, interval: float,
         as_json: bool) -> int:
    """Wait for the tables; print where they stand at the end."""
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.subscriber.applied_position import check_applied
    from airflow_provider_rowfilter.subscriber.state_reader import StateReader

    deadline = time.monotonic() + timeout
    target = _target(spec, lsn, at, deadline)
    said_disabled = False
    with connect(spec.subscriber, "subscriber", spec) as conn:
        while True:
            progress = check_applied(StateReader(conn, spec.subscription).read_state(), target)
            if progress.error:
                raise RowFilterError(progress.error, hint="the wait cannot end until this is repaired (`rowfilter "
                                     "status` says what to run)")
            if progress.done or time.monotonic() >= deadline:
                break
            if progress.disabled and not said_disabled:
                say(f"subscription {spec.subscription}: disabled: nothing is applied until `rowfilter enable`",
                    err=True)
                said_disabled = True
            time.sleep(max(min(interval, deadline - time.monotonic()), 0.0))
    if as_json:
        print(json.dumps(progress.as_dict()))
    if progress.done:
        if not as_json:
            say(f"subscription {spec.subscription}: every table has applied past {target}"
                + (f" ({', '.join(f'{t} {p}' for t, p in progress.positions.items())})" if progress.positions else
                   " (it has no tables)"))
        return 0
    say(("ERROR:", "bold red"), f" timed out after {duration(timeout)} waiting for subscription {spec.subscription} "
        f"to apply past {target}: behind: {progress.waiting_text()}", err=True)
    say("HINT:  run the apply (the incremental sync DAG, or `rowfilter apply`), or wait longer with --timeout; "
        "`rowfilter status` says why a table is behind", err=True)
    return EXIT_TIMEOUT


def _target(spec: SubscriptionSpec, lsn: str | None, at: str | None, deadline: float) -> str:
    """``--lsn`` as PostgreSQL prints it, or ``--at`` resolved on the publisher."""
    if lsn is not None:
        return format_lsn(parse_lsn(lsn.strip()))
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.publisher.wal_position import committed_position, parse_at

    when = parse_at(at or "now")
    with connect(spec.publisher, "publisher", spec) as pub:
        try:
            position = committed_position(pub, when, deadline=deadline)
        except TimeoutError as e:
            raise RowFilterError(f"--at {at}: not reached before --timeout ran out: {e}",
                                 hint="give a larger --timeout, or a time closer to now") from None
    if not position.exact:
        say(f"--at {at}: PostgreSQL keeps no map from a past time to a WAL position; waiting for everything the "
            f"publisher had committed at {position.read_at.isoformat(timespec='seconds')} ({position.lsn}), which "
            f"holds everything committed by {position.at.isoformat(timespec='seconds')}", err=True)
    return position.lsn
