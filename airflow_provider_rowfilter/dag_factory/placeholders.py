"""The DAGs that stand for a spec file the DAG factory cannot build: failing where Airflow alerts.

A spec file of a live subscription that gets a typo must not stop its replication silently. Its
DAGs are replaced by placeholders under the same DAG ids whose one task, ``invalid_spec``, fails at
once (no retry) with the error naming the file and the key, and the placeholder of the incremental
sync (and of a scheduled refresh) **keeps the schedule the file had**, with its failure callbacks:
a run is created on the subscription's schedule, fails with the reason as the task's error, and the
on-failure callback, the email and any alerting on failed tasks fire, every interval, until the
file is fixed.

The schedule is read leniently from what is left of the file (:func:`lenient_settings`): each key
of the ``airflow:`` section is checked on its own, so a typo elsewhere does not lose it; a file that
is not YAML any more is searched line by line for ``schedule:``. When no schedule can be read the
factory's default (every five minutes) is used: failing more often than the subscription ran is
better than never.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from airflow.sdk import DAG, BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_rowfilter.core.errors import RowFilterError, SpecError
from airflow_provider_rowfilter.core.spec.input_files import MAX_SPEC_BYTES, read_bytes, yaml_document
from airflow_provider_rowfilter.dag_factory.settings import callback_from

#: The schedule of the incremental sync when the file gives none (AirflowSettings.schedule's default).
DEFAULT_SCHEDULE = "*/5 * * * *"
_DAG_ID = re.compile(r"^[A-Za-z0-9_.-]+$")
_NAME_LINE = re.compile(r"^(\s*)(subscription|subscriber_conn_id|publisher_conn_id|dag_id_prefix)\s*:\s*([^#]*?)\s*(#.*)?$")
_SCHEDULE_LINE = re.compile(r"^\s+(refresh_schedule|schedule)\s*:\s*(.*?)\s*(#.*)?$")
#: The placeholder kinds that keep a schedule, and the ``airflow:`` key that gives it.
SCHEDULED = {"incremental_sync": "schedule", "refresh": "refresh_schedule"}


class SpecFileWarning(UserWarning):
    """A spec file of the DAG factory's folder is invalid (its placeholder DAG's task says why)."""


@dataclass(frozen=True)
class LenientSettings:
    """What could still be read from an invalid spec file: schedules and who to alert."""

    schedule: str | None = DEFAULT_SCHEDULE
    refresh_schedule: str | None = None
    start_date: dt.datetime = dt.datetime(2025, 1, 1)
    owner: str | None = None
    callbacks: list[Callable[..., Any]] = field(default_factory=list)
    tags: tuple[str, ...] = ()
    #: True when the schedule is the default because the file gave none that could be read.
    schedule_guessed: bool = True


def lenient_settings(path: Path, settings_of: Callable[[Mapping[str, Any], str], Any],
                     notifier: Callable[[Any, str], Callable[..., Any]]) -> LenientSettings:
    """The schedules, start date, owner, tags and failure callbacks of ``path``'s ``airflow:`` section, each
    key checked on its own with ``settings_of`` (AirflowSettings.from_mapping); what does not pass is left out.

    ``notifier`` builds the email notifier of a list of addresses (the factory's ``email_notifier``).
    """
    text, raw = lenient_document(path)
    section = raw.get("airflow") if isinstance(raw, Mapping) else None
    if not isinstance(section, Mapping):
        return _from_lines(text)
    values: dict[str, Any] = {}
    source = str(path)
    for key, value in section.items():
        try:
            settings = settings_of({key: value}, source)
        except (RowFilterError, TypeError, ValueError):
            continue
        values[key] = getattr(settings, key, None)
    callbacks: list[Callable[..., Any]] = []
    if values.get("email"):
        try:
            callbacks.append(notifier(values["email"], source))
        except RowFilterError:
            pass
    if values.get("on_failure_callback"):
        callbacks.append(callback_from(values["on_failure_callback"], source))
    given = "schedule" in values and _valid_schedule(values["schedule"])
    return LenientSettings(
        schedule=values["schedule"] if given else DEFAULT_SCHEDULE,
        refresh_schedule=values.get("refresh_schedule") if _valid_schedule(values.get("refresh_schedule")) else None,
        start_date=values.get("start_date") or dt.datetime(2025, 1, 1), owner=values.get("owner"),
        callbacks=callbacks, tags=tuple(values.get("tags") or ()), schedule_guessed=not given)


def lenient_document(path: Path) -> tuple[str, Any]:
    """``(text, YAML)`` of a spec file whatever is wrong with it: ``("", None)`` when it cannot be read as a file
    (core/spec/input_files.py: not a regular file, too large), bytes that are not UTF-8 replaced by U+FFFD, and None
    for YAML that does not parse or nests too deep. Never raises: what it returns only names a placeholder."""
    try:
        text = read_bytes(path, f"spec file {str(path)!r}", MAX_SPEC_BYTES).decode("utf-8", errors="replace")
    except SpecError:
        return "", None
    try:
        return text, yaml_document(text, f"spec file {str(path)!r}")
    except (SpecError, RecursionError):
        return text, None


def _from_lines(text: str) -> LenientSettings:
    """A file that is not YAML (or whose ``airflow:`` is not a mapping): its ``schedule:`` lines, if any parse."""
    found: dict[str, str | None] = {}
    for line in text.splitlines():
        match = _SCHEDULE_LINE.match(line)
        if match is None or match.group(1) in found:
            continue
        try:
            value = yaml.safe_load(match.group(2)) if match.group(2) else None
        except (yaml.YAMLError, RecursionError):  # one line of brackets can nest deep too
            continue
        if value is None or (isinstance(value, str) and _valid_schedule(value)):
            found[match.group(1)] = value
    if "schedule" not in found:
        return LenientSettings(refresh_schedule=found.get("refresh_schedule"))
    return LenientSettings(schedule=found["schedule"], refresh_schedule=found.get("refresh_schedule"),
                           schedule_guessed=False)


def _valid_schedule(schedule: Any) -> bool:
    """Whether Airflow takes ``schedule`` (None: manual runs only, a valid choice)."""
    if schedule is None:
        return True
    if not isinstance(schedule, str):
        return False
    try:
        DAG(dag_id="rowfilter_schedule_probe", schedule=schedule, start_date=dt.datetime(2025, 1, 1),
            max_active_runs=1).timetable.validate()
    except Exception:  # whatever Airflow refuses (a bad cron raises its own error types)
        return False
    return True


def placeholder_ids(path: Path, taken: set[str], kinds: tuple[str, ...]) -> dict[str, str | None]:
    """``{dag_id: kind}`` an invalid file stands under: its own DAG ids when its ``subscription`` (and
    ``airflow.dag_id_prefix``) can be read, from the YAML or else line by line, and are free; else
    ``{"rowfilter_invalid_<file name>": None}``."""
    name, prefix = _names(path)
    prefix = prefix or (f"rowfilter_{name}" if name else None)
    if isinstance(name, str) and isinstance(prefix, str) and _DAG_ID.match(prefix):
        ids: dict[str, str | None] = {f"{prefix}_{kind}": kind for kind in kinds}
        if not taken & set(ids):
            return ids
    return {f"rowfilter_invalid_{re.sub(r'[^A-Za-z0-9_.-]', '_', path.name)}": None}


def _names(path: Path) -> tuple[Any, Any]:
    """``(subscription, airflow.dag_id_prefix)`` of a spec file, whatever else is wrong with it."""
    found = lenient_keys(path)
    return found.get("subscription"), found.get("dag_id_prefix")


#: The keys :func:`lenient_keys` reads: the top-level ones naming the subscription and its connections, and
#: ``airflow.dag_id_prefix``.
LENIENT_KEYS = ("subscription", "subscriber_conn_id", "publisher_conn_id", "dag_id_prefix")


def lenient_keys(path: Path) -> dict[str, Any]:
    """What a spec file says of :data:`LENIENT_KEYS`, whatever else is wrong with it (from the YAML, or line by
    line when it is not YAML any more): who the subscription is, so its placeholder and the Replication page
    can still name it and read its state."""
    text, raw = lenient_document(path)
    if isinstance(raw, Mapping):
        section = raw.get("airflow")
        found = {k: raw.get(k) for k in LENIENT_KEYS[:3]}
        found["dag_id_prefix"] = section.get("dag_id_prefix") if isinstance(section, Mapping) else None
        return {k: v for k, v in found.items() if isinstance(v, str) and v}
    found: dict[str, Any] = {}
    for line in text.splitlines():
        match = _NAME_LINE.match(line)
        if match and match.group(2) not in found and (match.group(2) == "dag_id_prefix") == bool(match.group(1)):
            try:
                value = yaml.safe_load(match.group(3))
            except (yaml.YAMLError, RecursionError):
                continue
            if isinstance(value, str) and value:
                found[match.group(2)] = value
    return found


def invalid_spec_dag(dag_id: str, path: Path, error: Exception, *, kind: str | None = None,
                     settings: LenientSettings | None = None) -> DAG:
    """A DAG standing for an invalid spec file: its one task fails, without retry, with ``error``.

    ``kind`` is the DAG it stands for (``incremental_sync``, …; None: every DAG of a file whose
    subscription cannot be read, scheduled as its incremental sync would be).
    """
    settings = settings or LenientSettings()
    key = SCHEDULED.get(kind or "incremental_sync")
    schedule = getattr(settings, key) if key else None
    first_line = str(error).splitlines()[0] if str(error) else type(error).__name__

    default_args: dict[str, Any] = {"retries": 0}
    if settings.owner:
        default_args["owner"] = settings.owner
    if settings.callbacks:
        default_args["on_failure_callback"] = list(settings.callbacks)
    when = ("manual runs only" if schedule is None else
            f"runs on {schedule!r}" + (" (the factory's default: the file's own schedule cannot be read)"
                                       if settings.schedule_guessed and key == "schedule" else ", the file's schedule"))
    with DAG(dag_id=dag_id, schedule=schedule, start_date=settings.start_date, catchup=False, max_active_runs=1,
             is_paused_upon_creation=False, default_args=default_args,
             tags=["rowfilter", "invalid-spec", *settings.tags],
             description=f"INVALID SPEC FILE {path.name}: {first_line}"[:500],
             doc_md=f"The spec file `{path}` is invalid; fix it and the subscription's DAGs come back. Until then "
                    f"this DAG {when} and each run fails with the error, so that the subscription's alerts fire."
                    f"\n\n```\n{error}\n```") as dag:
        InvalidSpecOperator(task_id="invalid_spec", error=str(error))
    return dag


class InvalidSpecOperator(BaseOperator):
    """Fail at once, without retry, with the spec file's error (one frame of ours under it in the task log)."""

    ui_color = "#f4c7c3"

    def __init__(self, *, error: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error = error

    def execute(self, context: Any) -> None:
        raise AirflowFailException(self.error)
