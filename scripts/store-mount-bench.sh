#!/bin/bash
# Mount time and resident memory of a large disk store, opened lazily (the default) and
# whole (`-o load=whole`), with the kernel's caches dropped before each mount.
# Usage (root): DIRS=2000 FILES=1000 ROUNDS=3 scripts/store-mount-bench.sh [STORE] [MNT]
# Builds STORE (default /var/tmp/lanefs-big) once, through `lanefs run`, if it is missing.
set -euo pipefail
L=${LANEFS:-$(dirname "$0")/../target/release/lanefs}
STORE=${1:-/var/tmp/lanefs-big}
MNT=${2:-/mnt/lanefs-big}
DIRS=${DIRS:-2000} FILES=${FILES:-1000} ROUNDS=${ROUNDS:-3}
mkdir -p "$MNT"
wait_gone() { while pgrep -f "lanefs mount --store $STORE" >/dev/null; do sleep 0.1; done; }
if [ ! -e "$STORE/lanefs.store" ]; then
  "$L" mount --store "$STORE" --background "$MNT"
  "$L" run --mount "$MNT" -- python3 - "$MNT" "$DIRS" "$FILES" <<'PY'
import os, sys
root, dirs, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for d in range(dirs):
    os.mkdir(f"{root}/d{d}")
    for f in range(files):
        os.close(os.open(f"{root}/d{d}/f{f}", os.O_CREAT | os.O_WRONLY, 0o644))
PY
  umount "$MNT"; wait_gone
  "$L" compact "$STORE"
fi
for round in $(seq 1 "$ROUNDS"); do
  for load in lazy whole; do
    sync; echo 3 > /proc/sys/vm/drop_caches
    s=$(date +%s.%N)
    "$L" mount --store "$STORE" -o load=$load --background "$MNT"
    e=$(date +%s.%N)
    r=$("$L" stats "$MNT" | grep -oE "resident memory [0-9.]+ [KMG]iB")
    s2=$(date +%s.%N); stat "$MNT/d$((DIRS - 1))/f$((FILES - 1))" >/dev/null; e2=$(date +%s.%N)
    r2=$("$L" stats "$MNT" | grep -oE "resident memory [0-9.]+ [KMG]iB")
    printf 'round %s load=%s: mount %.2f s, %s; first stat 2 levels down %.3f s, then %s\n' \
      "$round" "$load" "$(echo "$e - $s" | bc)" "$r" "$(echo "$e2 - $s2" | bc)" "$r2"
    umount "$MNT"; wait_gone
  done
done
