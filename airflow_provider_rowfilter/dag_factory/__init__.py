"""DAGs from subscription spec files: a team adds a subscription by adding a YAML file.

Each spec file (the YAML the ``rowfilter`` command reads, README "Use") becomes three DAGs:

- ``<prefix>_initial_sync`` (manual): refresh, one snapshot task per table waiting for its copy
  (dynamic task mapping, bounded by a pool), apply, then wait until every table is ``r``;
- ``<prefix>_incremental_sync`` (scheduled, one run at a time, no catch-up, retries with exponential
  back-off): one ApplyChanges micro-batch per run;
- ``<prefix>_refresh`` (manual unless scheduled): refresh, then copy the tables it added;

then the operations run by hand with parameters (skip a transaction, resync tables, drop), and
``<prefix>_verify`` (manual unless ``verify_schedule``) and ``<prefix>_reconcile_tables`` (manual).

``<prefix>`` is ``rowfilter_<subscription>``. The file's optional ``airflow:`` mapping holds the
Airflow-only settings (:class:`AirflowSettings`); the ``rowfilter`` command and the jobs ignore it.
See docs/dag-factory.md. The modules: ``settings`` (a spec file and its ``airflow:``
settings), ``copies`` (the initial copies' mapped tasks), ``build`` (the DAGs of a file, of a folder),
``operations`` (the DAGs run by hand).
"""

from __future__ import annotations

from airflow_provider_rowfilter.core.spec.dag_kinds import DAG_KINDS
from airflow_provider_rowfilter.dag_factory.build import build_dags, dags_from_folder
from airflow_provider_rowfilter.dag_factory.copies import WAITING_FOR_COPY, copy_tasks, tables_waiting_for_copy
from airflow_provider_rowfilter.dag_factory.operations import check_dags, operations_dags
from airflow_provider_rowfilter.dag_factory.placeholders import SpecFileWarning, invalid_spec_dag
from airflow_provider_rowfilter.dag_factory.settings import (
    DEFAULT_POOL,
    SPEC_PATTERNS,
    AirflowSettings,
    SubscriptionFile,
    callback_from,
)

__all__ = ["DAG_KINDS", "DEFAULT_POOL", "SPEC_PATTERNS", "WAITING_FOR_COPY", "AirflowSettings", "SpecFileWarning",
           "SubscriptionFile", "build_dags", "callback_from", "check_dags", "copy_tasks", "dags_from_folder",
           "invalid_spec_dag", "operations_dags", "tables_waiting_for_copy"]
