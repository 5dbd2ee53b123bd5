#!/usr/bin/env bash
# The GPT-2 family on one GPU (issue 41): Ember's engine against the
# torch.compile peer at 124M, medium, large and xl, in one invocation, with
# ONE markdown table. From the repository root on the GPU machine, with the
# release binaries in .device/:
#
#   OUT=/some/dir bash bench/run_family.sh
#   SIZES="medium xl" OUT=/some/dir bash bench/run_family.sh
#   bash bench/run_family.sh --dry-run    # CPU: a tiny model dir, float32, 2 steps
#
# Stages, each time-limited (bench/bench_lib.sh's `stage`; a failed one is
# logged and the rest go on):
#   1. environment: GPU, CUDA toolkit (NVRTC), python packages, binaries
#   2. models: `bench/family.py write` makes one random-weight HF directory per
#      size (transformers' GPT2LMHeadModel init from a fixed seed, fp16,
#      config.json + model.safetensors) under MODELS_DIR, kept between calls
#   3. per size, in SIZES order, within its share of the time left (shares
#      weighted gpt2 2, medium 3, large 4, xl 5):
#      - .device/ember-engine-bench --model-dir D --graphs --no-eager, one run per
#        context in CONTEXTS (decode at every batch of BATCHES whose KV cache
#        fits in the GPU's memory: `family.py fit`); the i-th shape of
#        PREFILLS is timed in the i-th run (`--prefill N,L`)
#      - bench/peer_compile.py --model-dir D on the same shapes (its own check
#        against transformers first)
#   4. cold start of the largest size: ember-server --model-dir D, an empty
#      --kernel-cache-dir, seconds from launch to health SERVING, then a
#      restart on that cache (bench_lib.sh's cold_start, as in run_gpu.sh)
#   5. `bench/family.py table`: the table, with each size's weight-read floor
#      (engine bench's weight_bytes_per_step / HBM_TBS) beside its B=1 rows
#
# Contexts: a context c is the position the peer decodes at (it attends to
# c + 1 tokens). Ember's decode steps advance one position each, so Ember's
# prompts are c - WARMUP - STEPS - STEPS/2 tokens long: its STEPS timed graph
# steps are centred on c. GPT-2 has 1024 positions and Ember's run needs
# WARMUP + 2 * STEPS + 1 of them after the prompt, so c <= 1023 - STEPS/2
# (1007 at STEPS=32): the long context is 1000, not 1024.
#
# $OUT gets: bench.log (everything), table.md (printed at the end too),
# results.json (the rows, the stage list and every raw JSON) and raw/. The
# exit status is 1 when a stage failed, timed out or had no time left.
#
# Knobs (environment, defaults in brackets): SIZES [gpt2 medium large xl],
# CONTEXTS [256 1000], BATCHES [1,8,64,256], PREFILLS [1x256 16x256], STEPS
# [32], WARMUP [4], PEER_ITERS [100], PEER_WARMUP [20], PEER_COMPILE_MODE
# [default; max-autotune-no-cudagraphs autotunes, slower to compile],
# PEER_EXTRA_ARGS, HBM_TBS [from the GPU's name: H200 4.8, H100 SXM 3.35, H100
# NVL 3.9, H100 PCIe 2.0], BENCH_WALL_S [530], COLD_RESERVE_S [130: kept for
# the cold start and the table], COLD_START [1], MODELS_DIR
# [~/.cache/ember/family-models], EMBER_BIN_DIR [.device], PYTHON [python3],
# DEVICE [cuda].
#
# Dry run (--dry-run or DRY_RUN=1; tested in CI by tests/tests/bench_scripts.rs):
# the tiny size on the CPU (ember binaries from target/release), contexts 16
# and 24, batches 1 and 2, prefills 1x8 and 2x8, 1 warmup + 2 steps, the peer
# in float32 with few iterations, the cold start on the CPU; the model
# directory is written into $OUT/models. Without torch (CI) the directory is
# written with the standard library and the peer is `peer_compile.py --stub`
# (an empty step timed: the numbers mean nothing, the plumbing is tested).
set -u

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
REPO=$PWD
for arg in "$@"; do
    case $arg in
    --dry-run) DRY_RUN=1 ;;
    *) echo "usage: bash bench/run_family.sh [--dry-run]" >&2; exit 2 ;;
    esac
