"""The repair the page offers first for what it read: the factory DAG that fixes it, and its parameters.

Pure, like health.py: from the page's view of one subscription, the one repair its state calls for, in the order an
incident needs them. A lost slot (missing while tables are past their copy, or invalidated) is repaired by
``refresh --recreate-slot --reconcile`` (the refresh DAG with ``recreate_slot`` and ``reconcile``): a new slot,
every table reconciled in place, none emptied. A conflict that names a finish LSN is skipped (the skip DAG). A
table whose copy filter changed, or whose last verify found it different, is reconciled in place (the reconcile
DAG). Resync, which empties tables, is never the one offered: the page asks for a confirmation before it.
"""

from __future__ import annotations

from typing import Any


def offered_repair(view: Any) -> dict[str, Any] | None:
    """``{"kind": DAG kind, "values": its parameters, "label": the button, "why": what calls for it}`` or None."""
    dags = view.dag_ids or {}
    slot = view.slot or {}
    past_copy = [t["table"] for t in view.tables if t["state"] != "i"]
    lost = slot.get("wal_status") == "lost" or (slot.get("exists") is False and bool(past_copy))
    errors = " ".join([view.last_error or "", *(t.get("last_error") or "" for t in view.tables)])
    if (lost or "--recreate-slot" in errors) and "refresh" in dags:
        why = "its replication slot was invalidated" if slot.get("wal_status") == "lost" else \
            "its replication slot is gone"
        return {"kind": "refresh", "values": {"recreate_slot": True, "reconcile": True},
                "label": "Recreate the slot, reconcile in place…", "why": why}
    if view.conflict_lsn and "skip_transaction" in dags:
        return {"kind": "skip_transaction", "values": {"lsn": view.conflict_lsn},
                "label": f"Skip transaction {view.conflict_lsn}…", "why": "a conflict stopped the apply"}
    changed = [t["table"] for t in view.tables if t.get("filter_changed")]
    differ = [t["table"] for t in view.tables if (t.get("last_check") or {}).get("kind") == "verify"
              and (t.get("last_check") or {}).get("clean") is False]
    tables = sorted(set(changed) | set(differ))
    if tables and "reconcile_tables" in dags:
        why = "its copy filter or column list changed" if changed else "its last verify found it different"
        return {"kind": "reconcile_tables", "values": {"tables": ", ".join(tables), "dry_run": False},
                "label": f"Reconcile {', '.join(tables)} in place…", "why": why}
    return None
