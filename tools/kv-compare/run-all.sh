#!/usr/bin/env bash
# Runs every kv-compare workload for each engine, one engine at a time, and keeps the output.
# Usage: tools/kv-compare/run-all.sh DATA_DIR OUT_DIR [engines...]
# QUICK=1: only load, open, checkpoint and readers (a second sample of the timings).
# Needs root (the open test drops the page cache). Peak disk use: about 4 GB per engine;
# each engine's stores are deleted after its run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data=${1:?data dir}; out=${2:?output dir}; shift 2
engines=${*:-redb redb-qr fjall fjall-ingest lmdb}
INODES=${INODES:-1000000} CHURN=${CHURN:-100} CRASH_ROUNDS=${CRASH_ROUNDS:-10}
DATA_MB=${DATA_MB:-1024} DATA_BATCH_MB=${DATA_BATCH_MB:-64} DATA_CHURN=${DATA_CHURN:-24}
(cd "$here" && cargo build --release -q)
B=$here/target/release/kv-compare
mkdir -p "$data" "$out"
one() {
  local e=$1 d=$data/meta-$1
  rm -rf "$d" "$data/data-$e"
  echo "## $e ($(date -u +%FT%TZ), $(nproc) cores, $(uname -r)); load average: $(cat /proc/loadavg)"
  $B load --engine $e --dir "$d" --inodes $INODES --batch 100000
  $B open --engine $e --dir "$d"
  $B checkpoint --engine $e --dir "$d" --sizes 10000,100000 --reps 5
  $B readers --engine $e --dir "$d" --size 100000 --batches 3
  if [ -z "${QUICK:-}" ]; then
    $B churn --engine $e --dir "$d" --size 100000 --batches $CHURN
    $B open --engine $e --dir "$d"
    $B crash --engine $e --dir "$d" --rounds $CRASH_ROUNDS
    rm -rf "$d"
    $B data --engine $e --dir "$data/data-$e" --live-mb $DATA_MB --batch-mb $DATA_BATCH_MB --churn $DATA_CHURN
    rm -rf "$data/data-$e"
  fi
  rm -rf "$d"
  echo "# load average at the end: $(cat /proc/loadavg)"
}
for e in $engines; do
  one $e 2>&1 | tee "$out/$e.txt"
done
