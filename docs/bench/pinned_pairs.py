"""Paired, alternated timings of memsnap builds and Python's pickle.load on pinned CPUs.

For machines without farm-bench (the GPU machine reached through `device`), as used for the
"Figures of 2026-12-02, evening" in docs/performance.md:

    python3 docs/bench/pinned_pairs.py DIR CPUS
        DIR: holds memsnap-base, memsnap-new (binaries), huge.pickle, giant.pickle and
             huge_python_stacks.pickle.xz (the bench files of ../shared/bench, unpacked)
        CPUS: the cores for "two cores", e.g. 2,3 (check they are not SMT siblings:
              /sys/devices/system/cpu/cpuN/topology/thread_siblings_list); the first of them
              alone is "one core"

Each pair runs A then B; the ratio is taken pair by pair and its median printed, with the
median and minimum of each side. One warm-up run of each command is not counted.
"""
import os
import statistics
import subprocess
import sys
import time


def run(cmd):
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"failed: {cmd}: {r.stderr[-300:]!r}")
    return dt


def pair(label, a, b, n):
    run(a)
    run(b)
    ta, tb, ratios = [], [], []
    for _ in range(n):
        x, y = run(a), run(b)
        ta.append(x)
        tb.append(y)
        ratios.append(x / y)
    print(
        f"{label}: A median {statistics.median(ta):.3f} s (min {min(ta):.3f}), "
        f"B median {statistics.median(tb):.3f} s (min {min(tb):.3f}), "
        f"A/B median of pairs {statistics.median(ratios):.3f}",
        flush=True,
    )


def main():
    d, cpus = sys.argv[1], sys.argv[2]
    two = ["taskset", "-c", cpus]
    one = ["taskset", "-c", cpus.split(",")[0]]
    base, new = os.path.join(d, "memsnap-base"), os.path.join(d, "memsnap-new")
    huge, giant = os.path.join(d, "huge.pickle"), os.path.join(d, "giant.pickle")
    huge_xz = os.path.join(d, "huge_python_stacks.pickle.xz")
    py = two + [sys.executable, "-c", f"import pickle; pickle.load(open({huge!r}, 'rb'))"]

    def ms(binary, command, path, cores=two):
        return cores + [binary, command, "--json", path]

    pair("huge: pickle.load vs new summary", py, ms(new, "summary", huge), 7)
    pair("huge: new vs base summary", ms(new, "summary", huge), ms(base, "summary", huge), 9)
    pair("huge.xz: new vs base summary", ms(new, "summary", huge_xz), ms(base, "summary", huge_xz), 5)
    pair("giant: new vs base summary", ms(new, "summary", giant), ms(base, "summary", giant), 3)
    pair("giant: new vs base analyze", ms(new, "analyze", giant), ms(base, "analyze", giant), 3)
    pair("giant: new analyze vs new summary", ms(new, "analyze", giant), ms(new, "summary", giant), 3)
    pair("giant: new summary, 2 cores vs 1", ms(new, "summary", giant), ms(new, "summary", giant, one), 3)
    pair("giant: new analyze, 2 cores vs 1", ms(new, "analyze", giant), ms(new, "analyze", giant, one), 3)


if __name__ == "__main__":
    main()
