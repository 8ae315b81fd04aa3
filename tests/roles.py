"""The run's password roles: what the jobs, operators and differential tests connect as, as users do.

The run's cluster asks every connection for a password (SCRAM-SHA-256, tooling/embedded_auth.py). The
superuser's is in the cluster's 0600 password file (``PGPASSFILE`` for the run: the tests' own setup and
the native referee); these two roles' passwords are nowhere on disk: random for each run, they reach a
job only as users give them (``ROWFILTER_<ROLE>_PASSWORD``, an Airflow connection's password, connection.py
``in_task``), so a job that loses one on the way fails to connect. Superusers: what they may do is not
what these tests are about (tests/airflow/cluster.py has least-privilege roles for the DAG tests).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from urllib.parse import quote

import psycopg


@dataclass(frozen=True)
class PasswordRole:
    """A login role of the run's cluster that authenticates with ``password``."""

    name: str
    password: str

    def url(self, dsn: str) -> str:
        """The libpq URL of ``dsn``'s database as this role, without a password."""
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        return f"postgresql://{quote(self.name)}@{info['host']}:{info['port']}/{quote(str(info['dbname']), safe='')}"


PUBLISHER = PasswordRole("rf_test_publisher", f"pub-{secrets.token_urlsafe(18)}")
SUBSCRIBER = PasswordRole("rf_test_subscriber", f"sub-{secrets.token_urlsafe(18)}")
ROLES = {"publisher": PUBLISHER, "subscriber": SUBSCRIBER}
#: What a job reads the passwords from (core/spec/conninfo.py PASSWORD_ENV).
PASSWORD_ENV = {"ROWFILTER_PUBLISHER_PASSWORD": PUBLISHER.password, "ROWFILTER_SUBSCRIBER_PASSWORD": SUBSCRIBER.password}
