#!/bin/bash
# The seed's shape: P fs_mark processes, each in its own directory, -s0 -S5 -D dirs -n files.
M=$1; P=$2
for i in $(seq 1 $P); do mkdir -p $M/s$i; done
start=$(date +%s.%N)
for i in $(seq 1 $P); do (cd /tmp && fs_mark -d $M/s$i -s 0 -S 5 -D 16 -n 2000 -L 1 > /tmp/seedfm.$i.log 2>&1) & done
wait
end=$(date +%s.%N)
python3 -c "print(f'{$P*2000/($end-$start):.0f} files/s over all $P processes')"
for i in $(seq 1 $P); do rm -rf $M/s$i; done
