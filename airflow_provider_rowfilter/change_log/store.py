"""The change log on object storage (``s3://``, ``gs://``, ``abfs://``, ``hdfs://``) through pyarrow's filesystems.

The same log as a directory (change_log/log.py: the names, the chain, the continuity rule, the id), with
its guarantees re-derived for a store that has no rename and no fsync:

- **A segment is visible whole or not at all.** It is written to a private local file first, then sent
  under its final name in one upload: a single PUT, or a multipart upload that becomes visible only when
  it completes (S3, GCS and Azure all give a new object whole or not at all, and strong
  read-after-write consistency). A process killed mid-upload leaves no object (an incomplete multipart
  upload is invisible; a bucket rule ``AbortIncompleteMultipartUpload`` reclaims its parts). An upload
  that fails is deleted and raises; the slot has not moved, so the next run reads the range again and
  writes the same name. Before the capture trusts a segment ahead of the slot (finishing an
  interrupted batch), its footer must read and name its range (:meth:`ObjectStoreLog.captured_through`).
- **Durable before the slot moves.** A completed PUT is durable in the store; only then is the slot
  advanced (publisher/capture.py), as after the directory's fsync.
- **The position object** (``_position.json``: the log's id) is one small PUT of the whole document.
- **One writer:** held by the database (publisher/writer_lock.py), not by the store.

Credentials and endpoint come from the environment the store's own SDK reads (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``, ``AWS_PROFILE``
and ``~/.aws``, an instance or pod role; ``GOOGLE_APPLICATION_CREDENTIALS``; ``AZURE_STORAGE_*``), never
from the spec or a command line (docs/change-log.md, "On object storage").
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs as pafs

from airflow_provider_rowfilter.change_log.log import (
    POSITION_FILE,
    ChangeLog,
    ChangeLogError,
    Segment,
    parse_segment_name,
    segment_name,
)
from airflow_provider_rowfilter.change_log.segment_reader import read_metadata
from airflow_provider_rowfilter.core.lsn import format_lsn
from airflow_provider_rowfilter.core.spec.environment import environment
from airflow_provider_rowfilter.core.spec.log_location import LogLocation, parse_location
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec

_CHUNK = 8 << 20  # bytes per write of an upload (pyarrow sends parts of its own size)


@dataclass(frozen=True)
class ObjectPath:
    """An object of the log: ``str()`` is its URL (what Spark and messages read), ``name`` its file name."""

    url: str
    key: str  # bucket/prefix/name, the filesystem's path
    fs: pafs.FileSystem = field(compare=False, repr=False)

    def __str__(self) -> str:
        return self.url

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    def reader_args(self) -> tuple[str, pafs.FileSystem]:
        return self.key, self.fs

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.delete_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def read_bytes(self) -> bytes:
        with self.fs.open_input_stream(self.key) as stream:
            return stream.read()


#: The local folders where a segment for object storage is written before its upload: ``<prefix><pid>-<random>``.
STAGING_PREFIX = "rowfilter-segment-"


#: What a failed store operation of a capture means: the slot moves only after the store did.
_NOTHING_ADVANCED = ("nothing was advanced: the slot still holds every change not in a complete segment, and the next "
                     "run goes on from there")


def remove_stale_staging(folder: str | None = None) -> list[str]:
    """Remove the staging folders (:data:`STAGING_PREFIX`) in ``folder`` (the temporary directory) that belong to
    this user and to a process that no longer runs: what a killed writer left. Returns what was removed; never
    raises (a folder another user owns, or one being removed meanwhile, is left alone)."""
    where = folder or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(where))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(STAGING_PREFIX):
            continue
        pid = entry.name[len(STAGING_PREFIX):].split("-", 1)[0]
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid() \
                    or not pid.isdigit() or _alive(int(pid)):
                continue
            shutil.rmtree(entry.path)
        except OSError:
            continue
        removed.append(entry.path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that number: alive
        return True
    return True


def open_change_log(spec: SubscriptionSpec) -> ChangeLog:
    """The spec's change log: a directory (:class:`ChangeLog`) or on object storage (:class:`ObjectStoreLog`)."""
    where = spec.change_log_location()
    return ChangeLog(where.path) if where.local else ObjectStoreLog(where)


