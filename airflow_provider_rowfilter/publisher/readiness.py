"""Is a standby ready to take over the subscription's slot? PostgreSQL's "Logical Replication Failover" procedure.

Adapted to our slot: on the primary, the slots that must survive are
ours (``failover AND NOT temporary``); on each standby, one is ready when
``synced AND NOT temporary AND invalidation_reason IS NULL`` (17: ``NOT conflicting``). Beside the
two queries, what makes a standby not ready is named with its fix: ``sync_replication_slots``,
``hot_standby_feedback``, ``primary_slot_name`` on the standby, ``synchronized_standby_slots`` on the
primary (without it, decoding may run ahead of the standby, and a promotion loses what the subscriber
already has), and the replay of each ``f`` table's copy position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import psycopg

from airflow_provider_rowfilter.connection import connect, primary_message
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.spec.conninfo import redact
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.core.spec.values import CONN_ID
from airflow_provider_rowfilter.publisher.failover import FAILOVER_VERSION


@dataclass(frozen=True)
class Readiness:
    """Whether one standby could take over with the subscription's slot, as PostgreSQL's procedure checks it."""

    standby: str  # where it is (host:port, or the connection id), never a password
    ready: bool
    slot: dict | None = None  # the slot on the standby: synced, temporary, invalidation_reason, confirmed_flush_lsn
    problems: tuple[str, ...] = field(default=())  # each what is wrong, and the fix
    #: ``standby`` (in recovery), ``promoted`` (a primary now: the publisher itself when ``is_publisher``, i.e. the
    #: spec's publisher now reaches this server on a timeline of its own), ``primary`` (not in recovery, and not the
    #: publisher promoted: a mistake of the spec), or ``unreachable``
    role: str = "standby"
    is_publisher: bool = False
    timeline: int | None = None  # its timeline: the one it replays (a standby), or writes (a primary)
    replayed_lsn: str | None = None  # pg_last_wal_replay_lsn(): how far a standby has replayed
    replayed_at: str | None = None  # pg_last_xact_replay_timestamp(): the commit time of the last transaction replayed
    #: the primary could not be read: only the standby's own side was checked (its synchronized slot)
    primary_unreachable: str | None = None

    def summary(self) -> str:
        """One line: ``failover ready`` / ``promoted: …`` / ``NOT failover ready: …``, and its timeline and replay."""
        where = [f"timeline {self.timeline}"] if self.timeline is not None else []
        if self.replayed_lsn and self.role == "standby":
            where.append(f"replayed to {self.replayed_lsn}" + (f" (a transaction of {self.replayed_at})"
                                                               if self.replayed_at else ""))
        facts = f" ({', '.join(where)})" if where else ""
        if self.role == "promoted":
            return (f"promoted{facts}: it is the publisher now" if self.is_publisher else
                    f"promoted{facts}, but the spec's publisher does not reach it: " + "; ".join(self.problems))
        if self.ready:
            return f"failover ready{facts}" + (f" (the primary's side not checked: {self.primary_unreachable})"
                                               if self.primary_unreachable else "")
        return f"NOT failover ready{facts}: " + "; ".join(self.problems)

    def as_dict(self) -> dict:
        return asdict(self)


def standby_label(standby: str) -> str:
    """How a standby is named in output: its connection id, or host:port of its URL (no secret)."""
    if CONN_ID.match(standby):
        return standby
    try:
        params = psycopg.conninfo.conninfo_to_dict(standby)
    except psycopg.ProgrammingError:
        return redact(standby)
    return f"{params.get('host', 'localhost')}:{params.get('port', '5432')}"


#: A standby to check: how it is named, and how to open a session on it.
Standby = tuple[str, Callable[[], psycopg.Connection]]


def spec_standbys(spec: SubscriptionSpec) -> list[Standby]:
    """The spec's ``standbys``, each reached with the publisher's credentials (connection.py ``password``)."""
    def opener(standby: str) -> Callable[[], psycopg.Connection]:
        def open_standby() -> psycopg.Connection:
            if CONN_ID.match(standby):
                raise RowFilterError(f"standby {standby!r} is an Airflow connection id",
                                     hint="run where Airflow and its connections are (the operators and the DAG "
                                     "factory's files resolve it), or give its URL")
            return connect(standby, "standby", spec)
        return open_standby
    return [(standby_label(s), opener(s)) for s in spec.standbys]


def readiness(pub: psycopg.Connection | None, slot: str, standbys: Sequence[Standby],
              copied: Sequence[tuple[str, str]] = (), *, unreachable: str | None = None) -> list[Readiness]:
    """Each standby's readiness to take over the subscription's ``slot`` (read now).

    :param pub: a connection to the publisher (the primary); None when it cannot be reached (``unreachable``
        says why): each standby's own side is then read all the same (in recovery or promoted, its timeline,
        its synchronized copy of the slot), which is what an outage asks: can it be promoted with the slot?
    :param standbys: the standbys (:func:`spec_standbys`).
    :param copied: the tables in ``f`` with their copy positions: the standby must have replayed them.
    """
    if pub is None:
        return [_unreachable_primary(label, open_standby, slot, unreachable or "unreachable")
                for label, open_standby in standbys]
    primary = _primary_facts(pub, slot)
    return [_standby_readiness(label, open_standby, slot, primary, copied) for label, open_standby in standbys]


def _unreachable_primary(label: str, open_standby: Callable[[], psycopg.Connection], slot: str,
                         why: str) -> Readiness:
    """A standby read while its primary is down: promoted already, or in recovery with a usable copy of the slot."""
    try:
        with open_standby() as conn:
            facts = _standby_facts(conn, slot)
    except (RowFilterError, psycopg.Error) as e:
        return Readiness(label, False, problems=(f"cannot read the standby: {_said(e)}",), role="unreachable",
                         primary_unreachable=why)
    where = {"timeline": facts["timeline"], "replayed_lsn": facts["replayed"], "replayed_at": facts["replayed_at"]}
    if not facts["in_recovery"]:
        return Readiness(label, False, facts["slot"], ("it was promoted while the primary cannot be reached: point the "
                                                       "spec's publisher at it (or list both in one URL)",),
                         role="promoted", primary_unreachable=why, **where)
    found = facts["slot"]
    problems = [] if found and found["failover_ready"] else [
        f'replication slot "{slot}" on the standby is not ready to be used after a promotion: '
        + ("it is not there" if found is None else ", ".join(
            k for k, bad in (("not synchronized (synced is false)", not found["synced"]),
                             ("temporary", found["temporary"]),
                             (f"invalidated ({found['invalidation_reason']})", found["invalidation_reason"])) if bad))]
    return Readiness(label, not problems, found, tuple(problems), primary_unreachable=why, **where)


@dataclass(frozen=True)
class _Primary:
    version: int
    standby: bool
    slot_failover: bool | None
    slot_exists: bool
    synchronized: tuple[str, ...]  # synchronized_standby_slots
    physical: dict[str, bool]  # the physical slots: name -> active
    server: str | None = None  # which server it is (_server)


def _primary_facts(pub: psycopg.Connection, slot: str) -> _Primary:
    version = pub.info.server_version
    standby = pub.execute("SELECT pg_is_in_recovery()").fetchone()[0]
    row = pub.execute(f"SELECT {'failover' if version >= FAILOVER_VERSION else 'NULL::bool'} "
                      "FROM pg_replication_slots WHERE slot_name = %s AND NOT temporary", (slot,)).fetchone()
    listed = pub.execute("SELECT current_setting('synchronized_standby_slots', true)").fetchone()[0] or ""
    physical = dict(pub.execute("SELECT slot_name::text, active FROM pg_replication_slots "
                                "WHERE slot_type = 'physical'").fetchall())
    names = tuple(n.strip().strip('"') for n in listed.split(",") if n.strip())
    return _Primary(version, standby, None if row is None else row[0], row is not None, names, physical, _server(pub))


def _standby_readiness(label: str, open_standby: Callable[[], psycopg.Connection], slot: str, primary: _Primary,
                       copied: Sequence[tuple[str, str]]) -> Readiness:
    problems: list[str] = []
    if not primary.slot_exists:
        problems.append(f'replication slot "{slot}" does not exist on the primary: `rowfilter refresh` creates it')
    elif not primary.slot_failover:
        problems.append(f'replication slot "{slot}" is not a failover slot: `rowfilter refresh` makes it one '
                        "(failover: true, or unset, in the spec)")
    try:
        with open_standby() as conn:
            facts = _standby_facts(conn, slot)
    except (RowFilterError, psycopg.Error) as e:
        return Readiness(label, False, problems=(*problems, f"cannot read the standby: {_said(e)}"), role="unreachable")
    where = {"timeline": facts["timeline"], "replayed_lsn": facts["replayed"], "replayed_at": facts["replayed_at"]}
    if not facts["in_recovery"]:
        if facts["server"] is not None and facts["server"] == primary.server and (facts["timeline"] or 1) > 1:
            # The server the publisher's URL reaches now (both servers in one, target_session_attrs=read-write), on a
            # timeline of its own: a standby promoted since. It is the publisher: nothing to take over. (The
            # publisher itself named as its standby, on the timeline it began on, is a mistake of the spec.)
            return Readiness(label, True, facts["slot"], role="promoted", is_publisher=True, **where)
        return Readiness(label, False, facts["slot"], (
            *problems, "it is not a standby (pg_is_in_recovery() is false), nor the publisher after a promotion: "
            "a standby promoted while the spec's publisher still names another server, or no standby at all; point "
            "the publisher at the primary that accepts writes (both servers in one URL with "
            "target_session_attrs=read-write follow a promotion) and list its physical standbys in standbys",),
            role="primary", **where)
    if primary.version < FAILOVER_VERSION or primary.standby:
        why = (f"the publisher is PostgreSQL {primary.version // 10000}: slots are synchronized to standbys from 17"
               if not primary.standby else "the publisher is itself a standby: its slots are not synchronized")
        return Readiness(label, False, problems=(why,), **where)
    if facts["sync_replication_slots"] != "on":
        problems.append("sync_replication_slots is off on the standby: ALTER SYSTEM SET sync_replication_slots = on; "
                        "SELECT pg_reload_conf() (there; its primary_conninfo must name a dbname)")
    if facts["hot_standby_feedback"] != "on":
        problems.append("hot_standby_feedback is off on the standby: ALTER SYSTEM SET hot_standby_feedback = on; "
                        "SELECT pg_reload_conf() (there)")
    physical = facts["primary_slot_name"]
    if not physical:
        problems.append("primary_slot_name is not set on the standby: SELECT "
                        "pg_create_physical_replication_slot('standby1') on the primary, then ALTER SYSTEM SET "
                        "primary_slot_name = 'standby1' on the standby")
    else:
        if physical not in primary.physical:
            problems.append(f'the standby streams through physical slot "{physical}", which does not exist on the '
                            f"primary: SELECT pg_create_physical_replication_slot('{physical}') there")
        if physical not in primary.synchronized:
            problems.append(f"synchronized_standby_slots on the primary does not name the standby's slot "
                            f'"{physical}": logical decoding may then run ahead of the standby, and a promotion '
                            "would lose changes the subscriber already has. Fix: ALTER SYSTEM SET "
                            f"synchronized_standby_slots = '{', '.join((*primary.synchronized, physical))}'; "
                            "SELECT pg_reload_conf() on the primary")
    found = facts["slot"]
    if found is None:
        problems.append(f'replication slot "{slot}" is not on the standby yet: its slot sync worker has not '
                        "copied it (it needs the settings above, and a failover slot on the primary)")
    else:
        if not found["synced"]:
            problems.append(f'replication slot "{slot}" on the standby was not synchronized from the primary '
                            "(synced is false): drop it there; the slot sync worker then copies the primary's")
        if found["temporary"]:
            problems.append(f'replication slot "{slot}" is on the standby but not persisted yet (temporary): '
                            "PostgreSQL keeps it once the primary's slot has moved past the standby's oldest WAL, "
                            "which the next applies do")
        if found["invalidation_reason"]:
            problems.append(f'replication slot "{slot}" on the standby is invalidated '
                            f'({found["invalidation_reason"]})')
    replayed = facts["replayed"]
    for table, lsn in copied:
        if replayed is None or parse_lsn(replayed) < parse_lsn(lsn):
            problems.append(f"table {table} finished its initial copy consistent with {lsn}, which the standby has "
                            f"not replayed yet (it is at {replayed or 'nothing'}): wait for it, or the table is "
                            "copied again after a failover")
    return Readiness(label, not problems, found, tuple(problems), **where)


def _standby_facts(conn: psycopg.Connection, slot: str) -> dict:
    version = conn.info.server_version
    in_recovery, sync, feedback, physical, replayed = conn.execute(
        "SELECT pg_is_in_recovery(), current_setting('sync_replication_slots', true), "
        "current_setting('hot_standby_feedback'), current_setting('primary_slot_name'), "
        "pg_last_wal_replay_lsn()::text").fetchone()
    found = None
    if version >= FAILOVER_VERSION:
        # The documentation's query on the standby (18: invalidation_reason IS NULL; 17: NOT conflicting).
        bad = "invalidation_reason" if version >= 180000 else "CASE WHEN conflicting THEN 'conflict' END"
        row = conn.execute(f"SELECT synced, temporary, {bad}, confirmed_flush_lsn::text, "
                           f"(synced AND NOT temporary AND {bad} IS NULL) AS failover_ready "
                           "FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
        if row is not None:
            found = dict(zip(("synced", "temporary", "invalidation_reason", "confirmed_flush_lsn", "failover_ready"),
                             row, strict=True))
    return {"in_recovery": in_recovery, "sync_replication_slots": sync, "hot_standby_feedback": feedback,
            "primary_slot_name": physical, "replayed": replayed, "slot": found, "server": _server(conn),
            **_replay_facts(conn)}


#: Which server a session is on: the cluster's system identifier (a standby shares its primary's) and when its
#: postmaster started (never the same on two servers of one cluster).
_SERVER = "SELECT (SELECT system_identifier::text FROM pg_control_system()) || '@' || pg_postmaster_start_time()::text"


def _server(conn: psycopg.Connection) -> str | None:
    try:
        return conn.execute(_SERVER).fetchone()[0]
    except psycopg.Error:  # pg_control_system() not granted to the role: unknown
        _clear(conn)
        return None


def _clear(conn: psycopg.Connection) -> None:
    """After a refused query, the session usable again (a transaction of a session that is not autocommit)."""
    if not conn.autocommit and not conn.broken:
        conn.rollback()


def _replay_facts(conn: psycopg.Connection) -> dict:
    """The server's timeline and the commit time of the last transaction a standby replayed; each None where the role
    may not read it."""
    found: dict = {"timeline": None, "replayed_at": None}
    # A primary's timeline is its WAL file's (a promoted standby's is new from its promotion on, before its first
    # checkpoint); a standby's, the one it receives on, else that of its last restartpoint.
    timeline = ("SELECT CASE WHEN pg_is_in_recovery() THEN coalesce((SELECT received_tli FROM pg_stat_wal_receiver), "
                "(SELECT timeline_id FROM pg_control_checkpoint())) "
                "ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END")
    for key, query in (("timeline", timeline),
                       ("replayed_at", "SELECT to_char(pg_last_xact_replay_timestamp() AT TIME ZONE 'UTC', "
                                       "'YYYY-MM-DD HH24:MI:SS \"UTC\"')")):
        try:
            found[key] = conn.execute(query).fetchone()[0]
        except psycopg.Error:
            _clear(conn)
    return found


def _said(e: BaseException) -> str:
    if isinstance(e, RowFilterError):
        return e.message + (f" ({e.detail})" if e.detail else "")
    return primary_message(e) if isinstance(e, psycopg.Error) else str(e)
