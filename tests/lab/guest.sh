#!/bin/bash
# tests/lab/guest.sh — copied as run.sh into each lab guest's own 9p share (/mnt/host);
# the image's host-run.service runs it after EVERY boot (a reboot runs it again).
#
# First boot: static address from node.env (systemd-networkd, so it is back by itself after a
# reboot, before rbd-owner.service starts), /etc/ceph/ceph.conf + the agent's keyring (0600) for
# the rbd CLI, /etc/rbd-owner/config.yaml written by the lab, then `dpkg -i` of the freshly built
# .deb: its postinst enables and starts rbd-owner.socket and rbd-owner.service (real units, real
# udev rules). Every boot: start the command loop (tests/lab/cmdloop.sh) as a transient unit and
# report out/ready (boot id, uptime).
H=/mnt/host; O=$H/out; mkdir -p "$O"
exec >> "$O/setup.log" 2>&1
ts() { echo "[up $(cut -d' ' -f1 /proc/uptime)s] $*"; }
# shellcheck source=/dev/null  # written by the host into the guest's share at run time
. $H/node.env    # NODE_ID GUEST_IP MON_HOST MAP_OPTS
ts "run.sh: $NODE_ID boot $(cat /proc/sys/kernel/random/boot_id) kernel $(uname -r)"
rm -f "$O/ready"
if [ ! -e /etc/systemd/network/10-lab.network ]; then
  # (not hostnamectl: activating systemd-hostnamed costs seconds under TCG)
  echo "$NODE_ID" > /etc/hostname
  hostname "$NODE_ID"
  printf '127.0.1.1 %s\n' "$NODE_ID" >> /etc/hosts
  mkdir -p /etc/systemd/network
  printf '[Match]\nName=eth0\n[Network]\nAddress=%s\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n' "$GUEST_IP" \
    > /etc/systemd/network/10-lab.network
  # networkd brings the address back after a reboot (before rbd-owner.service: network-online);
  # this boot gets it right away. --no-reload: the .deb's postinst reloads systemd below (each
  # reload reruns the generators: 5-17 s under TCG)
  systemctl enable --no-reload systemd-networkd.service systemd-networkd-wait-online.service 2>&1 | grep -v Created
  # eth0 appears once udev's coldplug has loaded virtio_net, which may be after this unit starts
  for _ in $(seq 1200); do [ -e /sys/class/net/eth0 ] && break; sleep 0.1; done
  ip addr add "$GUEST_IP" dev eth0; ip link set eth0 up
  ts "eth0 $(ip -4 -br addr show eth0 | tr -s ' ')"
  # the host writes the agent's keyring once the cluster is up (it starts while the guests boot)
  for _ in $(seq 1200); do [ -s $H/keyring ] && break; sleep 0.1; done
  mkdir -p /etc/ceph
  install -m 0600 $H/keyring /etc/ceph/ceph.client.rbdowner.keyring
  # the rbd CLI's maps (the e2e's maps behind the agent's back) get the lab's krbd options too
  printf '[global]\nmon_host = %s\n' "$MON_HOST" > /etc/ceph/ceph.conf
  [ -z "$MAP_OPTS" ] || printf 'rbd_default_map_options = %s\n' "$MAP_OPTS" >> /etc/ceph/ceph.conf
  mkdir -p /etc/rbd-owner
  install -m 0644 $H/config.yaml /etc/rbd-owner/config.yaml
  # the lab's short fence_expiry (tests/lab/lib.sh) is allowed only under this switch
  mkdir -p /etc/systemd/system/rbd-owner.service.d
  printf '[Service]\nEnvironment=RBD_OWNER_TEST_SHORT_FENCES=1\n' > /etc/systemd/system/rbd-owner.service.d/lab.conf
  a=$(date +%s%N)
  DEBIAN_FRONTEND=noninteractive dpkg -i --force-confdef --force-confold $H/rbd-owner.deb
  rc=$?
  ts "dpkg -i rc=$rc in $(( ($(date +%s%N) - a) / 1000000 )) ms"
  echo "$rc" > "$O/dpkg.rc"
fi
# the command loop; a transient unit so that this oneshot ends and boot completes
systemctl stop lab-cmd.service 2>/dev/null
systemd-run --unit=lab-cmd --collect --quiet -p KillMode=mixed /bin/bash $H/cmdloop.sh
ts "command loop started"
