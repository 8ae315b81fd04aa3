"""One initial-sync, incremental-sync and refresh DAG per subscription spec file (the DAG factory).

Every ``*.yaml``/``*.yml`` in ``$ROWFILTER_SUBSCRIPTIONS_DIR`` (default: ``subscriptions/`` beside
this file) is a subscription: a team adds one by adding a file. A file that is not a valid spec
becomes a placeholder DAG whose task fails with the error naming the file; the other files' DAGs
load as usual. See docs/dag-factory.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow_provider_rowfilter.dag_factory import dags_from_folder

FOLDER = Path(os.environ.get("ROWFILTER_SUBSCRIPTIONS_DIR") or Path(__file__).with_name("subscriptions"))

globals().update(dags_from_folder(FOLDER))
