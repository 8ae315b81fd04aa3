"""A class-data-sharing archive of a job's driver JVM, so that a JVM living for one batch starts sooner.

Much of a cold spark-submit run is the JVM loading, parsing and verifying Spark's classes (about
18,000, 13,000 of them from Spark's jars). HotSpot archives the classes an application loaded when it
exits (``-XX:ArchiveClassesAtExit``, JDK 13 and later: JEP 350, dynamic CDS archives) and maps such an
archive into later JVMs (``-XX:SharedArchiveFile``), which then skip that work. Measured in
docs/apply.md ("Measured"); what users see: docs/operators.md ("A class archive for the driver").

The operators (operators/rowfilter_job.py) keep one archive per job and per installation of Java
and Spark (:func:`archive_key`) in :func:`archive_dir`. Making one costs its run seconds (the JVM
records every class it loads and writes them when it exits), so only a disk that has kept that
directory since an earlier task gets one: the first task on a disk only creates the directory, and a
worker whose disk lives for one task (a pod per task) never pays for an archive it could not reuse.
On a disk that keeps it, the next run that finds no archive makes it, into a file of its own, which becomes the
archive only when the job succeeded and started a Spark session in that JVM (:meth:`ClassArchive.keep`;
spark/session.py marks it, :func:`mark_session`): a run that found nothing to judge loads only
spark-submit's own classes, and its archive would serve the later runs that do judge.
An archive that no longer fits the
JVM (another JDK, a jar replaced) is refused by the JVM itself, which then loads its classes as
usual; the key changes with the installation, so the next run makes a new one. The JVM's CDS
warnings (hundreds of lines while dumping) are turned off.

Pure Python: no pyspark (the operators use it), only the files of the installations.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_rowfilter.core.private_files import private_directory

#: Where the archives are kept, when set (``off``: no archive); else ``$XDG_CACHE_HOME/rowfilter/class-archives``.
ARCHIVE_DIR_ENV = "ROWFILTER_CLASS_ARCHIVE_DIR"
#: The JVM's own options that decide class sharing: when the caller gives one, it is left alone.
OWN_OPTIONS = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit", "AutoCreateSharedArchive")
#: Set for a job whose driver JVM makes an archive: the file :func:`mark_session` creates once the job
#: started its Spark session in that JVM.
SESSION_MARK_ENV = "ROWFILTER_CLASS_ARCHIVE_SESSION"
#: A file being written by a JVM that never finished (its task killed) is removed after this long.
STALE_SECONDS = 3600
_QUIET = "-Xlog:cds=off,cds+dynamic=off"
_MAKING = ".making"


@dataclass(frozen=True)
class ClassArchive:
    """The archive of one job on one installation, and where this run's JVM writes one if there is none."""

    path: Path
    making: Path
    #: Whether the archive existed when this run was planned: the JVM maps it (else it makes one).
    exists: bool

    @property
    def session_mark(self) -> Path:
        return self.making.with_name(self.making.name + ".session")

    def job_env(self) -> dict[str, str]:
        """The job's environment: where it marks a started Spark session, when this JVM makes the archive."""
        return {} if self.exists else {SESSION_MARK_ENV: str(self.session_mark)}

    def java_options(self) -> tuple[str, ...]:
        """The driver's options: map the archive, or make one when this JVM exits."""
        if self.exists:
            return (f"-XX:SharedArchiveFile={self.path}", _QUIET)
        return (f"-XX:ArchiveClassesAtExit={self.making}", _QUIET)

    def keep(self) -> bool:
        """After a job that succeeded: what its JVM wrote becomes the archive (atomically), if the job started
        its Spark session there (else it is discarded and a later run makes one). Whether it did."""
        try:
            if not self.session_mark.exists() or self.making.stat().st_size == 0:
                self.discard()
                return False
            os.replace(self.making, self.path)
            self.session_mark.unlink(missing_ok=True)
        except FileNotFoundError:  # an archive was mapped, or the JVM wrote none
            self.discard()
            return False
        job = self.path.name.rsplit("-", 1)[0]
        for older in self.path.parent.glob(f"{job}-*.jsa"):  # of an installation since replaced
            if older != self.path:
                older.unlink(missing_ok=True)
        return True

    def discard(self) -> None:
        """After a job that failed: what its JVM may have written is not trusted."""
        self.making.unlink(missing_ok=True)
        self.session_mark.unlink(missing_ok=True)


def mark_session() -> None:
    """In a job's process, once its classic Spark session runs: the JVM's archive is worth keeping."""
    mark = os.environ.get(SESSION_MARK_ENV)
    if mark:
        try:
            Path(mark).touch()
        except OSError:  # best effort: without the mark the operator only discards the archive
            pass


def archive_dir() -> Path:
    """:data:`ARCHIVE_DIR_ENV`, else ``$XDG_CACHE_HOME/rowfilter/class-archives`` (``~/.cache`` by default)."""
    chosen = os.environ.get(ARCHIVE_DIR_ENV)
    if chosen:
        return Path(chosen).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "rowfilter" / "class-archives"


