"""Files and directories the product writes, private to their owner whatever the umask: 0600 and 0700.

Change-log segments hold replicated rows; the Spark Connect server's token lets its holder run code as the
server's user; positions, locks and logs say what a subscription does. Another OS user on the host must read
none of them (docs/operations.md, "Security"). ``open()`` and ``mkdir()`` create with ``0666``/``0777`` less
the umask, so a umask of 022 (the usual) makes them world-readable; these create with ``0600``/``0700`` and
set the mode again after creating (a umask can only take bits away, one of 077 or more would leave the
owner unable to read its own file).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700


def private_directory(path: str | os.PathLike[str]) -> list[Path]:
    """Create ``path`` and its missing parents with mode 0700; return the directories made (outermost first).

    An existing directory keeps its mode: it is its owner's choice (a group that backs it up, say).
    """
    path = Path(path)
    missing = [d for d in (path, *path.parents) if not d.exists()]
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIRECTORY_MODE)
        except FileExistsError:  # made meanwhile by another process: its mode is its maker's
            continue
        os.chmod(directory, DIRECTORY_MODE)
    return list(reversed(missing))


def create_private(path: str | os.PathLike[str], flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """Open ``path`` with ``flags`` (creating it 0600 where they say so); return the descriptor.

    A file created here is 0600 whatever the umask; an existing one is made 0600 too (a file of ours
    written by an older version, or under a looser umask). ``O_NOFOLLOW``: a symlink planted at the
    name is refused, never followed.
    """
    fd = os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private(path: str | os.PathLike[str], mode: str = "w", **kwargs: Any) -> IO[Any]:
    """``open(path, mode)`` for ``w``, ``a``, ``a+`` (text or ``b``): the file created 0600 (:func:`create_private`)."""
    base = mode.replace("b", "").replace("t", "")
    flags = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
             "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND, "w+": os.O_RDWR | os.O_CREAT | os.O_TRUNC}[base]
    return os.fdopen(create_private(path, flags), mode, **kwargs)


def write_private(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` to ``path`` (replacing what it held), mode 0600."""
    with open_private(path, "wb") as out:
        out.write(data.encode("utf-8") if isinstance(data, str) else data)
