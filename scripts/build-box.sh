#!/usr/bin/env bash
# Build a local Vagrant box (provider libvirt) of Debian 12 for the lab VM, from Debian packages
# only, as the `vm` backend's image is built (no public box can be downloaded here).
#
#   scripts/build-box.sh OUT_DIR        -> OUT_DIR/fabriclab-bookworm.box
#
# The box boots Debian's own kernel directly (libvirt's kernel/initrd/cmdline: the root file
# system is one ext4 disk without a partition table or boot loader), runs systemd, sshd and the
# QEMU guest agent, and has a `vagrant` user with Vagrant's insecure key and password-less sudo;
# systemd-networkd takes DHCP on every Ethernet NIC. The Debian packages scripts/setup.sh installs
# are in the box already (`setup.sh --packages`), so provisioning under an emulated CPU need not
# unpack them; the project is not in it: the Vagrantfile's provisioning runs scripts/setup.sh in
# the VM, as CI runs it here, and it finds the packages there and makes the venv.
set -euo pipefail
OUT=${1:?usage: build-box.sh OUT_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/debian-tree.sh
. "$ROOT/scripts/debian-tree.sh"
PACKAGES=linux-image-amd64,systemd-sysv,udev,kmod,dbus,openssh-server,sudo,qemu-guest-agent,iproute2,python3,ca-certificates,rsync,procps,curl,gnupg
PACKAGES+=,$(bash "$ROOT/scripts/setup.sh" --packages | paste -sd,)
DISK_GB=${FABRICLAB_BOX_DISK_GB:-12}

log() { printf '[box] %s\n' "$*"; }
[ "$(id -u)" -eq 0 ] || { echo "build-box.sh must run as root (debootstrap)" >&2; exit 1; }
for tool in debootstrap mkfs.ext4 qemu-img; do
  command -v "$tool" >/dev/null || {
    echo "$tool missing: apt-get install debootstrap e2fsprogs qemu-utils" >&2; exit 1; }
done
KEY=$(ls /usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub \
        /opt/vagrant/embedded/gems/gems/vagrant-*/keys/vagrant.pub 2>/dev/null | head -1 || true)
[ -n "$KEY" ] || { echo "Vagrant's insecure public key not found: apt-get install vagrant" >&2; exit 1; }

debian_tree "$OUT" "$PACKAGES"

log "vagrant user, sshd, network"
chroot "$TREE" useradd -m -s /bin/bash vagrant
install -d -m 0700 -o 1000 -g 1000 "$TREE/home/vagrant/.ssh"
install -m 0600 -o 1000 -g 1000 "$KEY" "$TREE/home/vagrant/.ssh/authorized_keys"
echo 'vagrant ALL=(ALL) NOPASSWD: ALL' > "$TREE/etc/sudoers.d/vagrant"
chmod 0440 "$TREE/etc/sudoers.d/vagrant"
echo 'UseDNS no' > "$TREE/etc/ssh/sshd_config.d/vagrant.conf"
cat > "$TREE/etc/systemd/network/50-dhcp.network" <<'EOF'
[Match]
Type=ether

[Network]
DHCP=yes
EOF
chroot "$TREE" systemctl enable systemd-networkd ssh qemu-guest-agent >/dev/null 2>&1 || true
echo '/dev/vda / ext4 errors=remount-ro 0 1' > "$TREE/etc/fstab"
echo fabriclab-lab > "$TREE/etc/hostname"
rm -f "$TREE/etc/machine-id" && : > "$TREE/etc/machine-id"
rm -f "$TREE"/etc/ssh/ssh_host_*  # each VM makes its own at first boot
# Ed25519 and ECDSA only: an RSA-3072 key's prime search takes 17 s and more under an emulated
# CPU, and longer as the host is loaded, all before sshd answers (Vagrant's net-ssh speaks ECDSA).
printf 'HostKey /etc/ssh/ssh_host_ed25519_key\nHostKey /etc/ssh/ssh_host_ecdsa_key\n' \
  > "$TREE/etc/ssh/sshd_config.d/host-keys.conf"
cat > "$TREE/etc/systemd/system/ssh-host-keys.service" <<'EOF'
[Unit]
Description=Generate SSH host keys on first boot
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -q -N "" -t ed25519 -f /etc/ssh/ssh_host_ed25519_key
ExecStart=/usr/bin/ssh-keygen -q -N "" -t ecdsa -f /etc/ssh/ssh_host_ecdsa_key

[Install]
WantedBy=multi-user.target
EOF
chroot "$TREE" systemctl enable ssh-host-keys >/dev/null 2>&1

cp "$TREE"/boot/vmlinuz-* "$WORK/vmlinuz"
cp "$TREE"/boot/initrd.img-* "$WORK/initrd.img"
rm -rf "$TREE"/var/cache/apt/archives/*.deb
log "root file system (${DISK_GB} GiB, qcow2)"
mkfs.ext4 -q -F -L fabriclab-root -d "$TREE" "$WORK/root.raw" "${DISK_GB}G"
qemu-img convert -f raw -O qcow2 "$WORK/root.raw" "$WORK/box.img"
rm -f "$WORK/root.raw"

log "box"
cat > "$WORK/metadata.json" <<EOF
{"provider": "libvirt", "format": "qcow2", "virtual_size": $DISK_GB}
EOF
cat > "$WORK/Vagrantfile" <<'EOF'
# The box's own settings: boot its kernel directly (no boot loader in the image).
Vagrant.configure("2") do |config|
  config.vm.provider :libvirt do |libvirt|
    libvirt.kernel = File.join(File.dirname(__FILE__), "vmlinuz")
    libvirt.initrd = File.join(File.dirname(__FILE__), "initrd.img")
    libvirt.cmd_line = "root=/dev/vda rw console=ttyS0 net.ifnames=0"
  end
end
EOF
echo "built $(date -u +%FT%TZ) from $MIRROR; packages $PACKAGES" > "$WORK/manifest.txt"
tar -C "$WORK" -czf "$WORK/fabriclab-bookworm.box" metadata.json Vagrantfile box.img vmlinuz \
  initrd.img manifest.txt
mv "$WORK/fabriclab-bookworm.box" "$OUT/"
log "done: $OUT/fabriclab-bookworm.box"
