#!/usr/bin/env bash
# The robustness gate: the README's test command, on a fresh clone, with CPU-bound processes
# running beside it, several times in a row. Exits 0 only if every run passed.
#
#   bash tools/stress_suite.sh                       # 3 runs of the full command, 2 CPU hogs
#   STRESS_TESTS="tests/test_events.py" bash tools/stress_suite.sh    # a selection instead
#
# Each run clones the checkout's committed HEAD afresh (no .mypy_cache, no __pycache__, nothing
# uncommitted) and runs the second ```bash block of its README.md as written, in that clone.
# Settings (environment):
#   STRESS_RUNS=3          runs in a row
#   STRESS_HOGS=2          CPU-bound processes started before each run and stopped after it
#   STRESS_TESTS=          pytest arguments that replace the command's bare `python -m pytest`
#                          (a test selection, e.g. "tests/test_readme.py -k fast")
#   STRESS_VENV=system     where the command installs: "system" a new virtual environment that
#                          sees this interpreter's packages (pip adds only what differs), "fresh"
#                          a new bare one (the full install, as on a new machine), "none" this
#                          interpreter's own environment
#   STRESS_RUN_TIMEOUT=3600  seconds one run may take
#   STRESS_KEEP=0          1: keep the temporary directory (clones, logs)
set -uo pipefail

runs=${STRESS_RUNS:-3}
hogs=${STRESS_HOGS:-2}
tests=${STRESS_TESTS:-}
venv_mode=${STRESS_VENV:-system}
run_timeout=${STRESS_RUN_TIMEOUT:-3600}
python=${PYTHON:-python3}

src=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel) || { echo "not in a git checkout" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/dask-research-stress.XXXXXX")
hog_pids=()

stop_hogs() {
  local pid
  for pid in "${hog_pids[@]}"; do
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  hog_pids=()
}

cleanup() {
  stop_hogs
  if [ "${STRESS_KEEP:-0}" = 1 ]; then
    echo "kept $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

# The command, read from the README each run uses (a clone of HEAD: the same text each time).
readme_command() {
  "$python" - "$1/README.md" "$tests" <<'EOF'
import re, sys
blocks = re.findall(r"```bash\n(.*?)\n```", open(sys.argv[1]).read(), flags=re.S)
cmd = blocks[1].strip()
if sys.argv[2]:
    assert cmd.endswith("python -m pytest"), cmd
    cmd += " " + sys.argv[2]
print(cmd)
EOF
}

case "$venv_mode" in
  system) "$python" -m venv --system-site-packages "$work/venv" || exit 2 ;;
  fresh) "$python" -m venv "$work/venv" || exit 2 ;;
  none) ;;
  *) echo "STRESS_VENV=$venv_mode: expected system, fresh or none" >&2; exit 2 ;;
esac

echo "stress gate: $runs run(s) of the README test command on fresh clones of $src (HEAD $(git -C "$src" rev-parse --short HEAD)), $hogs CPU hog(s) beside each, venv: $venv_mode"
green=0
for i in $(seq 1 "$runs"); do
  clone="$work/clone-$i"
  git clone -q "$src" "$clone" || { echo "run $i: git clone failed" >&2; exit 2; }
  cmd=$(readme_command "$clone") || { echo "run $i: no test command in $clone/README.md" >&2; exit 2; }
  [ "$i" = 1 ] && echo "command: $cmd"
  for _ in $(seq 1 "$hogs"); do
    "$python" -c "while True: pass" &
    hog_pids+=($!)
  done
  log="$work/run-$i.log"
  start=$(date +%s)
  (
    cd "$clone" || exit 2
    if [ "$venv_mode" != none ]; then
      # shellcheck disable=SC1091
      . "$work/venv/bin/activate"
    fi
    timeout --signal=TERM --kill-after=60 "$run_timeout" bash -c "$cmd"
  ) >"$log" 2>&1
  rc=$?
  seconds=$(( $(date +%s) - start ))
  stop_hogs
  summary=$(grep -E "^(=+ )?([0-9]+ [a-z]+|no tests ran).* in [0-9.]+s( \([0-9:]+\))?( =+)?$" "$log" | tail -1)
  if [ "$rc" -eq 0 ]; then
    green=$((green + 1))
    echo "run $i: green in ${seconds} s: ${summary:-?}"
  else
    echo "run $i: RED (exit $rc) in ${seconds} s: ${summary:-?}"
    grep -E "^(FAILED|ERROR) " "$log" | head -20
    cp "$log" "${TMPDIR:-/tmp}/dask-research-stress-run-$i.log" && echo "  log: ${TMPDIR:-/tmp}/dask-research-stress-run-$i.log"
  fi
done
echo "stress gate: $green/$runs green"
[ "$green" -eq "$runs" ]