def java_binary() -> Path | None:
    """The ``java`` spark-submit starts (bin/spark-class: ``$JAVA_HOME/bin/java``, else the one on PATH)."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(os.path.realpath(found)) if found and os.path.isfile(found) else None


def spark_jars() -> Path | None:
    """The jars of the Spark spark-submit runs: ``$SPARK_HOME/jars``, else pyspark's own (a pip install)."""
    home = os.environ.get("SPARK_HOME")
    if not home:
        spec = importlib.util.find_spec("pyspark")  # finds the package without importing it
        home = next(iter(spec.submodule_search_locations or ()), None) if spec is not None else None
    jars = Path(home) / "jars" if home else None
    return jars if jars is not None and jars.is_dir() else None


def archive_key(job: str, java: Path, jars: Path, conf: Mapping[str, str]) -> str:
    """``<job>-<hash>``: the hash of what the archive depends on (the JVM's binary, Spark's jars with their
    sizes and times, the driver's extra class path)."""
    digest = hashlib.sha256()
    for path in (java, *sorted(jars.glob("*.jar"))):
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    digest.update(str(conf.get("spark.driver.extraClassPath", "")).encode())
    return f"{job}-{digest.hexdigest()[:16]}"


def class_path_directories(conf: Mapping[str, str], environ: Mapping[str, str] | None = None) -> list[Path]:
    """The directories spark-submit's launcher puts on the driver's class path (launcher/AbstractCommandBuilder.java
    ``buildClassPath``): the configuration directory (``SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``),
    ``HADOOP_CONF_DIR``, ``YARN_CONF_DIR``, and the directories among ``spark.driver.extraClassPath`` and
    ``SPARK_DIST_CLASSPATH``."""
    environ = os.environ if environ is None else environ
    jars = spark_jars()
    spark_home = environ.get("SPARK_HOME") or (str(jars.parent) if jars is not None else None)
    named = [environ.get("SPARK_CONF_DIR") or (os.path.join(spark_home, "conf") if spark_home else None),
             environ.get("HADOOP_CONF_DIR"), environ.get("YARN_CONF_DIR"),
             *str(conf.get("spark.driver.extraClassPath", "")).split(os.pathsep),
             *environ.get("SPARK_DIST_CLASSPATH", "").split(os.pathsep)]
    return [Path(p) for p in named if p and not p.endswith("*") and os.path.isdir(p)]


def _non_empty(directory: Path) -> bool:
    try:
        return any(directory.iterdir())
    except OSError:
        return True  # unreadable: the JVM could not tell either


def class_archive(job: str, conf: Mapping[str, str], directory: Path | None = None,
                  environ: Mapping[str, str] | None = None) -> ClassArchive | None:
    """The archive for ``job``'s driver, or None: no ``java`` or Spark jars found, the caller's driver
    options choose class sharing themselves, a directory on the driver's class path holds a file, the
    directory is new (made now, for the next run) or cannot be made.

    :param environ: spark-submit's environment (this process's by default).

    HotSpot archives only classes from jars: a JVM asked to write an archive at exit while a directory of its
    class path holds a file (a ``spark-defaults.conf`` in ``SPARK_CONF_DIR``, a ``core-site.xml`` in
    ``HADOOP_CONF_DIR``, which spark-submit puts there) refuses ("Cannot have non-empty directory in paths")
    and exits 1 after the job succeeded. Such a driver gets no archive: it starts as without one.
    """
    options = str(conf.get("spark.driver.extraJavaOptions", ""))
    environ = os.environ if environ is None else environ
    if any(own in options for own in OWN_OPTIONS) or environ.get(ARCHIVE_DIR_ENV) == "off":
        return None
    if any(_non_empty(d) for d in class_path_directories(conf, environ)):
        return None
    java, jars = java_binary(), spark_jars()
    if java is None or jars is None:
        return None
    directory = directory or archive_dir()  # the operator's own environment: where its disk keeps archives
    try:
        if not directory.is_dir():  # the first task on this disk: whether the disk outlives it, the next one sees
            private_directory(directory)  # 0700: a JVM maps what it finds there
            return None
        _remove_stale(directory)
        key = archive_key(job, java, jars, conf)
    except OSError:  # a jar gone or unreadable as it is read: no archive this run, the job runs as without
        return None
    path = directory / f"{key}.jsa"
    return ClassArchive(path, directory / f"{key}.{uuid.uuid4().hex[:12]}{_MAKING}", path.is_file())


def _remove_stale(directory: Path) -> None:
    """Files left by JVMs that never finished writing (their task was killed)."""
    now = time.time()
    for entry in (*directory.glob(f"*{_MAKING}"), *directory.glob(f"*{_MAKING}.session")):
        try:
            if now - entry.stat().st_mtime > STALE_SECONDS:
                entry.unlink()
        except FileNotFoundError:
            pass
