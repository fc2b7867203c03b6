#!/usr/bin/env bash
# What the tests need beyond scripts/setup.sh: headless Chromium, which renders the experiment
# report (report.html) the way a person opens it. Idempotent; root.
set -euo pipefail
if ! command -v chromium >/dev/null; then
  echo "[test-deps] installing chromium"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
