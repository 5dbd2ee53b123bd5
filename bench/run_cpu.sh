#!/usr/bin/env bash
# Ember's engine vs PyTorch eager on the CPU, decode step by step, in one
# invocation. From the repo root, with a release build of ember-engine-bench:
#
#   bash bench/run_cpu.sh
#   bash bench/run_cpu.sh --dry-run     # or DRY_RUN=1: the plumbing only (below)
#
# Workload (both sides): GPT-2 124M (GPT2Config defaults), random weights;
# Ember once per weight format in WEIGHTS (f32 and bf16: --cpu-weights), torch
# in f32; for each batch size B, B random prompts of CONTEXT tokens are prefilled, then
# WARMUP untimed and STEPS timed decode steps of one token per row (forward +
# greedy sampling). The figure compared is each side's p50 ms/step (nearest
# rank over the timed steps, computed the same way by both).
#
#   Ember:  $EMBER_BIN_DIR/ember-engine-bench --device cpu --preset gpt2
#           --batch-sizes B --context CONTEXT --steps STEPS --warmup WARMUP
#           --membw-mib MEMBW_MIB --cpu-weights W --json F
#   torch:  bench/peer_cpu.py (transformers GPT2LMHeadModel, eager,
#           past_key_values) with the same flags
#
# Each Ember run first measures the machine's streaming-read bandwidth on its
# rayon pool (--membw-mib: a buffer far larger than the caches, read with the
# widest vector loads), so every row also gives the step's weight-read floor
# (weights read per step / that bandwidth) and the share of it the step
# reaches. The table (bench/cpu_table.py) names the CPU model and its SIMD
# features; it reads exactly the keys it documents and fails, naming the key,
# if one is missing.
#
# Dry run (--dry-run or DRY_RUN=1): both weight formats, the tiny preset,
# context 16, batch 1 and 2,
# 1 warmup + 2 timed steps, one pass, a 16 MiB probe, and a stub peer
# (peer_cpu.py --stub: no torch, an empty step timed) under the system
# python3; no venv is made. tests/tests/bench_scripts.rs runs it against the
# built binary and checks that the table has numbers.
#
# Order, for fairness on a shared machine: for each pass (PASSES, default 2),
# for each batch size: Ember in each weight format, then torch. Every
# (pass, batch) pair is reported.
#
# Environment knobs (defaults in brackets):
#   EMBER_BIN_DIR      dir holding ember-engine-bench [<repo>/target/release]
#   OUT                results dir [<repo>/bench-out-cpu]
#   EMBER_BENCH_VENV   python venv with torch + transformers, created if missing
#                      or lacking them [$HOME/.cache/ember/bench-venv]
#   PYTHON             use this interpreter instead (no venv is made or touched)
#   WEIGHTS [f32,bf16]  Ember's weight formats (--cpu-weights), each a column
#   BATCH_SIZES [1,16]  CONTEXT [128]  STEPS [32]  WARMUP [4]  PASSES [2]
#   PRESET [gpt2]  MEMBW_MIB [1024]
#   TORCH_THREADS      peer_cpu.py --threads (default: torch's choice; Ember's
#                      rayon pool uses every logical CPU unless RAYON_NUM_THREADS)
#   BASELINE_BIN_DIR   a dir holding an earlier ember-engine-bench (e.g. built
#                      at a branch point): run after Ember in each format, with
#                      the same flags, interleaved; the summary gains its mean
#                      ms/step and the change [unset: not run]
#   ENGINE_EXTRA_ARGS  more flags for ember-engine-bench (word-split; e.g.
#                      "--cpu-isa avx512" times the bf16 fallback kernel)
#   PEER_EXTRA_ARGS    more flags for peer_cpu.py (word-split)
#   STAGE_TIMEOUT_S    limit per engine/peer invocation [1800]
#
# $OUT gets: bench.log (everything), raw/ember_<weights>_p<pass>_b<batch>.json,
# raw/base_<weights>_p<pass>_b<batch>.json, raw/torch_p<pass>_b<batch>.json,
# results.json (merged), table.md (the table, also printed at the end) and
# pip-freeze.txt (the python environment used).
set -uo pipefail

