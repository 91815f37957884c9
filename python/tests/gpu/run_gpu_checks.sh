#!/usr/bin/env bash
# GPU checks of memsnap.record and the pytest plugin, on a machine with PyTorch + CUDA.
#
#   bash python/tests/gpu/run_gpu_checks.sh [OUT_DIR]
#
# Needs, installed for $PYTHON (default python3): the memsnap wheel, torch with a CUDA device,
# and pytest (run as `python -m pytest`). Works offline. Each step prints what it found and
# the script exits non-zero at the first check that does not hold:
#
#   (a) record() around a small training loop that keeps a tensor per step in a list (the line
#       marked `# LEAK`): the analysis must name that line, and memsnap.check --fail-on leaks
#       must fail; the verdict is printed.
#   (b) a real out-of-memory error inside record(on_oom=True): the OOM dump must be written,
#       and its analysis must have an `oom` suspect.
#   (c) pytest with the plugin on a file with one leaking and one clean @gpu_memory test:
#       exactly one failure, whose message is the check's verdict; the output is printed.
#   (d) if the repository's python/tests is beside this script, its CUDA tests
#       (test_record.py, test_plugin.py: the `real` ones), which skip elsewhere.
#
# Snapshots, reports and logs are left in OUT_DIR (default: a new temporary folder).
set -euo pipefail

PYTHON=${PYTHON:-python3}
OUT=${1:-$(mktemp -d -t memsnap-gpu-XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
echo "== memsnap GPU checks; files in $OUT"
"$PYTHON" - <<'EOF'
import sys
import memsnap
import torch
assert torch.cuda.is_available(), "no CUDA device: torch.cuda.is_available() is False"
import pytest
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"{torch.cuda.get_device_name(0)}, memsnap {memsnap.__version__} at {memsnap.__file__}, pytest {pytest.__version__}")
EOF

echo
echo "== (a) record() around a leaking loop"
cat >"$OUT/leak_loop.py" <<'EOF'
"""A small training loop that keeps every step's softmax output (the `# LEAK` line)."""
import sys
from pathlib import Path

import torch

import memsnap

out = Path(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
history = []
with memsnap.record(out / "leak.pickle") as rec:
    for step in range(10):
        x = torch.randn(512, 1024, device="cuda")
        y = model(x)
        loss = (y - x).square().mean()
        history.append(y.softmax(-1))  # LEAK
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
leak_line = next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if line.endswith("# LEAK"))
print(f"snapshot: {rec.path} ({rec.path.stat().st_size} bytes); leak planted at {Path(__file__).name}:{leak_line}")
a = rec.analyze()
for s in a.suspects:
    site = f"{Path(s.site.filename).name}:{s.site.line} in {s.site.function}" if s.site else "(no user frame)"
    print(f"  suspect {s.kind} ({s.severity}), {s.bytes} bytes at {site}, confidence {s.confidence:.2f}")
    print(f"    evidence: {s.evidence}")
    print(f"    advice: {s.advice}")
verdict = memsnap.check(rec.path, fail_on="leaks", max_peak="64MiB")
print("verdict (memsnap check --fail-on leaks --max-peak 64MiB):")
for line in verdict.failures:
    print("  " + line)
print("  " + verdict.summary)
at_line = [s for s in a.suspects if s.site and Path(s.site.filename).name == Path(__file__).name and s.site.line == leak_line]
assert at_line, f"no suspect at the LEAK line {leak_line}"
assert any(s.severity == "leak" for s in at_line), f"the suspects at line {leak_line} are not leaks: {[(s.kind, s.severity) for s in at_line]}"
assert not verdict.passed and any("fail-on" in f and f":{leak_line} " in f for f in verdict.failures), verdict
memsnap.report(rec.path, out / "leak.html")
print(f"report: {out / 'leak.html'}")
print("(a) OK")
EOF
"$PYTHON" "$OUT/leak_loop.py" "$OUT"

echo
echo "== (b) a real OOM inside record(on_oom=True)"
cat >"$OUT/oom.py" <<'EOF'
"""Allocate past the GPU's memory inside record(): the OOM observer's dump is the state then."""
import sys
from pathlib import Path

import torch

import memsnap

out = Path(sys.argv[1])
total = torch.cuda.get_device_properties(0).total_memory
kept = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]  # 1 GiB live
with memsnap.record(out / "oom.pickle", on_oom=True) as rec:
    try:
        kept.append(torch.empty(total + (1 << 30), dtype=torch.uint8, device="cuda"))
        raise AssertionError("allocating more than the GPU has did not fail")
    except torch.cuda.OutOfMemoryError as e:
        print("OutOfMemoryError:", str(e).splitlines()[0][:200])