class ObjectStoreLog(ChangeLog):
    """A change log under a URL's prefix on object storage; see the module's docstring for its guarantees."""

    on_this_host = False  # its replaced logs are the bucket's lifecycle rules' (docs/change-log.md)

    def __init__(self, location: LogLocation, filesystem: pafs.FileSystem | None = None) -> None:
        assert location.url is not None
        self.url = location.url
        self.scheme = location.scheme
        self.directory = Path(location.path)  # for messages only: nothing local is ever made there
        try:
            self.fs, self.key = (filesystem, location.path) if filesystem else _filesystem(location)
        except (OSError, ValueError) as e:
            raise ChangeLogError(f"cannot open the change log {self.url!r}: {e}",
                                 hint=_CREDENTIALS_HINT) from e
        self._staging: str | None = None  # the private local folder of the segment being written

    @property
    def where(self) -> str:
        return self.url

    def _here(self) -> tuple[str, str]:
        return "", self.url  # the same log from every machine

    def _object(self, name: str) -> ObjectPath:
        return ObjectPath(f"{self.url}/{name}", f"{self.key}/{name}", self.fs)

    def segments(self) -> list[Segment]:
        infos = self._store("list", lambda: self.fs.get_file_info(pafs.FileSelector(self.key, allow_not_found=True)))
        found = []
        for info in infos:
            lsns = parse_segment_name(info.base_name) if info.type == pafs.FileType.File else None
            if lsns is not None:
                found.append(Segment(self._object(info.base_name), *lsns))
        return sorted(found, key=lambda s: (s.start_lsn, s.end_lsn))

    def captured_through(self) -> int | None:
        """As for a directory, after checking the newest segment is whole (its footer names its range)."""
        segments = self.segments()
        if segments:
            self._check_whole(segments[-1])
        ends = [s.end_lsn for s in segments]
        position = self._position()
        if position is not None:
            ends.append(position["captured_through"])
        return max(ends, default=None)

    def _check_whole(self, segment: Segment) -> None:
        try:
            facts = (read_metadata(segment.path).metadata or {}).get(b"rowfilter.change_log")
        except (OSError, ValueError) as e:
            facts, problem = None, str(e)
        else:
            problem = "its footer has no rowfilter.change_log metadata"
        if facts is not None and json.loads(facts).get("end_lsn") == format_lsn(segment.end_lsn):
            return
        raise ChangeLogError(f"the change-log segment {str(segment.path)!r} is not whole: {problem}",
                             detail="a segment on object storage is written in one upload; this one was cut or "
                             "replaced by something else. Nothing was captured, applied or advanced",
                             hint="if the slot has not passed its start, delete the object and run again (the slot "
                             "still holds its changes); otherwise restore it from a copy")

    def _read_position(self) -> str | None:
        def read() -> str | None:
            try:
                with self.fs.open_input_stream(f"{self.key}/{POSITION_FILE}") as stream:
                    return stream.read().decode()
            except FileNotFoundError:
                return None
        return self._store("read the position of", read)

    def _write_position(self, text: str) -> None:
        data = text.encode()
        self._store("write the position of", lambda: self._put(f"{self.key}/{POSITION_FILE}", [data]))

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """A private local folder for the segment being written, named by this process; the store needs no
        directory. The folders of writers that were killed (SIGKILL, a lost pod: nothing removed them) are
        removed first (:func:`remove_stale_staging`)."""
        remove_stale_staging()
        with tempfile.TemporaryDirectory(prefix=f"{STAGING_PREFIX}{os.getpid()}-") as folder:  # 0700, removed after
            self._staging = folder
            try:
                yield
            finally:
                self._staging = None

    def staging_path(self, start_lsn: int) -> Path:
        if self._staging is None:
            raise ChangeLogError("a segment is written inside ObjectStoreLog.writing()")
        return Path(self._staging) / f"{start_lsn:016X}-{os.getpid()}.parquet"

    def staging_mode(self) -> int:
        return 0o600

    def publish_segment(self, staged: Path, start_lsn: int, end_lsn: int) -> Segment:
        """Upload the staged file under its final name in one upload; delete a failed one; remove the local file."""
        name = segment_name(start_lsn, end_lsn)
        target = self._object(name)

        def chunks() -> Iterator[bytes]:
            with open(staged, "rb") as local:
                while block := local.read(_CHUNK):
                    yield block
        try:
            self._store(f"write the segment {name} to", lambda: self._put(target.key, chunks()))
        finally:
            staged.unlink(missing_ok=True)
        return Segment(target, start_lsn, end_lsn)

    def _put(self, key: str, blocks) -> None:
        """One object, whole: on any failure the object (possibly completed with part of the data, as pyarrow's
        stream completes what it has when it is dropped) is deleted, and the error raised."""
        stream = None
        try:
            stream = self.fs.open_output_stream(key)
            for block in blocks:
                stream.write(block)
            stream.close()
        except BaseException:
            if stream is not None:
                with contextlib.suppress(Exception):
                    stream.close()  # pyarrow has no abort: complete it, then delete it
            with contextlib.suppress(Exception):
                self.fs.delete_file(key)
            raise

    def _store(self, what: str, call, detail: str | None = _NOTHING_ADVANCED):
        """Run a store operation; turn its failure into a ChangeLogError naming the log and the cause (``detail``:
        what it means for the run; the capture's by default, which advances the slot only after the store did)."""
        try:
            return call()
        except ChangeLogError:
            raise
        except OSError as e:
            raise ChangeLogError(f"could not {what} the change log {self.url!r}: {_first_line(e)}", detail=detail,
                                 hint=_CREDENTIALS_HINT) from e

    def set_aside(self) -> str | None:
        return self._move_aside("replaced")

    def retire(self) -> str | None:
        return self._move_aside("dropped")

    def _move_aside(self, label: str) -> str | None:
        """Copy every object of the log under ``<prefix>.<label>-<time>`` then delete the originals (no rename)."""
        infos = [i for i in self._store("list", lambda: self.fs.get_file_info(
            pafs.FileSelector(self.key, allow_not_found=True, recursive=True)), None) if i.type == pafs.FileType.File]
        if not infos:
            return None
        aside = f"{self.key}.{label}-{int(time.time())}"
        for info in infos:  # the originals stay whole until every copy is made: run again to finish
            self._store("copy", lambda i=info: self.fs.copy_file(i.path, aside + i.path[len(self.key):]), None)
        for info in infos:
            self._store("delete from", lambda i=info: self.fs.delete_file(i.path), None)
        return f"{self.scheme}://{aside}"


