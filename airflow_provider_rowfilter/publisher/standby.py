"""Capture from a physical standby (PostgreSQL 16+ decodes on a standby): what works there, what it lacks.

Pointing ``publisher`` at a standby puts everything of ours there: the slot (created on the standby,
never a failover slot), the capture (``pg_logical_slot_peek_binary_changes`` reads to what the standby
has replayed: publisher/slot_health.py ``WAL_END``) and the initial copy's snapshot (a temporary slot
exporting it, as on a primary). The primary holds nothing of ours, which only ``filtering: source``
allows: a standby cannot create a publication, so the capture publications ``filtering: spark`` reads
through (a publications file, or a publisher before 15) would have to live on the primary; that mode
is refused on a standby. A slot on a standby is invalidated (``rows_removed``) when the primary
removes catalog rows it still needs: ``hot_standby_feedback`` and a physical slot
(``primary_slot_name``) keep them (PostgreSQL's "Logical Decoding on a Standby" section).
"""

from __future__ import annotations

import psycopg

from airflow_provider_rowfilter.publisher.capture_objects import CaptureError
from airflow_provider_rowfilter.publisher.failover import STANDBY_DECODING_VERSION


def is_standby(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]


def check_capture_source(conn: psycopg.Connection, filtering: str) -> list[str]:
    """On a standby: refuse (CaptureError) what it cannot do; return warnings about what may invalidate the slot.
    On a primary: nothing."""
    if not is_standby(conn):
        return []
    version = conn.info.server_version
    if version < STANDBY_DECODING_VERSION:
        raise CaptureError(f"the publisher is a standby running PostgreSQL {version // 10000}: logical decoding on a "
                           "standby needs PostgreSQL 16+",
                           hint="point publisher at the primary, or upgrade the standby")
    if filtering != "source":
        raise CaptureError(
            "the publisher is a standby, and filtering is spark: the capture publications that mode reads the slot "
            "through cannot be created on a standby (it is read-only), and we keep the primary free of our objects",
            hint="use filtering: auto (or source) with the definitions in the publisher's catalog (PostgreSQL 15+, no "
            "publications_ddl), or point publisher at the primary")
    feedback, physical = conn.execute(
        "SELECT current_setting('hot_standby_feedback'), current_setting('primary_slot_name')").fetchone()
    warnings = []
    if feedback != "on":
        warnings.append("the publisher is a standby with hot_standby_feedback off: its primary may remove catalog "
                        "rows the slot still needs, which invalidates it (rows_removed). Fix: ALTER SYSTEM SET "
                        "hot_standby_feedback = on; SELECT pg_reload_conf() on the standby")
    if not physical:
        warnings.append("the publisher is a standby without primary_slot_name: without a physical slot on the primary, "
                        "hot_standby_feedback holds only while the standby is connected, and the primary may remove "
                        "what the slot needs (rows_removed). Fix: a physical slot on the primary and primary_slot_name "
                        "on the standby")
    return warnings