done
DRY_RUN=${DRY_RUN:-0}
OUT=${OUT:-$REPO/bench-out-family}
if [[ $DRY_RUN == 1 ]]; then
    DEVICE=cpu SIZES=tiny CONTEXTS="16 24" BATCHES=1,2 PREFILLS="1x8 2x8" STEPS=2 WARMUP=1
    PEER_ITERS=3 PEER_WARMUP=1 PEER_COMPILE_MODE=default BENCH_WALL_S=${BENCH_WALL_S:-900}
    COLD_RESERVE_S=${COLD_RESERVE_S:-60}
    EMBER_BIN_DIR=${EMBER_BIN_DIR:-$REPO/target/release} MODELS_DIR=$OUT/models
fi

# ---- knobs -------------------------------------------------------------------
BIN_DIR=${EMBER_BIN_DIR:-$REPO/.device}
SERVER_BIN=$BIN_DIR/ember-server
ENGINE_BIN=$BIN_DIR/ember-engine-bench
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
read -r -a SIZE_LIST <<<"${SIZES:-gpt2 medium large xl}"
read -r -a CONTEXT_LIST <<<"${CONTEXTS:-256 1000}"
read -r -a PREFILL_LIST <<<"${PREFILLS:-1x256 16x256}"
BATCHES=${BATCHES:-1,8,64,256}
STEPS=${STEPS:-32}
WARMUP=${WARMUP:-4}
PEER_ITERS=${PEER_ITERS:-100}
PEER_WARMUP=${PEER_WARMUP:-20}
PEER_COMPILE_MODE=${PEER_COMPILE_MODE:-default}
read -r -a PEER_EXTRA <<<"${PEER_EXTRA_ARGS:-}"
MODELS_DIR=${MODELS_DIR:-$HOME/.cache/ember/family-models}
BENCH_WALL_S=${BENCH_WALL_S:-530}
COLD_RESERVE_S=${COLD_RESERVE_S:-130}
T_WRITE=240      # all model directories
T_EMBER=240      # one engine-bench run, at most (and its part of the size's share)
T_TABLE=30
T_LISTEN=60      # cold start: launch -> "listening on"
T_SERVING=150    # cold start: listening -> SERVING
RESERVE_S=$T_TABLE

