#!/usr/bin/env bash
# One ember-server per GPU on a multi-GPU host, and how throughput scales
# (issues 22 and 40). From the repository root, with release binaries built
# with the cuda feature in target/release (or EMBER_BIN_DIR):
#
#   OUT=/some/dir bash bench/run_multi_gpu.sh      # every visible GPU
#   bash bench/run_multi_gpu.sh --mock             # loadgen mocks instead of GPUs
#   bash bench/run_multi_gpu.sh --dry-run          # CPU only: two tiny CPU servers
#
# What it does:
#   1. starts one server per GPU at once (`--device cuda:N`, port 0, each with
#      its own kernel cache dir and XDG_CACHE_HOME under KERNEL_CACHE_ROOT, or
#      all on one prepared cache with KERNEL_CACHE_DIR) and waits until every
#      one answers grpc.health.v1 Check("ember.v1.Inference") with SERVING.
#      With --mock (or SERVERS=mock) each "server" is a `loadgen mock` (fixed
#      TTFT and ITL, no batching limit): perfect scaling is then guaranteed on
#      the server side, so whatever is missing is the client's;
#   2. weak scaling: for each workload N x M (a burst of N requests per server,
#      M new tokens each, `--no-stop-on-eos`, unique prompts), each sampling
#      (greedy, or a temperature), and each server count G in SCALES, fires
#      N x G requests at the first G servers, WARMUP_RUNS unmeasured then
#      REPEAT_RUNS measured times, in one or both of two ways (LOADGEN_MODE):
#        per-server  one loadgen process per server, started together: each
#                    connects, then all fire their first request at the same
#                    wall-clock instant (`loadgen --start-at`); merged after;
#        shared      one loadgen process for all G servers, `--balance least`;
#      every run is its own invocation(s) with `--start-at` a few seconds
#      ahead (START_DELAY), so connecting is never inside the measurement and
#      both ways measure the same thing. G = 1 is one process either way;
#   3. (STRONG=1) strong scaling: N requests over all servers, shared;
#   4. writes $OUT/table.md (also printed; bench/multi_gpu_table.py): per
#      workload, sampling, G and mode, completion tok/s = all completion
#      tokens / (last request end - first t0) over every process, the worst
#      server's TTFT p99, the weak scaling factor (tok/s at G / at 1; G x is
#      perfect), the start skew (latest - earliest t0 of the processes) and
#      the drain skew (latest - earliest server's last request end); then
#      every server's split (requests, tokens/s over its own span, share, TTFT
#      p50/p99, when it started and finished). Figures are the run with the
#      median tok/s of the REPEAT_RUNS.
#
# LOADGEN_MODE's default is both: one loadgen process for many servers was
# the measurement of issue 22 (weak scaling 1.84-1.92x on 2 GPUs, growing
# with run length), and whether that process, not the servers, is what
# scales short is the open question; the two ways side by side on the same
# servers answer it. The per-server figure is the deployment's (each server
# has its own clients) and the one to hold the targets against.
#
# Servers are always stopped on exit (SIGTERM, then SIGKILL after 15 s). The
# exit status is non-zero if a server does not become SERVING, a loadgen run
# fails (any failed request included), or the table cannot be made.
#
# The dry run (`--dry-run` or DRY_RUN=1) takes the same path on the CPU: two
# servers with `--device cpu --preset tiny`, workload 8 x 8, no nvidia-smi.
# ember-tests' `bench_multi_gpu` test runs it (and `--dry-run --mock`) in CI.
#
# Environment knobs [default; dry run's default]:
#   GPUS               device indices, space- or comma-separated [every GPU
#                      nvidia-smi lists, or 0..k-1 for k entries in
#                      CUDA_VISIBLE_DEVICES; with --mock "0 1 2 3"; "0 1"]
#   WORKLOADS          NxM list, per server [128x256 256x768; 8x8]
#   SAMPLINGS          greedy and/or temperatures [greedy 1.0]
#   SCALES             server counts [1, 2, 4, ... up to and with the count]
#   LOADGEN_MODE       per-server, shared or both [both]
#   STRONG             1: also N over all servers (strong scaling) [0]
#   START_DELAY        seconds from launching a run's loadgens to its t0 [2; 1]
#   SERVERS            ember or mock [ember] (--mock sets mock)
#   MOCK_TTFT_MS, MOCK_ITL_MS   the mocks' timings [50, 5; 20, 5]
#   EMBER_BIN_DIR      dir with ember-server and loadgen [target/release]
#   OUT                output dir [bench-out-multi-gpu; bench-out-multi-gpu-dry]
#   PRESET             server --preset [gpt2; tiny]
#   SERVER_ARGS        more server flags [--max-batch-size 256 --max-pending 4096;
#                      --max-batch-size 8]
#   LOADGEN_ARGS       more loadgen flags (e.g. --channels 2) []
#   WARMUP_RUNS [1]  REPEAT_RUNS [3; 1]
#   KERNEL_CACHE_ROOT  per-GPU caches live in KERNEL_CACHE_ROOT/gpuN
#                      [${XDG_CACHE_HOME:-$HOME/.cache}/ember/multi-gpu; a temp dir]
#   KERNEL_CACHE_DIR   one prepared (already warm) cache shared by every server
#                      instead of one per GPU []
#   T_SERVING          seconds for every server to become SERVING [900; 180]
#   T_LOADGEN          seconds per loadgen invocation [600; 120]
#   PYTHON             [python3] (stdlib only: parses loadgen's JSON)
#
# Duration on 4 GPUs with the defaults: 2 workloads x 2 samplings x (G=1 once,
# G=2 and G=4 both ways) x (1 + 3) runs = 80 runs of 1-5 s, plus START_DELAY
# each: about 8 minutes after the servers are up (REPEAT_RUNS=1: 3 minutes).
#
# $OUT gets table.md, servers.tsv, runs.tsv, server-<i>.log (stderr) and .out
# (stdout), runs/<workload>-<sampling>-g<G>-<mode>-<w|r><k>[-s<i>].{json,log}
# and bench.log (everything printed). Needs python3 and curl
# (deploy/ember-healthcheck), or python's grpcio instead of curl, for the
# health checks; nvidia-smi except in the dry run and with --mock.
set -u
set -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
REPO=$PWD

