#!/usr/bin/env bash
# What the tests need beyond scripts/setup.sh: headless Chromium, which renders the experiment
# report (report.html) the way a person opens it, and a second Ray version for the cluster
# test's version mismatch. Idempotent; root.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null; then
  echo "[test-deps] installing chromium"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

# Another Ray than the venv's, beside it (not in it): the cluster test's coordinator with a Ray
# version the cluster does not run (tests/integration/test_cluster.py). Only Ray's own files
# (--no-deps): the venv's packages serve its imports.
VENV=${VENV:-.venv}
if [ -x "$VENV/bin/python" ]; then
  here=$("$VENV/bin/python" -c 'import ray; print(ray.__version__)')
  other=2.59.0
  [ "$here" = "$other" ] && other=2.58.1
  dir=.test-deps/ray-other
  if [ "$(cat "$dir/VERSION" 2>/dev/null)" != "$other" ]; then
    echo "[test-deps] installing Ray $other beside the venv's $here ($dir)"
    rm -rf "$dir" "$dir.part"
    "$VENV/bin/python" -m pip install -q --no-deps --target "$dir.part" "ray==$other"
    echo "$other" > "$dir.part/VERSION"
    mv "$dir.part" "$dir"
  fi
fi