# shellcheck source=bench/bench_lib.sh
source "$REPO/bench/bench_lib.sh"
mkdir -p "$OUT/raw" || exit 1
rm -f "$OUT"/raw/*.json
bench_start "$BENCH_WALL_S"
RAW=$OUT/raw
export PYTHONUNBUFFERED=1

# ---- 1. environment ----------------------------------------------------------------
say "GPT-2 family bench in $REPO: sizes ${SIZE_LIST[*]}, contexts ${CONTEXT_LIST[*]}," \
    "batches $BATCHES, prefills ${PREFILL_LIST[*]}; output in $OUT, wall limit ${BENCH_WALL_S}s"
bench_environment "$SERVER_BIN" "$ENGINE_BIN"
GPU_NAME='' MEM_MIB=0
if [[ $DEVICE == cuda* ]] && command -v nvidia-smi >/dev/null 2>&1; then
    gpu=${DEVICE#cuda}
    gpu=${gpu#:}
    IFS=, read -r GPU_NAME MEM_MIB < <(nvidia-smi -i "${gpu:-0}" \
        --query-gpu=name,memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
    MEM_MIB=${MEM_MIB// /}
fi
if [[ -z ${HBM_TBS:-} ]]; then
    case $GPU_NAME in
    *H200*) HBM_TBS=4.8 ;;
    *H100*PCIe*) HBM_TBS=2.0 ;;
    *H100*NVL*) HBM_TBS=3.9 ;;
    *H100*) HBM_TBS=3.35 ;;
    *) HBM_TBS=0 ;;
    esac
fi
say "GPU: ${GPU_NAME:-none} (${MEM_MIB:-0} MiB); HBM ${HBM_TBS} TB/s for the weight-read floor"
PEER=(bench/peer_compile.py)
PEER_DTYPE=float16
if [[ $DRY_RUN == 1 ]]; then
    PEER_DTYPE=float32
    if ! "$PY" -c 'import torch, transformers' 2>/dev/null; then
        say "DRY RUN without torch: the model dir from the standard library, the peer as --stub"
        PEER+=(--stub)
    fi
fi

# ---- 2. model directories ------------------------------------------------------------
stage models "$(limit $T_WRITE "$COLD_RESERVE_S")" "$PY" bench/family.py write "$MODELS_DIR" \
    "${SIZE_LIST[@]}" --dtype "$PEER_DTYPE" --device "$DEVICE"

# ---- 3. per size: Ember, then the peer -------------------------------------------------
weight() { case $1 in gpt2) echo 2 ;; medium) echo 3 ;; large) echo 4 ;; xl) echo 5 ;; *) echo 2 ;; esac; }
weights_left() {
    local s sum=0
    for s in "$@"; do sum=$((sum + $(weight "$s"))); done
    echo "$sum"
}

# ember_run SIZE DIR INDEX LIMIT: the INDEX-th engine-bench run of SIZE: decode at
# CONTEXT_LIST[INDEX] (if any), with PREFILL_LIST[INDEX] (if any).
ember_run() {
    local size=$1 dir=$2 i=$3 t=$4 ctx='' prefill='' name args=()
    ((i < ${#CONTEXT_LIST[@]})) && ctx=${CONTEXT_LIST[$i]}
    ((i < ${#PREFILL_LIST[@]})) && prefill=${PREFILL_LIST[$i]}
    if [[ -n $ctx ]]; then
        local prompt=$((ctx - WARMUP - STEPS - STEPS / 2)) batches
        batches=$("$PY" bench/family.py fit --model-dir "$dir" --batches "$BATCHES" \
            --positions $((prompt + WARMUP + 2 * STEPS + 1)) --mem-mib "${MEM_MIB:-0}" \
            --elem-bytes "$([[ $DEVICE == cpu ]] && echo 4 || echo 2)" \
            --skipped "$RAW/ember-$size-c$ctx.skipped.json")
        name=c$ctx
        args=(--batch-sizes "${batches:-1}" --context "$prompt" --steps "$STEPS" --warmup "$WARMUP")
    else
        name=p$i
        args=(--batch-sizes 1 --context 16 --steps 1 --warmup 1)
    fi
    [[ -n $prefill ]] && args+=(--prefill "${prefill/x/,}")
    stage "ember:$size:$name" "$t" "$ENGINE_BIN" --device "$DEVICE" --model-dir "$dir" --graphs --no-eager \
        "${args[@]}" --json "$RAW/ember-$size-$name.json"
}

RUNS=$((${#CONTEXT_LIST[@]} > ${#PREFILL_LIST[@]} ? ${#CONTEXT_LIST[@]} : ${#PREFILL_LIST[@]}))
for ((k = 0; k < ${#SIZE_LIST[@]}; k++)); do
    size=${SIZE_LIST[$k]}
    dir=$MODELS_DIR/$size
    share=$(($(limit 100000 "$COLD_RESERVE_S") * $(weight "$size") / $(weights_left "${SIZE_LIST[@]:k}")))
    deadline=$(($(date +%s) + share))
    say "== $size: ${share}s (Ember runs up to 45% of it, the peer the rest)"
    if [[ ! -f $dir/config.json ]]; then
        record "size:$size" 1 0 "no model directory $dir"
        continue
    fi
    if [[ -x $ENGINE_BIN ]]; then
        for ((i = 0; i < RUNS; i++)); do
            want=$((share * 45 / 100 / RUNS))
            ember_run "$size" "$dir" "$i" "$(limit $((want < T_EMBER ? want : T_EMBER)) "$COLD_RESERVE_S")"
        done
    else
        record "ember:$size" missing 0 "$ENGINE_BIN not found"
    fi
    ctx_csv=$(IFS=,; echo "${CONTEXT_LIST[*]}")
    prefill_csv=$(IFS=,; echo "${PREFILL_LIST[*]}")
    stage "peer:$size" "$((deadline - $(date +%s)))" "$PY" "${PEER[@]}" --device "$DEVICE" \
        --model-dir "$dir" --dtype "$PEER_DTYPE" --batch-sizes "$BATCHES" --contexts "$ctx_csv" \
        --prefill "$prefill_csv" --iters "$PEER_ITERS" --warmup "$PEER_WARMUP" \
        --prefill-iters "$PEER_ITERS" --compile-mode "$PEER_COMPILE_MODE" "${PEER_EXTRA[@]}" \
        --json "$RAW/peer-$size.json"
done

# ---- 4. cold start of the largest size -------------------------------------------------
COLD_SIZE=
for s in tiny gpt2 medium large xl; do
    [[ " ${SIZE_LIST[*]} " == *" $s "* && -f $MODELS_DIR/$s/config.json ]] && COLD_SIZE=$s
done
if [[ ${COLD_START:-1} == 1 && -x $SERVER_BIN && -n $COLD_SIZE ]]; then
    SERVER_COMMON=(--device "$DEVICE" --listen 127.0.0.1:0 --model-dir "$MODELS_DIR/$COLD_SIZE"
        --max-pending 4096 --shutdown-timeout 5)
    say "cold start: $COLD_SIZE, an empty --kernel-cache-dir, then a restart on it"
    cold_start "cold_$COLD_SIZE" "$WORK/cache-cold"
    cold_start "restart_$COLD_SIZE" "$WORK/cache-cold"
else
    record cold_start skipped 0 "COLD_START=0, no server binary or no model directory"
fi

# ---- 5. the table ------------------------------------------------------------------------
say "the table"
timeout "$T_TABLE" "$PY" bench/family.py table --raw "$RAW" --stages "$STAGES" \
    --sizes "${SIZE_LIST[@]}" --contexts "${CONTEXT_LIST[*]}" --prefills "${PREFILL_LIST[*]}" \
    --batches "$BATCHES" --hbm-tbs "$HBM_TBS" --cold-size "$COLD_SIZE" \
    --notes "Ember step: engine bench --graphs, p50 of $STEPS graph steps centred on ctx, each ending with the ids' read-back; Ember overlapped: the same steps in the overlapped loop (each call queues a step, then reads the previous one's ids: the server's default), whose ratio Ember / peer shows; Ember GPU-only: graph replays back to back; Ember prefill: one prefill step (blocks taken, inputs written, ids read back), replayed from its captured graph where the server has one (up to 4,096 tokens), else eager. peer: peer_compile.py (torch.compile $PEER_COMPILE_MODE), median of $PEER_ITERS replays + .cpu() of the ids at position ctx; peer GPU-only: replays back to back. Ember / peer > 1: Ember slower. Floor: weight bytes per step / HBM." \
    --table "$OUT/table.md" --results "$OUT/results.json" || record table 1 0 "family.py table failed"
column -t -s $'\t' "$STAGES" 2>/dev/null || cat "$STAGES"
# Exit 1 when a stage failed, timed out or found no time left (the table names it).
failed=$(awk -F'\t' '($2 != "0" && $2 != "skipped") || $4 == "no time left"' "$STAGES" | wc -l)
say "done in $(($(date +%s) - T0))s; files in $OUT; $failed stage(s) not clean"
((failed == 0))
