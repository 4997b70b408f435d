#!/usr/bin/env bash
# Two builds of lanefs side by side under `lanefs run`, for the before and after of a change
# to the server or the client: each build mounts its own memory store, and the rounds
# alternate between them (docs/BENCHMARKS.md, "Unmodified programs"). Run as root.
#
#     scripts/channel-ab.sh BASE_RELEASE_DIR NEW_RELEASE_DIR
#     WORKLOADS="crunl" THREADS="1 2" ROUNDS=5 SECS=1 scripts/channel-ab.sh /old/target/release target/release
#
# Each directory holds a release build's `lanefs` and `liblanefs_client.so` (`cargo build
# --release -p lanefs-cli -p lanefs-client` in each checkout). Prints the median ops/s of
# each build per workload and thread count, their ratio, and the new build's report
# counters (`lanefs stats`).
set -euo pipefail
cd "$(dirname "$0")/.."
A=$(realpath "$1"); B=$(realpath "$2")
WORKLOADS="${WORKLOADS:-crunl rndrename}"
THREADS="${THREADS:-1 2 8}"
SECS="${SECS:-1}"
ROUNDS="${ROUNDS:-5}"
bin=$(mktemp)
cc -O2 -pthread -o "$bin" bench/c/seedbench.c
ma=$(mktemp -d); mb=$(mktemp -d)
"$A/lanefs" mount --background "$ma"
"$B/lanefs" mount --background "$mb"
trap 'umount -l "$ma"; umount -l "$mb"; rmdir "$ma" "$mb"; rm -f "$bin"' EXIT
one() { # build dir workload workers -> ops/s
    rm -rf "$2" && mkdir -p "$2"
    "$1/lanefs" run -- "$bin" "$3" "$2" "$4" "$SECS" threads | awk '{print $4}'
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-10s %3s %10s %10s %8s\n' workload T base new new/base
for w in $WORKLOADS; do
    for t in $THREADS; do
        : > /tmp/ab.base; : > /tmp/ab.new
        for _ in $(seq "$ROUNDS"); do
            one "$A" "$ma/x" "$w" "$t" >> /tmp/ab.base
            one "$B" "$mb/x" "$w" "$t" >> /tmp/ab.new
        done
        a=$(median < /tmp/ab.base); b=$(median < /tmp/ab.new)
        printf '%-10s %3s %10s %10s %8.2f\n' "$w" "$t" "$a" "$b" "$(echo "$b / $a" | bc -l)"
    done
done
"$B/lanefs" stats --json "$mb" | python3 -c 'import json, sys; s = json.load(sys.stdin)
print("new build:", {k: s.get(k) for k in ("transport", "channel_requests",
      "report_entry_invalidations", "report_names_unlocked")})'
