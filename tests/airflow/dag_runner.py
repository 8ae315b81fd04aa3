"""Run ``dag.test()`` of one DAG in a fresh interpreter with its own AIRFLOW_HOME and sqlite database.

A fresh interpreter because Airflow reads its configuration (home, database, DAGs folder) once, at
import; the pytest process has imported Airflow already with another home.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULT_PREFIX = "DAG-TEST-RESULT "

SCRIPT = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.models.renderedtifields import RenderedTaskInstanceFields
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session

runs, prefix = json.loads(sys.argv[1]), sys.argv[2]
bag = DagBag()
if bag.import_errors:
    raise SystemExit(f"import errors: {bag.import_errors}")
for dag_id, run_conf in runs:
    dr = bag.dags[dag_id].test(run_conf=run_conf or None)
    with create_session() as session:
        tasks, xcoms, rendered = {}, {}, {}
        for ti in dr.get_task_instances(session=session):
            key = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"
            tasks[key] = str(getattr(ti.state, "value", ti.state))
            row = session.query(XComModel).filter_by(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id,
                                                     map_index=ti.map_index, key="return_value").one_or_none()
            if row is not None:
                xcoms[key] = row.value
            fields = session.query(RenderedTaskInstanceFields).filter_by(
                dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, map_index=ti.map_index).one_or_none()
            if fields is not None:
                rendered[key] = fields.rendered_fields
    state = str(getattr(dr.state, "value", dr.state))
    print(prefix + json.dumps({"dag_id": dag_id, "state": state, "tasks": tasks, "xcoms": xcoms,
                                   "rendered": rendered}, default=str),
          flush=True)
"""


def run_dags(airflow_db: dict[str, str], runs: list[tuple[str, dict[str, Any] | None]], *,
             dags_folder: Path | None = None, env: dict[str, str] | None = None,
             on_line: Callable[[str], None] | None = None, timeout: float = 300) -> list[dict[str, Any]]:
    """Run ``dag.test()`` for each ``(dag_id, run_conf)`` in one interpreter, in order.

    Returns one ``{"dag_id", "state", "tasks": {task_id: state}, "xcoms": {task_id: value}, "rendered":
    {task_id: rendered template fields as stored}}`` per run; each also carries the whole ``output``
    of the interpreter.

    :param on_line: called with each line of output as it comes (to act on what a task logs).
    """
    full = {**airflow_db, **(env or {})}
    if dags_folder is not None:
        full["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags_folder)
    # spark-submit is installed beside the interpreter by pyspark.
    full["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), full.get("PATH", "")])
    lines: list[str] = []
    with subprocess.Popen([sys.executable, "-c", SCRIPT, json.dumps(runs), RESULT_PREFIX], env=full,
                          cwd=full["AIRFLOW_HOME"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:
        timer = threading.Timer(timeout, process.kill)
        timer.start()
        try:
            for line in process.stdout:  # type: ignore[union-attr]
                lines.append(line)
                if on_line is not None:
                    on_line(line)
        finally:
            timer.cancel()
        returncode = process.wait()
    output = "".join(lines)
    results = [json.loads(line[len(RESULT_PREFIX):]) for line in lines if line.startswith(RESULT_PREFIX)]
    assert returncode == 0 and len(results) == len(runs), (
        f"dag.test() failed (exit {returncode}, {len(results)} of {len(runs)} runs done):\n{output[-10000:]}")
    for result in results:
        result["output"] = output
    return results
