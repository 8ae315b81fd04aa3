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
# apache-airflow-providers-apache-spark pulls in pyspark-client, whose files overwrite pyspark's own
# package directory: keep pyspark at the client's version so the two agree (tests/spark/test_versions.py).
client="$(sed -n 's/^pyspark-client==//p' "$scratch/constraints.txt")"
if [ -n "$client" ]; then
    sed -i "s/^pyspark==.*/pyspark==$client/" "$scratch/constraints.txt"
fi
mv "$scratch/constraints.txt" constraints.txt
git --no-pager diff --stat -- constraints.txt || true
