#!/usr/bin/env bash
# What the tests need beyond scripts/setup.sh (a fabric on this host): the venv's test extras
# (pytest, Ray for the cluster's tests, the Docker SDK) and the dashboard generator's group; the
# packages fabriclab otherwise installs on first need (the eBPF toolchain, the full-kernel
# guest's tools), up front; tmux (fabriclab top is tested in it); Debian's PyTorch (the
# examples' torch.distributed programs); headless Chromium, which
# renders the experiment report the way a person opens it; and a second Ray version for the
# cluster test's version mismatch. Idempotent; root.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

FABRICLAB_VENV=$(realpath -m "$VENV") FABRICLAB_EXTRAS=test,cluster,grafana,frames FABRICLAB_GROUPS=dev \
  ./scripts/venv.sh

mapfile -t wanted < <(./scripts/setup.sh --later)
# python3-torch: Debian's CPU build of PyTorch 1.13 (gloo included, no CUDA: 145 packages,
# 545 MB installed, against the several GB of PyPI's default wheel), for examples/torch_*.py
# openmpi-bin, python3-mpi4py: Debian's Open MPI and mpi4py, for examples/mpi_allreduce.py
# bridge-utils, iputils-ping: Mininet's spanning-tree bridges and its pingall, for a fabric
# exported as a Mininet module (fabriclab export --format mininet)
wanted+=(tmux chromium python3-torch openmpi-bin python3-mpi4py bridge-utils iputils-ping)
missing=()
for pkg in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[test-deps] installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Another Ray than the venv's, beside it (not in it): the cluster test's coordinator with a Ray
# version the cluster does not run (tests/integration/test_cluster.py). Only Ray's own files
# (--no-deps): the venv's packages serve its imports.
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
