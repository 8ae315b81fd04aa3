#!/usr/bin/env bash
# Lint, type-check core/ (setup.cfg [mypy]), then run the whole test suite (one PostgreSQL cluster
# and one Spark session per run).
# Arguments go to pytest, e.g. scripts/test.sh tests/core -m "not spark" -x
# --quick first: the quick tier only, everything but the end-to-end tests in tests/e2e/ (docs/development.md).
set -euo pipefail
quick=()
if [[ "${1:-}" == "--quick" ]]; then
    shift
    quick=(--ignore=tests/e2e)
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest ${quick[@]+"${quick[@]}"} "$@"
