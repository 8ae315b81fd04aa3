#!/usr/bin/env bash
# Run the end-to-end demo against a throwaway local PostgreSQL. Arguments (--keep DIR, --batches N) go
# to `python -m airflow_provider_rowfilter.tooling.demo`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/bootstrap.sh
exec .venv/bin/python -m airflow_provider_rowfilter.tooling.demo "$@"
