#!/usr/bin/env bash
# Idempotent set-up of a Debian 12 machine for a fabric on this host: packages, Open vSwitch
# daemons with userspace TSO, and the venv (scripts/venv.sh: Debian's python3,
# --system-site-packages for Mininet) with the project installed editable, no extras
# (FABRICLAB_EXTRAS=cluster adds Ray for a cluster's machines, as scripts/venv.sh says). Safe to
# run again; does only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${FABRICLAB_VENV:-$ROOT/.venv}
# gcc and python3-dev build the compiled transport engine at install (setup.py; without them
# the agents run the Python engine)
PACKAGES=(mininet openvswitch-switch python3-openvswitch iperf3 fping tcpdump prometheus python3-venv python3-pip
          iproute2 ethtool procps gcc python3-dev)
# installed the first time an experiment needs them (testbed/linux/packages.py), by the tests'
# set-up (scripts/test-deps.sh), and in the lab VM's box: the eBPF toolchain (ECN marker, link
# cuts) and the full-kernel guest's tools
LATER=(clang libbpf-dev bpftool debootstrap qemu-system-x86 e2fsprogs)

log() { printf '[setup] %s\n' "$*"; }
if [ "${1:-}" = "--packages" ]; then  # every package, for scripts/build-box.sh (the lab VM's box)
  printf '%s\n' "${PACKAGES[@]}" "${LATER[@]}" tmux
  exit 0
fi
if [ "${1:-}" = "--later" ]; then  # what comes on first need, for scripts/test-deps.sh
  printf '%s\n' "${LATER[@]}"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/setup.sh must run as root (network namespaces, Open vSwitch)" >&2
  exit 1
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Debian's prometheus package tries to start its service; without systemd that is refused
  # (policy-rc.d), which is fine: tests start Prometheus by hand when they need it.
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# shellcheck source=scripts/services.sh
. scripts/services.sh  # (the working directory is the project's)
disable_unused_prometheus

ovs_ctl=/usr/share/openvswitch/scripts/ovs-ctl
# Under systemd (the lab VM) its service owns the daemons; without it (CI, containers) ovs-ctl.
ovs() {  # ovs start|restart
  if [ -d /run/systemd/system ] && systemctl cat openvswitch-switch >/dev/null 2>&1; then
    systemctl "$1" openvswitch-switch
  else
    "$ovs_ctl" "$1" --system-id=random >/dev/null 2>&1 || "$ovs_ctl" "$1" --system-id=random
  fi
}
if ! ovs-vsctl --timeout=5 show >/dev/null 2>&1; then
  log "starting Open vSwitch"
  ovs start
fi
# The userspace datapath needs TSO support or TCP through it breaks or crawls. It only takes
# effect at vswitchd start, so restart once when it was just switched on.
if [ "$(ovs-vsctl --timeout=5 --if-exists get Open_vSwitch . other_config:userspace-tso-enable | tr -d '"')" != "true" ]; then
  log "enabling userspace TSO in Open vSwitch (restart)"
  ovs-vsctl --timeout=5 set Open_vSwitch . other_config:userspace-tso-enable=true
  ovs restart
fi
ovs-vsctl --timeout=10 show >/dev/null

FABRICLAB_VENV=$VENV ./scripts/venv.sh
"$VENV/bin/python" -c "import mininet.node" \
  || { echo "venv cannot import mininet (Debian's package)" >&2; exit 1; }
log "ready: $VENV/bin/fabriclab"
