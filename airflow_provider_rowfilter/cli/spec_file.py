"""A spec file as the commands need it, with the Airflow connections it names resolved."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.core.spec.values import CONN_ID


def load_spec(path: str, needs: Sequence[str] = ("publisher", "subscriber"),
              change_log_conn_id: str | None = None) -> SubscriptionSpec:
    """The spec file as the jobs need it: a file of the DAG factory, which names Airflow connections
    instead of URLs, is resolved through Airflow in a process of its own (hooks/spec_resolver.py: this
    command never imports Airflow); the passwords come back by pipe and go to this process's
    environment, where the jobs read them (connection.py ``PASSWORD_ENV``). Only when a role the command
    ``needs`` has a connection id and no URL: ``validate`` reads the publisher alone. The change log's
    store credentials likewise, from the Airflow connection ``change_log_conn_id`` (``--change-log-conn-id``,
    else the spec's) names: they replace the store's variables (``AWS_…``) in this process's environment."""
    spec = SubscriptionSpec.load(path)
    store = change_log_conn_id or spec.change_log_conn_id
    if change_log_conn_id:
        spec.check_change_log_conn_id(change_log_conn_id)
    named = [r for r in needs if getattr(spec, f"{r}_conn_id") and not getattr(spec, r)]
    named += [f"standbys ({s})" for s in spec.standbys if CONN_ID.match(s)]
    named += ["change_log_conn_id"] if store else []
    if not named:
        return spec
    import importlib.util
    import os
    import subprocess

    if importlib.util.find_spec("airflow") is None:
        raise SpecError(f"spec file {path!r} names Airflow connections "
                        f"({', '.join(r if r.startswith(('standbys', 'change_log')) else f'{r}_conn_id' for r in named)}), "
                        "and Airflow is not installed here",
                        hint="run the command where Airflow and its connections are, or give "
                        f"{' and '.join(named)} URLs in a spec file of their own")
    done = subprocess.run([sys.executable, "-m", "airflow_provider_rowfilter.hooks.spec_resolver", path,
                           *(["--change-log-conn-id", store] if store else [])],
                          capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    answer = json.loads(lines[-1]) if lines else {}
    if "spec" not in answer:  # its stderr is not shown: Airflow's own output may quote a connection
        raise SpecError(answer.get("error") or f"could not resolve the Airflow connections of {path!r} "
                        f"(exit status {done.returncode})", hint=answer.get("hint") or "run python -m "
                        f"airflow_provider_rowfilter.hooks.spec_resolver {path} to see Airflow's error")
    store_env = answer.get("store") or {}
    for key, value in answer["passwords"].items():
        if key not in store_env:
            os.environ.setdefault(key, value)
    os.environ.update(store_env)  # the connection named for the store wins over the environment's own credentials
    return SubscriptionSpec.from_json(answer["spec"])
