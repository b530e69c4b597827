#!/usr/bin/env bash
# The checks that need a GPU, in one run (about 12 minutes on one GPU once torch is installed):
#   1. the CUDA-marked tests (the speed part's included),
#   2. a CUDA grading of the sample class (in a copy of assignments/, so the checkout is unchanged),
#   3. the benchmark (`make bench`) on the GPU,
#   4. the speed part's clock against torch.utils.benchmark's adaptive_autorange and triton's do_bench (when
#      triton imports), the SM clock, temperature and throttle reasons around each timed round (with
#      nvidia-ml-py), and whether a frozen helper's queued GPU work slows the reference (tools/gpu_timing.py),
#   5. the fork server on the device (tools/fork_check.py): it holds no CUDA while two workers forked from it
#      each make a context of their own, and a correct grading's cost from the command line and in a
#      long-lived grading process (wall, CPU, execution_time),
#   6. the capture and the replay on the device (tools/capture_check.py): the reference's forwards captured as
#      graphs in one worker, replayed in another, their outputs compared, and what each step costs.
#   7. how far the slowest honest forwards (a loop over the heads, a Python loop over the tokens) stay from a
#      request's CPU deadline on the device (tools/request_margin.py).
# (Steps 2 and 4 time replayed graphs, as every grading does.)
# Everything it prints is also kept under $OUT (default gpu-check/): the test log, the class table and
# each results.json, bench.json and bench.png, gpu-timing.txt and gpu-timing.json, fork-check.txt and
# fork-check.json, capture-check.txt and capture-check.json, request-margin.txt and request-margin.json, and the sample class's time (grade-class.time).
#
#   tools/gpu_check.sh                      # uses .venv, installing a CUDA build of torch if it has none
#   VENV=/opt/venv tools/gpu_check.sh       # an environment that already has a CUDA build of torch
#   DEVICE=cpu tools/gpu_check.sh           # a rehearsal of the same steps on a machine without a GPU
#   TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" tools/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check}
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-"torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"}
DEVICE=${DEVICE:-cuda}
PY="$VENV/bin/python"
mkdir -p "$OUT"

if [ "$DEVICE" = cuda ]; then
    if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
        echo "== installing a CUDA build of torch ($TORCH_SPEC)"
        make setup VENV="$VENV" TORCH_SPEC="$TORCH_SPEC"
    fi
    "$PY" -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'; \
print('torch', torch.__version__, 'on', torch.cuda.get_device_name())" | tee "$OUT/device.txt"
    command -v nvidia-smi >/dev/null && nvidia-smi >> "$OUT/device.txt" || true
else
    "$PY" -c "import torch; print('torch', torch.__version__, 'on the CPU (a rehearsal)')" | tee "$OUT/device.txt"
fi

status=0
echo "== 1. CUDA tests"
# only the files that hold CUDA tests: the others may need test-only packages a GPU image lacks
"$PY" -m pytest -m cuda -q -rA -p no:cacheprovider $(grep -l "mark.cuda" tests/test_*.py) 2>&1 | tee "$OUT/cuda-tests.txt" || status=1

echo "== 2. the sample class graded on $DEVICE"
rm -rf "$OUT/course" && cp -r assignments "$OUT/course"
rm -rf "$OUT/course/autograded" "$OUT/course/feedback"
started=$SECONDS
"$PY" -m autograder grade-class "$OUT/course" --device "$DEVICE" --force 2>&1 | tee "$OUT/grade-class.txt" || status=1
echo "the sample class graded in $((SECONDS - started)) s (load $(cut -d' ' -f1 /proc/loadavg))" | tee "$OUT/grade-class.time"
"$PY" - "$OUT/course" <<'PYTHON' | tee "$OUT/speed.txt"
import json, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1], "autograded").glob("*/mha/results.json")):
    results = json.loads(path.read_text())
    speed = results["extra_data"].get("speed") or {}
    line = f"{path.parts[-3]:8s} {results['score']:6.2f}/{results['max_score']:g}"
    for name, figures in (speed.get("workloads") or {}).items():
        if "relative" in figures:
            line += (f" | {name}: {figures['speedup']:.2f}x vs the reference's {figures['reference_speedup']:.2f}x"
                     f" (relative {figures['relative']:.2f})")
        else:
            line += f" | {name}: {figures.get('failed', 'not measured')[:80]}"
    print(line)
PYTHON

# what `make bench DEVICE=cuda` runs, without make's check of the virtualenv (it would reinstall the
# default torch over a CUDA build installed by hand)
echo "== 3. the benchmark on $DEVICE"
"$PY" tools/bench.py --device "$DEVICE" --out "$OUT/bench" 2>&1 | tee "$OUT/bench.txt" || status=1

echo "== 4. the grader's clock against the standard tools, the GPU's state, a frozen helper ($DEVICE)"
if [ "$DEVICE" = cuda ] && ! "$PY" -c "import pynvml" 2>/dev/null; then
    "$PY" -m pip install -q --retries 0 --timeout 10 nvidia-ml-py 2>/dev/null \
        || echo "(nvidia-ml-py could not be installed: no clocks)"
fi
"$PY" tools/gpu_timing.py --device "$DEVICE" --out "$OUT" 2>&1 | tee "$OUT/gpu-timing.txt" || status=1

echo "== 5. the fork server on $DEVICE: no CUDA in it, a context per worker; a correct grading's cost"
"$PY" tools/fork_check.py --device "$DEVICE" --out "$OUT" 2>&1 | tee "$OUT/fork-check.txt" || status=1

echo "== 6. the reference's forwards captured and replayed as graphs on $DEVICE: their cost, and the same outputs"
"$PY" tools/capture_check.py --device "$DEVICE" --out "$OUT" 2>&1 | tee "$OUT/capture-check.txt" || status=1

echo "== 7. the slowest honest forwards against a request's CPU deadline on $DEVICE"
"$PY" tools/request_margin.py --device "$DEVICE" --out "$OUT" 2>&1 | tee "$OUT/request-margin.txt" || status=1

echo "== done (status $status): see $OUT/"
exit $status
