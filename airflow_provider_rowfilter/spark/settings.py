"""The JVM settings of every job's Spark driver and executors, in one place.

Pure Python (no pyspark): the Airflow operators add them to what they give spark-submit
(operators/rowfilter_job.py), and a job that starts its own session adds them to that session's
settings (spark/session.py). Measurements behind each choice: docs/apply.md, "Speed".
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from collections.abc import Mapping

#: JVM options of the jobs' driver and executors, given to spark-submit by the operators and to a
#: session the job starts itself (spark/session.py). UTC for java.time; let the JIT compile Spark's
#: generated methods however long they are: the apply's judging projection runs about 5× slower in
#: HotSpot's bytecode interpreter (the sessions' hugeMethodLimit keeps whole-stage methods under
#: 8,000 bytes; this covers the rest, and a session that raises it); and keep the optimising compiler
#: (C2) from betting on branches it has not seen taken (an "uncommon trap"): when the bet loses, the
#: judging projection is thrown back to the interpreter until C2 has compiled it again, which took a
#: third of the warm 200k batches from 1.1–2.5 s to 5.4–6.8 s (docs/apply.md, "Speed").
SPARK_JVM_OPTIONS = ("-Duser.timezone=UTC", "-XX:-DontCompileHugeMethods", "-XX:PerMethodTrapLimit=0")
#: Added for JVMs that live for one short apply batch (ApplyChangesOperator's spark-submit, the apply
#: job's own session, when the batch is bounded by at most SHORT_BATCH_CHANGES): HotSpot's quick
#: compiler only. Its code runs slower than the optimising compiler's, but a short batch is over
#: before that compiler would have paid for itself: a 200k-change batch in a fresh JVM took
#: 29.7–37.6 s (7 runs) against 41.8–44.4 s (3 runs). At 1M changes in one batch no difference could
#: be told from the noise (86.6 and 89.5 s against 82.2 and 103.7 s), so larger batches keep both
#: (docs/apply.md, "Speed").
SHORT_BATCH_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1",)
SHORT_BATCH_CHANGES = 300_000
#: Settings of the JVM's SQL engine, fixed when that JVM starts it: a job's own session sets them
#: (spark/session.py), and so does the local Spark Connect server (spark/connect_server.py); a Connect
#: client cannot (Spark refuses a static setting). Spark keeps 100 compiled classes of generated code
#: by default; one apply batch's plans compile about 95, so a second subscription or job on the same
#: JVM (a Connect server) evicts them and each run compiles its plans again: 1.6 s of a warm
#: 2-CPU run's 2.2 s of judging. With room for 2,000 a warm run on its job's session compiles
#: nothing it compiled before (docs/apply.md, "Compiled code kept").
STATIC_SQL_SETTINGS = {"spark.sql.codegen.cache.maxEntries": "2000"}
#: Optimizer rules that prove more than PostgreSQL's planner does, so that a row filter PostgreSQL would fail on
#: (an error raised for the row) would yield NULL in Spark: UnwrapCastInBinaryComparison rewrites
#: ``CAST(i2 AS DOUBLE) = 12.125`` to ``if(isnull(i2), null, false)`` (12.125 is no smallint); the CASE it
#: decides then folds to NULL, and ``(n % 0.0) <= NULL`` with it, dropping the division by zero PostgreSQL
#: raises (it folds only a constant NULL operand: eval_const_expressions in optimizer/util/clauses.c). Found by
#: tests/e2e/core/test_row_filter_differential.py; excluded in every session the jobs judge in, the user's
#: own exclusions added to it (spark/session.py ``session_conf``). SimplifyConditionals likewise replaced
#: ``CASE WHEN c THEN true ELSE true END`` by ``true`` without evaluating ``c``, where PostgreSQL evaluates the
#: condition and raises its error (an invalid regular expression there); the planner keeps such a CASE.
EXCLUDED_OPTIMIZER_RULES = ("org.apache.spark.sql.catalyst.optimizer.UnwrapCastInBinaryComparison",
                            "org.apache.spark.sql.catalyst.optimizer.SimplifyConditionals")
EXCLUDED_RULES_SETTING = "spark.sql.optimizer.excludedRules"
#: The one action of a small batch runs without adaptive execution, over one shuffle partition
#: (spark/apply_frames.py ``DecidedBatch.collected``): for a few thousand rows AQE has nothing to
#: adapt, and it ran the query's six levels of shuffle stages one after the other, re-planning after
#: each (0.92 s against 1.07 s of a warm 100-change run's action through Spark Connect; docs/apply.md,
#: "Small batches"). Without AQE, Spark's default of 200 shuffle partitions would make hundreds of
#: empty tasks per stage. Set for that action only; a Connect session a killed run left them set on
#: is reset when a job attaches to it (spark/session.py ``connect_session``).
SMALL_BATCH_SQL_SETTINGS = {"spark.sql.adaptive.enabled": "false", "spark.sql.shuffle.partitions": "1"}
#: Spark's own RPC (the driver's endpoints) and block transfers (cached and shuffled rows) answer only a peer
#: that proves it holds the application's secret: without it another user of the host fetched a session's
#: cached rows from its block manager port with a few lines of Python (tests/spark/test_spark_network.py).
#: Under a local master Spark makes the secret itself (256 random bits, ``SecurityManager.initializeAuth``):
#: it is in no setting, on no command line and in no log. Not encrypted: the peers are one JVM and loopback,
#: which no other unprivileged user can read (and with ``spark.network.crypto.enabled`` the Connect server's
#: first query of a new session hung in 2 of 8 trials, none of 8 without).
NETWORK_AUTH_SETTINGS = {"spark.authenticate": "true"}


#: Where Spark's web UI listens: it binds to the JVM's ``SPARK_LOCAL_IP``, else to every address (``WebUI.bind``
#: and ``initServer`` in core/src/main/scala/org/apache/spark/ui/WebUI.scala: no setting chooses it;
#: ``spark.driver.bindAddress`` is the RPC's). Given to every JVM of a local master this package starts.
UI_ADDRESS_ENV = "SPARK_LOCAL_IP"
LOOPBACK = "127.0.0.1"


def is_local(master: str) -> bool:
    """Whether ``master`` runs the whole application in the JVM started here (``local``, ``local[N]``, ``local[*]``,
    ``local[N, F]``; not ``local-cluster``, whose workers are JVMs of their own)."""
    return re.fullmatch(r"local(\[.*\])?", master.strip()) is not None


def ui_settings(master: str, conf: Mapping[str, str] | None = None,
                launched: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark's web UI for a Spark this package starts on this host (a local master): off unless the user asks for it
    (``spark.ui.enabled: true`` in ``conf``, the spec's ``spark_conf``, or in ``launched``, what spark-submit was
    given); one asked for cannot kill jobs or stages (``spark.ui.killEnabled`` false: a kill request carries no
    authentication, and any user of the host reaches 127.0.0.1). Nothing for a cluster: its UI is its own
    configuration's (docs/operations.md, "Security")."""
    if not is_local(master):
        return {}
    asked = {**(launched or {}), **(conf or {})}.get("spark.ui.enabled", "false")
    if str(asked).strip().lower() != "true":
        return {"spark.ui.enabled": "false"}
    return {"spark.ui.killEnabled": "false"}


