#!/bin/bash
# tests/lab/cmdloop.sh — the lab's command channel, guest side (runs as the transient unit
# lab-cmd.service, started by guest.sh). The host drops a script into /mnt/host/cmd/ID.sh
# (written elsewhere, then renamed into place); this loop claims it (rename to run/ID.sh), runs it
# as root with bash in the background, and leaves out/ID.out (stdout+stderr) and, last, out/ID.rc
# (the exit status; renamed into place, so its presence means the output is complete).
# Polls every 0.1 s without forking (read -t on a private fifo).
H=/mnt/host
mkdir -p $H/cmd $H/run $H/out
fifo=/run/lab-cmd.fifo; rm -f $fifo; mkfifo $fifo; exec 9<>$fifo
printf 'boot_id=%s\nuptime=%s\n' "$(cat /proc/sys/kernel/random/boot_id)" "$(cut -d' ' -f1 /proc/uptime)" > $H/out/.ready
mv $H/out/.ready $H/out/ready
shopt -s nullglob
while :; do
  for f in "$H"/cmd/*.sh; do
    id=${f##*/}; id=${id%.sh}
    mv "$f" "$H/run/$id.sh" 2>/dev/null || continue
    ( cd /root || exit; bash "$H/run/$id.sh" > "$H/out/$id.out" 2>&1 < /dev/null
      echo $? > "$H/out/.$id.rc"; mv "$H/out/.$id.rc" "$H/out/$id.rc" ) &
  done
  read -r -t 0.1 -u 9
done
