#!/usr/bin/env bash
# The real clients the `sluice serve` tests drive, installed once outside the checkout
# ($SLUICE_FIXTURES, default ${XDG_CACHE_HOME:-~/.cache}/sluice/fixtures):
#
#   venv-serve/    python3 venv with OpenAI's official client, `openai` 3.57.0 (PyPI)
#   node-serve/    Playwright's `playwright-core` 1.65.1 (npm; the driver only, no browser)
#   chromium       Debian's package (apt), the browser the dashboard test drives headless
#
# Idempotent: a finished install leaves node-serve/STAMP and later runs return at once. Needs
# python3 (venv, pip), node with npm, and apt as root (or sudo) where chromium is missing. Where
# a registry cannot be reached the step says so and fails.
set -euo pipefail

ROOT=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}
VENV=$ROOT/venv-serve
NODE=$ROOT/node-serve
STAMP_VERSION="serve-deps v2 openai==3.57.0 playwright-core@1.65.1"

if [ -f "$NODE/STAMP" ] && [ "$(cat "$NODE/STAMP")" = "$STAMP_VERSION" ] && command -v chromium >/dev/null; then
    exit 0
fi
mkdir -p "$ROOT"

if ! "$VENV/bin/python3" -c 'import openai; assert openai.__version__ == "3.57.0"' 2>/dev/null; then
    echo "# installing openai 3.57.0 into $VENV" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q openai==3.57.0 || { echo "error: cannot install openai from PyPI" >&2; exit 1; }
fi

if [ ! -d "$NODE/node_modules/playwright-core" ]; then
    echo "# installing playwright-core 1.65.1 into $NODE" >&2
    mkdir -p "$NODE"
    (cd "$NODE" && [ -f package.json ] || echo '{"private":true}' > package.json)
    (cd "$NODE" && npm install --silent --no-audit --no-fund playwright-core@1.65.1) ||
        { echo "error: cannot install playwright-core from npm" >&2; exit 1; }
fi

if ! command -v chromium >/dev/null; then
    echo "# installing Debian's chromium" >&2
    if [ "$(id -u)" = 0 ]; then
        apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } ||
            { echo "error: cannot install chromium with apt" >&2; exit 1; }
    else
        sudo -n apt-get install -y -q chromium >/dev/null ||
            { echo "error: chromium is missing and apt needs root: install Debian's chromium" >&2; exit 1; }
    fi
fi

echo "$STAMP_VERSION" > "$NODE/STAMP"
