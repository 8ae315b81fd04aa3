"""Where a change log lives: a local directory (a plain path or a ``file://`` URL), or a URL this release serves.

A spec's ``change_log`` is read here first, before anything treats it as a path: ``s3://bucket/subs/s1``
taken as a relative path would become a local directory named ``s3:`` under the working directory,
and the segments would land on a disk no other machine reads (issue 32). So every value that starts
like a URL (``scheme:/``) is a URL: its scheme is served, or the value is refused naming the schemes
that are, never taken as a path. Pure Python: no file system is touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from airflow_provider_rowfilter.core.errors import SpecError

#: URL schemes of object stores a change log may live on: pyarrow's filesystems (change_log/store.py).
REMOTE_SCHEMES: tuple[str, ...] = ("s3", "gs", "abfs", "hdfs")
#: Other spellings of a store's scheme (Hadoop's connectors, older names) and the one a spec writes.
_SPELLINGS = {"s3a": "s3", "s3n": "s3", "gcs": "gs", "abfss": "abfs", "wasb": "abfs", "wasbs": "abfs"}
# A scheme (RFC 3986: a letter, then letters, digits, + - .) and a colon, then a slash: a URL, never a path.
# A single letter and a colon is a scheme too ("c:/logs" is not a POSIX path anyone means).
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/")


@dataclass(frozen=True)
class LogLocation:
    """A change log's location: ``scheme`` ``file`` and a local ``path``, or a remote ``url``."""

    scheme: str
    path: str  # the local directory (scheme "file"), or the URL's bucket/prefix without the scheme
    url: str | None = None  # the URL as given (remote schemes)

    @property
    def local(self) -> bool:
        return self.scheme == "file"


def is_url(value: str) -> bool:
    """Whether ``value`` starts like a URL (``scheme:/``), so it must never be read as a local path."""
    return _URL.match(value) is not None


def parse_location(value: str, what: str) -> LogLocation:
    """Read a ``change_log`` value: a plain path, ``file:///dir`` or a served remote URL.

    :raises SpecError: a URL of a scheme this release does not serve, or a malformed one, naming ``what``,
        the value and the fix; nothing was created anywhere.
    """
    match = _URL.match(value)
    if match is None:
        return LogLocation("file", value)
    scheme = match.group(1).lower()
    parts = urlsplit(value)
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
            raise SpecError(f"{what}: change_log {value!r} is not a local file URL",
                            hint="write file:///absolute/path (or the plain path); a log another machine holds "
                            "belongs on object storage")
        return LogLocation("file", unquote(parts.path))
    if scheme in REMOTE_SCHEMES:
        if not parts.netloc or parts.query or parts.fragment:
            raise SpecError(f"{what}: change_log {value!r} names no bucket",
                            hint=f"write {scheme}://bucket/prefix/<subscription>")
        return LogLocation(scheme, parts.netloc + parts.path.rstrip("/"), value.rstrip("/"))
    served = ", ".join(f"{s}://" for s in ("file", *REMOTE_SCHEMES))
    instead = _SPELLINGS.get(scheme)
    hint = (f"write it as {instead}://… (the spelling this release serves for that store)" if instead in REMOTE_SCHEMES
            else
            f"use a directory every capture and apply reaches (a plain path or file:///…); this release serves "
            f"change_log URLs of the schemes {served}")
    raise SpecError(f"{what}: change_log {value!r}: the URL scheme {scheme}:// is not served by this release; "
                    "it is never taken as a local path", hint=hint)
