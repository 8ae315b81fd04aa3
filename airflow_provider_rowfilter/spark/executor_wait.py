"""A job on a cluster that gets no executor says so, instead of waiting silently.

A standalone master gives an application its executors only when workers have the cores and memory it asks for;
an application that holds every core (``spark.cores.max`` unset takes all of them: a Spark Connect server started
against the master, another job) leaves the next one ``WAITING`` for as long as it runs. Spark itself says nothing
until a stage is submitted, and then only "Initial job has not accepted any resources". So a job's session on a
cluster master watches for its first executor, and logs a WARNING naming the likely causes and the fix after
:data:`WAIT_WARNING_ENV` seconds (30 by default), then every minute while it waits (docs/operations.md,
"On a Spark cluster"). Nothing for a local master (its executor is the driver) or Spark Connect (the server's).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark import SparkContext

log = logging.getLogger(__name__)

#: Seconds a job's session waits for its first executor before it warns (then every minute).
WAIT_WARNING_ENV = "ROWFILTER_EXECUTOR_WAIT_WARNING"
DEFAULT_WAIT_WARNING = 30.0
_REPEAT = 60.0


def watch_executors(sc: SparkContext, master: str) -> threading.Thread | None:
    """Start the watch (a daemon thread that ends with the first executor, or when the context stops)."""
    if master.startswith("local"):
        return None
    first = float(os.environ.get(WAIT_WARNING_ENV) or DEFAULT_WAIT_WARNING)
    thread = threading.Thread(target=_watch, args=(sc, master, first), name="rowfilter-executor-wait", daemon=True)
    thread.start()
    return thread


def executors(sc: SparkContext) -> int | None:
    """The executors the application has now (the driver's block manager not counted); None once it stopped."""
    try:
        jsc = sc._jsc
        if jsc is None or jsc.sc().isStopped():
            return None
        return max(0, int(jsc.sc().getExecutorMemoryStatus().size()) - 1)
    except Exception:  # the gateway gone as the job exits
        return None


def _watch(sc: SparkContext, master: str, first: float) -> None:
    stop = threading.Event()
    waited, wait = 0.0, min(first, 1.0)
    while True:
        stop.wait(wait)
        waited += wait
        count = executors(sc)
        if count is None or count > 0:
            return
        if waited + 1e-9 >= first:
            cores = sc.getConf().get("spark.cores.max")
            memory = sc.getConf().get("spark.executor.memory", "1g")
            log.warning("%s has given this job no executor for %.0f s (it asks for %s core(s) and %s of memory per "
                        "executor): the cluster's cores are held by other applications (a Spark Connect server "
                        "started against it keeps them while it runs, another job), or no worker has that much "
                        "free. See the master's web UI; give each application spark.cores.max so they fit side by "
                        "side (docs/operations.md, \"On a Spark cluster\")", master, waited,
                        cores or "every free", memory)
            first = waited + _REPEAT
        wait = min(1.0, max(0.1, first - waited))