def network_security(master: str, conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """:data:`NETWORK_AUTH_SETTINGS` for a Spark this package starts on this host (a local master), unless
    ``conf`` (the user's settings) decides ``spark.authenticate`` itself. Nothing for a cluster (YARN,
    Kubernetes, standalone): its security is its own configuration's (an external shuffle service on YARN, as
    EMR and Dataproc run, refuses executors of an authenticated application unless its NodeManagers are
    configured for it; docs/operations.md, "Security")."""
    if not is_local(master) or "spark.authenticate" in (conf or {}):
        return {}
    return dict(NETWORK_AUTH_SETTINGS)


def private_local_dir(prefix: str = "rowfilter-spark-", *, remove_at_exit: bool = True) -> str:
    """A new 0700 directory in the system's temporary directory for Spark's scratch files (``spark.local.dir``:
    shuffle and spill files, which hold replicated rows), whatever the umask; removed when this process exits
    unless ``remove_at_exit`` is false (a server's, removed when it is stopped). Spark removes what it made
    inside when it stops."""
    path = tempfile.mkdtemp(prefix=prefix)  # 0700, made by this user only
    if remove_at_exit:
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def wants_local_dir(conf: Mapping[str, str], environ: Mapping[str, str] | None = None) -> bool:
    """Whether a Spark of these settings and this environment takes the scratch directory given to it: not
    when ``spark.local.dir`` is set, nor when ``SPARK_LOCAL_DIRS`` is (Spark prefers that), nor off a local
    master (a path made here would not exist on the executors' hosts)."""
    environ = os.environ if environ is None else environ
    return (conf.get("spark.master", "local").startswith("local") and "spark.local.dir" not in conf
            and not environ.get("SPARK_LOCAL_DIRS"))


def with_jvm_options(conf: Mapping[str, str] | None, *, short_batch: bool = False) -> dict[str, str]:
    """``conf`` with :data:`SPARK_JVM_OPTIONS` added to the driver's and executors' Java options.

    :param short_batch: the JVMs run one short apply batch and exit: add :data:`SHORT_BATCH_JVM_OPTIONS` too.

    An option the caller sets itself (``-Duser.timezone=…``, ``-XX:+DontCompileHugeMethods``,
    ``-XX:TieredStopAtLevel=4``) is kept as given.
    """
    options = (*SPARK_JVM_OPTIONS, *(SHORT_BATCH_JVM_OPTIONS if short_batch else ()))
    result = dict(conf or {})
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        present = result.get(key) or ""
        added = [o for o in options
                 if o.split("=")[0].removeprefix("-XX:-").removeprefix("-D") not in present]
        result[key] = " ".join(part for part in (present.strip(), *added) if part)
    return result
