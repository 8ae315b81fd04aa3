"""Conflict counts, ours beside a native subscription's (``pg_stat_subscription_stats``), for the conflict tests."""

from __future__ import annotations

import time

import psycopg

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec

TABLE = "CREATE TABLE w (id int PRIMARY KEY, u int UNIQUE, v text);"


def execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def native_count(dsn: str, name: str, column: str, at_least: int = 1, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while True:
        with psycopg.connect(dsn, autocommit=True) as conn:
            n = conn.execute(f"SELECT {column} FROM pg_stat_subscription_stats WHERE subname = %s", (name,)).fetchone()[0]
        if n >= at_least:
            return n
        assert time.monotonic() < deadline, f"{name}: {column} = {n} after {timeout} s"
        time.sleep(0.2)


def ours_count(dsn: str, spec: SubscriptionSpec, column: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(f"SELECT {column} FROM rowfilter.subscription_stats WHERE subname = %s",
                            (spec.subscription,)).fetchone()[0]
