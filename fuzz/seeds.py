"""Cut real snapshots down to seeds for the `analyze_cli` fuzz target.

    python3 fuzz/seeds.py corpus/analyze_cli ../fixtures/dev/*.pickle* ../fixtures/extra5/*.pickle.xz

Each seed keeps the file's shape (keys, segments, blocks, trace entries, frames, settings) but
only the last ENTRIES trace entries of each device (as a wrapped ring buffer would), at most
FRAMES frames per stack and at most SEGMENTS segments, so that it is a few tens of KB: small
enough for libFuzzer to mutate quickly, real enough that most mutations are still read and reach
the replay and the detectors. Written with pickle protocol 4 (framed: the parallel reader's
path) and, for every third file, protocol 2 (the C++ pickler's form: the sequential path).
"""

import lzma
import os
import pickle
import sys

ENTRIES = 300
FRAMES = 4
SEGMENTS = 24


def cut_frames(d):
    if isinstance(d, dict) and isinstance(d.get("frames"), list):
        d["frames"] = d["frames"][:FRAMES]


def cut(snap):
    segs = snap.get("segments", [])
    if isinstance(segs, list):
        segs = segs[:SEGMENTS]
        for s in segs:
            cut_frames(s)
            for b in s.get("blocks", []) if isinstance(s, dict) else []:
                cut_frames(b)
        snap["segments"] = segs
    traces = snap.get("device_traces", [])
    if isinstance(traces, list):
        snap["device_traces"] = [t[-ENTRIES:] if isinstance(t, list) else t for t in traces]
        for t in snap["device_traces"]:
            for e in t if isinstance(t, list) else []:
                cut_frames(e)
    return snap


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for i, path in enumerate(sys.argv[2:]):
        opener = lzma.open if path.endswith(".xz") else open
        with opener(path, "rb") as f:
            snap = pickle.load(f)
        if not isinstance(snap, dict):
            continue
        snap = cut(snap)
        name = os.path.basename(path).split(".pickle")[0]
        with open(os.path.join(out, name + ".p4.pickle"), "wb") as f:
            pickle.dump(snap, f, protocol=4)
        if i % 3 == 0:
            with open(os.path.join(out, name + ".p2.pickle"), "wb") as f:
                pickle.dump(snap, f, protocol=2)


if __name__ == "__main__":
    main()