print(f"snapshot at exit: {rec.path}; oom dump: {rec.oom_path}; failures seen: {rec.oom_events}; "
      f"observer args (device, alloc, device total or cap, device free): {rec.oom_info}")
assert rec.oom_path is not None and rec.oom_path.exists(), rec.oom_error
a = rec.analyze(oom=True)
for s in a.suspects:
    print(f"  suspect {s.kind} ({s.severity}), {s.bytes} bytes, evidence: {s.evidence}")
assert any(s.kind == "oom" for s in a.suspects), [s.kind for s in a.suspects]
live = sum(d.allocated_bytes for d in a.devices)
print(f"allocated at the OOM dump: {live} bytes (the 1 GiB kept alive is in it)")
assert live >= 1 << 30, live
print("(b) OK")
EOF
"$PYTHON" "$OUT/oom.py" "$OUT"

echo
echo "== (c) pytest with the plugin: one leaking and one clean @gpu_memory test"
mkdir -p "$OUT/plugin"
cat >"$OUT/plugin/test_memory.py" <<'EOF'
import pytest
import torch

KEPT = []


def train(keep: bool) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(10):
        x = torch.randn(512, 1024, device="cuda")
        y = model(x)
        loss = (y - x).square().mean()
        if keep:
            KEPT.append(y.softmax(-1))  # LEAK
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.gpu_memory(max_peak="8GiB", fail_on="leaks")
def test_leaky():
    train(keep=True)


@pytest.mark.gpu_memory(max_peak="8GiB", fail_on="leaks")
def test_clean():
    train(keep=False)
EOF
set +e
(cd "$OUT/plugin" && "$PYTHON" -m pytest -p no:cacheprovider -rA test_memory.py) >"$OUT/plugin/pytest.log" 2>&1
rc=$?
set -e
cat "$OUT/plugin/pytest.log"
grep -q "1 failed, 1 passed" "$OUT/plugin/pytest.log" || { echo "(c) FAILED: expected 1 failed, 1 passed (pytest exit $rc)"; exit 1; }
grep -q "GPU memory check failed for test_memory.py::test_leaky" "$OUT/plugin/pytest.log" || { echo "(c) FAILED: no verdict in the failure"; exit 1; }
grep -q "fail-on .* (leak) found: device .*test_memory.py:" "$OUT/plugin/pytest.log" || { echo "(c) FAILED: the verdict names no leak site"; exit 1; }
test -f "$OUT/plugin/.memsnap/test_memory.py__test_leaky.pickle" || { echo "(c) FAILED: the failed test's snapshot was not kept"; exit 1; }
test -f "$OUT/plugin/.memsnap/test_memory.py__test_leaky.html" || { echo "(c) FAILED: the failed test's report was not written"; exit 1; }
test ! -e "$OUT/plugin/.memsnap/test_memory.py__test_clean.pickle" || { echo "(c) FAILED: the passed test's snapshot was kept"; exit 1; }
echo "(c) OK: kept $(ls "$OUT/plugin/.memsnap" | tr '\n' ' ')"

if [ -f "$HERE/../test_record.py" ] && [ -f "$HERE/../test_plugin.py" ]; then
  echo
  echo "== (d) the repository's CUDA tests (test_record.py, test_plugin.py -k real)"
  "$PYTHON" -m pytest -p no:cacheprovider -q -rs "$HERE/../test_record.py" "$HERE/../test_plugin.py" -k real
fi

echo
echo "== all GPU checks passed; files in $OUT"
