#!/usr/bin/env bash
# The unit suite as an unprivileged user, as `make unit` promises it runs: `make test` (and so
# CI) runs it once this way before the full suite as root. As root it drops to
# FABRICLAB_UNIT_USER (default: nobody) with the project's venv; as any other user it runs
# `make unit`. A checkout the user cannot read (one in root's home) is read with the one
# capability that reads files (CAP_DAC_READ_SEARCH), nothing else; it says so.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-.venv}
USER_NAME=${FABRICLAB_UNIT_USER:-nobody}
if [ "$(id -u)" -ne 0 ]; then
  exec make unit
fi
home=$(mktemp -d /tmp/fabriclab-unit.XXXXXX)
trap 'rm -rf "$home"' EXIT  # so no exec below: the trap removes the user's home and temp files
chown "$USER_NAME" "$home"
args=(-q -m "not integration" -p no:cacheprovider "$ROOT/tests/unit" "$@")  # "$@": -k ...
# the property suite's 10,000 generated inputs run in full in `make test`'s suite as root; here a
# tenth of them checks that none needs a privilege (FABRICLAB_PROPERTY_SCALE to change it)
envs=(env -i "PATH=/usr/local/bin:/usr/bin:/bin" "HOME=$home" "TMPDIR=$home"
      PYTHONDONTWRITEBYTECODE=1 "LANG=${LANG:-C.UTF-8}"
      "FABRICLAB_PROPERTY_SCALE=${FABRICLAB_PROPERTY_SCALE:-0.1}")
python="$ROOT/$VENV/bin/python"
if runuser -u "$USER_NAME" -- test -r "$ROOT/pyproject.toml" -a -x "$python"; then
  echo "[unit-as-user] the unit suite as $USER_NAME"
  cd "$home"
  runuser -u "$USER_NAME" -- "${envs[@]}" "$python" -m pytest "${args[@]}"
  exit
fi
echo "[unit-as-user] the unit suite as $USER_NAME, reading $ROOT with CAP_DAC_READ_SEARCH" \
     "(the user cannot reach it otherwise)"
cd "$home"
group=$(id -gn "$USER_NAME")
setpriv --reuid="$USER_NAME" --regid="$group" --clear-groups \
  --inh-caps=+dac_read_search --ambient-caps=+dac_read_search \
  "${envs[@]}" "$python" -m pytest "${args[@]}"