# ---- paths and knobs -----------------------------------------------------------
for arg in "$@"; do
    case $arg in
    --dry-run) DRY_RUN=1 ;;
    *) echo "usage: bash bench/run_cpu.sh [--dry-run]" >&2; exit 2 ;;
    esac
done
DRY_RUN=${DRY_RUN:-0}
if [[ $DRY_RUN == 1 ]]; then
    PRESET=tiny CONTEXT=16 BATCH_SIZES=1,2 STEPS=2 WARMUP=1 PASSES=1 MEMBW_MIB=16
    PYTHON=${PYTHON:-python3}
fi
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || exit 1
BIN_DIR=${EMBER_BIN_DIR:-$REPO/target/release}
OUT=${OUT:-$REPO/bench-out-cpu}
mkdir -p "$OUT/raw" || exit 1
OUT=$(cd "$OUT" && pwd) || exit 1          # relative to the caller's directory
if [[ -d $BIN_DIR ]]; then BIN_DIR=$(cd "$BIN_DIR" && pwd); fi
ENGINE_BIN=$BIN_DIR/ember-engine-bench
BASE_BIN=${BASELINE_BIN_DIR:+$BASELINE_BIN_DIR/ember-engine-bench}
VENV=${EMBER_BENCH_VENV:-$HOME/.cache/ember/bench-venv}
BATCH_SIZES=${BATCH_SIZES:-1,16}
WEIGHTS=${WEIGHTS:-f32,bf16}
CONTEXT=${CONTEXT:-128}
STEPS=${STEPS:-32}
WARMUP=${WARMUP:-4}
PASSES=${PASSES:-2}
PRESET=${PRESET:-gpt2}
MEMBW_MIB=${MEMBW_MIB:-1024}
TORCH_THREADS=${TORCH_THREADS:-}
STAGE_TIMEOUT_S=${STAGE_TIMEOUT_S:-1800}
read -r -a ENGINE_EXTRA <<<"${ENGINE_EXTRA_ARGS:-}"
read -r -a PEER_EXTRA <<<"${PEER_EXTRA_ARGS:-}"

# The versions this script installs into a new venv (plain PyPI wheels; the
# download.pytorch.org index is not needed). An existing venv is reused as is.
TORCH_PIN=2.15.0
TRANSFORMERS_PIN=5.23.0

LOG=$OUT/bench.log
cd "$REPO" || exit 1

# ---- helpers -------------------------------------------------------------------
machine() {
    echo "# Ember vs torch, CPU decode"
    echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host:     $(uname -n) ($(uname -sr), $(uname -m))"
    echo "cpu:      $(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')"
    echo "simd:     $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' |
        grep -E '^(avx2|fma|avx512.*|amx.*)$' | tr '\n' ' ')"
    echo "nproc:    $(nproc)"
    if command -v lscpu >/dev/null; then
        lscpu | grep -E '^(Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|L3 cache):' |
            sed 's/  */ /g; s/^/          /'
    fi
    echo "memory:   $(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo 2>/dev/null)"
    echo "loadavg:  $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null) (at start)"
    echo "git:      $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' (dirty tree)')"
    echo "engine:   $ENGINE_BIN${BASE_BIN:+ (baseline: $BASE_BIN)}"
    echo "threads:  RAYON_NUM_THREADS=${RAYON_NUM_THREADS:-unset} OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset} TORCH_THREADS=${TORCH_THREADS:-default}"
    echo "workload: preset $PRESET, Ember weights $WEIGHTS, batch sizes $BATCH_SIZES, context $CONTEXT, $WARMUP warmup + $STEPS timed steps, $PASSES passes, probe $MEMBW_MIB MiB"
    if [[ $DRY_RUN == 1 ]]; then echo "DRY RUN: tiny model, stub peer (no torch); the numbers mean nothing"; fi
}

