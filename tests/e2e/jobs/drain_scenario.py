"""The drain tests' backlog: a publisher of t and u, and transactions enough for several batches."""

from __future__ import annotations

from tests.e2e.jobs.apply_scenario import publisher_sql

PUBLISHER = publisher_sql(60, 90)
BATCH = 50  # max_changes of every run here: 240 changes make five batches or more


def backlog(transactions: int, base: int = 10_000, per: int = 10) -> list[str]:
    """``transactions`` publisher transactions of ``per`` changes each, on fresh keys of t (and some rows of u)."""
    statements = []
    for i in range(transactions):
        lo = base + i * per
        if i % 4 == 3:  # u: some rows enter the filter (n > 50), others stay out
            statements.append(f"UPDATE u SET n = n + 1 WHERE k BETWEEN {i * 2 + 1} AND {i * 2 + per}")
        else:
            statements.append(f"INSERT INTO t SELECT g, g % 5, 'b' || g FROM generate_series({lo}, {lo + per - 1}) g")
    return statements
