#!/bin/bash
# guest-krbd.sh — copied as run.sh into the guest's 9p share (/mnt/host); host-run.service
# runs it once after boot. Installs the udev rules, runs the krbd real-kernel test binary,
# writes results to /mnt/host/out, unmaps anything left and powers off.
H=/mnt/host; O=$H/out; mkdir -p $O
exec > >(tee $O/guest.log) 2>&1
. $H/env
echo "[up $(cut -d' ' -f1 /proc/uptime)s] guest $(uname -r), /sys/bus/rbd before: $(ls -d /sys/bus/rbd 2>&1)"
ip addr add "$GUEST_IP" dev eth0 && ip link set eth0 up
install -m 0644 $H/60-rbd-owner.rules /etc/udev/rules.d/60-rbd-owner.rules
udevadm control --reload
ping -c1 -W5 "${RBD_OWNER_KRBD_MON%:*}" | tail -1
cp $H/krbd.test /tmp/krbd.test
cd /tmp
# twice: with udevd's events (the default when udevd runs), then with the kernel's own
rc=0
for ev in udev kernel; do
  timeout -k 10 300 env RBD_OWNER_KRBD_REAL=1 RBD_OWNER_KRBD_EVENTS=$ev RBD_OWNER_KRBD_MON="$RBD_OWNER_KRBD_MON" \
    RBD_OWNER_KRBD_USER="$RBD_OWNER_KRBD_USER" RBD_OWNER_KRBD_KEYRING=$H/keyring \
    RBD_OWNER_KRBD_FSID="$RBD_OWNER_KRBD_FSID" RBD_OWNER_KRBD_IMAGES="$RBD_OWNER_KRBD_IMAGES" \
    ./krbd.test -test.run '^TestRealKernel$' -test.v -test.count=1 -test.timeout 280s >> $O/test.log 2>&1 || rc=1
done
echo "test rc=$rc"
tail -n +1 $O/test.log
# the test unmaps everything; never power off with a device still mapped (hangs without the cluster)
for d in /sys/bus/rbd/devices/*; do
  [ -e "$d" ] && { echo "LEFT MAPPED: ${d##*/}"; echo "${d##*/} force" > /sys/bus/rbd/remove_single_major; }
done
dmesg | grep -E 'rbd|libceph' > $O/dmesg.txt
echo $rc > $O/rc
sync
systemctl poweroff -ff
