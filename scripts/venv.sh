#!/usr/bin/env bash
# The project's venv, without root: Debian's python3 with --system-site-packages (Mininet comes
# from Debian's package when setup.sh installed it), the project installed editable with its test
# extras. Idempotent: reinstalls only when pyproject.toml changed. Needs python3-venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${FABRICLAB_VENV:-$(pwd)/.venv}
log() { printf '[venv] %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv $VENV"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
stamp="$VENV/.fabriclab-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  log "installing fabriclab into the venv"
  "$VENV/bin/pip" install -q -e ".[test]" 2> >(grep -vE "WARNING: Location|^ *$" >&2)
  touch "$stamp"
fi
"$VENV/bin/python" -c "import os_ken, pyroute2, jsonschema, fabriclab.model.experiment" \
  || { echo "the venv cannot import os_ken/pyroute2/jsonschema/fabriclab" >&2; exit 1; }
