#!/usr/bin/env bash
# This build's ember-server against a baseline build's (the branch point), on
# the seeds' workloads, driven by ONE loadgen binary (this build's: the same
# prompts for both), in one invocation:
#
#   BASELINE_BIN_DIR=/dir/with/baseline/ember-server OUT=/some/dir bash bench/run_seeds_ab.sh
#   bash bench/run_seeds_ab.sh --dry-run     # tiny preset on the CPU, this build as both
#
# For each workload both servers start and run at once (each with part of
# the GPU's memory, the idle one doing nothing), and the loadgen drives them in turn,
# alternating which goes first, ROUNDS times (a warmup run and one measured
# run each turn). Prints one table: each build's median completion tok/s (and
# TTFT p50 for seed048) over the rounds, the ratio this / baseline, and every
# round's ratio, so drift on a shared machine shows.
#
# Workloads (the seeds', as bench/run_gpu.sh runs them, gRPC door):
#   seed044   64 x 256 tokens, burst, --max-batch-size 64
#   seed045   256 x 64 tokens, burst, --max-batch-size 64 --prefill-max-batch-size 16
#   seed048   256 prompts of ~260 tokens, 1 new token, 1 ms apart (absolute), batch 16/16
#
# Environment knobs [default; dry run's default]:
#   ROUNDS            alternations per workload [3; 1]
#   WORKLOADS         subset of the names above [all; seed044]
#   PRESET, DEVICE    --preset and --device [gpt2, cuda; tiny, cpu]
#   EMBER_BIN_DIR     this build's ember-server and loadgen [.device; target/release]
#   BASELINE_BIN_DIR  the baseline's ember-server [required; EMBER_BIN_DIR]
#   MEM_FRACTION      --gpu-memory-utilization of each server [0.4; unused on the CPU]
#   OUT               output dir [bench-out-seeds-ab; bench-out-seeds-ab-dry]
set -u
set -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
REPO=$PWD
DRY_RUN=0
for arg in "$@"; do
    case $arg in
        --dry-run) DRY_RUN=1 ;;
        -h | --help) sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run_seeds_ab.sh: unknown argument '$arg' (--dry-run, --help)" >&2; exit 2 ;;
    esac
done
say() { printf '[seeds-ab] %s\n' "$*"; }
die() { say "FAILED: $*"; exit 1; }
if [[ $DRY_RUN == 1 ]]; then
    BIN_DIR=${EMBER_BIN_DIR:-$REPO/target/release}
    BASE_DIR=${BASELINE_BIN_DIR:-$BIN_DIR}
    ROUNDS=${ROUNDS:-1} WORKLOADS=${WORKLOADS:-seed044} PRESET=${PRESET:-tiny}
    DEVICE=${DEVICE:-cpu} OUT=${OUT:-bench-out-seeds-ab-dry}
    N044=4 T044=8 N045=8 T045=4 N048=8 R048=4
    MEM=()
else
    BIN_DIR=${EMBER_BIN_DIR:-$REPO/.device}
    BASE_DIR=${BASELINE_BIN_DIR:?set BASELINE_BIN_DIR to the baseline build}
    ROUNDS=${ROUNDS:-3} WORKLOADS=${WORKLOADS:-seed044 seed045 seed048} PRESET=${PRESET:-gpt2}
    DEVICE=${DEVICE:-cuda} OUT=${OUT:-bench-out-seeds-ab}
    N044=64 T044=256 N045=256 T045=64 N048=256 R048=256
    MEM=(--gpu-memory-utilization "${MEM_FRACTION:-0.4}")
fi
for b in "$BIN_DIR/ember-server" "$BIN_DIR/loadgen" "$BASE_DIR/ember-server"; do
    [[ -x $b ]] || die "$b not found"
done
command -v python3 >/dev/null || die "needs python3"
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
export NO_COLOR=1

# knobs|loadgen args of each workload.
declare -A SPEC=(
    [seed044]="--max-batch-size 64|--num-requests $N044 --max-new-tokens $T044 --submit-interval-ms 0 --no-stop-on-eos --unique-prompts --prompt Hello"
    [seed045]="--max-batch-size 64 --prefill-max-batch-size 16|--num-requests $N045 --max-new-tokens $T045 --submit-interval-ms 0 --no-stop-on-eos --unique-prompts --prompt Hello"
    [seed048]="--max-batch-size 16 --prefill-max-batch-size 16|--prompt Hello --prompt-repeats $R048 --unique-prompts --num-requests $N048 --max-new-tokens 1 --submit-interval-ms 1 --submit-schedule absolute"
)

PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done' EXIT

# launch NAME BIN KNOBS...: starts BIN's server in the background (both
# builds' servers start at once; their kernel compiles overlap).
launch() {
    local name=$1 bin=$2
    shift 2
    "$bin" --device "$DEVICE" --preset "$PRESET" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
        --max-pending 4096 --shutdown-timeout 5 "${MEM[@]}" "$@" \
        >"$OUT/$name.out" 2>"$OUT/$name.log" &
    PIDS+=($!)
}

# ready NAME PID: waits for the server's /health on its HTTP door, prints
# its gRPC address. Both addresses are read on every pass and both must be
# there: the server writes them one after the other, and a pass that read
# the gRPC line before it was written must not count (it would print an
# empty address).
ready() {
    local name=$1 pid=$2 deadline addr http
    deadline=$(($(date +%s) + ${T_SERVING:-300}))
    while :; do
        addr=$(sed -n 's/^listening on //p' "$OUT/$name.out")
        http=$(sed -n 's/^http listening on //p' "$OUT/$name.out")
        if [[ -n $addr && -n $http ]] && python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "http://$http/health" 2>/dev/null; then
            echo "$addr"
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || return 1
        (($(date +%s) < deadline)) || return 1
        sleep 0.5
    done
}

for wl in $WORKLOADS; do
    [[ -n ${SPEC[$wl]:-} ]] || die "unknown workload $wl"
    read -r -a knobs <<<"${SPEC[$wl]%%|*}"
    read -r -a lg <<<"${SPEC[$wl]#*|}"
    say "workload $wl: starting both servers (${knobs[*]})"
    launch "$wl.this" "$BIN_DIR/ember-server" "${knobs[@]}"
    launch "$wl.base" "$BASE_DIR/ember-server" "${knobs[@]}"
    this=$(ready "$wl.this" "${PIDS[0]}") || die "$wl: this build's server (see $OUT/$wl.this.log)"
    base=$(ready "$wl.base" "${PIDS[1]}") || die "$wl: the baseline's server (see $OUT/$wl.base.log)"
    for ((r = 1; r <= ROUNDS; r++)); do
        order=(this base)
        ((r % 2 == 0)) && order=(base this)
        for who in "${order[@]}"; do
            addr=$this
            [[ $who == base ]] && addr=$base
            "$BIN_DIR/loadgen" --target "http://$addr" "${lg[@]}" --warmup-runs 1 --repeat-runs 1 \
                --progress off --json "$OUT/$wl.$who.$r.json" >"$OUT/$wl.$who.$r.log" 2>&1 ||
                die "$wl round $r ($who): loadgen failed (see $OUT/$wl.$who.$r.log)"
        done
        say "$wl round $r done"
    done
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    PIDS=()
done

python3 - "$OUT" "$ROUNDS" "$WORKLOADS" >"$OUT/result.md" <<'PY' || die "no result"
import json, os, statistics, sys
out, rounds, workloads = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def run(wl, who, r):
    doc = json.load(open(os.path.join(out, f"{wl}.{who}.{r}.json")))
    m = [x for x in doc["runs"] if not x.get("warmup")][-1]
    return m.get("throughput_completion_tps"), m["metrics"]["ttft_ms"]["p50"], m.get("failed", 0)
print("## This build vs the baseline, one loadgen, alternating\n")
print("| workload | metric | this | baseline | this / baseline | per round | failed |")
print("|---|---|---:|---:|---:|---|---:|")
for wl in workloads:
    this = [run(wl, "this", r) for r in range(1, rounds + 1)]
    base = [run(wl, "base", r) for r in range(1, rounds + 1)]
    failed = sum(x[2] for x in this + base)
    metrics = [("completion tok/s (higher is better)", 0)]
    if wl == "seed048":
        metrics.append(("TTFT p50 ms (lower is better)", 1))
    for name, i in metrics:
        t = statistics.median(x[i] for x in this)
        b = statistics.median(x[i] for x in base)
        per = ", ".join(f"{x[i] / y[i]:.3f}" for x, y in zip(this, base))
        print(f"| {wl} | {name} | {t:.1f} | {b:.1f} | {t / b:.3f} | {per} | {failed} |")
PY
cat "$OUT/result.md"
