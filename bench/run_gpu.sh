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
WORKLOADS=(
    "seed044|--max-batch-size 64|--num-requests 64 --max-new-tokens 256 --submit-interval-ms 0 --no-stop-on-eos --unique-prompts --prompt Hello --warmup-runs 1 --repeat-runs 3"
    "single_1x256|--max-batch-size 64|--num-requests 1 --max-new-tokens 256 --submit-interval-ms 0 --no-stop-on-eos --prompt Hello --warmup-runs 1 --repeat-runs 3"
    "seed045|--max-batch-size 64 --prefill-max-batch-size 16|--num-requests 256 --max-new-tokens 64 --submit-interval-ms 0 --no-stop-on-eos --unique-prompts --prompt Hello --warmup-runs 1 --repeat-runs 3"
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
T0=$(date +%s)
END=$((T0 + BENCH_WALL_S))
OUT=${OUT:-$REPO/bench-out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
LOG=$OUT/bench.log
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!
export NO_COLOR=1 # plain logs from ember-server and loadgen (tracing)
STAGES=$WORK/stages.tsv
: >"$STAGES"
SERVER_PID=

say() { printf '[bench %4ds] %s\n' "$(($(date +%s) - T0))" "$*"; }

# limit WANT [RESERVE]: WANT capped by what is left before END - RESERVE (>= 0).
limit() {
    local want=$1 reserve=${2:-0} left
    left=$((END - reserve - $(date +%s)))
    ((left < 0)) && left=0
    echo $((want < left ? want : left))
}

# record NAME RC SECONDS NOTE
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$STAGES"; }

# stage NAME TIMEOUT CMD...: runs CMD under timeout, logs and records the result.
stage() {
    local name=$1 t=$2 rc start
    shift 2
    start=$(date +%s)
    if ((t <= 0)); then
        say "SKIP $name: no time left"
        record "$name" skipped 0 "no time left"
        return 1
    fi
    say ">>> $name (limit ${t}s): $*"
    timeout --kill-after=10 "$t" "$@"
    rc=$?
    local note=
    ((rc == 124 || rc == 137)) && note="timed out after ${t}s"
    say "<<< $name: exit $rc after $(($(date +%s) - start))s ${note}"
    record "$name" "$rc" "$(($(date +%s) - start))" "$note"
    return "$rc"
}

stop_server() {
    [[ -n $SERVER_PID ]] || return 0
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null
        for _ in $(seq 1 150); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$SERVER_PID" 2>/dev/null; then
            say "server $SERVER_PID did not exit 15 s after SIGTERM; SIGKILL"
            kill -KILL "$SERVER_PID" 2>/dev/null
        fi
    fi
    wait "$SERVER_PID" 2>/dev/null
    say "server exited with $?"
    SERVER_PID=
}

cleanup() {
    stop_server
    rm -rf "$WORK"
    # Let tee write the last lines into bench.log before the script ends.
    exec >&- 2>&-
    wait "$TEE_PID" 2>/dev/null
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

# ---- 1. environment -------------------------------------------------------------
say "Ember GPU bench in $REPO, output in $OUT, wall limit ${BENCH_WALL_S}s"
{
    echo "date_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host=$(uname -n)"
    echo "kernel=$(uname -r)"
    echo "cpus=$(nproc)"
} | tee "$WORK/env.txt"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu,utilization.gpu \
        --format=csv | tee "$WORK/nvidia-smi.csv"
    nvidia-smi | head -20
else
    say "nvidia-smi not found"
fi

# The CUDA backend compiles kernels with NVRTC at run time: it needs libnvrtc and
# the toolkit's headers ($CUDA_PATH/include, default /usr/local/cuda).
if [[ -z ${CUDA_PATH:-} ]]; then
    for d in /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-13 /opt/cuda; do
        if [[ -f $d/include/cuda_runtime.h ]]; then
            export CUDA_PATH=$d
            break
        fi
    done
fi
say "CUDA_PATH=${CUDA_PATH:-<not found>}"
if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
    for d in "${CUDA_PATH:-/usr/local/cuda}/lib64" "${CUDA_PATH:-/usr/local/cuda}/targets/x86_64-linux/lib"; do
        [[ -d $d ]] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
fi
say "libnvrtc: $(ldconfig -p 2>/dev/null | grep -m1 -o 'libnvrtc\.so[^ ]*' \
    || find "${CUDA_PATH:-/usr/local/cuda}/lib64/" -maxdepth 1 -name 'libnvrtc.so*' 2>/dev/null | head -1)"
"$PY" - <<'EOF' 2>&1 | tee "$WORK/python.txt"
import sys
print("python", sys.version.split()[0])
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda,
          "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
except Exception as e:
    print("torch unavailable:", e)
try:
    import transformers
    print("transformers", transformers.__version__)
except Exception as e:
    print("transformers unavailable:", e)
try:
    import grpc
    print("grpcio", grpc.__version__)
except Exception as e:
    print("grpcio unavailable:", e)
EOF
for b in "$SERVER_BIN" "$LOADGEN_BIN" "$ENGINE_BENCH_BIN"; do
    if [[ -x $b ]]; then
        say "binary $b: $(sha256sum "$b" | cut -c1-16) $(timeout 10 "$b" --version 2>/dev/null | head -1)"
    else
        say "binary $b: missing"
    fi
done

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
# wait_serving ADDR SECONDS: grpc.health.v1 Check("ember.v1.Inference") until SERVING.
wait_serving() {
    local addr=$1 secs=$2
    if "$PY" -c 'import grpc' 2>/dev/null; then
        "$PY" - "$addr" "$secs" "$SERVER_PID" <<'EOF'
import os, sys, time
import grpc
addr, secs, pid = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
deadline = time.time() + secs
check = grpc.insecure_channel(addr).unary_unary("/grpc.health.v1.Health/Check")
# HealthCheckRequest{service: "ember.v1.Inference"}, hand-encoded (no generated code needed).
service = b"ember.v1.Inference"
request = b"\x0a" + bytes([len(service)]) + service
last = None
while time.time() < deadline:
    try:  # a dead child stays a zombie until the shell reaps it
        with open(f"/proc/{pid}/stat") as f:
            alive = f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        alive = False
    if not alive:
        sys.exit(f"server exited while starting (last health: {last})")
    try:
        reply = check(request, timeout=2)
        if reply == b"\x08\x01":  # HealthCheckResponse{status: SERVING}
            sys.exit(0)
        last = {b"": "UNKNOWN", b"\x08\x02": "NOT_SERVING"}.get(reply, reply.hex())
    except grpc.RpcError as e:
        last = e.code().name
    time.sleep(0.25)
sys.exit(f"not SERVING within {secs:.0f}s (last health: {last})")
EOF
    elif command -v curl >/dev/null 2>&1; then
        local deadline=$(($(date +%s) + secs))
        until "$REPO/deploy/ember-healthcheck" "$addr" >/dev/null; do
            kill -0 "$SERVER_PID" 2>/dev/null || { say "server exited while starting"; return 1; }
            (($(date +%s) < deadline)) || { say "not SERVING within ${secs}s"; return 1; }
            sleep 0.25
        done
    else
        say "no grpcio and no curl: cannot check health; waiting 30 s instead"
        sleep 30
    fi
}

# start_server LABEL KNOBS...: starts the server, sets ADDR; fails if not SERVING in time.
start_server() {
    local label=$1 line='' t0
    shift
    local out=$WORK/server-$label.out err=$WORK/server-$label.log
    t0=$(date +%s.%N)
    say "starting server [$label]: $SERVER_BIN ${SERVER_COMMON[*]} $*"
    RUST_LOG=${RUST_LOG:-info} "$SERVER_BIN" "${SERVER_COMMON[@]}" "$@" >"$out" 2>"$err" &
    SERVER_PID=$!
    local listen_deadline=$((${t0%.*} + T_LISTEN))
    while :; do
        line=$(grep -m1 '^listening on ' "$out" 2>/dev/null) && break
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            say "server [$label] exited before listening"
            return 1
        fi
        if (($(date +%s) >= listen_deadline)); then
            say "server [$label] printed no 'listening on' line in ${T_LISTEN}s"
            return 1
        fi
        sleep 0.1
    done
    ADDR=${line#listening on }
    say "server [$label] listening on $ADDR after $(($(date +%s) - ${t0%.*}))s; waiting for SERVING"
    if ! wait_serving "$ADDR" "$(limit $T_SERVING "$PEER_RESERVE_S")"; then
        return 1
    fi
    local took
    took=$(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }")
    say "server [$label] SERVING after ${took}s"
    record "server_start:$label" 0 "$took" "listening on $ADDR"
}

# dump_server_log LABEL: the server's stderr into the log (bounded).
dump_server_log() {
    local err=$WORK/server-$1.log n
    [[ -f $err ]] || return 0
    n=$(wc -l <"$err")
    say "---- server [$1] log ($n lines$( ((n > 240)) && echo ', first 120 and last 120'))"
    if ((n > 240)); then
        head -120 "$err"
        echo "[... $((n - 240)) lines ...]"
        tail -120 "$err"
    else
        cat "$err"
    fi
    say "---- end of server [$1] log"
}

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

# ---- 3b. cold start ----------------------------------------------------------------
# cold_start LABEL CACHE_DIR: one start to SERVING with --kernel-cache-dir CACHE_DIR,
# recorded as server_start:LABEL (seconds, from launch), then stopped.
cold_start() {
    local label=$1 dir=$2
    if start_server "$label" --max-batch-size 64 --kernel-cache-dir "$dir"; then
        say "cold start [$label]: $(tail -n1 "$STAGES" | cut -f3) s to SERVING"
    else
        record "server_start:$label" 1 0 "server did not become SERVING"
    fi
    stop_server
    grep -E 'warmup|tuned|cuBLASLt|cache' "$WORK/server-$label.log" | tail -n 8
}
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