#: Seconds a request to the store may take before the capture gives up on it (connect and each request; the
#: S3 client tries three times): a store that stops answering fails the run where Airflow alerts, not after minutes.
TIMEOUT_ENV = "ROWFILTER_STORE_TIMEOUT"
DEFAULT_TIMEOUT = 30.0


def _filesystem(location: LogLocation, environ: Mapping[str, str] | None = None) -> tuple[pafs.FileSystem, str]:
    """pyarrow's filesystem for the URL and the log's path in it, configured from ``environ`` (this process's
    environment by default). S3 is configured here (the keys when the environment holds them, the endpoint from
    ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, bounded timeouts); the others as pyarrow reads their URLs."""
    assert location.url is not None
    environ = os.environ if environ is None else environ
    if location.scheme != "s3":
        with environment(environ):
            return pafs.FileSystem.from_uri(location.url)
    timeout = float(environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT)
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL") or None
    # Keys the environment holds are the SDK's first choice anyway; given here, they are what a reader on another
    # machine uses too (StoreAccess), not whatever that machine's environment holds. Else the SDK's own chain.
    keys = ({"access_key": environ["AWS_ACCESS_KEY_ID"], "secret_key": environ["AWS_SECRET_ACCESS_KEY"],
             "session_token": environ.get("AWS_SESSION_TOKEN") or None}
            if environ.get("AWS_ACCESS_KEY_ID") and environ.get("AWS_SECRET_ACCESS_KEY") else {})
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    return pafs.S3FileSystem(endpoint_override=endpoint, request_timeout=timeout, connect_timeout=timeout,
                             retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=3),
                             allow_delayed_open=True,  # a small object: one PutObject
                             **keys, **({"region": region} if region else {})), location.path


#: The variables of each store's SDK that give its credentials and endpoint (docs/change-log.md, "On object
#: storage"): what :class:`StoreAccess` carries from the driver's environment to the Spark executors.
STORE_VARIABLES = {
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
           "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_EC2_METADATA_DISABLED", TIMEOUT_ENV),
    "gs": ("GOOGLE_APPLICATION_CREDENTIALS",),
    "abfs": ("AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID", "AZURE_AUTHORITY_HOST"),
    "hdfs": ("HADOOP_HOME", "ARROW_LIBHDFS_DIR", "CLASSPATH", "KRB5CCNAME"),
}


@dataclass(frozen=True)
class StoreAccess:
    """How a process on another machine (a Spark executor's Python worker) opens the log's store as this one does:
    the log's URL and the store's variables of this process's environment (:data:`STORE_VARIABLES`).

    Pickled into the Spark task that reads the segments, as the subscriber's password is (subscriber/copy_target.py
    ``executor_conninfo``): never on a command line, in a Spark setting (which the UI's environment page shows) or in a
    log; its ``repr`` names the URL and the variables' names only. Where the environment holds no keys (a role, a
    profile), the executor's own environment and identity give them, as the store's SDK finds them there.
    """

    url: str
    environment: tuple[tuple[str, str], ...] = field(repr=False)

    @classmethod
    def of(cls, url: str, environ: Mapping[str, str] | None = None) -> StoreAccess:
        environ = os.environ if environ is None else environ
        scheme = parse_location(url, "the change log").scheme
        return cls(url, tuple((k, environ[k]) for k in STORE_VARIABLES.get(scheme, ()) if environ.get(k)))

    def __repr__(self) -> str:
        return f"StoreAccess({self.url!r}, variables={[k for k, _ in self.environment]})"

    @contextlib.contextmanager
    def opened(self) -> Iterator[pafs.FileSystem]:
        """pyarrow's filesystem of the store (keys: the path within it, ``bucket/prefix/name``), with the carried
        variables in this process's environment while it is used (a GCS or Azure client may read them late)."""
        values = dict(self.environment)
        with environment(values):
            yield _filesystem(parse_location(self.url, "the change log"), {**os.environ, **values})[0]

    def key(self, url: str) -> str:
        """An object's key in :meth:`filesystem` from its URL (``s3://bucket/p/x`` → ``bucket/p/x``)."""
        return parse_location(url, "a change-log segment").path


_CREDENTIALS_HINT = ("check the store is reachable and the credentials in the environment of the capture and the apply "
                     "(for S3: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL "
                     "for an S3-compatible server), or name an Airflow connection that has them: change_log_conn_id "
                     "(docs/change-log.md, \"On object storage\")")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
