#!/usr/bin/env bash
# The GPU check of issue 19, in one go, bounded to about 8 minutes (every step has a timeout).
#
#   bash benchmarks/gpu_check.sh                 # on a GPU machine (e.g. one H200, 16 cores)
#   bash benchmarks/gpu_check.sh --cpu           # dry run here: same Python, NumPy stand-in
#                                                # (writes *_cpu.json/.log, which git ignores)
#   bash benchmarks/gpu_check.sh --fetch-wheels  # on a machine with PyPI: fill .whl/ for one without
#
# Steps: (1) install what is missing (CuPy, the CUDA build of torch, dask/distributed, TorchRL)
# from .whl/ if present, else from PyPI; (2) the GPU-marked tests (Philox kernel, GPU shards,
# replay device tier and CUDA delivery); (3) Philox raw stream GPU vs numpy on a few shards;
# (4) the 7-input example on the GPU vs the machine's CPU cores (same draws, one run);
# (5) replay device-tier sampling, batches(to="torch", device="cuda") exposed latency with
# prefetch 0 vs 2, and TorchRL's GPU storage. Figures: benchmarks/results/gpu_check.json (with
# the machine) and bench_gpu_*.json; all of them are copied to $OUT when it is set.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
PY="${PYTHON:-python3}"
MODE=gpu
case "${1:-}" in
  --cpu) MODE=cpu ;;
  --fetch-wheels) MODE=fetch ;;
  "") ;;
  *) echo "usage: $0 [--cpu | --fetch-wheels]" >&2; exit 2 ;;
esac
RESULTS="$ROOT/benchmarks/results"
mkdir -p "$RESULTS"
SUFFIX=""
[ "$MODE" = cpu ] && SUFFIX="_cpu"
LOG="$RESULTS/gpu_check$SUFFIX.log"
[ "$MODE" = fetch ] || : >"$LOG"
export PYTHONUNBUFFERED=1

# Packages the GPU machine may lack (its image has CuPy, torch, numpy, pytest, hypothesis).
WHEELS="dask distributed partd locket tblib tornado zict toolz cloudpickle msgpack sortedcontainers
        psutil pyyaml click fsspec tqdm torchrl tensordict orjson pyvers"

if [ "$MODE" = fetch ]; then
  # Same versions as here for dask/distributed; latest for the rest. cp312 manylinux x86-64.
  mkdir -p .whl
  excl="$(git rev-parse --git-path info/exclude 2>/dev/null)"      # works in worktrees too
  [ -n "$excl" ] && { grep -qx '/.whl/' "$excl" 2>/dev/null || echo '/.whl/' >>"$excl"; }
  for p in $WHEELS; do
    v=$("$PY" -c "import importlib.metadata as m; print(m.version('$p'))" 2>/dev/null)
    spec="$p${v:+==$v}"
    case "$p" in dask|distributed) ;; *) spec="$p" ;; esac
    timeout 120 "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$spec" \
      || echo "could not fetch $spec" >&2
  done
  du -sh .whl
  exit 0
fi

declare -A RC SECS
step() {   # step NAME TIMEOUT_S command...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "=== $name (timeout ${limit}s): $*" | tee -a "$LOG"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  RC[$name]=${PIPESTATUS[0]}
  SECS[$name]=$((SECONDS - t0))
  echo "=== $name: rc=${RC[$name]} in ${SECS[$name]}s" | tee -a "$LOG"
}

install() {
  local site=/tmp/gpu_check_site
  if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" .whl/*.whl || return 1
  else
    "$PY" -c "import cupy" 2>/dev/null || "$PY" -m pip install -q --target "$site" cupy-cuda12x || return 1
    "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null \
      || "$PY" -m pip install -q --target "$site" torch --index-url https://download.pytorch.org/whl/cu124 \
      || return 1
    "$PY" -c "import distributed" 2>/dev/null || "$PY" -m pip install -q --target "$site" "dask[distributed]" || return 1
    "$PY" -c "import torchrl" 2>/dev/null || "$PY" -m pip install -q --target "$site" torchrl \
      || echo "TorchRL not installed: its figures will say so"
  fi
  "$PY" - <<'EOF'
import cupy, torch, distributed
print("cupy", cupy.__version__, "devices", cupy.cuda.runtime.getDeviceCount())
print("torch", torch.__version__, "cuda", torch.cuda.is_available())
print("distributed", distributed.__version__)
EOF
}

