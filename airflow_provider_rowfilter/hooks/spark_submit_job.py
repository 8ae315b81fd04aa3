"""JobSubmitHook: spark-submit of one of this package's jobs, through Airflow's public API only.

``SparkSubmitHook`` builds the command line, submits, tracks a cluster-mode driver and kills it on
``on_kill``. What the operators need to know of a submit, this subclass owns, without reading any
private attribute of Airflow (whose next release may rename them):

- **where the job runs**: :attr:`JobSubmitHook.master` and :attr:`JobSubmitHook.deploy_mode`, read
  from the ``spark`` connection (:func:`spark_master`) with the Spark connection's documented fields
  (host, port, the ``deploy-mode`` extra). The deploy mode is handed back to ``SparkSubmitHook`` as its
  own ``deploy_mode`` argument, so the mode the operator checks (a password must never reach a
  spark-submit command line: operators/rowfilter_job.py) is the one spark-submit is given;
- **the submit and its output**: every line spark-submit prints goes through the hook's logger, its
  public ``log``, which is a :class:`~airflow_provider_rowfilter.hooks.job_output.JobOutput` here; a
  failed submit becomes the job's own error, failing without retry or retried as the job's exit
  status says (jobs/exit_status.py prints it last).
"""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk.exceptions import AirflowException

from airflow_provider_rowfilter.hooks.job_output import JobOutput, job_failure

#: Where SparkSubmitHook submits without a connection of the id it is given.
DEFAULT_MASTER = "yarn"


def spark_master(conn_id: str, deploy_mode: str | None = None) -> tuple[str, str | None]:
    """The master URL and deploy mode of the Airflow ``spark`` connection ``conn_id``, as spark-submit gets them.

    A connection made in the UI holds the whole master URL (``local[2]``, ``spark://host:7077``,
    ``k8s://https://host``) in its host; one made from a URI (``spark://host:7077``) has its scheme as
    the connection type and the port apart. ``deploy_mode`` (the operator's) wins over the connection's
    ``deploy-mode`` extra. tests/airflow/test_spark_submit_job.py holds this against SparkSubmitHook's own
    reading of the same connections.
    """
    try:
        conn = SparkSubmitHook.get_connection(conn_id)
    except AirflowException:  # no such connection: SparkSubmitHook's own default
        return DEFAULT_MASTER, deploy_mode
    if conn.conn_type == "spark" and conn.host and ("://" in conn.host or not conn.port):
        master = conn.host
    else:
        master = f"{conn.conn_type}://{conn.host or ''}"
    if conn.port:
        master = f"{master}:{conn.port}"
    return master, deploy_mode or conn.extra_dejson.get("deploy-mode")


class JobSubmitHook(SparkSubmitHook):
    """``SparkSubmitHook`` for one of the package's jobs: where it is submitted, the submit, what the job printed.

    :param conn_id: the Airflow ``spark`` connection.
    :param deploy_mode: ``client`` or ``cluster``; default the connection's ``deploy-mode`` extra, else client.
    :param kwargs: the rest of ``SparkSubmitHook``'s arguments.
    """

    def __init__(self, *, conn_id: str = "spark_default", deploy_mode: str | None = None, **kwargs: Any) -> None:
        self._output: JobOutput | None = None
        self.master, mode = spark_master(conn_id, deploy_mode)
        super().__init__(conn_id=conn_id, deploy_mode=mode, **kwargs)
        self.deploy_mode: str = mode or "client"

    @property
    def on_cluster_manager(self) -> bool:
        """Whether YARN or Kubernetes runs the driver's environment (SparkSubmitHook hands them ``env_vars``
        as settings on the command line, or refuses them)."""
        return "yarn" in self.master or "k8s" in self.master

    @property
    def log(self) -> Any:
        """The hook's logger: a :class:`JobOutput` over LoggingMixin's, which SparkSubmitHook gives every line."""
        if self.__dict__.get("_output") is None:
            self._output = JobOutput(super().log)
        return self._output

    @property
    def output(self) -> JobOutput:
        """What the job printed: its error, its exit status, its JSON result line."""
        return self.log

    def submit(self, application: str = "", **kwargs: Any) -> str | None:
        """Submit; a failed job raises its own error (:func:`job_failure`), anything else SparkSubmitHook's."""
        try:
            return super().submit(application, **kwargs)
        except AirflowException as e:
            failure = job_failure(self.output, self.output.exit_status, e)
            if failure is e:
                raise
            raise failure from None
