# Shared by bench/run_gpu.sh and bench/run_family.sh (sourced, not run): the
# time-limited stages and their record, the environment report, and one
# ember-server's start, health wait, stop and cold start.
#
# The caller sets REPO (the repository root), PY (python3) and OUT (results
# dir); bench_start sets T0, END, WORK, LOG, STAGES and copies everything
# printed into $OUT/bench.log. start_server and cold_start also read
# SERVER_BIN, SERVER_COMMON (an array: the flags of every start), T_LISTEN,
# T_SERVING and RESERVE_S (seconds before END that a start leaves alone).
# shellcheck shell=bash

# bench_start WALL_S: the clock (T0, END = T0 + WALL_S), $WORK (removed at
# exit), $OUT/bench.log (a copy of everything printed), $STAGES, the traps.
bench_start() {
    T0=$(date +%s)
    END=$((T0 + $1))
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
    trap bench_cleanup EXIT
    trap 'say "interrupted"; exit 130' INT TERM
}

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

bench_cleanup() {
    stop_server
    rm -rf "$WORK"
    # Let tee write the last lines into bench.log before the script ends.
    exec >&- 2>&-
    wait "$TEE_PID" 2>/dev/null
}

# bench_environment BIN...: host, GPU, CUDA toolkit (exports CUDA_PATH and the
# LD_LIBRARY_PATH NVRTC needs), python packages and each binary's hash, into
# the log and $WORK/env.txt, nvidia-smi.csv and python.txt.
bench_environment() {
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
    local b
    for b in "$@"; do
        if [[ -x $b ]]; then
            say "binary $b: $(sha256sum "$b" | cut -c1-16) $(timeout 10 "$b" --version 2>/dev/null | head -1)"
        else
            say "binary $b: missing"
        fi
    done
}

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

# shellcheck disable=SC2153 # SERVER_BIN and SERVER_COMMON are the caller's
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
    if ! wait_serving "$ADDR" "$(limit "$T_SERVING" "${RESERVE_S:-0}")"; then
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

