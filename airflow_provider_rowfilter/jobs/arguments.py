"""Command line and log set-up shared by every job: the spec comes as a file or as the versioned JSON document."""

from __future__ import annotations

import argparse
import logging
import warnings
from collections.abc import Sequence

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec

#: PySpark 4.0's FutureWarning about pandas 3, issued on every run: about PySpark's version support, nothing
#: a user of a job can act on.
PANDAS_WARNING = "PySpark does not yet fully support pandas"


def setup_logging() -> None:
    """The jobs' log: our lines at their level on stderr (``LEVEL logger: message``, which the operators
    read back at that level: hooks/job_output.py), without PySpark's pandas-version warning."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore", message=PANDAS_WARNING, category=FutureWarning)


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--spec", help="subscription spec file (YAML)")
    source.add_argument("--spec-json", help="the spec as JSON (what the Airflow operators pass; holds no secret)")
    return p


def spec_from_arguments(args: argparse.Namespace) -> SubscriptionSpec:
    return SubscriptionSpec.load(args.spec) if args.spec else SubscriptionSpec.from_json(args.spec_json)


def positive(text: str) -> int:
    """An argparse ``type``: a whole number of at least 1 (a bound of 0 or less means nothing)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> tuple[argparse.Namespace, SubscriptionSpec]:
    args = p.parse_args(argv)
    return args, spec_from_arguments(args)


def seconds(text: str) -> float:
    """An argparse ``type``: a number of seconds, 0 or more (a time budget; 0 means one batch)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds of 0 or more")
    return value


def interval(text: str) -> float:
    """An argparse ``type``: a number of seconds above 0 (between two readings: 0 would never rest)."""
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds above 0")
    return value
