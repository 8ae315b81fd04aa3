"""Where the paths a spec file names may lead: its own folder, the folders the deployment allows, no system directory.

Whoever writes a spec file chooses files the jobs read (``publications_ddl``) and a directory they write
(``change_log``), with the rights of the user that runs Airflow or the ``rowfilter`` command. So a spec
file's paths stay in its own folder (after symlinks are resolved: a link out of it counts where it
leads), unless the people who run the jobs allow more in :data:`ALLOWED_PATHS_ENV`, a setting of the
processes' environment that a spec file cannot change. A ``change_log`` is never a system directory,
allowed or not: the log's writer creates, renames and removes files there (docs/operations.md, "Security").
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow_provider_rowfilter.core.errors import SpecError

#: Directories outside a spec file's folder that its paths may name, separated by ``os.pathsep`` (``:``).
ALLOWED_PATHS_ENV = "ROWFILTER_ALLOWED_PATHS"

#: Directories a change log must not be: the file system's own, where a lock, a position file and segments
#: would sit among the system's files (and ``rowfilter drop`` would move the directory aside).
SYSTEM_DIRECTORIES = frozenset({
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media", "/mnt", "/opt",
    "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/bin", "/usr/lib", "/usr/local",
    "/usr/sbin", "/usr/share", "/var", "/var/cache", "/var/lib", "/var/log", "/var/mail", "/var/run", "/var/spool",
    "/var/tmp",
})
#: Trees no change log belongs anywhere in: pseudo file systems, configuration, boot files and programs.
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/sbin", "/sys", "/usr/bin",
                "/usr/lib", "/usr/sbin")


def allowed_directories() -> tuple[Path, ...]:
    """The directories :data:`ALLOWED_PATHS_ENV` names, symlinks resolved (empty entries ignored)."""
    value = os.environ.get(ALLOWED_PATHS_ENV, "")
    return tuple(Path(entry).resolve() for entry in value.split(os.pathsep) if entry.strip())


def confine(path: str, key: str, spec_dir: Path, source: str) -> str:
    """``path`` (relative to ``spec_dir``) resolved, when it lies in ``spec_dir`` or an allowed directory.

    :raises SpecError: it leads elsewhere (naming the key, where it leads and both fixes).
    """
    refuse_nul(path, key, source)
    folder = spec_dir.resolve()
    real = (spec_dir / path).resolve()
    for root in (folder, *allowed_directories()):
        if real == root or root in real.parents:
            return str(real)
    leads = f" (it leads to {str(real)!r})" if str(real) != os.path.normpath(spec_dir / path) else ""
    raise SpecError(f"{source}: {key} {path!r} is outside the spec file's folder {str(folder)!r}{leads}",
                    hint=f"put it in {str(folder)!r} or a folder below it; a spec file may name other places only "
                    f"where whoever runs the jobs allows them: {ALLOWED_PATHS_ENV}=/dir1{os.pathsep}/dir2 in the "
                    "environment of the rowfilter command and of Airflow's DAG processor and workers "
                    "(docs/operations.md, \"Security\")")


def refuse_nul(path: str, key: str, source: str) -> None:
    """Refuse a path holding a NUL character, which no file name can (the system calls end the name there).

    :raises SpecError: naming the key and the character's place.
    """
    if "\0" in path:
        raise SpecError(f"{source}: {key} {path!r} holds a NUL character (\\x00) at position {path.index(chr(0)) + 1}",
                        hint=f"remove it: a path cannot hold NUL; check how {key} was written (an escape \"\\0\" in a "
                        "double-quoted YAML string is one)")


def check_change_log_location(path: str, what: str) -> None:
    """Refuse a ``change_log`` that is a system directory or the home directory itself (symlinks resolved).

    :raises SpecError: naming the key, the directory and the fix.
    """
    refuse_nul(path, "change_log", what)
    real = os.path.realpath(os.path.abspath(path))
    home = os.path.realpath(os.path.expanduser("~"))
    inside = next((tree for tree in SYSTEM_TREES if real.startswith(tree + "/")), None)
    if real in SYSTEM_DIRECTORIES or real == home or inside is not None:
        kind = "the home directory" if real == home else "a system directory" if inside is None else \
            f"inside the system directory {inside}"
        shown = f"{path!r}" + (f" (which is {real!r})" if real != os.path.normpath(path) else "")
        raise SpecError(f"{what}: change_log {shown} is {kind}",
                        hint="give the change log a directory of its own (e.g. /var/lib/rowfilter/<subscription>/"
                        "changes), or leave change_log out: .rowfilter/<subscription>/changes beside the spec file")
