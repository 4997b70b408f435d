#!/bin/bash
# Scaling runs for a many-core machine: every workload at T=1..16 (and 32), side by side with
# the "before" locking modes and the kernel on the same machine, in one go.
#
# usage: scripts/scaling.sh LANEFS_BINARY OUTDIR
#   THREADS (default 1,2,4,8,16; crunl adds 32) and REPEAT (default 3) override the sizes; each step has
#   its own time limit, so one slow step cannot take the others' time.
# Writes OUTDIR/results.jsonl (a {"step": ...} line, then that step's JSON cells),
# OUTDIR/tables.txt (the tables) and OUTDIR/machine.txt (what the machine is and has).
set -u
bin=$(realpath "$1")
out=$2
threads=${THREADS:-1,2,4,8,16}
repeat=${REPEAT:-3}
mkdir -p "$out"
work=$(mktemp -d /tmp/lanefs-scaling.XXXXXX)
mnt=$work/mnt

{
	date -u
	uname -a
	nproc
	grep -m1 'model name' /proc/cpuinfo
	grep -E 'MemTotal' /proc/meminfo
	ls -l /dev/fuse 2>&1
	command -v mkfs.ext4 losetup fs_mark 2>&1
	df -h /tmp /dev/shm 2>&1
	findmnt -no FSTYPE,SOURCE -T /tmp 2>&1
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"

# step NAME SECONDS ARGS...: one `lanefs bench` run under a time limit.
step() {
	local name=$1 limit=$2
	shift 2
	echo "{\"step\":\"$name\",\"args\":\"$*\"}" >>"$out/results.jsonl"
	echo "== $name: lanefs bench $*" | tee -a "$out/tables.txt"
	local t0=$SECONDS
	timeout "$limit" "$bin" bench "$@" --json >>"$out/results.jsonl" 2>>"$out/tables.txt"
	echo "== $name: exit $?, $((SECONDS - t0)) s" | tee -a "$out/tables.txt"
}

# Seed 003 in memory: lanes against the kernel-before-pdirops and one-lock modes and the
# kernel's tmpfs through system calls.
step crunl 150 crunl --threads "$threads,32" --locking lanes,dirlock,coarse --path /dev/shm \
	--repeat "$repeat"
# The disk store without fsync against the memory store, in one run.
step store 110 crunl,rndrename --threads "$threads" --locking lanes --store "$work" \
	--no-baseline --repeat 2
# Seed 001: fsync of new files on the disk store against ext4 with and without fast_commit.
step fsmark 100 fsmark --threads "$threads" --api none --store "$work" --ext4 --repeat 2
# Seeds 003 (rename), 000 (cold stat scan) and 004 (open/read/close), before and after.
step seeds 110 rndrename,fstree,orc --compare --threads "$threads" --repeat 2
# Through the FUSE mount (memory store) against the kernel's tmpfs, when the machine has FUSE.
mkdir -p "$mnt"
if timeout 20 "$bin" mount --background "$mnt"; then
	step mount 80 crunl,fsmark --threads "$threads" --locking none --path "$mnt" --path /dev/shm \
		--no-baseline --repeat 2
	umount "$mnt" || umount -l "$mnt"
else
	echo "== mount: no FUSE mount on this machine" | tee -a "$out/tables.txt"
fi
rm -rf "$work"
