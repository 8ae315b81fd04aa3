"""``python -m airflow_provider_rowfilter.tooling.embedded``: start, inspect or stop a detached local
PostgreSQL cluster, and make login roles in it (docs/local-postgres.md)."""

from __future__ import annotations

import argparse
import getpass
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from airflow_provider_rowfilter.tooling.embedded import LocalPostgres
from airflow_provider_rowfilter.tooling.pg_host import DEFAULT_OS_USER, LocalPostgresError

logger = logging.getLogger(__name__)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m airflow_provider_rowfilter.tooling.embedded",
        description="Start, inspect or stop a detached local PostgreSQL cluster for demos and tests.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="initialise when needed, start, and print the DSN")
    start.add_argument("--port", type=int, default=None, help="TCP port on 127.0.0.1 (default: a free one)")
    where = start.add_mutually_exclusive_group()
    where.add_argument(
        "--bin-dir", type=Path, default=None, help="directory holding initdb, pg_ctl, postgres"
    )
    where.add_argument(
        "--binaries", choices=("auto", "embedded", "path"), default="auto", help="where to find the binaries"
    )
    start.add_argument(
        "--os-user", default=None, help=f"OS user for the server when root (default {DEFAULT_OS_USER})"
    )
    for name, text in (("status", "print the DSN of the running cluster"), ("stop", "stop the cluster")):
        sub.add_parser(name, help=text)
    role = sub.add_parser("role", help="create (or alter) a login role with a password read from standard input "
                          "(SCRAM-SHA-256); print its DSN (without the password)")
    role.add_argument("name", help="the role's name")
    role.add_argument("--superuser", action="store_true", help="make it a superuser")
    role.add_argument("--replication", action="store_true", help="give it REPLICATION (logical slots)")
    for command in sub.choices.values():
        command.add_argument(
            "--dir", type=Path, required=True, help="cluster data directory, e.g. .rowfilter/pg"
        )
    return parser.parse_args(argv)


def _run_command(args: argparse.Namespace) -> int:
    running = LocalPostgres.attach(args.dir)
    if args.command == "start":
        if running is None:
            running = LocalPostgres.start(
                args.dir,
                port=args.port,
                bin_dir=args.bin_dir,
                binaries=args.binaries,
                os_user=args.os_user,
                detach=True,
            )
        else:
            logger.info("Already running on port %d", running.port)
        print(running.dsn())
        return 0
    if args.command == "role":
        if running is None:
            print(f"no cluster is running in {args.dir}", file=sys.stderr)
            return 3
        # Standard input, as initdb --pwfile reads it: never a command-line argument (ps shows those).
        password = getpass.getpass(f"password for role {args.name}: ") if sys.stdin.isatty() else sys.stdin.readline()
        password = password.rstrip("\n")
        if not password:
            print("error: no password given on standard input", file=sys.stderr)
            return 2
        print(running.create_role(args.name, password, superuser=args.superuser, replication=args.replication))
        return 0
    if args.command == "status":
        if running is None:
            print(f"no cluster is running in {args.dir}", file=sys.stderr)
            return 3
        print(running.dsn())
        return 0
    if running is None:
        logger.info("No cluster is running in %s", args.dir)
    else:
        running.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``start`` / ``status`` / ``stop`` command line; return the exit status."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    args = _parse_args(argv)
    try:
        return _run_command(args)
    except LocalPostgresError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
