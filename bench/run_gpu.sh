#!/usr/bin/env bash
# Ember vs PyTorch on one GPU, in one invocation (issue 7). Run from the repo
# root on the GPU machine, with the stripped release binaries in .device/:
#
#   OUT=/some/dir bash bench/run_gpu.sh
#
# Stages, in order, each time-limited; a failed stage is logged and the rest go on:
#   1. environment: nvidia-smi, CUDA toolkit/NVRTC lookup, versions
#   2. engine bench: .device/ember-engine-bench (decode step by batch, prefill)
#   3. end to end: .device/ember-server on 127.0.0.1 (restarted with each knob set)
#      and .device/loadgen on the seeds' workloads 044, 045, 048 (absolute and
#      relative) and a single 1 x 256 stream
#   3b. cold start (COLD_START=1, the default): seconds from launch to health
#      SERVING (--max-batch-size 64) with an empty kernel cache, after
#      `ember-server --prepare-cache` into another directory (and that
#      preparation's own time), and a restart on the first cache
#   4. peers: bench/peer_hf.py (transformers generate, eager) and
#      bench/peer_cudagraph.py (static KV cache, one CUDA graph per step)
#   5. bench/summarize.py: one markdown comparison table
#
# $OUT receives three files: bench.log (everything, server logs included),
# results.json (every stage's JSON merged, with the commands and exit codes) and
# table.md (the comparison table, also printed at the end).
#
# The whole run stops itself within BENCH_WALL_S seconds (default 530), keeping
# PEER_RESERVE_S of it for the peers and the table even if Ember stages hang.
# The stage, server and cold-start helpers are bench/bench_lib.sh's (shared
# with bench/run_family.sh).
#
# Overridable from the environment: EMBER_BIN_DIR, PYTHON, BENCH_DEVICE,
# ENGINE_BENCH_ARGS, BENCH_WALL_S, BENCH_WORKLOADS (space-separated subset of
# the names below), SKIP_ENGINE=1, SKIP_E2E=1, SKIP_PEERS=1, and for a dry run
# on a CPU machine BENCH_PRESET (tiny), PEER_CG_ARGS, PEER_HF_ARGS, e.g.
#   BENCH_DEVICE=cpu BENCH_PRESET=tiny EMBER_BIN_DIR=target/release \
#   BENCH_WORKLOADS=single_1x256 PEER_CG_ARGS="--tiny --batch-sizes 1 --iters 5 --prefill 1x8" \
#   PEER_HF_ARGS="--tiny --batch-sizes 1 --new-tokens 8" bash bench/run_gpu.sh
set -u

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
REPO=$PWD

# ---- knobs -------------------------------------------------------------------
BIN_DIR=${EMBER_BIN_DIR:-$REPO/.device}
SERVER_BIN=$BIN_DIR/ember-server
LOADGEN_BIN=$BIN_DIR/loadgen
ENGINE_BENCH_BIN=$BIN_DIR/ember-engine-bench
PY=${PYTHON:-python3}
DEVICE=${BENCH_DEVICE:-cuda}

# Engine bench flags; `--json FILE` is appended. Change here if its CLI differs.
read -r -a ENGINE_ARGS <<<"${ENGINE_BENCH_ARGS:---device $DEVICE --batch-sizes 1,8,64,256 --context 256}"
ENGINE_JSON_FLAG=--json

# Every server: these plus the workload's knobs. Port 0: it prints its address.
SERVER_COMMON=(--device "$DEVICE" --listen 127.0.0.1:0 --preset "${BENCH_PRESET:-gpt2}"
    --max-pending 4096 --shutdown-timeout 5)

