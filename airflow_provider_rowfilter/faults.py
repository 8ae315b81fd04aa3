"""Named fault points: where the fault tests kill a job for real (a SIGKILL, not an exception).

``ROWFILTER_FAULT=<point>`` in a job's environment makes :func:`point` kill the process the first
time it reaches that point, the way PostgreSQL's injection points let its tests stop a backend at
a chosen line. Unset (always, outside the tests), a point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "ROWFILTER_FAULT"

#: Every point, in the order a batch reaches them (docs/apply.md, "What a crash leaves").
POINTS = (
    "capture-mid-read",        # a row group of the segment is written, the segment is not complete
    "capture-after-segment",   # the segment is durable, the position and the slot are not moved yet
    "apply-after-stage",       # the batch is staged in the subscriber, nothing applied yet
    "apply-mid-transaction",   # some tables applied inside the open subscriber transaction
    "apply-after-commit",      # the subscriber committed; old segments not yet removed
)

#: Where a batch that follows a schema change (schema_changes: follow) can be killed besides POINTS.
SCHEMA_POINTS = (
    "apply-after-schema",      # the subscriber's DDL run in the batch's open transaction, no row applied yet
)

#: Where a reconcile can be killed (docs/verify.md, "A reconcile killed"), in the order it reaches them.
RECONCILE_POINTS = (
    "reconcile-after-hold",    # the table is in d for the reconcile, nothing of it fixed yet
    "reconcile-mid-groups",    # the first group of rows fixed and committed, the others not yet
    "reconcile-before-finish",  # every group fixed, the table not yet back in f
)


def point(name: str) -> None:
    """Kill this process with SIGKILL when ``ROWFILTER_FAULT`` names ``name``."""
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
