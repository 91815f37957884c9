#!/bin/bash
# `summary --json` of the 87 MB bench file on 1, 2, 4, 8 and 16 cores: the median wall time of 7
# runs of two builds, and Python's pickle.load, for machines without farm-bench (the GPU
# machine reached through `device`, as in docs/performance.md, "Figures of 2026-12-04, later").
#
#     bash docs/bench/huge_by_cores.sh DIR
#         DIR: holds memsnap-new and memsnap-base (binaries) and huge_python_stacks.pickle.xz
set -e
cd "$1"
xz -dkc huge_python_stacks.pickle.xz > /tmp/huge.pickle
nproc; lscpu | grep 'Model name'
med() { python3 -c "import sys,statistics; print('%.3f' % statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
for n in 1 2 4 8 16; do
  cpus="0-$((n-1))"
  for b in new base; do
    ts=()
    for i in 1 2 3 4 5 6 7; do
      s=$(date +%s.%N); RAYON_NUM_THREADS=$n taskset -c $cpus ./memsnap-$b summary --json /tmp/huge.pickle > /dev/null; e=$(date +%s.%N)
      ts+=($(python3 -c "print($e-$s)"))
    done
    echo "cores=$n $b median $(med ${ts[@]}) s"
  done
done
for i in 1 2 3; do s=$(date +%s.%N); taskset -c 0 python3 -c "import pickle; pickle.load(open('/tmp/huge.pickle','rb'))"; e=$(date +%s.%N); python3 -c "print('pickle.load', $e-$s)"; done
/usr/bin/time -f "new 2 cores peak %M KB" env RAYON_NUM_THREADS=2 taskset -c 0-1 ./memsnap-new summary --json /tmp/huge.pickle > /dev/null
/usr/bin/time -f "new 16 cores peak %M KB" ./memsnap-new summary --json /tmp/huge.pickle > /dev/null