DRY_RUN=${DRY_RUN:-0}
SERVERS=${SERVERS:-ember}
for arg in "$@"; do
    case $arg in
        --dry-run) DRY_RUN=1 ;;
        --mock) SERVERS=mock ;;
        -h | --help)
            sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "run_multi_gpu.sh: unknown argument '$arg' (--dry-run, --mock, --help)" >&2
            exit 2
            ;;
    esac
done

# ---- knobs -------------------------------------------------------------------
BIN_DIR=${EMBER_BIN_DIR:-$REPO/target/release}
SERVER_BIN=$BIN_DIR/ember-server
LOADGEN_BIN=$BIN_DIR/loadgen
PY=${PYTHON:-python3}
WARMUP_RUNS=${WARMUP_RUNS:-1}
SAMPLINGS=${SAMPLINGS:-greedy 1.0}
LOADGEN_MODE=${LOADGEN_MODE:-both}
STRONG=${STRONG:-0}
read -r -a LOADGEN_EXTRA <<<"${LOADGEN_ARGS:-}"
if [[ $DRY_RUN == 1 ]]; then
    OUT=${OUT:-$REPO/bench-out-multi-gpu-dry}
    WORKLOADS=${WORKLOADS:-8x8}
    PRESET=${PRESET:-tiny}
    read -r -a SERVER_EXTRA <<<"${SERVER_ARGS:---max-batch-size 8}"
    REPEAT_RUNS=${REPEAT_RUNS:-1}
    START_DELAY=${START_DELAY:-1}
    MOCK_TTFT_MS=${MOCK_TTFT_MS:-20}
    T_SERVING=${T_SERVING:-180}
    T_LOADGEN=${T_LOADGEN:-120}
else
    OUT=${OUT:-$REPO/bench-out-multi-gpu}
    WORKLOADS=${WORKLOADS:-128x256 256x768}
    PRESET=${PRESET:-gpt2}
    read -r -a SERVER_EXTRA <<<"${SERVER_ARGS:---max-batch-size 256 --max-pending 4096}"
    REPEAT_RUNS=${REPEAT_RUNS:-3}
    START_DELAY=${START_DELAY:-2}
    MOCK_TTFT_MS=${MOCK_TTFT_MS:-50}
    T_SERVING=${T_SERVING:-900}
    T_LOADGEN=${T_LOADGEN:-600}
