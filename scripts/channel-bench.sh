#!/usr/bin/env bash
# Unmodified programs on three paths, side by side in one run: a kernel tmpfs, a lanefs mount
# through the kernel, and the same mount under `lanefs run` (docs/BENCHMARKS.md, "Unmodified
# programs"). The program is bench/c/seedbench.c, which makes the seed workloads with libc
# calls only. Run as root (it mounts).
#
#     scripts/channel-bench.sh            # defaults below; override with the variables
#     WORKLOADS="crunl stat" THREADS="1 2" MODE=procs SECS=2 ROUNDS=5 scripts/channel-bench.sh
#     RUN_FLAGS=--warm-stat WORKLOADS=stat scripts/channel-bench.sh   # flags of `lanefs run`
#
# Prints, per workload and worker count, the median ops/s of ROUNDS rounds (the paths take
# turns within each round) and the ratios the issue's targets name. A fourth path, the same
# tmpfs under `lanefs run` (outside any lanefs mount: the client's prefix check only), gives
# the client's cost to calls it does not serve (`outside/tmpfs`).
set -euo pipefail
cd "$(dirname "$0")/.."
WORKLOADS="${WORKLOADS:-crunl rndrename stat orc}"
THREADS="${THREADS:-1 2 8 32}"
MODE="${MODE:-threads}"
SECS="${SECS:-1}"
ROUNDS="${ROUNDS:-3}"
RUN_FLAGS="${RUN_FLAGS:-}"
cargo build --release --locked -q -p lanefs-cli -p lanefs-client
cc -O2 -pthread -o target/release/seedbench bench/c/seedbench.c
lanefs=target/release/lanefs
bin=target/release/seedbench
mnt=$(mktemp -d)
shm=$(mktemp -d -p /dev/shm)
$lanefs mount --background "$mnt"
trap 'umount -l "$mnt"; rmdir "$mnt"; rm -rf "$shm"' EXIT

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
one() { # path-kind dir workload workers -> ops/s
    local kind=$1 d=$2 w=$3 t=$4
    rm -rf "$d" && mkdir -p "$d"
    if [ "$kind" = run ] || [ "$kind" = outside ]; then
        $lanefs run $RUN_FLAGS -- $bin "$w" "$d" "$t" "$SECS" "$MODE" | awk '{print $4}'
    else
        $bin "$w" "$d" "$t" "$SECS" "$MODE" | awk '{print $4}'
    fi
}
printf '%-10s %3s %12s %12s %12s %12s %10s %10s %14s\n' workload T tmpfs kernel lanefs-run outside run/tmpfs run/kernel outside/tmpfs
for w in $WORKLOADS; do
    for t in $THREADS; do
        : > /tmp/cb.tmpfs; : > /tmp/cb.kernel; : > /tmp/cb.run; : > /tmp/cb.outside
        for _ in $(seq "$ROUNDS"); do
            one tmpfs "$shm/x" "$w" "$t" >> /tmp/cb.tmpfs
            one kernel "$mnt/k" "$w" "$t" >> /tmp/cb.kernel
            one run "$mnt/r" "$w" "$t" >> /tmp/cb.run
            one outside "$shm/o" "$w" "$t" >> /tmp/cb.outside
        done
        a=$(median < /tmp/cb.tmpfs); b=$(median < /tmp/cb.kernel); c=$(median < /tmp/cb.run)
        o=$(median < /tmp/cb.outside)
        printf '%-10s %3s %12s %12s %12s %12s %10.2f %10.2f %14.3f\n' "$w" "$t" "$a" "$b" "$c" "$o" \
            "$(echo "$c / $a" | bc -l)" "$(echo "$c / $b" | bc -l)" "$(echo "$o / $a" | bc -l)"
    done
done
