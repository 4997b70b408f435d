#!/usr/bin/env bash
# A disk-store mount holding more file data than its process may use: the server runs in a
# memory cgroup (v1 here) limited to LIMIT; DATA of files is written through the mount with
# fsync, then read back and checked; peak RSS from /proc/PID/status (VmHWM).
set -euo pipefail
BIN=${BIN:-target/release/lanefs}  # run from the repository root, as root
LIMIT=${LIMIT:-512M}; FILES=${FILES:-6}; MB=${MB:-512}
store=/tmp/rss-store; mnt=/tmp/rss-mnt
umount $mnt 2>/dev/null || true; rm -rf $store; mkdir -p $mnt
cg=$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup); cgd=/sys/fs/cgroup/memory$cg/lanefs-rss
mkdir -p $cgd; echo $LIMIT > $cgd/memory.limit_in_bytes
sh -c "echo \$\$ > $cgd/cgroup.procs; exec $BIN mount --store $store $mnt -o cache=64M" &
for i in $(seq 50); do mountpoint -q $mnt && break; sleep 0.2; done
pid=$(pgrep -f "mount --store $store" | head -1)
t0=$(date +%s.%N)
for i in $(seq $FILES); do
  head -c $((MB<<20)) /dev/urandom > /tmp/rss-src 2>/dev/null || true
  dd if=/tmp/rss-src of=$mnt/f$i bs=1M conv=fsync status=none
  sum[$i]=$(sha256sum < /tmp/rss-src | cut -c1-16)
  echo "wrote f$i: $(grep -E 'VmRSS|VmHWM' /proc/$pid/status | tr -s ' \n' ' ')"
done
t1=$(date +%s.%N)
sync; echo 3 > /proc/sys/vm/drop_caches
ok=0
for i in $(seq $FILES); do
  s=$(sha256sum < $mnt/f$i | cut -c1-16); [ "$s" = "${sum[$i]}" ] && ok=$((ok+1)) || echo "f$i differs"
done
t2=$(date +%s.%N)
echo "files: $FILES x $MB MiB; checked ok: $ok; cgroup limit $LIMIT; failcnt $(cat $cgd/memory.failcnt); max_usage $(( $(cat $cgd/memory.max_usage_in_bytes) >> 20 )) MiB"
grep -E 'VmRSS|VmHWM' /proc/$pid/status
$BIN stats $mnt 2>/dev/null | head -20 || true
du -sh $store $store/* 2>/dev/null
echo "write s: $(echo "$t1-$t0" | bc); read+check s: $(echo "$t2-$t1" | bc)"
umount $mnt; sleep 1; rmdir $cgd 2>/dev/null || true
