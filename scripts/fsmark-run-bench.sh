#!/usr/bin/env bash
# fsmark (create, fsync, close: fs_mark -s0; bench/c/seedbench.c) on a disk-store mount,
# through the kernel and under `lanefs run`, against ext4 with fast_commit, in one run
# (docs/BENCHMARKS.md, "Unmodified programs"). Run as root: it makes two ext4 filesystems
# on loop files under /var/tmp (one plain, holding the lanefs store; one with fast_commit,
# the kernel's own case), so both sides flush to the same disk.
#
#     scripts/fsmark-run-bench.sh
#     THREADS="1 8" ROUNDS=5 SECS=2 scripts/fsmark-run-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${THREADS:-1 2 8}"
SECS="${SECS:-1}"
ROUNDS="${ROUNDS:-3}"
SIZE="${SIZE:-4G}"
cargo build --release --locked -q -p lanefs-cli -p lanefs-client
bin=target/release/seedbench
cc -O2 -pthread -o "$bin" bench/c/seedbench.c
lanefs=target/release/lanefs
work=$(mktemp -d -p /var/tmp)
mkdir "$work/plain" "$work/fc" "$work/mnt"
cleanup() {
    umount -l "$work/mnt" 2>/dev/null || true
    umount "$work/plain" "$work/fc" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
truncate -s "$SIZE" "$work/plain.img" "$work/fc.img"
mkfs.ext4 -q -F "$work/plain.img"
mkfs.ext4 -q -F -O fast_commit "$work/fc.img"
mount -o loop "$work/plain.img" "$work/plain"
mount -o loop "$work/fc.img" "$work/fc"
$lanefs mount --background --store "$work/plain/store" "$work/mnt"

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
one() { # kind dir workers -> files/s
    local kind=$1 d=$2 t=$3
    rm -rf "$d" && mkdir -p "$d" && sync
    if [ "$kind" = run ]; then
        $lanefs run -- $bin fsmark "$d" "$t" "$SECS" threads | awk '{print $4}'
    else
        $bin fsmark "$d" "$t" "$SECS" threads | awk '{print $4}'
    fi
}
printf '%3s %14s %14s %14s %12s %12s\n' T ext4-fc lanefs-kernel lanefs-run run/ext4fc run/kernel
for t in $THREADS; do
    : > /tmp/fm.fc; : > /tmp/fm.kernel; : > /tmp/fm.run
    for _ in $(seq "$ROUNDS"); do
        one plain "$work/fc/x" "$t" >> /tmp/fm.fc
        one plain "$work/mnt/k" "$t" >> /tmp/fm.kernel
        one run "$work/mnt/r" "$t" >> /tmp/fm.run
    done
    a=$(median < /tmp/fm.fc); b=$(median < /tmp/fm.kernel); c=$(median < /tmp/fm.run)
    printf '%3s %14s %14s %14s %12.2f %12.2f\n' "$t" "$a" "$b" "$c" \
        "$(echo "$c / $a" | bc -l)" "$(echo "$c / $b" | bc -l)"
done
