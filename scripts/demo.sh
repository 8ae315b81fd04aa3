#!/usr/bin/env bash
# Run the end-to-end demo against a throwaway local PostgreSQL. Arguments go to `rowfilter demo`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/bootstrap.sh
exec .venv/bin/rowfilter demo "$@"