if [ "$MODE" = gpu ]; then
  export PYTHONPATH="$ROOT:/tmp/gpu_check_site${PYTHONPATH:+:$PYTHONPATH}"
  step install 90 install
  step tests 120 bash -c "'$PY' -m pytest -q -p no:cacheprovider -rs tests/montecarlo/test_gpu_kernel.py \
      tests/replay/test_gpu.py; a=\$?; '$PY' -m pytest -q -p no:cacheprovider -rs -k cupy \
      tests/replay/test_storages.py; b=\$?; exit \$((a | b))"
  step philox 45 "$PY" benchmarks/bench_gpu.py philox
  step mc 150 "$PY" benchmarks/bench_gpu.py mc
  step replay 90 "$PY" benchmarks/bench_gpu.py replay
else
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  step tests 300 "$PY" -m pytest -q -p no:cacheprovider -rs \
    tests/montecarlo/test_gpu_kernel.py tests/montecarlo/test_gpu.py tests/montecarlo/test_philox_ref.py
  step bench 240 "$PY" benchmarks/bench_gpu.py all --cpu
fi

# one JSON with the machine, the steps and every figure
STEPS=""
for k in "${!RC[@]}"; do STEPS+="$k=${RC[$k]}:${SECS[$k]} "; done
STEPS="$STEPS" SUFFIX="$SUFFIX" "$PY" - <<'EOF'
import json, os, pathlib, subprocess, sys
sys.path.insert(0, os.getcwd())
from benchmarks.harness import write_results
res = pathlib.Path("benchmarks/results")
sfx = os.environ["SUFFIX"]
steps = {}
for item in os.environ["STEPS"].split():
    name, rest = item.split("=")
    rc, secs = rest.split(":")
    steps[name] = {"rc": int(rc), "seconds": int(secs), "timed_out": int(rc) in (124, 137)}
try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
except Exception as e:
    smi = f"nvidia-smi unavailable ({type(e).__name__})"
parts = {}
for p in ("philox", "mc", "replay"):
    f = res / f"bench_gpu_{p}{sfx}.json"
    if f.exists():
        parts[p] = json.loads(f.read_text())["figures"]
mc, rp = parts.get("mc", {}), parts.get("replay", {})
lat = rp.get("exposed_latency", {})
goals = {
    "philox_bit_equal": parts.get("philox", {}).get("all_equal"),
    "mc_speedup_vs_cpu_cores (goal >= 20)": mc.get("speedup_vs_cpu_ordinary"),
    "mc_speedup_same_draws": mc.get("speedup_vs_cpu_portable_same_draws"),
    "mc_shards_outside_tolerance": None if not mc else len(mc.get("shards_outside_class", [])),
    "exposed_fraction_prefetch2 (goal <= 0.05)": {k: v.get("exposed_fraction") for k, v in lat.items()
                                                   if k.endswith("prefetch2")},
    "device_sampling_vs_torchrl (goal >= 3)": rp.get("torchrl", {}).get("ours_over_torchrl_speed"),
}
path = write_results(f"gpu_check{sfx}", {"gpu": smi, "steps": steps, "goals": goals, "parts": parts},
                     notes="benchmarks/gpu_check.sh (issue 19)")
print(json.dumps(goals, indent=1, default=str))
print("wrote", path)
EOF

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  for f in gpu_check bench_gpu_philox bench_gpu_mc bench_gpu_replay; do
    [ -f "$RESULTS/$f$SUFFIX.json" ] && cp "$RESULTS/$f$SUFFIX.json" "$OUT"/
  done
  cp "$LOG" "$OUT"/
fi
fail=0
for k in "${!RC[@]}"; do [ "${RC[$k]}" = 0 ] || fail=1; done
exit $fail
