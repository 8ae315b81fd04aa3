#!/usr/bin/env bash
# Regenerate constraints.txt: resolve pyproject.toml's ranges afresh in a scratch venv and pin the result.
# Review the diff, run scripts/test.sh, and commit both together.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
"$PYTHON" -m venv "$scratch/venv"
"$scratch/venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[test]"
{
    sed -n '/^#/p' constraints.txt
    "$scratch/venv/bin/python" -m pip freeze --exclude airflow-provider-rowfilter
} > "$scratch/constraints.txt"
mv "$scratch/constraints.txt" constraints.txt
git --no-pager diff --stat -- constraints.txt || true