# Sets PY: $PYTHON, or the venv's python (made and filled if needed).
setup_python() {
    if [[ -n ${PYTHON:-} ]]; then
        PY=$PYTHON
        if [[ $DRY_RUN == 1 ]]; then
            "$PY" -c 'import sys; print(f"python:   {sys.executable} {sys.version.split()[0]} (stub peer)")'
            return
        fi
    else
        PY=$VENV/bin/python
        if ! "$PY" -c 'import torch, transformers' 2>/dev/null; then
            echo "== venv: installing torch==$TORCH_PIN transformers==$TRANSFORMERS_PIN into $VENV"
            [[ -x $PY ]] || python3 -m venv "$VENV" || return 1
            "$PY" -m pip install --progress-bar off -q --upgrade pip || return 1
            "$PY" -m pip install --progress-bar off \
                "torch==$TORCH_PIN" "transformers==$TRANSFORMERS_PIN" || return 1
        fi
    fi
    "$PY" -c 'import sys, torch, transformers
print(f"python:   {sys.executable} {sys.version.split()[0]}")
print(f"torch:    {torch.__version__} (threads {torch.get_num_threads()}), transformers {transformers.__version__}")' || return 1
    "$PY" -m pip freeze >"$OUT/pip-freeze.txt" 2>/dev/null || true
}

FAILED=()
# run_stage NAME JSON CMD...: runs CMD under the stage limit; logs its exit code.
run_stage() {
    local name=$1 json=$2 rc=0 t0=$SECONDS
    shift 2
    echo
    echo "== $name: $*"
    rm -f "$json"
    timeout "$STAGE_TIMEOUT_S" "$@" || rc=$?
    echo "== $name: rc $rc, $((SECONDS - t0)) s"
    if [[ $rc -ne 0 || ! -s $json ]]; then FAILED+=("$name"); fi
}

merge() {
    "$PY" bench/cpu_table.py "$OUT"
}

main() {
    # Results of an earlier run in the same $OUT would be merged into this table.
    rm -f "$OUT"/raw/*.json "$OUT/table.md" "$OUT/results.json"
    machine
    if ! setup_python; then
        echo "error: no python with torch + transformers (venv $VENV)"
        return 1
    fi
    if [[ ! -x $ENGINE_BIN ]]; then
        echo "warning: $ENGINE_BIN not found or not executable: Ember columns will be empty"
        FAILED+=("ember (no binary at $ENGINE_BIN)")
    fi
    local pass b w ej bj tj
    local -a ember_args
    local -a batches formats torch_threads=() peer_mode=()
    IFS=, read -r -a batches <<<"$BATCH_SIZES"
    IFS=, read -r -a formats <<<"$WEIGHTS"
    if [[ -n $TORCH_THREADS ]]; then torch_threads=(--threads "$TORCH_THREADS"); fi
    if [[ $DRY_RUN == 1 ]]; then peer_mode=(--stub --tiny); fi
    for ((pass = 1; pass <= PASSES; pass++)); do
        for b in "${batches[@]}"; do
            tj=$OUT/raw/torch_p${pass}_b$b.json
            for w in "${formats[@]}"; do
                ej=$OUT/raw/ember_${w}_p${pass}_b$b.json
                bj=$OUT/raw/base_${w}_p${pass}_b$b.json
                ember_args=(--device cpu --preset "$PRESET" --batch-sizes "$b" --context "$CONTEXT"
                    --steps "$STEPS" --warmup "$WARMUP" --membw-mib "$MEMBW_MIB" --cpu-weights "$w"
                    "${ENGINE_EXTRA[@]}")
                if [[ -x $ENGINE_BIN ]]; then
                    run_stage "ember $w pass $pass batch $b" "$ej" "$ENGINE_BIN" "${ember_args[@]}" --json "$ej"
                fi
                if [[ -n $BASE_BIN ]]; then
                    run_stage "baseline $w pass $pass batch $b" "$bj" "$BASE_BIN" "${ember_args[@]}" --json "$bj"
                fi
            done
            run_stage "torch pass $pass batch $b" "$tj" "$PY" bench/peer_cpu.py \
                --batch-sizes "$b" --context "$CONTEXT" --steps "$STEPS" --warmup "$WARMUP" \
                --dtype float32 "${torch_threads[@]}" "${peer_mode[@]}" --json "$tj" "${PEER_EXTRA[@]}"
        done
    done
    echo
    echo "loadavg:  $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null) (at end)"
    echo
    merge || FAILED+=("table (bench/cpu_table.py)")
    if ((${#FAILED[@]})); then
        printf 'failed stage: %s\n' "${FAILED[@]}"
        return 1
    fi
}

main 2>&1 | tee "$LOG"
