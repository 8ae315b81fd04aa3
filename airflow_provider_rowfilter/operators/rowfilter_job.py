"""What every rowfilter operator shares: submit one of the package's own jobs with spark-submit.

Like ``SparkJDBCOperator``, each operator is a ``SparkSubmitOperator`` whose application is a script
shipped inside this package (``airflow_provider_rowfilter/jobs/<job>.py``). The operator only
marshals: it renders its arguments, builds and validates the spec, puts it on the command line as
JSON (``--spec-json``; it holds no password), hands the passwords to the job as environment
variables, and lets ``SparkSubmitOperator`` do the submitting.

With a ``spark_connect`` connection (Airflow's Spark provider) as ``conn_id`` there is no
spark-submit: the job runs as a plain Python process (``python -m airflow_provider_rowfilter.jobs.<job>``)
that attaches to that Spark Connect server (the spec's ``spark_remote``); no JVM starts in the task.
"""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import psycopg
from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowNotFoundException
from airflow.sdk.log import mask_secret

import airflow_provider_rowfilter
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.spec.spark_remote import SPARK_CONNECT_TOKEN_ENV
from airflow_provider_rowfilter.hooks.job_output import JobOutput, connect_url, job_failure
from airflow_provider_rowfilter.hooks.rowfilter import ResolvedSpec, RowFilterHook
from airflow_provider_rowfilter.hooks.spark_submit_job import JobSubmitHook
from airflow_provider_rowfilter.hooks.store_connection import store_environment
from airflow_provider_rowfilter.operators.task_errors import clear_errors, in_airflow_terms
from airflow_provider_rowfilter.spark.class_archive import SESSION_MARK_ENV, ClassArchive, class_archive
from airflow_provider_rowfilter.spark.settings import LOOPBACK, UI_ADDRESS_ENV, is_local, with_jvm_options

if TYPE_CHECKING:
    from airflow.sdk import Context

JOBS_DIR = Path(airflow_provider_rowfilter.__file__).parent / "jobs"
PYTHON_CONF = ("spark.pyspark.python", "spark.pyspark.driver.python")
PYTHON_ENV = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
#: What SparkSubmitHook takes: the operator hands it the same arguments SparkSubmitOperator would.
_HOOK_PARAMETERS = tuple(p for p in inspect.signature(SparkSubmitHook.__init__).parameters if p not in ("self", "kwargs"))


def job_path(job: str) -> str:
    """Path of a job script inside the installed package (what spark-submit runs)."""
    return str(JOBS_DIR / f"{job}.py")


