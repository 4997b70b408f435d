#!/bin/bash
set -u
L=$PWD/target/release/lanefs; O=$OUT
echo Y > /sys/module/fuse/parameters/enable_uring
W=$(mktemp -d /tmp/dm.XXXX); mkdir -p $W/bu $W/bd
$L mount $W/bu -o uring=on --background; $L mount $W/bd -o uring=off --background
for w in crunl fsmark; do
  $L stats --json $W/bu > $O/$w-u0.json; $L stats --json $W/bd > $O/$w-d0.json
  timeout 130 $L bench $w --threads 1,2,4,8,16 --locking none --api none --path $W/bu --path $W/bd --path /dev/shm --no-baseline --repeat 1 --seconds 1 > $O/$w.txt 2>&1
  echo "exit $?" >> $O/$w.txt
  $L stats --json $W/bu > $O/$w-u1.json; $L stats --json $W/bd > $O/$w-d1.json
done
umount $W/bu; umount $W/bd
