#!/usr/bin/env bash
# Build the full-kernel guest image of the `vm` backend from Debian packages only.
#
#   scripts/build-vm-image.sh OUT_DIR
#
# OUT_DIR gets vmlinuz, initrd.img, root.img (ext4, the guest's root file system) and
# manifest.txt. The guest runs Debian 12's own kernel, which has what this machine's kernel
# lacks: the Open vSwitch kernel datapath, netem, RED, fq_codel, DCTCP. Its Python dependencies
# are those of the project (pyproject.toml), installed by pip into /opt/fabriclab/site; the
# project itself is carried in at run time, so one image serves every checkout. The init program
# (/sbin/fabriclab-init) runs one job and powers off: see testbed/vm/guest.py for the disk protocol.
set -euo pipefail
OUT=${1:?usage: build-vm-image.sh OUT_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/debian-tree.sh
. "$ROOT/scripts/debian-tree.sh"
PACKAGES=linux-image-amd64,udev,kmod,openvswitch-switch,iproute2,iperf3,ethtool,fping,mininet,python3,procps,e2fsprogs,tar,bpftool
# bpftool loads the ECN marker; its object is built on the host (clang stays out of the guest)
# and carried in with the job
IMAGE_MB=${FABRICLAB_VM_IMAGE_MB:-3072}

log() { printf '[vm-image] %s\n' "$*"; }
[ "$(id -u)" -eq 0 ] || { echo "build-vm-image.sh must run as root (debootstrap)" >&2; exit 1; }
for tool in debootstrap mkfs.ext4; do
  command -v "$tool" >/dev/null || { echo "$tool missing: apt-get install debootstrap e2fsprogs" >&2; exit 1; }
done

debian_tree "$OUT" "$PACKAGES"

log "python dependencies"
python3 - "$ROOT/pyproject.toml" > "$WORK/requirements.txt" <<'EOF'
import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))
EOF
# the guest runs the same Debian python3 (3.11), so wheels resolved here fit it
python3 -m pip install -q --no-warn-script-location --target "$TREE/opt/fabriclab/site" \
  -r "$WORK/requirements.txt" 2> >(grep -vE "^\s*$|WARNING: (Running pip as|Location)" >&2 || true)

log "init program"
install -m 0755 "$ROOT/scripts/vm-init.sh" "$TREE/sbin/fabriclab-init"
echo fabriclab-vm > "$TREE/etc/hostname"
rm -f "$TREE/etc/machine-id" && : > "$TREE/etc/machine-id"

cp "$TREE"/boot/vmlinuz-* "$WORK/vmlinuz"
cp "$TREE"/boot/initrd.img-* "$WORK/initrd.img"
rm -rf "$TREE"/var/cache/apt/archives/*.deb
log "root file system (${IMAGE_MB} MiB)"
mkfs.ext4 -q -F -L fabriclab-root -d "$TREE" "$WORK/root.img" "${IMAGE_MB}M"
{
  echo "built $(date -u +%FT%TZ) from $MIRROR"
  echo "kernel $(basename "$TREE"/boot/vmlinuz-*)"
  echo "packages $PACKAGES"
  cat "$WORK/requirements.txt"
} > "$WORK/manifest.txt"
mv "$WORK/vmlinuz" "$WORK/initrd.img" "$WORK/root.img" "$WORK/manifest.txt" "$OUT/"
log "done: $OUT"