fi
MOCK_ITL_MS=${MOCK_ITL_MS:-5}
case $LOADGEN_MODE in
    both) MODES=(per-server shared) ;;
    per-server | shared) MODES=("$LOADGEN_MODE") ;;
    *)
        echo "run_multi_gpu.sh: LOADGEN_MODE must be per-server, shared or both (got '$LOADGEN_MODE')" >&2
        exit 2
        ;;
esac
[[ $SERVERS == ember || $SERVERS == mock ]] || {
    echo "run_multi_gpu.sh: SERVERS must be ember or mock (got '$SERVERS')" >&2
    exit 2
}

# ---- setup ---------------------------------------------------------------------
mkdir -p "$OUT/runs" || exit 1
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d) || exit 1
exec > >(tee "$OUT/bench.log") 2>&1
TEE_PID=$!
export NO_COLOR=1 # plain logs from ember-server and loadgen
# cuda:N counts GPUs in nvidia-smi's (PCI bus) order, as GPUS and the table do.
export CUDA_DEVICE_ORDER=PCI_BUS_ID
T0=$(date +%s)
PIDS=()
say() { printf '[multi-gpu %4ds] %s\n' "$(($(date +%s) - T0))" "$*"; }
die() {
    say "FAILED: $*"
    exit 1
}

