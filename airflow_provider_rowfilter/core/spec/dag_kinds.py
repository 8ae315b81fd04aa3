"""The DAGs of one spec file (``rowfilter_<subscription>_<kind>``), and the ``rowfilter`` command each operation DAG runs.

Names only: the DAG factory builds a DAG of each kind (dag_factory/settings.py), and an operator's error says the
DAG to trigger in place of the command its hint names (operators/task_errors.py).
"""

from __future__ import annotations

#: The DAGs of one spec file: the three that replicate, then the operations, run by hand with parameters.
DAG_KINDS = ("initial_sync", "incremental_sync", "refresh", "skip_transaction", "resync_tables", "drop_subscription",
             "sync_sequences", "verify", "reconcile_tables", "watch", "disable_subscription",
             "enable_subscription")
#: The DAG kind that runs each ``rowfilter`` command a hint may name.
COMMAND_DAGS = {"skip": "skip_transaction", "resync": "resync_tables", "drop": "drop_subscription",
                "refresh": "refresh", "snapshot": "refresh", "reconcile": "reconcile_tables", "verify": "verify",
                "disable": "disable_subscription", "enable": "enable_subscription"}
