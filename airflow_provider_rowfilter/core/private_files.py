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
GROUP_FILE_MODE = 0o640
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


def group_mode(directory: str | os.PathLike[str]) -> int:
    """The mode for files in ``directory``: 0640 when its owner opened it to its group (``g+rx``, e.g. for the
    Spark executors of a cluster that run as another user of that group), else 0600. Never world-readable."""
    return GROUP_FILE_MODE if os.stat(directory).st_mode & 0o050 == 0o050 else FILE_MODE


def create_private(path: str | os.PathLike[str], flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC, *,
                   mode: int = FILE_MODE) -> int:
    """Open ``path`` with ``flags`` (creating it with ``mode``, 0600, where they say so); return the descriptor.

    A file created here has ``mode`` whatever the umask; an existing one of ours gets it too (a file written by
    an older version, or under a looser umask). ``O_NOFOLLOW``: a symlink planted at the name is refused,
    never followed.
    """
    fd = os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private(path: str | os.PathLike[str], how: str = "w", *, mode: int = FILE_MODE, **kwargs: Any) -> IO[Any]:
    """``open(path, how)`` for ``w``, ``a``, ``a+``, ``w+`` (text or ``b``): the file created with ``mode``, 0600
    (:func:`create_private`)."""
    base = how.replace("b", "").replace("t", "")
    flags = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
             "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND, "w+": os.O_RDWR | os.O_CREAT | os.O_TRUNC}[base]
    return os.fdopen(create_private(path, flags, mode=mode), how, **kwargs)


def write_private(path: str | os.PathLike[str], data: str | bytes, *, mode: int = FILE_MODE) -> None:
    """Write ``data`` to ``path`` (replacing what it held), with ``mode`` (0600)."""
    with open_private(path, "wb", mode=mode) as out:
        out.write(data.encode("utf-8") if isinstance(data, str) else data)
