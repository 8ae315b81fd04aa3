"""The files a user hands us (a spec file, the publications file it names), read so that no content can hang or break us.

Each is opened without blocking and must be a regular file: a FIFO, a device or a directory is refused before
anything is read (a FIFO named as ``publications_ddl`` held ``rowfilter validate`` until it was killed). Each
has a size limit, is decoded as UTF-8 with PostgreSQL's words for a byte that is not (``pg_verifymbstr`` in
src/backend/utils/mb/mbutils.c), and a YAML document may nest only :data:`MAX_YAML_DEPTH` levels (PyYAML's
composer recurses once per level: 3,000 levels ended in a RecursionError). Every refusal names the file and
the fix.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

import yaml

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.spec.values import yaml_problem

#: A spec file is a few hundred bytes; a publications file of this size holds some 100,000 tables' entries.
MAX_SPEC_BYTES = 1 << 20
MAX_SCRIPT_BYTES = 8 << 20
#: Mappings and lists inside one another in a YAML document (a spec file needs 4).
MAX_YAML_DEPTH = 64
_BOMS = {b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16", b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32"}


def read_bytes(path: str | os.PathLike[str], what: str, limit: int, *, follow: bool = True) -> bytes:
    """The bytes of the regular file ``path`` (``what`` names it in errors), at most ``limit`` of them.

    :param follow: False refuses a symbolic link in the last component (``O_NOFOLLOW``).
    :raises SpecError: missing, unreadable, not a regular file, or larger than ``limit``.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise SpecError(f"{what} does not exist") from None
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise SpecError(f"{what} is a symbolic link", hint="name the file itself in the spec (a spec file's "
                            "paths are resolved when it is read)") from None
        raise SpecError(f"{what} cannot be read: {e.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise SpecError(f"{what} is {_kind(mode)}, not a regular file",
                            hint="name a regular file: a FIFO, a device or a directory is not read")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise SpecError(f"{what} is larger than {limit >> 20} MiB",
                        hint="check that the spec names the right file; split a larger publications file")
    return data


def decoded(data: bytes, what: str) -> str:
    """``data`` as UTF-8; else PostgreSQL's error for the first byte that is not, with its line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        bom = next((name for mark, name in sorted(_BOMS.items(), key=lambda kv: -len(kv[0])) if data.startswith(mark)),
                   None)
        encoding = f"it is {bom} (it begins with that encoding's byte-order mark): " if bom else ""
        raise SpecError(f'{what}: invalid byte sequence for encoding "UTF8": 0x{data[e.start:e.start + 1].hex()} at '
                        f"byte {e.start} (line {line})",
                        hint=f"{encoding}save the file as UTF-8, e.g. iconv -f {bom or 'LATIN1'} -t UTF-8 (name the "
                        "encoding it was written in)") from None


def read_text(path: str | os.PathLike[str], what: str, limit: int, *, follow: bool = True) -> str:
    """:func:`read_bytes`, :func:`decoded`."""
    return decoded(read_bytes(path, what, limit, follow=follow), what)


def yaml_document(text: str, what: str) -> Any:
    """``yaml.safe_load(text)`` once its nesting is known to be at most :data:`MAX_YAML_DEPTH` (PyYAML's event
    parser, which does not recurse, counts it first).

    :raises SpecError: not YAML (PyYAML's problem and place, never its quote of the text), or nested too deep.
    """
    level = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                level += 1
                if level > MAX_YAML_DEPTH:
                    mark = event.start_mark
                    raise SpecError(f"{what} nests more than {MAX_YAML_DEPTH} mappings or lists inside one another "
                                    f"(line {mark.line + 1}, column {mark.column + 1})",
                                    hint="a spec file is a mapping of keys, a few of them holding a list or a "
                                    "mapping: check the file's brackets and indentation")
            elif isinstance(event, yaml.CollectionEndEvent):
                level -= 1
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"{what} is not valid YAML: {yaml_problem(e)}") from None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"
