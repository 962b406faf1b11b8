#!/usr/bin/env bash
# Create .venv with Squall installed (editable, with the dev extras) at the versions
# constraints.txt pins, and re-install only when pyproject.toml or constraints.txt changed
# since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'squall: %s\n' "$*" >&2; }

VENV=.venv
STAMP=$VENV/.squall-installed
PY=${PYTHON:-python3}

if ! command -v "$PY" >/dev/null 2>&1; then
    log "no $PY on PATH; Squall needs Python >= 3.11."
    exit 1
fi
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    log "$("$PY" --version 2>&1) is too old; Squall needs Python >= 3.11 (set PYTHON=/path/to/python3.11)."
    exit 1
fi

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt constraints.txt ]; then
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PY" -m venv "$VENV" 2>/dev/null; then
        # Debian/Ubuntu ship venv's ensurepip separately.
        if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
            log "installing python3-venv with apt-get..."
            rm -rf "$VENV"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
            "$PY" -m venv "$VENV"
        else
            log "'$PY -m venv' failed: install your distribution's python3-venv package."
            exit 1
        fi
    fi
fi

log "installing Squall and its dependencies into $VENV (versions from constraints.txt; torch the CPU build)..."
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -c constraints.txt -e '.[dev]' 2>&1 | { grep -v -e "is ignored: it is neither" -e "BuildBackendWarning" || true; }
touch "$STAMP"
