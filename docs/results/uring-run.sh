#!/bin/bash
# io_uring vs /dev/fuse vs tmpfs, per workload and thread count, with lanefs stats deltas.
L=/work/wt-uring/target/release/lanefs
out=/tmp/bench/raw.jsonl; : > $out
for w in crunl fsmark; do
 for t in 1 2 8 32; do
  su=$($L stats --json /tmp/bu); sd=$($L stats --json /tmp/bd)
  $L bench $w --threads $t --locking none --api none --path /tmp/bu --path /tmp/bd --path /dev/shm --repeat 3 --seconds 2 --json 2>/dev/null | grep '^{' > /tmp/bench/cell.jsonl
  eu=$($L stats --json /tmp/bu); ed=$($L stats --json /tmp/bd)
  python3 - "$w" "$t" "$su" "$eu" "$sd" "$ed" >> $out <<'PY'
import json,sys
w,t=sys.argv[1],int(sys.argv[2])
su,eu,sd,ed=[json.loads(x) for x in sys.argv[3:7]]
cells=[json.loads(l) for l in open('/tmp/bench/cell.jsonl')]
for c in cells: c['workload_']=w
d=lambda a,b,k:b[k]-a[k]
print(json.dumps({"workload":w,"threads":t,"cells":cells,
 "uring":{"requests":d(su,eu,"requests"),"cpu_ns":d(su,eu,"server_cpu_ns")},
 "dev":{"requests":d(sd,ed,"requests"),"cpu_ns":d(sd,ed,"server_cpu_ns")}}))
PY
 done
done
