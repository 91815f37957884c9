"""Wall and CPU time (user + system) of commands pinned to given cores, and the lower bound the
CPU time sets on wall time.

    python3 docs/bench/cpu_bound.py CPUS RUNS -- CMD_A... -- CMD_B...
        e.g. python3 docs/bench/cpu_bound.py 2,3 5 -- memsnap summary --json giant.pickle \
                 -- memsnap analyze --json giant.pickle

Runs the commands alternately (one warm-up each, not counted) under `taskset -c CPUS`, takes each
run's CPU time from the kernel (`os.wait4`), and prints per command the median wall time, user
and system CPU, and CPU / cores: no schedule on those cores can finish in less. With two
commands it also prints B's bound over A's median wall time, which is the best B / A ratio any
parallel schedule of B's current work could reach (docs/performance.md, issue 12's
"analyze <= 1.3x summary").
"""
import os
import statistics
import subprocess
import sys
import time


def once(cpus, cmd):
    t = time.perf_counter()
    p = subprocess.Popen(["taskset", "-c", cpus, *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    err = p.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {cmd}: {err[-300:]!r}")
    return wall, ru.ru_utime, ru.ru_stime, ru.ru_maxrss


def main():
    cpus, runs = sys.argv[1], int(sys.argv[2])
    cmds, cur = [], None
    for a in sys.argv[3:]:
        if a == "--":
            cur = []
            cmds.append(cur)
        else:
            cur.append(a)
    cores = len(cpus.split(","))
    for c in cmds:
        once(cpus, c)
    rows = [[] for _ in cmds]
    for _ in range(runs):
        for i, c in enumerate(cmds):
            rows[i].append(once(cpus, c))
    med = []
    for c, r in zip(cmds, rows):
        wall = statistics.median(x[0] for x in r)
        user = statistics.median(x[1] for x in r)
        sys_ = statistics.median(x[2] for x in r)
        rss = max(x[3] for x in r) / 1024
        med.append((wall, user + sys_))
        print(
            f"{' '.join(c)}: wall {wall:.3f} s, user {user:.3f} s, sys {sys_:.3f} s, "
            f"cpu/{cores} cores {(user + sys_) / cores:.3f} s, peak RSS {rss:.0f} MiB",
            flush=True,
        )
    if len(med) == 2:
        (wa, _), (wb, cb) = med
        print(f"B / A: {wb / wa:.3f}; B's CPU bound / A's wall: {cb / cores / wa:.3f}", flush=True)


if __name__ == "__main__":
    main()
