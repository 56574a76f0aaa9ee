#!/usr/bin/env bash
# Issue 15's GPU checks in one run, for a lent GPU machine that has torch and triton but no solver
# packages and no ../shared: the schedules are computed beforehand on the development machine.
#
#   bash bench/gpu_session.sh CASE SCHEDULE.json... [-- SECONDS]
#
# In order, each step limited to what is left of SECONDS (default 500): the decode step
# (bench/bench_step.py), the decode-attention bandwidth (bench/bench_kernels.py), a profile of the
# executor, its calibration, a replay of each schedule against that calibration, and last the
# executor and kernel tests on CUDA. Everything lands in $OUT (default bench/results/runs/gpu/): log.txt,
# step.md, kernels.md, profile.csv, cost.toml, replays.jsonl (one `kvbound replay --json` object per
# schedule, with its name) and tests.txt. A failing step is logged and the next one runs.
# SKIP="decode-step kernels tests" leaves those steps out; FLAGS="--no-graphs" goes to profile and replay.
set -u
cases=()
budget=500
while (($#)); do
    if [[ $1 == -- ]]; then budget=$2; shift 2; else cases+=("$1"); shift; fi
done
case_file=${cases[0]}
schedules=("${cases[@]:1}")
OUT=${OUT:-bench/results/runs/gpu}
DEVICE=${DEVICE:-cuda} SHAPE=${SHAPE:-llama-2-7b}  # DEVICE=cpu SHAPE=tiny: a dry run of the flow
mkdir -p "$OUT"
PY=${PYTHON:-python3}
# the GPU machine runs the checkout as it is (kvbound not pip-installed there): the package from the repository root
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)
log=$OUT/log.txt

left() { echo $((budget - ($(date +%s) - start))); }

step() {  # step NAME LIMIT COMMAND...: run COMMAND for at most min(LIMIT, time left)
    local name=$1 limit=$2
    shift 2
    if [[ " ${SKIP:-} " == *" $name "* ]]; then
        echo "=== $name: skipped (SKIP)" | tee -a "$log"
        return 1
    fi
    local avail
    avail=$(left)
    ((avail < limit)) && limit=$avail
    if ((limit < 5)); then
        echo "=== $name: skipped, no time left" | tee -a "$log"
        return 1
    fi
    echo "=== $name (limit ${limit}s, $(date +%T)): $*" | tee -a "$log"
    timeout --kill-after=5 "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $(($(date +%s) - start))s in all" | tee -a "$log"
    return $rc
}

step environment 30 bash -c "nvidia-smi; $PY -c 'import torch, triton, numpy, scipy; print(torch.__version__, triton.__version__, numpy.__version__, scipy.__version__, torch.cuda.get_device_name())'"
step decode-step 100 $PY bench/bench_step.py && cp bench/results/step.md "$OUT/"
step kernels 60 $PY bench/bench_kernels.py && cp bench/results/kernels.md "$OUT/"
step profile 120 $PY -m kvbound.cli profile --device $DEVICE --shape $SHAPE --repeat 3 ${FLAGS:-} --out "$OUT/profile.csv"
step calibrate 30 $PY -m kvbound.cli calibrate "$OUT/profile.csv" --out "$OUT/cost.toml"
for schedule in "${schedules[@]}"; do
    name=$(basename "$schedule" .json)
    if step "replay $name" 80 bash -c "$PY -m kvbound.cli replay '$case_file' '$schedule' --device $DEVICE --shape $SHAPE --repeat 3 ${FLAGS:-} --cost '$OUT/cost.toml' --json > '$OUT/replay_$name.tmp'"; then
        # one line per schedule in replays.jsonl, with its name; its summary on the terminal and in the log
        $PY -c "import json, sys; d = json.load(open(sys.argv[1])); d['schedule'] = sys.argv[2]
open(sys.argv[3], 'a').write(json.dumps(d) + '\n'); print({k: d[k] for k in list(d)[:8]})" \
            "$OUT/replay_$name.tmp" "$name" "$OUT/replays.jsonl" | tee -a "$log"
    fi
    rm -f "$OUT/replay_$name.tmp"
done
step tests 150 bash -c "$PY -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_engine_prepare.py tests/test_executor.py tests/test_executor_cli.py > '$OUT/tests.txt' 2>&1; rc=\$?; tail -5 '$OUT/tests.txt'; exit \$rc"
echo "=== done after $(($(date +%s) - start))s" | tee -a "$log"
