"""The subscription spec: one YAML file per subscription, one versioned JSON document across boundaries."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, field, fields
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, ValidationError, field_validator
from pydantic.dataclasses import dataclass

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.names import identifier, quote_identifier
from airflow_provider_rowfilter.core.spec.conninfo import check_no_password
from airflow_provider_rowfilter.core.spec.input_files import (
    MAX_SCRIPT_BYTES,
    MAX_SPEC_BYTES,
    decoded,
    read_bytes,
    read_text,
    yaml_document,
)
from airflow_provider_rowfilter.core.spec.log_location import LogLocation, is_url, parse_location
from airflow_provider_rowfilter.core.spec.memory_setting import DECODING_WORK_MEM_RANGE, memory_kb
from airflow_provider_rowfilter.core.spec.paths import check_change_log_location, confine
from airflow_provider_rowfilter.core.spec.schedule import FACTORY_DEFAULT_SCHEDULE, longest_gap
from airflow_provider_rowfilter.core.spec.spark_remote import check_spark_remote
from airflow_provider_rowfilter.core.spec.values import (
    CONN_ID,
    CONNINFO_KEYS,
    EXPECTED,
    ORIGIN_VERSION,
    SOURCE_FILTERING_VERSION,
    SPEC_VERSION,
    SUBSCRIPTION_NAME,
    ConflictLogMode,
    ConflictPolicy,
    Filtering,
    InvalidTablePolicy,
    Origin,
    SchemaChanges,
    parse_size,
    refusal,
)

_SCHEMA = ConfigDict(strict=True, extra="forbid")


@dataclass(frozen=True, config=_SCHEMA)
class SubscriptionSpec:
    """What one subscription replicates, from where to where.

    ``publisher``/``subscriber`` are libpq connection strings without a password in any form (the
    password comes from ``PGPASSWORD``/``~/.pgpass`` or, in Airflow, from the connection:
    core/spec/conninfo.py); ``publications_ddl`` is a path to a file of CREATE PUBLICATION statements,
    relative to the spec file. ``change_log`` is the directory of the durable change-log segments
    written by the capture (docs/change-log.md), relative to the spec file; it defaults to
    ``.rowfilter/<subscription>/changes`` beside the spec file (beside the working directory when the
    spec did not come from a file). ``conflict_policy`` is what ApplyChanges does when an INSERT finds
    its key in the subscriber: ``error`` stops the batch as PostgreSQL does, ``upsert`` overwrites (and
    an UPDATE that finds no row inserts it). ``conflict_log: table`` also keeps a row per skipped conflict
    (``update_missing``, ``delete_missing``) in ``rowfilter.conflict_log``; every conflict is counted either way
    (docs/operations.md, "Conflicts"). ``origin: none`` asks the publisher (16+) for the changes that did not
    come from replication only (:meth:`origin_option`); the apply's own writes carry a replication origin either
    way (subscriber/replication_origin.py). ``retained_wal_warning`` is how much WAL the
    subscription's slot may hold back on the publisher before ``status`` warns (a size such as
    ``'1GB'``, or bytes). ``spark_remote`` (``sc://host:port``) runs the job's Spark work as a Spark
    Connect client of that server instead of in a Spark driver of its own (``spark_master`` is then
    the server's business); it holds no token (docs/apply.md, "Spark Connect").
    ``on_invalid_table`` is what ``refresh`` does with a table whose definition it refuses (a filter
    Spark cannot evaluate exactly, an invalid one, a replica identity that does not cover it):
    ``refuse`` refuses the whole subscription; ``skip`` keeps the subscription for the other tables
    and leaves that one in state ``i`` with the reason as its ``last_error`` (flows/refresh.py).
    ``filtering`` says who evaluates the publications' filters, publish lists and column lists
    (:meth:`filtering_mode`; docs/change-log.md, "Two capture modes"). ``reconcile: true`` makes ``refresh``
    repair in place (flows/verify/reconcile.py) a table whose initial-copy filter or column list changed, instead of
    leaving it as PostgreSQL leaves it, and ``refresh --recreate-slot`` keep and reconcile the tables instead of
    emptying them (docs/verify.md).
    ``schema_changes`` is what the apply does when a batch's relations show a schema change on the publisher:
    ``stop`` (the default, PostgreSQL's behaviour) leaves the subscriber's table to you; ``follow`` adds, renames
    and widens its columns in the batch's transaction, before the first change that needs it; ``follow_drops``
    also drops those dropped on the publisher (apply/schema_follow.py; docs/operations.md, "Schema changes").
    ``failover`` makes the slot a failover slot, synchronized to the publisher's standbys (PostgreSQL
    17+, ``CREATE SUBSCRIPTION … failover``); None (the default) turns it on where the publisher supports
    it. ``standbys`` are the publisher's physical standbys (libpq strings, or Airflow connection ids),
    whose readiness to take over ``status``, ``validate`` and the lag check show (publisher/failover.py).
    ``apply_schedule`` is how often the apply runs (the apply DAG's cron schedule or a duration; a spec
    file of the DAG factory takes its ``airflow: schedule``): held against the publisher's limits on an
    unread slot (core/slot_retention.py).

    Every key is type-checked strictly (pydantic): ``copy_data: "false"`` is refused, not read as
    true. ``publications`` may be one name; ``spark_conf`` values may be numbers or booleans, which
    become the strings Spark reads (``2``, ``true``).

    Publication names are read as PostgreSQL reads ``CREATE SUBSCRIPTION … PUBLICATION pA``
    (core/names.py): unquoted folds to lower case, ``'"pA"'`` keeps its case. ``publications`` holds
    them as SQL would write them (``pa``, ``"pA"``: reading the spec again gives the same), and
    :attr:`publication_names` the names themselves, what the publisher's catalog holds.
    """

    subscription: str
    publications: tuple[str, ...]
    publisher: str | None = None
    subscriber: str | None = None
    publisher_conn_id: str | None = None
    subscriber_conn_id: str | None = None
    publications_ddl: str | None = None
    copy_data: bool = True
    change_log: str | None = None
    change_log_conn_id: str | None = None
    conflict_policy: ConflictPolicy = "error"
    conflict_log: ConflictLogMode = "none"
    origin: Origin = "any"
    on_invalid_table: InvalidTablePolicy = "refuse"
    filtering: Filtering = "auto"
    reconcile: bool = False
    schema_changes: SchemaChanges = "stop"
    spark_master: str = "local[*]"
    spark_conf: dict[str, str] = field(default_factory=dict)
    spark_remote: str | None = None
    retained_wal_warning: str | int = "1GB"
    logical_decoding_work_mem: str | int | None = None
    failover: bool | None = None
    standbys: tuple[str, ...] = ()
    apply_schedule: str | int | None = None
    spec_version: int = SPEC_VERSION

    @field_validator("publications", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        if isinstance(value, str):
            return (value,)
        return tuple(value) if isinstance(value, list) else value

    @field_validator("standbys", mode="before")
    @classmethod
    def _standby_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return (value,)
        return tuple(value) if isinstance(value, list) else value

    @field_validator("publications")
    @classmethod
    def _as_sql_reads_them(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(quote_identifier(identifier(v, "publications")) for v in value)

    @field_validator("spark_conf", mode="before")
    @classmethod
    def _settings_as_strings(cls, value: Any) -> Any:
        # Spark reads every setting as a string; YAML gives `spark.executor.cores: 2` as an int.
        if not isinstance(value, Mapping):
            return value
        return {k: ("true" if v else "false") if isinstance(v, bool) else str(v) if isinstance(v, int | float) else v
                for k, v in value.items()}

    def __post_init__(self) -> None:
        if self.spec_version != SPEC_VERSION:
            raise SpecError(f"spec_version={self.spec_version!r} {EXPECTED['spec_version'][0]}",
                            hint=EXPECTED["spec_version"][1])
        if not SUBSCRIPTION_NAME.match(self.subscription):
            raise SpecError(f"subscription name {self.subscription!r} is not a valid PostgreSQL name",
                            hint="use lower-case letters, digits and underscores (it names the slot too)")
        if not self.publications:
            raise SpecError(f"subscription {self.subscription!r} names no publications",
                            hint="set publications: [p1, …]")
        names = self.publication_names
        if len(set(names)) != len(names):  # publicationListToArray in src/backend/commands/subscriptioncmds.c
            dup = next(p for p in names if names.count(p) > 1)
            raise SpecError(f'publication name "{dup}" used more than once')
        for key in CONNINFO_KEYS:
            if getattr(self, key):
                check_no_password(getattr(self, key), f"the {key} of subscription {self.subscription!r}", key)
        for n, standby in enumerate(self.standbys):
            if not CONN_ID.match(standby):
                check_no_password(standby, f"standbys[{n}] of subscription {self.subscription!r}", "publisher")
        if self.apply_schedule is not None:
            longest_gap(self.apply_schedule, f"apply_schedule of subscription {self.subscription!r}")
        if self.spark_remote is not None:
            check_spark_remote(self.spark_remote, f"spark_remote of subscription {self.subscription!r}")
        if self.change_log:
            where = parse_location(self.change_log, f"subscription {self.subscription!r}")  # a URL is never a path
            if where.local:
                check_change_log_location(where.path, f"subscription {self.subscription!r}")
        if self.change_log_conn_id is not None:
            self.check_change_log_conn_id(self.change_log_conn_id)
        if self.filtering == "source" and self.publications_ddl:
            self.filtering_mode(0)  # refused now: a publications file is never the publisher's
        self.retained_wal_warning_bytes  # noqa: B018 -- a size parse_size reads, or the refusal now
        self.decoding_work_mem_kb  # noqa: B018 -- a size PostgreSQL would take, or its refusal now

    @classmethod
    def load(cls, path: str | os.PathLike) -> SubscriptionSpec:
        """Read a spec file; resolve ``publications_ddl`` and ``change_log`` relative to it."""
        p = Path(path)
        source = f"spec file {str(p)!r}"
        # A regular file of bounded size, UTF-8, YAML of bounded depth (core/spec/input_files.py).
        data = yaml_document(read_text(p, source, MAX_SPEC_BYTES), source)
        if not isinstance(data, dict):
            raise SpecError(f"spec file {str(p)!r} must hold a mapping (subscription: …, publications: …)")
        factory = data.pop("airflow", None)  # the Airflow DAG factory's own section (docs/dag-factory.md)
        if isinstance(factory, dict) and "apply_schedule" not in data:
            # The factory's incremental DAG runs the apply on this schedule (core/spec/schedule.py).
            schedule = factory.get("schedule", FACTORY_DEFAULT_SCHEDULE)
            if isinstance(schedule, str):
                data["apply_schedule"] = schedule
        # The files a spec file names stay in its folder, symlinks resolved (core/spec/paths.py).
        if data.get("publications_ddl") and isinstance(data["publications_ddl"], str):
            data["publications_ddl"] = confine(data["publications_ddl"], "publications_ddl", p.parent, source)
        change_log = data.get("change_log")
        if change_log is not None and not isinstance(change_log, str):
            raise SpecError(f"{str(p)!r}: change_log={change_log!r} is not a directory path",
                            hint="set change_log: path/to/changes (relative to the spec file) or leave it out")
        if change_log and is_url(change_log):
            where = parse_location(change_log, source)  # refused here unless served: never a local path
            change_log = where.path if where.local else None
            if not where.local:
                data["change_log"] = where.url  # object storage: no folder of the spec file's to confine it to
        named = isinstance(data.get("subscription"), str) and SUBSCRIPTION_NAME.match(data["subscription"])
        if change_log or (named and not data.get("change_log")):  # a bad name is refused as such (from_dict)
            change_log = change_log or default_change_log(data["subscription"])
            if change_log.strip():
                check_change_log_location(str(p.parent / change_log), f"{source}")
            data["change_log"] = confine(change_log, "change_log", p.parent, source)
        return cls.from_dict(data, source=source)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "spec") -> SubscriptionSpec:
        """Validate ``data`` (a spec file's keys); a bad key is refused naming ``source``, the key, its value and the fix."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(known), key=str)
        if unknown:
            raise SpecError(f"{source}: unknown key {unknown[0]!r}", hint=f"known keys: {', '.join(sorted(known))}")
        if "subscription" not in data:
            raise SpecError(f"{source}: missing key 'subscription'")
        data = {**data, "publications": data.get("publications") or ()}
        try:
            return cls(**data)
        except ValidationError as e:
            raise refusal(e, data, source) from None
        except SpecError as e:
            raise SpecError(f"{source}: {e.message}", detail=e.detail, hint=e.hint) from None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SubscriptionSpec:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError(f"the spec JSON is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise SpecError("the spec JSON must be an object (what SubscriptionSpec.to_json writes)")
        return cls.from_dict(data, source="spec JSON")

    @property
    def publication_names(self) -> tuple[str, ...]:
        """The publications' names as the publisher's catalog holds them (``publications`` read as SQL)."""
        return tuple(identifier(p, "publications") for p in self.publications)

    @property
    def retained_wal_warning_bytes(self) -> int:
        """``retained_wal_warning`` in bytes: past it, ``status`` warns that the slot holds back that much WAL."""
        return parse_size(self.retained_wal_warning, f"retained_wal_warning of subscription {self.subscription!r}")

    @property
    def decoding_work_mem_kb(self) -> int | None:
        """``logical_decoding_work_mem`` in kB, read as PostgreSQL reads the setting (core/spec/memory_setting.py); None:
        the publisher's own (the capture's session does not set it)."""
        if self.logical_decoding_work_mem is None:
            return None
        return memory_kb(self.logical_decoding_work_mem, "logical_decoding_work_mem", *DECODING_WORK_MEM_RANGE,
                         f"logical_decoding_work_mem of subscription {self.subscription!r}")

    def filtering_mode(self, server_version: int) -> str:
        """``source`` or ``spark`` for a publisher of ``server_version`` (``server_version_num``).

        ``source`` needs a publisher that filters itself (PostgreSQL 15+) and the definitions in its
        catalog (a publications file is ours alone: the publisher knows nothing of it).
        """
        able = server_version >= SOURCE_FILTERING_VERSION and not self.publications_ddl
        if self.filtering == "auto":
            return "source" if able else "spark"
        if self.filtering == "source" and not able:
            why = (f"publications_ddl {self.publications_ddl!r} defines the publications, which the publisher does "
                   "not know" if self.publications_ddl else
                   f"the publisher is PostgreSQL {server_version // 10000}, whose pgoutput has no row filters "
                   "or column lists (PostgreSQL 15+)")
            raise SpecError(f"subscription {self.subscription!r}: filtering=source is not possible: {why}",
                            hint="set filtering: auto (or spark): the apply then evaluates the definitions in Spark")
        return self.filtering

    def change_log_location(self) -> LogLocation:
        """Where the change log lives: ``change_log`` (a path, ``file://`` or a served URL), or the default."""
        return parse_location(self.change_log or default_change_log(self.subscription),
                              f"subscription {self.subscription!r}")

    def check_change_log_conn_id(self, conn_id: str) -> None:
        """Refuse an Airflow connection id for the store's credentials that is no id, or a log that has no store."""
        if not CONN_ID.match(conn_id):
            raise SpecError(f"change_log_conn_id {conn_id!r} of subscription {self.subscription!r} is not an Airflow "
                            "connection id", hint="name an aws, google_cloud_platform or wasb connection "
                            "(letters, digits, '_', '.', '-'); its credentials stay in Airflow")
        if self.change_log_location().local:
            raise SpecError(f"subscription {self.subscription!r} names change_log_conn_id {conn_id!r}, but its change "
                            f"log {self.change_log_location().path!r} is a local directory, which takes no credentials",
                            hint="set change_log to the store's URL (s3://bucket/prefix/s1, gs://…, abfs://…, "
                            "hdfs://…), or leave change_log_conn_id out")

    def origin_option(self, server_version: int) -> str | None:
        """The ``origin`` option pgoutput is given for a publisher of ``server_version``: sent from PostgreSQL 16
        on, as the apply worker's walreceiver sends it (libpqwalreceiver.c ``libpqrcv_startstreaming``); before
        16 ``any`` sends nothing (every change, the only behaviour there) and ``none`` is refused, since pgoutput
        there knows no such option."""
        if server_version >= ORIGIN_VERSION:
            return self.origin
        if self.origin == "none":
            raise SpecError(
                f"subscription {self.subscription!r}: origin = none needs a publisher of PostgreSQL 16 or later; "
                f"this one is PostgreSQL {server_version // 10000}",
                detail='its pgoutput has no origin option ("unrecognized pgoutput option: origin"): it sends every '
                "change, those that came from replication too",
                hint="set origin: any (and make sure no change comes back in a loop), or upgrade the publisher")
        return None

    def change_log_dir(self) -> Path:
        """The change-log directory: ``change_log``, or the default under the working directory."""
        return Path(self.change_log_location().path)

    def publications_sql(self) -> str | None:
        """The text of ``publications_ddl``, or None when publications come from the publisher's catalog."""
        if not self.publications_ddl:
            return None
        # The file the spec's check found (core/spec/paths.py ``confine`` resolved its symlinks): a symlink put in its
        # place since is refused, not followed; a FIFO or a device is refused unread (core/spec/input_files.py).
        what = f"publications_ddl file {self.publications_ddl!r} of subscription {self.subscription!r}"
        return decoded(read_bytes(self.publications_ddl, what, MAX_SCRIPT_BYTES, follow=False), what)


def default_change_log(subscription: str) -> str:
    """The change-log directory of a subscription when the spec names none (relative)."""
    return f".rowfilter/{subscription}/changes"
