#!/bin/bash
# PID 1 of the fabriclab guest (installed as /sbin/fabriclab-init by build-vm-image.sh).
# Runs one job and powers the guest off. Disks (see testbed/vm/guest.py):
#   /dev/vda  root file system (the host runs qemu with -snapshot: nothing written here stays)
#   /dev/vdb  the job: a tar with project/ (the checkout) and job.sh (what to run in project/)
#   /dev/vdc  the results: this script writes a tar of /out (output.txt, rc, files the job left)
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /tmp
mount -o remount,rw /
mkdir -p /run/lock /var/run/openvswitch /job /out
hostname fabriclab-vm
ip link set lo up
for m in openvswitch veth sch_htb sch_netem sch_red sch_fq_codel tcp_dctcp; do
  modprobe "$m" || echo "fabriclab-init: modprobe $m failed" >&2
done
echo "fabriclab-init: kernel $(uname -r), $(nproc) cpus" >&2
tar -xf /dev/vdb -C /job || echo "fabriclab-init: no job on /dev/vdb" >&2
/usr/share/openvswitch/scripts/ovs-ctl start --system-id=random >/out/ovs-start.txt 2>&1
export FABRICLAB_OUT=/out PYTHONPATH=/job/project:/opt/fabriclab/site
if [ -f /job/job.sh ]; then
  (cd /job/project && bash /job/job.sh) 2>&1 | tee /out/output.txt
  echo "${PIPESTATUS[0]}" > /out/rc
else
  echo 3 > /out/rc
fi
echo "fabriclab-init: job exit $(cat /out/rc)" >&2
tar -cf /dev/vdc -C /out . && sync
echo o > /proc/sysrq-trigger
sleep 30
