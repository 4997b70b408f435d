#!/bin/bash
set -u
L=$PWD/target/release/lanefs; O=$OUT
echo Y > /sys/module/fuse/parameters/enable_uring
W=$(mktemp -d /tmp/dm.XXXX); mkdir -p $W/bu $W/bd
$L mount $W/bu -o uring=on --background; $L mount $W/bd -o uring=off --background
{ $L stats --json $W/bu; $L stats --json $W/bd
  timeout 100 $L bench fsmark --threads 1,2,4,8,16 --locking none --api none --path $W/bu --path $W/bd --path /dev/shm --no-baseline --repeat 1 --seconds 1 2>&1
  echo "exit $?"; $L stats --json $W/bu; $L stats --json $W/bd; } > $O/fsmark.txt
umount $W/bu; umount $W/bd
