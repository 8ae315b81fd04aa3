"""spark/class_archive.py: which archive a job's driver maps or makes, and when it is kept (no JVM here: the
operator test in tests/airflow/test_operators.py runs real ones)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from airflow_provider_rowfilter.spark.class_archive import (
    ARCHIVE_DIR_ENV,
    SESSION_MARK_ENV,
    STALE_SECONDS,
    class_archive,
    mark_session,
)


@pytest.fixture
def installation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake JAVA_HOME and SPARK_HOME: a ``java`` file and two jars."""
    (tmp_path / "jdk" / "bin").mkdir(parents=True)
    (tmp_path / "jdk" / "bin" / "java").write_bytes(b"java")
    (tmp_path / "spark" / "jars").mkdir(parents=True)
    for name in ("a.jar", "b.jar"):
        (tmp_path / "spark" / "jars" / name).write_bytes(b"jar " + name.encode())
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    monkeypatch.delenv(ARCHIVE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def test_the_first_task_on_a_disk_makes_none_the_next_makes_it_and_later_runs_map_it(installation: Path) -> None:
    directory = installation / "cache" / "rowfilter" / "class-archives"
    assert class_archive("apply", {}) is None and directory.is_dir()  # the disk may not outlive this task
    first = class_archive("apply", {})
    assert first is not None and first.path.parent == directory
    assert first.java_options() == (f"-XX:ArchiveClassesAtExit={first.making}", "-Xlog:cds=off,cds+dynamic=off")
    first.making.write_bytes(b"archive")  # what the JVM writes when it exits
    first.session_mark.touch()  # what the job does once its Spark session runs (mark_session)
    assert first.keep() and first.path.read_bytes() == b"archive" and not first.making.exists()
    later = class_archive("apply", {})
    assert later is not None and later.path == first.path
    assert later.java_options() == (f"-XX:SharedArchiveFile={first.path}", "-Xlog:cds=off,cds+dynamic=off")
    assert later.keep() is False  # it mapped the archive: nothing to keep
    # Each job has its own (each loads its own classes).
    assert class_archive("snapshot", {}).path != first.path


def test_a_failed_empty_or_sessionless_run_keeps_nothing(installation: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class_archive("apply", {})  # the directory
    failed = class_archive("apply", {})
    failed.making.write_bytes(b"half")
    failed.session_mark.touch()
    failed.discard()
    assert not failed.making.exists() and not failed.path.exists() and not failed.session_mark.exists()
    empty = class_archive("apply", {})
    empty.making.write_bytes(b"")
    empty.session_mark.touch()
    assert empty.keep() is False and not empty.path.exists() and not empty.making.exists()
    # A job that started no Spark session in that JVM (nothing to judge): spark-submit's classes only.
    sessionless = class_archive("apply", {})
    assert sessionless.job_env() == {SESSION_MARK_ENV: str(sessionless.session_mark)}
    sessionless.making.write_bytes(b"launcher classes")
    assert sessionless.keep() is False and not sessionless.path.exists() and not sessionless.making.exists()
    # mark_session, called by spark/session.py once the session runs, is what makes it worth keeping.
    kept = class_archive("apply", {})
    kept.making.write_bytes(b"spark classes")
    monkeypatch.setenv(SESSION_MARK_ENV, str(kept.session_mark))
    mark_session()
    assert kept.keep() and kept.path.read_bytes() == b"spark classes" and not kept.session_mark.exists()
    assert class_archive("apply", {}).job_env() == {}  # the next run maps it: nothing to mark


def test_another_installation_gets_another_archive(installation: Path) -> None:
    class_archive("apply", {})  # the directory
    before = class_archive("apply", {}).path
    jar = installation / "spark" / "jars" / "b.jar"
    old = class_archive("apply", {})
    old.making.write_bytes(b"old classes")
    old.session_mark.touch()
    assert old.keep() and before.exists()
    jar.write_bytes(b"a new version of b")
    upgraded = class_archive("apply", {})
    assert upgraded.path != before and not upgraded.exists
    upgraded.making.write_bytes(b"new classes")
    upgraded.session_mark.touch()
    snapshot = class_archive("snapshot", {})
    snapshot.making.write_bytes(b"snapshot classes")
    snapshot.session_mark.touch()
    assert snapshot.keep()
    assert upgraded.keep() and not before.exists() and snapshot.path.exists()  # the replaced one goes, others stay
    assert class_archive("apply", {"spark.driver.extraClassPath": "/opt/x.jar"}).path != class_archive("apply", {}).path
    (installation / "spark" / "jars" / "c.jar").symlink_to(installation / "nowhere.jar")  # unreadable as it is read
    assert class_archive("apply", {}) is None


@pytest.mark.parametrize("options", ["-Xshare:off", "-XX:SharedArchiveFile=/mine.jsa", "-XX:ArchiveClassesAtExit=/x"])
def test_the_caller_s_own_class_sharing_is_left_alone(installation: Path, options: str) -> None:
    assert class_archive("apply", {"spark.driver.extraJavaOptions": f"-Dx=1 {options}"}) is None


def test_off_and_missing_installations(installation: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ARCHIVE_DIR_ENV, "off")
    assert class_archive("apply", {}) is None
    monkeypatch.setenv(ARCHIVE_DIR_ENV, str(installation / "chosen"))
    (installation / "chosen").mkdir()
    assert class_archive("apply", {}).path.parent == installation / "chosen"
    monkeypatch.setenv("SPARK_HOME", str(installation / "nowhere"))
    assert class_archive("apply", {}) is None
    monkeypatch.setenv("SPARK_HOME", str(installation / "spark"))
    monkeypatch.setenv("JAVA_HOME", str(installation / "nowhere"))
    assert class_archive("apply", {}) is None


def test_files_of_killed_runs_are_removed(installation: Path) -> None:
    class_archive("apply", {})  # the directory
    one = class_archive("apply", {})
    one.making.write_bytes(b"left by a killed task")
    old = time.time() - STALE_SECONDS - 60
    os.utime(one.making, (old, old))
    fresh = class_archive("apply", {})
    fresh.making.write_bytes(b"being written")
    class_archive("apply", {})
    assert not one.making.exists() and fresh.making.exists()


def test_no_archive_while_a_directory_on_the_driver_s_class_path_holds_a_file(installation: Path) -> None:
    """Issue 44 (5a): HotSpot refuses to archive with a non-empty directory on the class path ("Cannot have non-empty
    directory in paths", and the driver exits 1): spark-submit puts SPARK_CONF_DIR there, where a cluster's
    spark-defaults.conf (its spark.authenticate secret) lives. Such a driver runs without an archive."""
    class_archive("apply", {})  # the directory: archives are made from the next run on
    conf_dir = installation / "conf"
    conf_dir.mkdir()
    assert class_archive("apply", {}, environ={**os.environ, "SPARK_CONF_DIR": str(conf_dir)}) is not None  # empty
    (conf_dir / "spark-defaults.conf").write_text("spark.authenticate true\n")
    assert class_archive("apply", {}, environ={**os.environ, "SPARK_CONF_DIR": str(conf_dir)}) is None
    assert class_archive("apply", {}, environ={**os.environ, "HADOOP_CONF_DIR": str(conf_dir)}) is None
    assert class_archive("apply", {"spark.driver.extraClassPath": f"/opt/x.jar{os.pathsep}{conf_dir}"}) is None
    (installation / "spark" / "conf").mkdir()  # SPARK_HOME/conf, the launcher's default
    (installation / "spark" / "conf" / "log4j2.properties").write_text("")
    assert class_archive("apply", {}) is None