# stop_servers: SIGTERM to every server, SIGKILL to any still there after 15 s.
stop_servers() {
    local pid alive
    ((${#PIDS[@]})) || return 0
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for _ in $(seq 1 150); do
        alive=0
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for pid in "${PIDS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            say "server $pid still running 15 s after SIGTERM; SIGKILL"
            kill -KILL "$pid" 2>/dev/null
        fi
        wait "$pid" 2>/dev/null
    done
    PIDS=()
}

cleanup() {
    local rc=$?
    stop_servers
    rm -rf "$WORK"
    say "exit $rc after $(($(date +%s) - T0))s; files in $OUT"
    exec >&- 2>&-
    wait "$TEE_PID" 2>/dev/null
    exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

[[ -x $LOADGEN_BIN ]] || die "$LOADGEN_BIN not found (build it, or set EMBER_BIN_DIR)"
[[ $SERVERS == mock || -x $SERVER_BIN ]] || die "$SERVER_BIN not found (build it, or set EMBER_BIN_DIR)"
command -v "$PY" >/dev/null 2>&1 || die "$PY not found (PYTHON=...)"

# ---- devices --------------------------------------------------------------------
if [[ $SERVERS == mock ]]; then
    if [[ $DRY_RUN == 1 ]]; then GPUS=${GPUS:-0 1}; else GPUS=${GPUS:-0 1 2 3}; fi
    read -r -a gpus <<<"${GPUS//,/ }"
    GPU_MODEL="loadgen mock servers (TTFT $MOCK_TTFT_MS ms, ITL $MOCK_ITL_MS ms, no batching limit), not GPUs"
    GPU_COUNT=${#gpus[@]}
elif [[ $DRY_RUN == 1 ]]; then
    GPUS=${GPUS:-0 1}
    read -r -a gpus <<<"${GPUS//,/ }"
    GPU_MODEL="dry run: CPU (--device cpu --preset $PRESET), not a GPU measurement"
    GPU_COUNT=${#gpus[@]}
else
    command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found (a CPU-only machine? try --dry-run or --mock)"
    smi_ids=() # what nvidia-smi -i takes for the GPUs in use
    if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
        IFS=, read -r -a smi_ids <<<"$CUDA_VISIBLE_DEVICES"
    else
        mapfile -t smi_ids < <(nvidia-smi --query-gpu=index --format=csv,noheader)
    fi
    if [[ -n ${GPUS:-} ]]; then
        read -r -a gpus <<<"${GPUS//,/ }"
    else
        gpus=()
        for i in "${!smi_ids[@]}"; do gpus+=("$i"); done
    fi
    ((${#gpus[@]})) || die "no GPU found (nvidia-smi lists none; GPUS=...)"
    sel=()
    for g in "${gpus[@]}"; do
        [[ $g =~ ^[0-9]+$ && -n ${smi_ids[$g]:-} ]] || die "GPUS: no visible GPU $g"
        sel+=("${smi_ids[$g]// /}")
    done
    say "nvidia-smi:"
    nvidia-smi -i "$(IFS=,; echo "${sel[*]}")" \
        --query-gpu=index,name,memory.total,driver_version,clocks.max.sm,power.limit \
        --format=csv | tee "$OUT/nvidia-smi.csv" || die "nvidia-smi failed"
    GPU_MODEL=$(nvidia-smi -i "$(IFS=,; echo "${sel[*]}")" --query-gpu=name --format=csv,noheader |
        sort | uniq -c | awk '{n=$1; $1=""; printf "%s%s x%s", (NR>1 ? ", " : ""), n, $0}')
    GPU_COUNT=${#gpus[@]}
fi
# SCALES: 1, 2, 4, ... below the count, and the count itself.
if [[ -z ${SCALES:-} ]]; then
    SCALES=
    for ((g = 1; g < GPU_COUNT; g *= 2)); do SCALES+="$g "; done
    SCALES+=$GPU_COUNT
fi
read -r -a scales <<<"${SCALES//,/ }"
for g in "${scales[@]}"; do
    if ! [[ $g =~ ^[0-9]+$ ]] || ((g < 1 || g > GPU_COUNT)); then
        die "SCALES: '$g' is not a server count in 1..$GPU_COUNT"
    fi
done
[[ " ${scales[*]} " == *" 1 "* ]] || die "SCALES must include 1 (the baseline of the weak scaling factor)"
if [[ -n ${KERNEL_CACHE_DIR:-} ]]; then
    CACHE_NOTE="one shared cache: $KERNEL_CACHE_DIR"
elif [[ $DRY_RUN == 1 || $SERVERS == mock ]]; then
    KERNEL_CACHE_ROOT=${KERNEL_CACHE_ROOT:-$WORK/cache}
    CACHE_NOTE="one per server under $KERNEL_CACHE_ROOT (unused off the GPU)"
else
    KERNEL_CACHE_ROOT=${KERNEL_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/ember/multi-gpu}
    CACHE_NOTE="one per GPU: $KERNEL_CACHE_ROOT/gpuN"
fi
say "Ember multi-GPU bench in $REPO: $GPU_COUNT server(s) (${gpus[*]}, $SERVERS), workloads $WORKLOADS," \
    "samplings $SAMPLINGS, scales ${scales[*]}, loadgen ${MODES[*]}, output in $OUT"
if [[ $SERVERS == ember ]]; then
    say "binaries: $SERVER_BIN ($("$SERVER_BIN" --version 2>/dev/null)), $LOADGEN_BIN"
fi

# ---- 1. servers -------------------------------------------------------------------
# servers.tsv: index, device, address (filled in once each prints it).
SERVERS_TSV=$OUT/servers.tsv
: >"$SERVERS_TSV"
DEVICES=()
for i in "${!gpus[@]}"; do
    if [[ $SERVERS == mock ]]; then
        label="mock#$i"
        DEVICES+=("$label")
        args=(mock --listen 127.0.0.1:0 --ttft-ms "$MOCK_TTFT_MS" --itl-ms "$MOCK_ITL_MS")
        say "starting server $i [$label]: $LOADGEN_BIN ${args[*]}"
        "$LOADGEN_BIN" "${args[@]}" >"$OUT/server-$i.out" 2>"$OUT/server-$i.log" &
        PIDS+=($!)
        continue
    fi
    if [[ $DRY_RUN == 1 ]]; then
        dev=cpu
        label="cpu#$i"
    else
        dev=cuda:${gpus[$i]}
        label=$dev
    fi
    DEVICES+=("$label")
    if [[ -n ${KERNEL_CACHE_DIR:-} ]]; then
        cache=$KERNEL_CACHE_DIR
        xdg=${XDG_CACHE_HOME:-$HOME/.cache}
    else
        xdg=$KERNEL_CACHE_ROOT/gpu${gpus[$i]}
        cache=$xdg/ember/kernels
    fi
    mkdir -p "$cache" || die "cannot create $cache"
    args=(--device "$dev" --listen 127.0.0.1:0 --preset "$PRESET" --kernel-cache-dir "$cache"
        --shutdown-timeout 5 "${SERVER_EXTRA[@]}")
    say "starting server $i [$label]: XDG_CACHE_HOME=$xdg $SERVER_BIN ${args[*]}"
    XDG_CACHE_HOME=$xdg RUST_LOG=${RUST_LOG:-info} "$SERVER_BIN" "${args[@]}" \
        >"$OUT/server-$i.out" 2>"$OUT/server-$i.log" &
    PIDS+=($!)
done

# health ADDR: 0 if Check("ember.v1.Inference") answers SERVING. curl through
# deploy/ember-healthcheck, else grpcio if python has it.
if command -v curl >/dev/null 2>&1; then
    health() { EMBER_HEALTH_TIMEOUT=2 "$REPO/deploy/ember-healthcheck" "$1" >/dev/null 2>&1; }
elif "$PY" -c 'import grpc' 2>/dev/null; then
    health() {
        "$PY" - "$1" <<'EOF' >/dev/null 2>&1
import sys
import grpc
check = grpc.insecure_channel(sys.argv[1]).unary_unary("/grpc.health.v1.Health/Check")
service = b"ember.v1.Inference"  # HealthCheckRequest{service}, hand-encoded
sys.exit(0 if check(b"\x0a" + bytes([len(service)]) + service, timeout=2) == b"\x08\x01" else 1)
EOF
    }
else
    die "neither curl nor python's grpcio: cannot check health"
fi

# server_failed I WHY: says why and shows the end of server I's log.
server_failed() {
    say "server $1 [${DEVICES[$1]}] $2; last lines of $OUT/server-$1.log:"
    tail -n 30 "$OUT/server-$1.log"
}

ADDRS=()
READY=()
deadline=$((T0 + T_SERVING))
serving=0
while ((serving < ${#PIDS[@]})); do
    serving=0
    for i in "${!PIDS[@]}"; do
        if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
            wait "${PIDS[$i]}"
            server_failed "$i" "exited with $? while starting"
            die "a server did not start"
        fi
        if [[ -z ${ADDRS[$i]:-} ]]; then
            line=$(grep -m1 '^listening on ' "$OUT/server-$i.out" 2>/dev/null) || continue
            ADDRS[i]=${line#listening on }
            printf '%s\t%s\t%s\n' "$i" "${DEVICES[$i]}" "${ADDRS[$i]}" >>"$SERVERS_TSV"
            say "server $i [${DEVICES[$i]}] listening on ${ADDRS[$i]}"
        fi
        if [[ -n ${READY[$i]:-} ]] || health "${ADDRS[$i]}"; then
            [[ -z ${READY[$i]:-} ]] && say "server $i [${DEVICES[$i]}] SERVING"
            READY[i]=1
            serving=$((serving + 1))
        fi
    done
    ((serving == ${#PIDS[@]})) && break
    if (($(date +%s) >= deadline)); then
        for i in "${!PIDS[@]}"; do
            [[ -n ${READY[$i]:-} ]] || server_failed "$i" "not SERVING within ${T_SERVING}s"
        done
        die "a server did not become SERVING"
    fi
    sleep 0.5
done
say "all $serving servers SERVING after $(($(date +%s) - T0))s"

# ---- 2. loadgen ---------------------------------------------------------------------
# runs.tsv: workload, sampling, servers, mode, run (w0, r0, ...), JSON files
# (comma-separated: one per loadgen process).
RUNS_TSV=$OUT/runs.tsv
: >"$RUNS_TSV"

# run_set WL SAMPLING G MODE RUN REQUESTS M SAMPLE_ARGS...: one run of the
# workload on the first G servers: MODE per-server starts G loadgens (one
# per server, REQUESTS / G each), shared one loadgen for all G; every
# process fires its first request at the same --start-at instant.
run_set() {
    local wl=$1 samp=$2 g=$3 mode=$4 run=$5 requests=$6 m=$7
    shift 7
    local start_at base=$OUT/runs/$wl-$samp-g$g-$mode-$run i rc failed=0
    local pids=() files=() logs=() targets
    start_at=$(awk -v d="$START_DELAY" -v t="$(date +%s.%N)" 'BEGIN { printf "%.6f", t + d }')
    local common=(--max-new-tokens "$m" --submit-interval-ms 0 --no-stop-on-eos --unique-prompts
        --prompt Hello --warmup-runs 0 --repeat-runs 1 --progress off --start-at "$start_at"
        "$@" "${LOADGEN_EXTRA[@]}")
    if [[ $mode == per-server ]]; then
        for ((i = 0; i < g; i++)); do
            files+=("$base-s$i.json")
            logs+=("$base-s$i.log")
            timeout --kill-after=10 "$T_LOADGEN" "$LOADGEN_BIN" --target "http://${ADDRS[$i]}" \
                --num-requests $((requests / g)) --json "$base-s$i.json" "${common[@]}" \
                >"$base-s$i.log" 2>&1 &
            pids+=($!)
        done
    else
        targets=$(printf 'http://%s,' "${ADDRS[@]:0:g}")
        files+=("$base.json")
        logs+=("$base.log")
        timeout --kill-after=10 "$T_LOADGEN" "$LOADGEN_BIN" --target "${targets%,}" \
            --balance least --num-requests "$requests" --json "$base.json" "${common[@]}" \
            >"$base.log" 2>&1 &
        pids+=($!)
    fi
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}"
        rc=$?
        if ((rc != 0)); then
            failed=1
            say "loadgen ${logs[$i]##*/} exited with $rc$( ((rc == 124 || rc == 137)) && echo " (timed out after ${T_LOADGEN}s)"); its last lines:"
            tail -n 15 "${logs[$i]}"
        fi
    done
    ((failed)) && die "loadgen ($wl, $samp, $g server(s), $mode, $run) failed"
    for i in "${!PIDS[@]}"; do
        kill -0 "${PIDS[$i]}" 2>/dev/null || die "server $i [${DEVICES[$i]}] exited during the run"
    done
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$wl" "$samp" "$g" "$mode" "$run" \
        "$(IFS=,; echo "${files[*]}")" >>"$RUNS_TSV"
}

for wl in ${WORKLOADS//,/ }; do
    [[ $wl =~ ^([0-9]+)x([0-9]+)$ ]] || die "WORKLOADS: '$wl' is not NxM (e.g. 128x256)"
    n=${BASH_REMATCH[1]}
    m=${BASH_REMATCH[2]}
    for sampling in $SAMPLINGS; do
        if [[ $sampling == greedy ]]; then
            samp=greedy
            sample_args=()
        elif [[ $sampling =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
            samp=t$sampling
            sample_args=(--temperature "$sampling")
        else
            die "SAMPLINGS: '$sampling' is neither greedy nor a temperature"
        fi
        configs=() # "G MODE REQUESTS"
        for g in "${scales[@]}"; do
            if ((g == 1)); then
                configs+=("1 one $n")
            else
                for mode in "${MODES[@]}"; do configs+=("$g $mode $((n * g))"); done
            fi
        done
        ((STRONG == 1 && GPU_COUNT > 1)) && configs+=("$GPU_COUNT strong $n")
        for config in "${configs[@]}"; do
            read -r g mode requests <<<"$config"
            say ">>> $wl $samp: $requests requests x $m tokens on $g server(s), loadgen $mode"
            for ((k = 0; k < WARMUP_RUNS; k++)); do
                run_set "$wl" "$samp" "$g" "$mode" "w$k" "$requests" "$m" "${sample_args[@]}"
            done
            for ((k = 0; k < REPEAT_RUNS; k++)); do
                run_set "$wl" "$samp" "$g" "$mode" "r$k" "$requests" "$m" "${sample_args[@]}"
            done
        done
    done
done

# ---- 3. the table ------------------------------------------------------------------------
say "making the table"
if [[ $SERVERS == mock ]]; then
    server_cmd="loadgen mock --ttft-ms $MOCK_TTFT_MS --itl-ms $MOCK_ITL_MS"
else
    server_cmd="ember-server --preset $PRESET ${SERVER_EXTRA[*]}"
fi
MG_GPU_MODEL=$GPU_MODEL MG_GPU_COUNT=$GPU_COUNT MG_DRY_RUN=$DRY_RUN MG_CACHE_NOTE=$CACHE_NOTE \
    MG_SERVER_CMD="$server_cmd" MG_START_DELAY=$START_DELAY \
    MG_LOADGEN_CMD="--submit-interval-ms 0 --no-stop-on-eos --unique-prompts --prompt Hello${LOADGEN_EXTRA[*]:+ ${LOADGEN_EXTRA[*]}}" \
    MG_RUNS="$WARMUP_RUNS warmup + $REPEAT_RUNS measured" \
    MG_STARTED=$(date -u -d "@$T0" +%Y-%m-%dT%H:%MZ) \
    MG_COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown) \
    "$PY" "$REPO/bench/multi_gpu_table.py" "$RUNS_TSV" "$SERVERS_TSV" "$OUT/table.md" ||
    die "the table could not be made"
say "table in $OUT/table.md"
