#!/bin/bash
# Run from the repository root with the release binary built: OUT=DIR bash docs/results/scaling-16b/run.sh
# One device call: fsmark on the disk store in-process, and the mounts over io_uring and /dev/fuse.
set -u
L=$PWD/target/release/lanefs
O=${OUT:-/tmp/out}; mkdir -p $O
T=1,2,4,8,16
{ date -u; uname -a; nproc; grep -m1 'model name' /proc/cpuinfo; findmnt -no FSTYPE,SOURCE -T /tmp;
  echo "enable_uring: $(cat /sys/module/fuse/parameters/enable_uring 2>&1)"; } > $O/machine.txt 2>&1
cat $O/machine.txt
echo Y > /sys/module/fuse/parameters/enable_uring 2>/dev/null
echo "after: $(cat /sys/module/fuse/parameters/enable_uring 2>&1)" >> $O/machine.txt
W=$(mktemp -d /tmp/dr.XXXX)
# 1. in-process fsmark, disk store against ext4 and ext4 fast_commit.
timeout 110 $L bench fsmark --threads $T --api none --store $W/s1 --ext4 --repeat 2 > $O/fsmark.txt 2>&1
echo "fsmark exit $?" >> $O/fsmark.txt
# 2. memory-store mounts: io_uring and /dev/fuse, against tmpfs.
mkdir -p $W/bu $W/bd
timeout 20 $L mount $W/bu -o uring=on --background > $O/mount-uring.txt 2>&1; echo "uring mount exit $?" >> $O/mount-uring.txt
timeout 20 $L mount $W/bd -o uring=off --background >> $O/mount-uring.txt 2>&1
P="--path $W/bd --path /dev/shm"; grep -q "$W/bu" /proc/mounts && P="--path $W/bu $P"
timeout 150 $L bench crunl,fsmark --threads $T --locking none --api none $P --no-baseline --repeat 2 --seconds 1 > $O/mount.txt 2>&1
echo "mount bench exit $?" >> $O/mount.txt
$L stats $W/bu >> $O/mount.txt 2>&1; $L stats $W/bd >> $O/mount.txt 2>&1
umount $W/bu; umount $W/bd
# 3. disk-store mount over io_uring, fsmark against ext4 fast_commit.
mkdir -p $W/dm
timeout 20 $L mount --store $W/s2 $W/dm -o uring=auto --background > $O/diskmount.txt 2>&1
timeout 100 $L bench fsmark --threads $T --locking none --api none --path $W/dm --ext4 --no-baseline --repeat 2 >> $O/diskmount.txt 2>&1
echo "diskmount exit $?" >> $O/diskmount.txt
$L stats $W/dm >> $O/diskmount.txt 2>&1
umount $W/dm; rm -rf $W
