"""A run's one Spark session, started the first time a step needs Spark: the apply's batches and the table sync's copies.

Most runs need no Spark at all: a batch the publisher judged is reduced in process (flows/apply/reducers.py), a
table read by one reader copies straight from the publisher's COPY (flows/table_sync/table_copy.py), as
tablesync does; such a run never loads pyspark (its Connect client alone takes 0.7 s to import). The first step
that needs Spark starts the session (spark/session.py ``job_session``), the others share it, and it stops when
the run ends.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec

if TYPE_CHECKING:  # pyspark is loaded only when a step starts Spark
    from pyspark.sql import SparkSession


class SparkNeeded(Exception):  # not an error: what a run without Spark reports when it stops
    """A run without Spark (flows/apply/drain.py ``apply`` ``without_spark``) reached what only the job can do: a
    batch that needs Spark, or a change log here that is not the one on record. That batch wrote nothing;
    what its capture logged stays in the log for the job."""


class SparkOnDemand(ExitStack):
    """The run's one Spark session: ``given``, else the active one, else one built from the spec, started by the
    first step that asks (:meth:`get`) and kept for the others, stopped when the run ends (a given or active
    session is left running).

    ``allowed`` False (the apply operator's run in its own task): a step that needs Spark raises
    :class:`SparkNeeded` instead. ``check`` refuses a session the run cannot use (the copy's
    ``spark.speculation``). Spark that cannot start, cannot pass ``check`` or cannot say its parallelism is kept
    as :attr:`failure`: the table sync stops before the table that asked for it changes, instead of recording the
    error on that table (a Connect server that does not answer exits with the status Airflow retries).
    """

    def __init__(self, spec: SubscriptionSpec, given: SparkSession | None, job: str, *, allowed: bool = True,
                 check: Callable[[SparkSession], None] | None = None) -> None:
        super().__init__()
        self.spec, self.given, self.job, self.allowed, self.check = spec, given, job, allowed, check
        self.session: SparkSession | None = None
        self.parallelism: int | None = None
        self.failure: Exception | None = None

    def get(self, *, short_batch: bool = False) -> SparkSession:
        """The session; ``short_batch`` (its JVM compiles for a short life) counts only when it is started here."""
        if not self.allowed:
            raise SparkNeeded(f"subscription {self.spec.subscription}: a batch needs Spark")
        if self.session is None:
            from airflow_provider_rowfilter.spark.session import job_session

            try:
                session = self.enter_context(job_session(self.spec, self.job, self.given, short_batch=short_batch))
                if self.check is not None:
                    self.check(session)
            except Exception as e:
                self.failure = e
                raise
            self.session = session
        return self.session

    def default_parallelism(self) -> int:
        """Spark's default parallelism (one small action), asked once."""
        if self.parallelism is None:
            from airflow_provider_rowfilter.spark.copy_frames import default_parallelism

            session = self.get()
            try:
                self.parallelism = default_parallelism(session)
            except Exception as e:
                self.failure = e
                raise
        return self.parallelism
