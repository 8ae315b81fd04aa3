"""A task's error as a person in Airflow reads it: what to trigger instead of what to type, and no traceback of ours.

The jobs' HINTs name the ``rowfilter`` command (``rowfilter skip --lsn 0/1A2B3C8``), which is right in a
shell. In a task of the DAG factory's DAGs the same fix is a DAG to trigger, with its parameters:
:func:`in_airflow_terms` rewrites each command into the DAG of the same subscription that does it
(``rowfilter_s1_skip_transaction``, Trigger with ``lsn`` = ``0/1A2B3C8``); a command no DAG runs gets
the spec file (``--spec``), so it can be pasted into a shell where Airflow's connections are. In other
DAGs the commands get the spec file too.

:func:`clear_errors` wraps an operator's ``execute``: an :class:`AirflowFailException` or
:class:`AirflowException` the operator raised with its clear message leaves it with that message in
these terms and with a traceback of one frame of ours (the rest are Airflow's own task-runner frames,
which it logs with every task failure), never the job's or psycopg's chain.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Callable
from typing import Any, TypeVar, cast

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_rowfilter.core.spec.dag_kinds import COMMAND_DAGS, DAG_KINDS

F = TypeVar("F", bound=Callable[..., Any])
_COMMAND = re.compile(r"`rowfilter (?P<command>[a-z-]+)(?P<args>[^`]*)`")


def factory_prefix(task: Any) -> str | None:
    """``rowfilter_s1`` when ``task`` is in a DAG of the DAG factory (its id ends with one of its kinds)."""
    dag = task.dag if getattr(task, "has_dag", lambda: False)() else None
    if dag is None or "rowfilter" not in (dag.tags or ()):
        return None
    return next((dag.dag_id[: -len(kind) - 1] for kind in DAG_KINDS if dag.dag_id.endswith(f"_{kind}")), None)


def in_airflow_terms(task: Any, text: str) -> str:
    """``text`` with each `rowfilter …` command said as the DAG to trigger, or with its spec file (module)."""
    prefix = factory_prefix(task)
    spec = getattr(task, "spec", None)
    spec = spec if isinstance(spec, str) and spec and "{{" not in spec else None

    def rewrite(match: re.Match[str]) -> str:
        command, args = match.group("command"), match.group("args")
        try:
            words = shlex.split(args)
        except ValueError:
            words = args.split()
        if "--spec" in words:
            return match.group(0)
        if prefix is not None and command in COMMAND_DAGS:
            if command == "resync" and "--reconcile" in words:
                command = "reconcile"  # a repair in place: the reconcile DAG, never the one that empties
            params = _params(command, words)
            what = f"the DAG {prefix}_{COMMAND_DAGS[command]}"
            return f"{what} (Trigger DAG with {params})" if params else what
        if prefix is not None and command == "status":
            return "Browse → Replication"
        if spec is None:
            return match.group(0)
        return f"`rowfilter {command} --spec {shlex.quote(spec)}{args}`"

    return _COMMAND.sub(rewrite, text)


def _params(command: str, words: list[str]) -> str:
    """The DAG's parameters for the command's options, as its Trigger DAG form names them."""
    if command == "skip":
        lsn = _option(words, "--lsn")
        return f"lsn = {lsn}" if lsn else "lsn = the finish LSN"
    named = _tables(words)
    if command == "resync":
        listed = f"tables = {named!r}".replace("'", '"') if named else "tables = the table(s)"
        return f"{listed}, confirm_empty = true (it empties them)"
    if command in ("reconcile", "verify"):
        return (f"tables = {named!r}".replace("'", '"') if named else "") + (
            (", " if named else "") + "dry_run = true" if "--dry-run" in words else "")
    if command == "refresh":
        return ", ".join(f"{name} = true" for name in ("recreate_slot", "reconcile") if f"--{name.replace('_', '-')}" in words)
    if command == "drop":
        return "confirm = the subscription's name" + (", keep_slot = true" if "--keep-slot" in words else "")
    return ""


def _tables(words: list[str]) -> list[str]:
    """The tables a command's ``--table`` options name, without a hint's placeholders (``T``, ``<table>``)."""
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--table" and words[i + 1] != "T"
            and not words[i + 1].startswith("<")]


def _option(words: list[str], name: str) -> str | None:
    return next((words[i + 1] for i, w in enumerate(words[:-1]) if w == name), None)


def clear_errors(execute: F) -> F:
    """Re-raise the operator's own failure in Airflow's terms, with one frame of traceback (see the module)."""

    @functools.wraps(execute)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return execute(self, *args, **kwargs)
        except AirflowException as e:
            if type(e) not in (AirflowException, AirflowFailException):
                raise  # a skip, a reschedule, a deferral, a timeout: Airflow's own signals
            clean = type(e)(in_airflow_terms(self, str(e)))
        raise clean from None

    return cast(F, wrapper)  # the wrapper takes and returns what execute does
