#!/bin/bash
# Resident memory of a lanefs server while a program stats every file of a large disk store
# once (Python's os.walk and os.stat, under `lanefs run`, so the kernel holds no inode), with
# the inode cache bounded (`-o inode_cache=$CACHE`) and with the default bound, after the
# kernel's caches are dropped before each mount; and the scan's rate.
# Usage (root): CACHE=64m ROUNDS=2 [OPTS="inode_cache=64m load=lazy"] scripts/inode-cache-bench.sh [STORE] [MNT]
# STORE is built by scripts/store-mount-bench.sh (default /var/tmp/lanefs-big) if missing.
set -euo pipefail
L=${LANEFS:-$(dirname "$0")/../target/release/lanefs}
STORE=${1:-/var/tmp/lanefs-big}
MNT=${2:-/mnt/lanefs-big}
CACHE=${CACHE:-64m} ROUNDS=${ROUNDS:-2}
if [ ! -e "$STORE/lanefs.store" ]; then
  ROUNDS=0 "$(dirname "$0")/store-mount-bench.sh" "$STORE" "$MNT"
fi
mkdir -p "$MNT"
wait_gone() { while pgrep -f "lanefs mount --store $STORE" >/dev/null; do sleep 0.1; done; }
for round in $(seq 1 "$ROUNDS"); do
  for opt in ${OPTS:-"inode_cache=$CACHE" "load=lazy"}; do
    sync; echo 3 > /proc/sys/vm/drop_caches
    "$L" mount --store "$STORE" -o "$opt" --background "$MNT"
    out=$("$L" run --mount "$MNT" -- python3 - "$MNT" <<'PY'
import os, sys, time
root = sys.argv[1]
n, t = 0, time.monotonic()
for d, _, files in os.walk(root):
    for f in files:
        os.stat(os.path.join(d, f))
        n += 1
print(f"{n} files stat'd in {time.monotonic() - t:.1f} s ({n / (time.monotonic() - t):.0f}/s)")
PY
)
    st=$("$L" stats "$MNT")
    r=$(echo "$st" | grep -oE "resident memory [0-9.]+ [KMG]iB")
    c=$(echo "$st" | grep -oE "inodes in memory .*")
    e=$(echo "$st" | grep -oE "[0-9]+ evicted since")
    printf 'round %s -o %s: %s; after it: server %s, %s, %s\n' "$round" "$opt" "$out" "$r" "$c" "$e"
    umount "$MNT"; wait_gone
  done
done
