#!/usr/bin/env bash
# The GPU checks of issues 15 and 36 in one run, for a lent GPU machine that has torch and triton but no
# solver packages and no ../shared: the cases are self-contained and their schedules computed beforehand
# on the development machine.
#
#   bash bench/gpu_session.sh CASE.toml SCHEDULE.json... [CASE2.toml SCHEDULE.json...] [-- SECONDS]
#
# The inputs kept in bench/gpu_inputs/ are ignored by git: a device call must carry that folder.
# Profile and replays belong in one call (replays against a profile from another call were 2-4 points
# further off in total: bench/results/replay_cuda.md).
# In order, each step limited to what is left of SECONDS (default 560): the CUDA check of the kernels
# (a tensor-core decode that fails it is not tuned), the decode-attention tuning and bandwidth
# (bench/bench_kernels.py --tune $KERNEL_FLAGS, default --splits 4: the tuned settings land in
# kvbound/kernels/tuned/, where the later steps read them), the CUDA checks of the graphs and mixed
# batches (if the piecewise graphs fail them, the rest runs without: --piecewise-tokens 0), the decode
# step (bench/bench_step.py), a profile of the executor, its calibration, a replay of each schedule of
# each case against that calibration, and last the other executor tests on CUDA. KERNEL_TESTS (default
# "decode or tensor_core") selects the kernel tests of the first check. Everything lands in $OUT (default bench/results/runs/gpu/):
# log.txt, kernels.md, tuned.json, profile.csv, cost.toml, replays.jsonl (one `kvbound replay --json`
# object per schedule, with its case and name), step.md and tests.txt (the checks, then the tests). A failing step is logged
# and the next one runs. SKIP="kernels step tests" leaves those steps out; FLAGS (e.g. "--no-graphs" or
# "--prefill-split", not measured yet) goes to profile and replay; REPEAT (default 2) passes per profile and replay.
set -u
args=()
budget=560
while (($#)); do
    if [[ $1 == -- ]]; then budget=$2; shift 2; else args+=("$1"); shift; fi
done
OUT=${OUT:-bench/results/runs/gpu}
DEVICE=${DEVICE:-cuda} SHAPE=${SHAPE:-llama-2-7b}  # DEVICE=cpu SHAPE=tiny: a dry run of the flow
REPEAT=${REPEAT:-2}
FLAGS=${FLAGS:-}
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
    if [[ " ${SKIP:-} " == *" ${name%% *} "* ]]; then
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

tuned() {  # the tuned-settings file of this GPU
    $PY -c "import torch; from kvbound.kernels.tuning import tuned_path; print(tuned_path(torch.cuda.get_device_name()))"
}

step environment 30 bash -c "nvidia-smi; $PY -c 'import torch, triton, numpy, scipy; print(torch.__version__, triton.__version__, numpy.__version__, scipy.__version__, torch.cuda.get_device_name())'"
if [[ $DEVICE == cuda ]]; then
    # the kernels' CUDA check first: a decode variant that fails it is left out of the tuning
    kernel_flags=${KERNEL_FLAGS:---splits 4}
    if ! step "checks (kernels on CUDA)" 90 bash -c "$PY -m pytest -q -p no:cacheprovider tests/test_kernels.py -k '${KERNEL_TESTS:-decode or tensor_core}' > '$OUT/tests.txt' 2>&1; rc=\$?; tail -5 '$OUT/tests.txt'; exit \$rc"; then
        if grep -q "FAILED.*tensor_core\|FAILED.*dot=True" "$OUT/tests.txt"; then
            kernel_flags="$kernel_flags --no-dot"
            echo "=== the tensor-core decode failed its check: tuned without it" | tee -a "$log"
        fi
    fi
    step kernels 150 $PY bench/bench_kernels.py --tune $kernel_flags && cp bench/results/kernels.md "$OUT/" && cp "$(tuned)" "$OUT/tuned.json"
    step step 80 $PY bench/bench_step.py --requests 1 16 64 --graphs-only && cp bench/results/step.md "$OUT/"
    if ! step "checks (graphs, mixed batches on CUDA)" 120 bash -c "$PY -m pytest -q -p no:cacheprovider tests/test_engine_prepare.py tests/test_executor.py -k 'cuda or triton_kernels' >> '$OUT/tests.txt' 2>&1; rc=\$?; tail -5 '$OUT/tests.txt'; exit \$rc"; then
        if grep -q "FAILED.*piecewise" "$OUT/tests.txt"; then
            FLAGS="$FLAGS --piecewise-tokens 0"
            echo "=== the piecewise graphs failed their check: the rest runs without them ($FLAGS)" | tee -a "$log"
        fi
    fi
fi
step profile 150 $PY -m kvbound.cli profile --device $DEVICE --shape $SHAPE --repeat $REPEAT $FLAGS --out "$OUT/profile.csv"
step calibrate 30 $PY -m kvbound.cli calibrate "$OUT/profile.csv" --decode-share 0.5 --out "$OUT/cost.toml"
case_file=
for arg in "${args[@]}"; do
    if [[ $arg == *.toml ]]; then case_file=$arg; continue; fi
    name=$(basename "$case_file" .toml)/$(basename "$arg" .json)
    if step "replay $name" ${REPLAY_LIMIT:-110} bash -c "$PY -m kvbound.cli replay '$case_file' '$arg' --device $DEVICE --shape $SHAPE --repeat $REPEAT $FLAGS --cost '$OUT/cost.toml' --profile '$OUT/profile.csv' --json > '$OUT/replay.tmp'"; then
        # one line per schedule in replays.jsonl, with its name; its summary on the terminal and in the log
        $PY -c "import json, sys; d = json.load(open(sys.argv[1])); d['schedule'] = sys.argv[2]
open(sys.argv[3], 'a').write(json.dumps(d) + '\n'); print({k: d[k] for k in list(d)[:8] + ['paths', 'profile_coverage']})" \
            "$OUT/replay.tmp" "$name" "$OUT/replays.jsonl" | tee -a "$log"
    fi
    rm -f "$OUT/replay.tmp"
done
if [[ $DEVICE == cuda ]]; then
    step tests 150 bash -c "$PY -m pytest -q -p no:cacheprovider tests/test_executor.py tests/test_executor_cli.py >> '$OUT/tests.txt' 2>&1; rc=\$?; tail -5 '$OUT/tests.txt'; exit \$rc"
fi
echo "=== done after $(($(date +%s) - start))s" | tee -a "$log"
