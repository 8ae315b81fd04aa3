"""Change logs the subscriber no longer records: removed by the apply, never the one on record.

A log stops being the subscription's in two ways, and neither is read again:

- ``rowfilter refresh --recreate-slot`` (a new slot) moves it aside as ``<change_log>.replaced-<time>``
  (change_log/log.py ``set_aside``): its positions belong to a slot that no longer exists, and the tables it
  fed are copied again or reconciled from a snapshot of the new slot;
- the spec's ``change_log`` moved to another directory that holds everything the tables need: the apply
  records the new one (flows/apply/batch_plan.py ``_check_log``), and the old directory, when it was copied rather
  than moved, still holds segments: removed when it is a copy of the same log (its id) ending no later (the
  new one holds all it had); another log is kept, with a warning.

The apply removes them (:func:`remove_unrecorded`) once the subscriber records the current log: only logs on this
host, other than the directory on record (a log on object storage leaves its replaced prefixes to the bucket's
lifecycle rules), and only our files in them (segments, the position file, an older release's lock file, a
writer's temporary files); a directory that then holds anything
else is kept, with a warning naming it. ``<change_log>.dropped-<time>`` (``rowfilter drop``) is the user's to
delete: kept.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from airflow_provider_rowfilter.change_log.identity import LogIdentity
from airflow_provider_rowfilter.change_log.log import (
    LOCK_FILE,
    POSITION_FILE,
    TEMP_PREFIX,
    ChangeLog,
    ChangeLogError,
    parse_segment_name,
)

log = logging.getLogger(__name__)

#: What ``set_aside`` appends to the directory's name (change_log/log.py ``_move_aside``).
REPLACED = ".replaced-"


def replaced_logs(current: ChangeLog) -> list[Path]:
    """The logs ``refresh --recreate-slot`` moved aside from ``current``'s directory, oldest first."""
    parent, stem = current.directory.parent, current.directory.name + REPLACED
    if not parent.is_dir():
        return []
    return sorted(Path(e.path) for e in os.scandir(parent) if e.name.startswith(stem) and e.is_dir(follow_symlinks=False))


def remove_unrecorded(current: ChangeLog, recorded: LogIdentity | None,
                      previous: LogIdentity | None = None) -> list[Path]:
    """Remove the logs no longer recorded: the ones moved aside from ``current``, and ``previous`` (the log the
    subscriber recorded before ``recorded``), unless it is ``current``'s directory or on another host.

    Nothing unless ``recorded`` (what the subscriber records now) is ``current``. Returns the directories removed.
    """
    if recorded is None or not current.is_at(recorded):
        return []
    candidates = replaced_logs(current) if current.on_this_host else []
    if previous is not None and previous.host == socket.gethostname() and previous.path != recorded.path \
            and _superseded(ChangeLog(previous.path), current, recorded):
        candidates.append(Path(previous.path))
    removed = []
    for path in candidates:
        if _remove(path):
            removed.append(path)
    if removed:
        log.info("removed the change log(s) the subscriber no longer records: %s (it reads %s)",
                 ", ".join(map(str, removed)), recorded.location)
    return removed


def _superseded(old: ChangeLog, current: ChangeLog, recorded: LogIdentity) -> bool:
    """Whether ``old`` (the directory recorded before) is a copy of the log now read at ``current`` that ends no
    later: then ``current`` holds all it had. Another log, or one ending later, is left, with a warning."""
    if not old.directory.is_dir():
        return False  # moved (mv), not copied: nothing left behind
    same, ends, newer = False, None, None
    try:
        same = (identity := old.identity()) is not None and identity.id == recorded.id
        ends, newer = old.captured_through(), current.captured_through()
    except ChangeLogError:
        same = False
    if same and (ends is None or (newer is not None and ends <= newer)):
        return True
    log.warning("the change log at %s is no longer recorded (the subscription reads %s) and holds what that one "
                "does not: it is kept; delete it when you no longer need it", old.directory, recorded.location)
    return False


def _remove(directory: Path) -> bool:
    """Remove our files of one unrecorded log, then the directory when nothing else is in it.

    No capture writes there: the subscription's one capture (publisher/writer_lock.py) writes the log the spec
    names, and a worker left with an older spec that captured into it would leave the recorded log a gap, which
    the continuity rule refuses (change_log/log.py ``continuous``): nothing is lost unseen."""
    if not directory.is_dir():
        return False
    try:
        ChangeLog(directory).identity()  # a log of ours: its position file is readable
    except ChangeLogError as e:
        log.warning("%s is not removed: %s", directory, e.message)
        return False
    for entry in os.scandir(directory):
        if entry.name in (POSITION_FILE, LOCK_FILE) or entry.name.startswith(TEMP_PREFIX) \
                or parse_segment_name(entry.name) is not None:
            os.unlink(entry.path)
    try:
        directory.rmdir()
    except OSError:
        log.warning("change log %s is no longer recorded: its segments were removed; it holds other files, kept",
                    directory)
    return True
