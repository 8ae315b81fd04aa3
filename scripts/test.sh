#!/usr/bin/env bash
# Lint, type-check core/ (setup.cfg [mypy]), then run the whole test suite (one PostgreSQL cluster
# and one Spark session per run).
# Arguments go to pytest, e.g. scripts/test.sh tests/core -m "not spark" -x
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