# Workloads: NAME|SERVER KNOBS|LOADGEN ARGS (issue 7). Consecutive workloads
# with the same knobs share one server start.
SEED044="--max-batch-size 64|--num-requests 64 --max-new-tokens 256 --submit-interval-ms 0 --no-stop-on-eos --unique-prompts --prompt Hello --warmup-runs 1 --repeat-runs 3"
SINGLE="--max-batch-size 64|--num-requests 1 --max-new-tokens 256 --submit-interval-ms 0 --no-stop-on-eos --prompt Hello --warmup-runs 1 --repeat-runs 3"
SEED045="--max-batch-size 64 --prefill-max-batch-size 16|--num-requests 256 --max-new-tokens 64 --submit-interval-ms 0 --no-stop-on-eos --unique-prompts --prompt Hello --warmup-runs 1 --repeat-runs 3"
# Sampled variants of each decode shape (issue 38): OpenAI's default
# temperature 1.0 alone and with each filter, run beside the greedy one on the
# same server, so no shape is measured greedy-only. SAMPLED=0 drops them.
SAMPLINGS=(
    "t1|--temperature 1.0"
    "t1_p09|--temperature 1.0 --top-p 0.9"
    "t1_k50|--temperature 1.0 --top-k 50"
    "t1_minp|--temperature 1.0 --min-p 0.05"
)
WORKLOADS=()
for shape in "seed044|$SEED044" "single_1x256|$SINGLE" "seed045|$SEED045"; do
    WORKLOADS+=("$shape")
    if [[ ${SAMPLED:-1} == 1 ]]; then
        for sampling in "${SAMPLINGS[@]}"; do
            WORKLOADS+=("${shape%%|*}_${sampling%%|*}|${shape#*|} ${sampling#*|}")
        done
    fi
done
WORKLOADS+=(
    "seed048_absolute|--max-batch-size 16 --prefill-max-batch-size 16|--prompt Hello --prompt-repeats 256 --unique-prompts --num-requests 256 --max-new-tokens 1 --submit-interval-ms 1 --submit-schedule absolute --warmup-runs 1 --repeat-runs 3"
    "seed048_relative|--max-batch-size 16 --prefill-max-batch-size 16|--prompt Hello --prompt-repeats 256 --unique-prompts --num-requests 256 --max-new-tokens 1 --submit-interval-ms 1 --submit-schedule relative --warmup-runs 1 --repeat-runs 3"
)

# Time limits (seconds).
BENCH_WALL_S=${BENCH_WALL_S:-530}
PEER_RESERVE_S=${PEER_RESERVE_S:-170} # kept for peers + table
T_ENGINE=150
T_LISTEN=60        # server: start -> "listening on"
T_SERVING=240      # server: listening -> health SERVING (load, warmup, NVRTC)
T_WORKLOAD=150
T_PEER_HF=100
T_PEER_GRAPH=100
T_SUMMARY=30

# ---- setup ---------------------------------------------------------------------
OUT=${OUT:-$REPO/bench-out}
RESERVE_S=$PEER_RESERVE_S # server starts leave this for the peers and the table
# shellcheck source=bench/bench_lib.sh
source "$REPO/bench/bench_lib.sh"
bench_start "$BENCH_WALL_S"

# ---- 1. environment -------------------------------------------------------------
say "Ember GPU bench in $REPO, output in $OUT, wall limit ${BENCH_WALL_S}s"
bench_environment "$SERVER_BIN" "$LOADGEN_BIN" "$ENGINE_BENCH_BIN"

# ---- 2. engine bench --------------------------------------------------------------
if [[ ${SKIP_ENGINE:-0} == 1 ]]; then
    record engine skipped 0 "SKIP_ENGINE=1"
elif [[ -x $ENGINE_BENCH_BIN ]]; then
    stage engine "$(limit $T_ENGINE "$PEER_RESERVE_S")" \
        "$ENGINE_BENCH_BIN" "${ENGINE_ARGS[@]}" "$ENGINE_JSON_FLAG" "$WORK/engine.json"
else
    record engine missing 0 "$ENGINE_BENCH_BIN not found"
fi

# ---- 3. end to end: server + loadgen ------------------------------------------------
# (start_server, stop_server, dump_server_log: bench/bench_lib.sh)
if [[ ${SKIP_E2E:-0} == 1 ]]; then
    record e2e skipped 0 "SKIP_E2E=1"
elif [[ ! -x $SERVER_BIN || ! -x $LOADGEN_BIN ]]; then
    record e2e missing 0 "$SERVER_BIN or $LOADGEN_BIN not found"
