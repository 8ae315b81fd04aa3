"""What each key of a subscription spec may hold, and how a refusal says it (no I/O).

The spec's vocabularies (conflict policies, filtering modes, origins …) as ``Literal`` types pydantic checks,
the publisher versions that features need, and for each key the refusal's text and its fix (``EXPECTED``):
core/spec/subscription.py reads a spec with them; the DAG factory and the CLI name the same values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal, get_args

import yaml
from pydantic import ValidationError

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.spec import spark_remote

SPEC_VERSION = 1
#: What ApplyChanges does when an INSERT finds its key in the subscriber (the spec's ``conflict_policy``).
ConflictPolicy = Literal["error", "upsert"]
CONFLICT_POLICIES: tuple[str, ...] = get_args(ConflictPolicy)
#: What refresh does with a table whose definition it refuses (the spec's ``on_invalid_table``).
InvalidTablePolicy = Literal["refuse", "skip"]
#: Where ApplyChanges records the conflicts it skips (the spec's ``conflict_log``): counts only, or also a row
#: each in ``rowfilter.conflict_log`` (subscriber/conflicts.py).
ConflictLogMode = Literal["none", "table"]
CONFLICT_LOG_MODES: tuple[str, ...] = get_args(ConflictLogMode)
INVALID_TABLE_POLICIES: tuple[str, ...] = get_args(InvalidTablePolicy)
#: Who evaluates the row filters, publish lists and column lists (the spec's ``filtering``): ``source``
#: the publisher's own pgoutput, reading the slot through the subscription's publications; ``spark`` the
#: apply, reading it through our unfiltered capture publications; ``auto`` source where it can.
Filtering = Literal["auto", "source", "spark"]
FILTERING_MODES: tuple[str, ...] = get_args(Filtering)
#: What the apply does with a schema change on the publisher that a batch's relations show (the spec's
#: ``schema_changes``): ``stop`` stops the batch until the subscriber's table is changed by hand (PostgreSQL's
#: behaviour, which replicates no DDL); ``follow`` applies it to the subscriber's table in the batch's
#: transaction (a column added, renamed, widened; a dropped column is kept); ``follow_drops`` also drops the
#: columns dropped on the publisher (apply/schema_follow.py).
SchemaChanges = Literal["stop", "follow", "follow_drops"]
SCHEMA_CHANGES: tuple[str, ...] = get_args(SchemaChanges)
#: pgoutput filters rows (and projects column lists) from PostgreSQL 15 (pgoutput_row_filter in
#: src/backend/replication/pgoutput/pgoutput.c).
SOURCE_FILTERING_VERSION = 150000
#: Which changes the publisher sends by their replication origin (the spec's ``origin``, CREATE SUBSCRIPTION's
#: ``origin``): ``any`` every change, ``none`` only those that did not come from replication themselves.
Origin = Literal["any", "none"]
ORIGINS: tuple[str, ...] = get_args(Origin)
#: pgoutput takes the ``origin`` option from PostgreSQL 16 (parse_output_parameters in pgoutput.c;
#: libpqwalreceiver.c sends it only to a server of 16 or later).
ORIGIN_VERSION = 160000
#: A subscription name the spec accepts: it also names the slot and the capture publications.
SUBSCRIPTION_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
CONNINFO_KEYS = ("publisher", "subscriber")
#: What a key of the wrong type must be, and how to write it: the refusal's text and hint.
EXPECTED = {
    "subscription": ("is not a string", "write subscription: s1 (lower-case letters, digits and underscores)"),
    "publications": ("is not a list of publication names",
                     "write publications: [p1, p2] (or one name: publications: p1)"),
    "copy_data": ("is not true or false", "write copy_data: true or copy_data: false, without quotes"),
    "conflict_policy": (f"is not one of {', '.join(CONFLICT_POLICIES)}",
                        "error (PostgreSQL's behaviour: stop at a duplicate key) or upsert (last writer wins)"),
    "conflict_log": (f"is not one of {', '.join(CONFLICT_LOG_MODES)}",
                     "none (skipped conflicts are counted: rowfilter.subscription_stats) or table (each also gets a "
                     "row in rowfilter.conflict_log)"),
    "origin": (f"is not one of {', '.join(ORIGINS)}",
               "any (every change, PostgreSQL's default) or none (only changes that did not come from replication: "
               "cascades and two-way setups without loops; PostgreSQL 16+ publishers)"),
    "on_invalid_table": (f"is not one of {', '.join(INVALID_TABLE_POLICIES)}",
                         "refuse (the whole subscription, PostgreSQL's all-or-nothing) or skip (the other tables "
                         "replicate; the refused one waits in state i with the reason)"),
    "filtering": (f"is not one of {', '.join(FILTERING_MODES)}",
                  "auto (the publisher filters when it is PostgreSQL 15+ and the definitions come from its catalog), "
                  "source or spark"),
    "schema_changes": (f"is not one of {', '.join(SCHEMA_CHANGES)}",
                       "stop (PostgreSQL's behaviour: a batch stops until you change the subscriber's table), follow "
                       "(columns added, renamed or widened on the publisher follow in the batch) or follow_drops "
                       "(follow, and drop the columns dropped on the publisher)"),
    "reconcile": ("is not true or false", "write reconcile: true (refresh repairs in place a table whose copy filter "
                  "or column list changed) or reconcile: false (PostgreSQL's behaviour), without quotes"),
    "spark_conf": ("is not a mapping of Spark settings",
                   "write spark_conf: {spark.sql.shuffle.partitions: 8} (each value a string, number or true/false)"),
    "retained_wal_warning": ("is not a size", "write bytes (1073741824) or a size with one of PostgreSQL's units: "
                             "kB, MB, GB, TB ('1GB')"),
    "logical_decoding_work_mem": ("is not a size", "write a size as postgresql.conf does ('256MB', '1GB'; a number "
                                  "alone is kB), or leave it out for the publisher's own setting"),
    "spec_version": (f"is not supported (expected {SPEC_VERSION})", f"write spec_version: {SPEC_VERSION} or leave it out"),
    "publisher": ("is not a connection string", "write publisher: postgresql://user@host:port/db"),
    "subscriber": ("is not a connection string", "write subscriber: postgresql://user@host:port/db"),
    "change_log_conn_id": ("is not an Airflow connection id", "write change_log_conn_id: s3_replication (an aws, "
                           "google_cloud_platform or wasb connection) or leave it out"),
    "spark_remote": (spark_remote.NOT_A_URL, spark_remote.URL_HINT),
    "failover": ("is not true or false", "write failover: true (a failover slot, PostgreSQL 17+), failover: false, "
                 "or leave it out (on where the publisher supports it)"),
    "standbys": ("is not a list of standbys", "write standbys: [postgresql://user@standby1:5432/app] (or Airflow "
                 "connection ids: standbys: [pg_standby1])"),
    "apply_schedule": ("is not a schedule", "write the apply DAG's schedule ('*/5 * * * *', '@hourly') or a "
                       "duration ('5min')"),
}
#: An Airflow connection id in ``standbys`` (anything else there is a libpq connection string).
CONN_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


_SIZE = re.compile(r"^\s*(\d+)\s*(B|kB|MB|GB|TB)?\s*$")
_UNITS = {None: 1, "B": 1, "kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


def parse_size(value: str | int, what: str) -> int:
    """A size as PostgreSQL's memory settings write it (``'512MB'``, ``'1GB'``; units of 1024) or bytes, in bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None:
        raise SpecError(f"{what} = {value!r} is not a size",
                        hint="write bytes (1073741824) or a size with one of PostgreSQL's units: kB, MB, GB, TB ('1GB')")
    return int(match.group(1)) * _UNITS[match.group(2)]


def refusal(error: ValidationError, data: Mapping[str, Any], source: str) -> SpecError:
    """One SpecError from pydantic's errors: the first key, its value (a connection string only redacted), the fix."""
    first = error.errors()[0]
    key = str(first["loc"][0]) if first["loc"] else "?"
    value = data.get(key, first.get("input"))
    problem, hint = EXPECTED.get(key, ("is not a string", None))
    if key in CONNINFO_KEYS:  # may hold a password in any shape: say what it is, never what it says
        shown = f"<{type(value).__name__}>"
    else:
        shown = repr(value)
    others = sorted({str(e["loc"][0]) for e in error.errors()[1:] if e["loc"]} - {key})
    return SpecError(f"{source}: {key}={shown} {problem}", hint=hint,
                     detail=f"also invalid: {', '.join(others)}" if others else None)


def yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's problem and where it is, without the snippet of the file it quotes (it may hold a password)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or type(error).__name__
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem
