"""The subscription's operations and checks as DAGs run by hand with parameters (Trigger DAG's form)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG, Param

from airflow_provider_rowfilter.dag_factory.settings import SubscriptionFile
from airflow_provider_rowfilter.operators.reconcile_tables import ReconcileTablesOperator
from airflow_provider_rowfilter.operators.snapshot_copy import SnapshotCopyOperator
from airflow_provider_rowfilter.operators.subscription_ops import (
    DropSubscriptionOperator,
    SetEnabledOperator,
    SkipTransactionOperator,
    SyncSequencesOperator,
)
from airflow_provider_rowfilter.operators.verify_tables import VerifyTablesOperator

#: An LSN as PostgreSQL writes it, or NONE (the skip DAG's parameter).
_LSN_PARAM = r"^([0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}|NONE|none)$"


def operations_dags(source: SubscriptionFile, job: dict[str, Any], common: dict[str, Any]) -> dict[str, DAG]:
    """The subscription's operations as DAGs run by hand, each with its parameters (Trigger DAG's form):
    what ``rowfilter skip``, ``resync`` and ``drop`` do, through the file's Airflow connections."""
    spec, ids = source.spec, source.dag_ids
    manual = {**common, "schedule": None, "default_args": {**common["default_args"], "retries": 0}}
    dags: dict[str, DAG] = {}
    with DAG(dag_id=ids["skip_transaction"], description=f"Skip one remote transaction of {spec.subscription} "
             "(ALTER SUBSCRIPTION … SKIP): the finish LSN a conflict error names",
             params={"lsn": Param(type="string", pattern=_LSN_PARAM, title="Finish LSN of the transaction",
                                  description="as the conflict error gives it (0/1A2B3C8); NONE clears a pending skip")},
             **manual) as dag:
        SkipTransactionOperator(task_id="skip", spec=job["spec"], lsn="{{ params.lsn }}")
    dags[dag.dag_id] = dag
    with DAG(dag_id=ids["resync_tables"], description=f"EMPTY tables of {spec.subscription} and copy them again: "
             "truncated in the subscriber, back to i, then the initial copy (the incremental sync catches them up); "
             f"to repair in place instead, {ids['reconcile_tables']}",
             params={"tables": Param([], type="array", items={"type": "string"}, minItems=1, title="Tables",
                                     description="schema.table names of the subscription"),
                     "confirm_empty": Param(False, type="boolean", title="Empty these tables first",
                                            description="they are truncated in the subscriber and unreadable until "
                                            f"copied again; a repair in place is {ids['reconcile_tables']}")},
             render_template_as_native_obj=True, **manual) as dag:
        SnapshotCopyOperator(task_id="resync", resync=True, tables="{{ params.tables | join(',') }}",
                             confirm_empty="{{ params.confirm_empty }}", **job)
    dags[dag.dag_id] = dag
    with DAG(dag_id=ids["drop_subscription"], description=f"Drop subscription {spec.subscription} (DROP "
             "SUBSCRIPTION): its slot, its state and its change log; the subscriber's tables stay",
             params={"confirm": Param(type="string", title="Type the subscription's name to drop it",
                                      description=f"{spec.subscription}"),
                     "keep_slot": Param(False, type="boolean", title="Leave the publisher alone",
                                        description="its slot keeps retaining WAL until dropped")},
             render_template_as_native_obj=True, **manual) as dag:
        DropSubscriptionOperator(task_id="drop", spec=job["spec"], confirm="{{ params.confirm }}",
                                 keep_slot="{{ params.keep_slot }}")
    dags[dag.dag_id] = dag
    with DAG(dag_id=ids["sync_sequences"], description=f"Move the sequences of {spec.subscription}'s tables in the "
             "subscriber past the publisher's (before a switchover: sequences are not replicated)",
             params={"tables": Param([], type="array", items={"type": "string"}, title="Tables",
                                     description="schema.table names; none: every table of the subscription"),
                     "dry_run": Param(False, type="boolean", title="Dry run", description="say what would be set")},
             render_template_as_native_obj=True, **manual) as dag:
        SyncSequencesOperator(task_id="sync_sequences", spec=job["spec"], tables="{{ params.tables | join(',') }}",
                              dry_run="{{ params.dry_run }}")
    dags[dag.dag_id] = dag
    for kind, enabled, what in (("disable_subscription", False, "Pause (disable)"), ("enable_subscription", True,
                                                                                     "Resume (enable)")):
        with DAG(dag_id=ids[kind], description=f"{what} subscription {spec.subscription} (ALTER SUBSCRIPTION … "
                 f"{'ENABLE' if enabled else 'DISABLE'})" + ("" if enabled else ": the apply applies nothing until it "
                 "is enabled; the watch's slot guard keeps the slot read meanwhile"), **manual) as dag:
            SetEnabledOperator(task_id="enable" if enabled else "disable", spec=job["spec"], enabled=enabled)
        dags[dag.dag_id] = dag
    dags.update(check_dags(source, job, common))
    return dags


def check_dags(source: SubscriptionFile, job: dict[str, Any], common: dict[str, Any]) -> dict[str, DAG]:
    """``verify`` (by hand, or on ``airflow: verify_schedule``): every table, or the chosen ones, compared with the
    publisher's rows, failing when one differs; ``reconcile_tables`` (by hand): tables repaired in place."""
    spec, ids, settings = source.spec, source.dag_ids, source.settings
    tables = Param([], type="array", items={"type": "string"}, title="Tables",
                   description="schema.table names of the subscription; none: every table")
    dags: dict[str, DAG] = {}
    with DAG(dag_id=ids["verify"], description=f"Verify {spec.subscription}: each table against its publisher's "
             "rows under its filters, at one consistent point (read-only); fails when one differs",
             params={"tables": tables}, **{**common, "schedule": settings.verify_schedule}) as dag:
        VerifyTablesOperator(task_id="verify", tables="{{ params.tables | join(',') }}", **job)
    dags[dag.dag_id] = dag
    manual = {**common, "schedule": None, "default_args": {**common["default_args"], "retries": 0}}
    with DAG(dag_id=ids["reconcile_tables"], description=f"Reconcile tables of {spec.subscription} in place: to what "
             "a new copy would hold, never emptying them (the incremental sync catches them up)",
             params={"tables": tables, "dry_run": Param(False, type="boolean", title="Dry run",
                                                        description="change nothing: say what would change")},
             render_template_as_native_obj=True, **manual) as dag:
        ReconcileTablesOperator(task_id="reconcile", tables="{{ params.tables | join(',') }}",
                                dry_run="{{ params.dry_run }}", **job)
    dags[dag.dag_id] = dag
    return dags