class RowFilterJobOperator(SparkSubmitOperator):
    """Submit one of the package's jobs for a subscription (base class; use a concrete operator).

    The subscription comes from ``spec`` (a YAML spec file) and/or the keyword fields below; a field
    given here overrides the file's. Connections are Airflow connection ids: ``postgres`` ones for
    the publisher and the subscriber, a ``spark`` one (``conn_id``) for where the job runs.

    :param spec: path of a subscription spec file (YAML), relative to the DAG's folder. (templated)
    :param subscription: subscription name. (templated)
    :param publications: publication names, a list or a comma-separated string. (templated)
    :param publisher_conn_id: Airflow ``postgres`` connection of the publisher. (templated)
    :param subscriber_conn_id: Airflow ``postgres`` connection of the subscriber. (templated)
    :param publications_ddl: file of ``CREATE PUBLICATION`` statements to take the definitions
        from instead of the publisher's catalog; relative to the DAG's folder. (templated)
    :param copy_data: whether newly subscribed tables get table synchronization (default true).
    :param spark_conf: Spark settings the job applies to its session (spec key ``spark_conf``);
        settings for spark-submit itself go to ``conf``.
    :param forward_passwords: hand the connections' passwords to the job as the environment
        variables ``ROWFILTER_PUBLISHER_PASSWORD``/``ROWFILTER_SUBSCRIBER_PASSWORD`` (default). Set
        False where the cluster provides them itself (a Kubernetes secret, a ``~/.pgpass``).
    :param change_log_conn_id: an Airflow ``aws``, ``google_cloud_platform`` or ``wasb`` connection whose
        credentials the task and the job use for a change log on object storage, handed by environment like the
        passwords (hooks/store_connection.py). Default: the spec file's ``change_log_conn_id``, else the workers'
        own environment or role. (templated)
    :param jdbc_jar: deprecated and ignored: no job uses JDBC (the copy and the apply talk to
        PostgreSQL through psycopg), so no driver jar is shipped. Passing it warns
        (``AirflowProviderDeprecationWarning``); it will be removed in 1.0. A jar your own Spark
        settings need goes to ``jars``.
    :param conn_id: the Airflow ``spark`` connection (master, deploy mode); default ``spark_default``. A
        ``spark_connect`` connection (host and port of a Spark Connect server; its Token, if any, reaches
        the job by environment) runs the job as a Spark Connect client instead of through spark-submit.
    :param kwargs: everything else ``SparkSubmitOperator`` takes (``conf``, ``py_files``, ``jars``,
        ``env_vars``, ``executor_memory``, …), except ``application`` and ``application_args``.
    """

    #: Name of the job module in ``airflow_provider_rowfilter/jobs/``.
    job: ClassVar[str]
    #: Roles whose database the job connects to.
    roles: ClassVar[tuple[str, ...]] = ("publisher", "subscriber")
    #: Whether the job's driver JVM maps a class archive (spark/class_archive.py): a job that starts a Spark
    #: session does; one whose JVM is mostly spark-submit's own launcher would only pay for making it.
    archives_classes: ClassVar[bool] = True

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "spec",
        "subscription",
        "publications",
        "publisher_conn_id",
        "subscriber_conn_id",
        "change_log_conn_id",
        "publications_ddl",
    )
    ui_color = "#c8e6f5"

    def __init__(
        self,
        *,
        spec: str | None = None,
        subscription: str | None = None,
        publications: Sequence[str] | str | None = None,
        publisher_conn_id: str | None = None,
        subscriber_conn_id: str | None = None,
        publications_ddl: str | None = None,
        copy_data: bool | None = None,
        spark_conf: dict[str, str] | None = None,
        forward_passwords: bool = True,
        change_log_conn_id: str | None = None,
        jdbc_jar: str | None = None,
        conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        for fixed in ("application", "application_args"):
            if fixed in kwargs:
                raise TypeError(f"{type(self).__name__} sets {fixed} itself (the package's {self.job} job); "
                                f"remove {fixed}={kwargs[fixed]!r}")
        kwargs.setdefault("name", f"rowfilter-{self.job}")
        super().__init__(application=job_path(self.job), conn_id=conn_id, **kwargs)
        self.conn_id = conn_id
        #: The arguments given for SparkSubmitHook (:meth:`_get_hook`; the templated ones are read rendered).
        self.submit_kwargs = {k: v for k, v in kwargs.items() if k in _HOOK_PARAMETERS}
        self.spec = spec
        self.subscription = subscription
        self.publications = publications
        self.publisher_conn_id = publisher_conn_id
        self.subscriber_conn_id = subscriber_conn_id
        self.publications_ddl = publications_ddl
        self.copy_data = copy_data
        self.spark_conf = spark_conf
        self.forward_passwords = forward_passwords
        self.change_log_conn_id = change_log_conn_id
        if jdbc_jar is not None:
            warnings.warn(
                f"{type(self).__name__}(jdbc_jar=...) is deprecated and ignored: no rowfilter job uses JDBC any "
                "more, so no driver jar is shipped. Remove the argument (a jar your own settings need goes to "
                "jars=...); it will be removed in 1.0.",
                AirflowProviderDeprecationWarning,
                stacklevel=2,
            )
        self._output: JobOutput | None = None
        self._submit_hook: JobSubmitHook | None = None
        self._master: str | None = None
        self._archive: ClassArchive | None = None
        self._archive_options: tuple[str, ...] = ()  # what the archive added to the driver's Java options

    # --- what the concrete operators add ------------------------------------------------------------
    def job_arguments(self) -> list[str]:
        """Arguments after ``--spec-json``; validate them here (raise RowFilterError)."""
        return []

    def before_submit(self, resolved: ResolvedSpec) -> Any:
        """Read what :meth:`summary` compares against; best effort."""
        return None

    def run_in_task(self, resolved: ResolvedSpec) -> bool:
        """Do the run in the task itself when it needs no Spark; True: done, the job is not submitted."""
        return False

    def summary(self, resolved: ResolvedSpec, before: Any) -> dict[str, Any]:
        """What the task returns (XCom): read back from the subscriber after the job."""
        return {"subscription": resolved.spec.subscription}

    # --- execution -----------------------------------------------------------------------------------
    @clear_errors
    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]  # SparkSubmitOperator's returns None
        if self._is_connect():
            return self._execute_connect()
        resolved = self.prepare_submit()
        before = self._best_effort("read the subscriber's state before the job", self.before_submit, resolved)
        self._output = None
        if self.run_in_task(resolved):
            return self._result(resolved, before)
        self.application_args = [*(self.application_args or [])[:2], *self.job_arguments()]  # after the task's own run
        self.log.info("Submitting the %s job of subscription %s (publications %s) to %s: %s",
                      self.job, resolved.spec.subscription, ", ".join(resolved.spec.publications),
                      self._master, self.application)
        # spark-submit's output folds away in the UI's log view (Airflow's ::group:: markers); what the
        # job did, or why it failed, comes after it.
        self.log.info("::group::spark-submit output of the %s job", self.job)
        try:
            super().execute(context)
        except AirflowException as e:
            if self._archive is not None:
                self._archive.discard()
            self.log.info("::endgroup::")
            output = self._job_output()  # set while super().execute ran (hooks/spark_submit_job.py)
            if output is None or output.error_text is None:
                raise  # not the job's own error (spark-submit or the JVM failed): SparkSubmitHook's, retried
            self.log.error("The %s job failed (%s): %s", self.job,
                           "no retry" if isinstance(e, AirflowFailException) else "a retry may pass",
                           in_airflow_terms(self, str(e)))
            raise
        self.log.info("::endgroup::")
        if self._archive is not None and self._archive.keep():
            self.log.info("The driver's classes are archived for later runs of the %s job, whose JVMs start sooner: %s",
                          self.job, self._archive.path)
        return self._result(resolved, before)

    def _result(self, resolved: ResolvedSpec, before: Any) -> dict[str, Any]:
        result = self._best_effort("read the subscriber's state after the job", self.summary, resolved, before)
        return result if result is not None else {"subscription": resolved.spec.subscription}

    def prepare_submit(self) -> ResolvedSpec:
        """Resolve the spec and set ``application_args`` and ``env_vars`` for spark-submit.

        :raises AirflowFailException: when the spec is invalid, or when the passwords could only
            reach the job on the spark-submit command line.
        """
        resolved = self.resolve_spec()
        probe = self._get_hook()
        # The master and deploy mode spark-submit is given (hooks/spark_submit_job.py): the job must run
        # where spark-submit sends it, and env_vars must not end up on the command line.
        master, deploy_mode, on_cluster_manager = probe.master, probe.deploy_mode, probe.on_cluster_manager
        resolved = RowFilterHook.with_master(resolved, master)
        self._master = master
        secrets = resolved.password_env() if self.forward_passwords else {}
        for value in secrets.values():
            mask_secret(value)
        if secrets and (on_cluster_manager or deploy_mode == "cluster"):
            raise AirflowFailException(
                f"{self.task_id}: conn_id={self.conn_id!r} submits to {master!r} in {deploy_mode} mode, where "
                "SparkSubmitOperator turns env_vars into --conf settings on the spark-submit command line (or "
                "refuses them), so the connections' passwords would be exposed. Set forward_passwords=False "
                "and let the cluster give the driver ROWFILTER_PUBLISHER_PASSWORD / "
                "ROWFILTER_SUBSCRIBER_PASSWORD (a Kubernetes secret: conf={'spark.kubernetes.driver."
                "secretKeyRef.ROWFILTER_SUBSCRIBER_PASSWORD': 'name:key'}; a ~/.pgpass on the nodes), "
                "or use connections without a password (see docs/operators.md)."
            )
        try:
            arguments = self.job_arguments()
        except RowFilterError as e:
            raise AirflowFailException(f"{self.task_id}: {e}") from e
        self.application_args = ["--spec-json", resolved.spec.to_json(), *arguments]
        # The driver's JVM is started by spark-submit; an apply job's lives for one batch.
        self.conf = with_jvm_options(self.conf, short_batch=self.short_batch())
        # A driver JVM started here maps the archive of the classes it loads, or makes it (spark/class_archive.py).
        # An earlier submission of this operator added options of its own: they go first.
        driver, earlier = self.conf.get("spark.driver.extraJavaOptions", ""), " ".join(self._archive_options)
        self.conf["spark.driver.extraJavaOptions"] = driver.removesuffix(earlier).rstrip() if earlier else driver
        # Only a driver started on this machine with this environment: under YARN or Kubernetes the hook
        # hands env_vars to the cluster, and the driver would never mark its session.
        self._archive = class_archive(self.job, self.conf, environ={**os.environ, **(self.env_vars or {})}) \
            if deploy_mode == "client" and not on_cluster_manager and self.archives_classes else None
        self._archive_options = self._archive.java_options() if self._archive is not None else ()
        self.conf["spark.driver.extraJavaOptions"] = " ".join(
            part for part in (self.conf["spark.driver.extraJavaOptions"], *self._archive_options) if part)
        env = {k: v for k, v in (self.env_vars or {}).items() if k != SESSION_MARK_ENV}  # an earlier submission's
        if self._archive is not None:
            env.update(self._archive.job_env())
        if deploy_mode == "client" and not on_cluster_manager:
            env.update(self._local_python_env(master, env))
        if is_local(master):
            # The driver's web UI, when spark_conf asks for one, on loopback only: Spark binds it to SPARK_LOCAL_IP,
            # else to every address (spark/settings.py UI_ADDRESS_ENV); the job refuses a UI without it.
            env[UI_ADDRESS_ENV] = LOOPBACK
        env.update(secrets)
        self.env_vars = env or None
        # SparkSubmitOperator makes its hook once per operator object; one executed again (a retry in the
        # same process) must submit with this run's arguments: its hook is made again (_get_hook).
        self._hook = None
        if secrets:
            self.log.info("The password(s) of the %s go to the job by environment (%s)",
                          " and ".join(sorted(r for r, e in resolved.endpoints.items() if e.password)),
                          ", ".join(sorted(secrets)))
        return resolved

    # --- Spark Connect: the job as a plain Python process ---------------------------------------------
    def _job_output(self) -> JobOutput | None:
        """The job's output as read so far (the hook's, set while ``SparkSubmitOperator.execute`` ran)."""
        return self._output

    def _is_connect(self) -> bool:
        try:
            conn = SparkConnectHook.get_connection(self.conn_id)
        except AirflowNotFoundException:  # SparkSubmitHook's own default (yarn) applies
            return False
        return conn.conn_type == SparkConnectHook.conn_type

    def prepare_connect(self) -> tuple[ResolvedSpec, list[str], dict[str, str]]:
        """The spec with ``spark_remote`` set to the connection's server, the job's command and its environment.

        :raises AirflowFailException: on a bad spec. spark-submit settings (``conf``) are not used (a warning
            names them): a Spark Connect client cannot give its server JVM or cluster settings.
        """
        resolved = self.resolve_spec()
        if self.conf:
            # A DAG keeps working when its connection is switched between spark and spark_connect: the
            # server's JVM and cluster settings are its own, so spark-submit's settings have nothing to act on.
            self.log.warning("conf=%s: spark-submit settings, not used: conn_id=%r is a spark_connect connection, the "
                             "job is a client of a running Spark Connect server whose settings are its own (SQL "
                             "settings go to spark_conf, the others to the server: `rowfilter spark-server start "
                             "--conf`)", sorted(self.conf), self.conn_id)
        url, token = connect_url(SparkConnectHook(self.conn_id).get_connection_url())
        try:
            spec = replace(resolved.spec, spark_remote=url)
        except RowFilterError as e:
            raise AirflowFailException(f"{self.task_id}: conn_id={self.conn_id!r}: {e}") from e
        resolved = replace(resolved, spec=spec)
        secrets = resolved.password_env() if self.forward_passwords else {}
        if token:
            secrets[SPARK_CONNECT_TOKEN_ENV] = token
        for value in secrets.values():
            mask_secret(value)
        try:
            arguments = self.job_arguments()
        except RowFilterError as e:
            raise AirflowFailException(f"{self.task_id}: {e}") from e
        command = [sys.executable, "-m", f"airflow_provider_rowfilter.jobs.{self.job}",
                   "--spec-json", spec.to_json(), *arguments]
        env = {**os.environ, **{k: str(v) for k, v in (self.env_vars or {}).items()}, **secrets}
        return resolved, command, env

    def _execute_connect(self) -> dict[str, Any]:
        resolved, command, env = self.prepare_connect()
        before = self._best_effort("read the subscriber's state before the job", self.before_submit, resolved)
        self._output = None
        if self.run_in_task(resolved):
            return self._result(resolved, before)
        command = [*command[:5], *self.job_arguments()]  # after the task's own run
        self.log.info("Running the %s job of subscription %s as a Spark Connect client of %s",
                      self.job, resolved.spec.subscription, resolved.spec.spark_remote)
        self._output = output = JobOutput(self.log)
        self.log.info("::group::output of the %s job", self.job)
        with subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace") as process:
            assert process.stdout is not None
            for line in process.stdout:
                output.line(line.rstrip("\n"))
        self.log.info("::endgroup::")
        if process.returncode:
            error = AirflowException(f"the {self.job} job (Spark Connect client) exited with status {process.returncode}")
            raise job_failure(output, process.returncode, error) from None
        return self._result(resolved, before)

    def _get_hook(self) -> JobSubmitHook:
        """The hook SparkSubmitOperator submits with: ours (hooks/spark_submit_job.py), from the same arguments.

        Each of SparkSubmitHook's parameters gets the operator's rendered field where it is a template
        field of SparkSubmitOperator, else the argument the operator was given.
        """
        given = {"conn_id": self.conn_id, **self.submit_kwargs}
        templated = set(SparkSubmitOperator.template_fields)
        arguments = {name: getattr(self, name) if name in templated else given[name]
                     for name in _HOOK_PARAMETERS if name in templated or name in given}
        self._submit_hook = hook = JobSubmitHook(**arguments)
        self._output = hook.output  # each output line at its level; the job's error and exit status kept
        return hook

    def short_batch(self) -> bool:
        """Whether the submitted job runs one short batch and exits (its JVMs then compile for a short life)."""
        return False

    def spec_fields(self) -> dict[str, Any]:
        """The spec keys given as (rendered) arguments; None where the spec file or default decides."""
        return {
            "subscription": self.subscription,
            "publications": self.publications,
            "publisher_conn_id": self.publisher_conn_id,
            "subscriber_conn_id": self.subscriber_conn_id,
            "publications_ddl": self.publications_ddl,
            "copy_data": self.copy_data,
            "spark_conf": self.spark_conf,
        }

    def resolve_spec(self) -> ResolvedSpec:
        """Build and validate the spec from the rendered arguments; a bad one fails without retry."""
        fields = self.spec_fields()
        base_dir = self.dag.folder if self.has_dag() else None
        try:
            resolved = RowFilterHook().resolve_spec(spec=self.spec, fields=fields, base_dir=base_dir,
                                                    require=self.roles)
            store_conn_id = self.change_log_conn_id or resolved.spec.change_log_conn_id  # the argument, else the file's
            if store_conn_id:
                resolved = replace(resolved, store_env=store_environment(store_conn_id))
            return resolved
        except RowFilterError as e:
            raise AirflowFailException(f"{self.task_id}: {e}") from e
        except TypeError as e:  # a key of the wrong kind reached the spec dataclass
            raise AirflowFailException(f"{self.task_id}: invalid spec: {e}") from e

    def _local_python_env(self, master: str, env: dict[str, Any]) -> dict[str, str]:
        """Run the job with this interpreter (which has the package) when the driver runs here.

        In client mode the driver is a child of this process, so the Python that runs Airflow (and
        has airflow-provider-rowfilter and pyspark installed) runs the job; with a local master the
        executors' Python workers are local too. A Python chosen in ``env_vars`` or ``conf`` wins.
        """
        chosen = set(env) | set(self.conf or {}) | {k for k in PYTHON_ENV if os.environ.get(k)}
        extra: dict[str, str] = {}
        names = PYTHON_ENV if master.startswith("local") else ("PYSPARK_DRIVER_PYTHON",)
        if not chosen & {*PYTHON_ENV, *PYTHON_CONF}:
            extra.update(dict.fromkeys(names, sys.executable))
        # pyspark installs spark-submit beside the interpreter; a venv used without activating it
        # (`/venv/bin/airflow …`) does not have it on PATH.
        binary = self.submit_kwargs.get("spark_binary") or "spark-submit"
        here = Path(sys.executable).parent
        if shutil.which(binary) is None and (here / binary).exists() and "PATH" not in env:
            extra["PATH"] = os.pathsep.join([str(here), os.environ.get("PATH", "")])
        return extra

    def _best_effort(self, what: str, fn: Any, *args: Any) -> Any:
        # The replication already happened (or is about to); reading it back is an extra that never
        # fails the task (house style: best-effort extras never fail a task).
        try:
            return fn(*args)
        except (psycopg.Error, RowFilterError) as e:
            self.log.warning("Could not %s: %s", what, str(e).strip().splitlines()[0] if str(e).strip() else e)
            return None