else
    current_knobs=
    label=
    for wl in "${WORKLOADS[@]}"; do
        IFS='|' read -r name knobs lg_args <<<"$wl"
        if [[ -n ${BENCH_WORKLOADS:-} && " $BENCH_WORKLOADS " != *" $name "* ]]; then
            continue
        fi
        if [[ $knobs != "$current_knobs" || -z $SERVER_PID ]] || ! kill -0 "$SERVER_PID" 2>/dev/null; then
            if [[ -n $SERVER_PID ]]; then
                stop_server
                dump_server_log "$label"
            fi
            label=$name
            current_knobs=$knobs
            read -r -a knob_arr <<<"$knobs"
            if (($(limit 60 "$PEER_RESERVE_S") < 60)); then
                say "SKIP $name: under 60 s left before the peers' reserve"
                record "$name" skipped 0 "no time left"
                current_knobs=
                continue
            fi
            if ! start_server "$label" "${knob_arr[@]}"; then
                record "server_start:$label" 1 0 "server did not become SERVING"
                stop_server
                dump_server_log "$label"
                record "$name" skipped 0 "server did not start"
                current_knobs=
                continue
            fi
        fi
        read -r -a lg_arr <<<"$lg_args"
        printf '{"server_args": "%s", "loadgen_args": "%s"}\n' \
            "${SERVER_COMMON[*]} $knobs" "$lg_args" >"$WORK/wl-$name.cmd.json"
        stage "$name" "$(limit $T_WORKLOAD "$PEER_RESERVE_S")" \
            "$LOADGEN_BIN" --target "http://$ADDR" "${lg_arr[@]}" --json "$WORK/wl-$name.json"
    done
    stop_server
    [[ -n $label ]] && dump_server_log "$label"
fi

# ---- 3b. cold start (cold_start: bench/bench_lib.sh) --------------------------------
if [[ ${COLD_START:-1} == 1 && -x $SERVER_BIN && $DEVICE == cuda ]]; then
    cold_start cold_empty "$WORK/cache-cold"
    cold_start restart "$WORK/cache-cold"
    t_prep=$(date +%s.%N)
    stage prepare_cache "$(limit 300 "$PEER_RESERVE_S")" "$SERVER_BIN" "${SERVER_COMMON[@]}" \
        --max-batch-size 64 --kernel-cache-dir "$WORK/cache-prepared" --prepare-cache
    say "prepare-cache took $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t_prep }") s"
    cold_start prepared "$WORK/cache-prepared"
else
    record cold_start skipped 0 "COLD_START=0, no server binary, or not cuda"
fi

# ---- 4. peers ------------------------------------------------------------------------
if [[ ${SKIP_PEERS:-0} == 1 ]]; then
    record peers skipped 0 "SKIP_PEERS=1"
else
    export PYTHONUNBUFFERED=1
    read -r -a cg_args <<<"${PEER_CG_ARGS:---batch-sizes 1,8,64,256 --contexts 256}"
    read -r -a hf_args <<<"${PEER_HF_ARGS:---batch-sizes 1,64 --new-tokens 256}"
    stage peer_cudagraph "$(limit $T_PEER_GRAPH $T_SUMMARY)" \
        "$PY" bench/peer_cudagraph.py --device "$DEVICE" "${cg_args[@]}" \
        --json "$WORK/peer-cudagraph.json"
    stage peer_hf "$(limit $T_PEER_HF $T_SUMMARY)" \
        "$PY" bench/peer_hf.py --device "$DEVICE" "${hf_args[@]}" --json "$WORK/peer-hf.json"
fi

# ---- 5. results.json + table ----------------------------------------------------------
say "collecting results"
timeout 60 "$PY" bench/summarize.py --collect "$WORK" --results "$OUT/results.json" \
    --table "$OUT/table.md" || say "summarize.py failed (exit $?); raw stage list:"
column -t -s $'\t' "$STAGES" 2>/dev/null || cat "$STAGES"
say "done in $(($(date +%s) - T0))s; files in $OUT: $(cd "$OUT" && echo *)"
