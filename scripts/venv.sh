#!/usr/bin/env bash
# The project's venv, without root: Debian's python3 with --system-site-packages (Mininet comes
# from Debian's package when setup.sh installed it), the project installed editable. What a
# fabric on this host needs only; FABRICLAB_EXTRAS (e.g. "test,cluster,grafana") adds extras and
# FABRICLAB_GROUPS (e.g. "dev") dependency groups, as the tests' set-up asks. Idempotent:
# reinstalls only when pyproject.toml changed or more is asked. Needs python3-venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${FABRICLAB_VENV:-$(pwd)/.venv}
EXTRAS=${FABRICLAB_EXTRAS:-}
DEP_GROUPS=${FABRICLAB_GROUPS:-}
log() { printf '[venv] %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv $VENV"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
want="extras=$EXTRAS groups=$DEP_GROUPS"
stamp="$VENV/.fabriclab-installed"
# the compiled transport engine (setup.py) is built by the install: again when its sources change
native_changed() { [ -n "$(find traffic/native/src setup.py -newer "$stamp" 2>/dev/null | head -1)" ]; }
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || native_changed \
   || { [ -n "$EXTRAS$DEP_GROUPS" ] && ! grep -qxF "$want" "$stamp"; }; then
  quiet() { grep -vE "WARNING: Location|^ *$" >&2 || true; }
  if [ -n "$DEP_GROUPS" ]; then  # dependency groups need pip 25.1 or newer
    "$VENV/bin/pip" install -q 'pip>=25.1' 2> >(quiet)
  fi
  log "installing fabriclab${EXTRAS:+ [$EXTRAS]}${DEP_GROUPS:+ (groups $DEP_GROUPS)} into the venv"
  "$VENV/bin/pip" install -q -e ".${EXTRAS:+[$EXTRAS]}" 2> >(quiet)
  for group in ${DEP_GROUPS//,/ }; do
    "$VENV/bin/pip" install -q --group "$group" 2> >(quiet)
  done
  # what was asked, so that a later call asking for less reinstalls nothing
  { cat "$stamp" 2>/dev/null || true; echo "$want"; } | sort -u > "$stamp.new"
  mv "$stamp.new" "$stamp"
fi
"$VENV/bin/python" -c "import os_ken, pyroute2, jsonschema, fabriclab.model.experiment" \
  || { echo "the venv cannot import os_ken/pyroute2/jsonschema/fabriclab" >&2; exit 1; }
