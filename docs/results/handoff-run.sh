#!/bin/bash
# io_uring with SCHED_IDLE queue threads (NEW) against the io_uring transport before it
# (OLD), /dev/fuse (NEW, uring=off) and tmpfs, per workload and thread count, in one run:
#   OLD=/path/to/old/lanefs NEW=target/release/lanefs bash docs/results/handoff-run.sh > raw.jsonl
# Mounts at /tmp/h-old, /tmp/h-new, /tmp/h-dev; lanefs stats deltas per cell. Memory stores,
# or with STORE=1 fresh disk stores under /tmp/h-stores (removed after); OPTS=ttl=0 adds
# mount options; EXT4=1 adds ext4 with and without fast_commit (loop files, `--ext4`).
set -eu
OLD=${OLD:?old lanefs binary}; NEW=${NEW:-target/release/lanefs}
WORKLOADS=${WORKLOADS:-crunl orc fsmark}; THREADS=${THREADS:-1 2 8 32}
echo Y > /sys/module/fuse/parameters/enable_uring
for m in h-old h-new h-dev; do mkdir -p /tmp/$m; umount /tmp/$m 2>/dev/null || true; done
o=${OPTS:+,$OPTS}
store() { if [ -n "${STORE:-}" ]; then rm -rf /tmp/h-stores/$1; mkdir -p /tmp/h-stores/$1; echo --store /tmp/h-stores/$1; fi; }
$OLD mount /tmp/h-old -o uring=on$o --background $(store old)
$NEW mount /tmp/h-new -o uring=on$o --background $(store new)
$NEW mount /tmp/h-dev -o uring=off$o --background $(store dev)
cell=$(mktemp)
for w in $WORKLOADS; do
 for t in $THREADS; do
  so=$($NEW stats --json /tmp/h-old); sn=$($NEW stats --json /tmp/h-new); sd=$($NEW stats --json /tmp/h-dev)
  $NEW bench $w --threads $t --locking none --api none --path /tmp/h-old --path /tmp/h-new \
      --path /tmp/h-dev --path /dev/shm ${EXT4:+--ext4} --repeat ${REPEAT:-3} --seconds ${SECONDS_:-2} --json 2>/dev/null | grep '^{' > $cell
  eo=$($NEW stats --json /tmp/h-old); en=$($NEW stats --json /tmp/h-new); ed=$($NEW stats --json /tmp/h-dev)
  python3 - "$w" "$t" "$cell" "$so" "$eo" "$sn" "$en" "$sd" "$ed" <<'PY'
import json,sys
w,t,cell=sys.argv[1],int(sys.argv[2]),sys.argv[3]
so,eo,sn,en,sd,ed=[json.loads(x) for x in sys.argv[4:10]]
cells=[json.loads(l) for l in open(cell)]
d=lambda a,b,k:(b.get(k) or 0)-(a.get(k) or 0)
srv=lambda a,b:{"requests":d(a,b,"requests"),"cpu_ns":d(a,b,"server_cpu_ns"),"boosts":d(a,b,"uring_boosts")}
print(json.dumps({"workload":w,"threads":t,"cells":cells,"old":srv(so,eo),"new":srv(sn,en),"dev":srv(sd,ed)}),flush=True)
PY
 done
done
rm -f $cell
for m in h-old h-new h-dev; do umount /tmp/$m; done
sleep 1; rm -rf /tmp/h-stores
