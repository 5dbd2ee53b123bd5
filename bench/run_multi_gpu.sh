#!/usr/bin/env bash
# One ember-server per GPU on a multi-GPU host, and how throughput scales
# (issue 22). From the repository root, with release binaries built with the
# cuda feature in target/release (or EMBER_BIN_DIR):
#
#   OUT=/some/dir bash bench/run_multi_gpu.sh
#   bash bench/run_multi_gpu.sh --dry-run       # CPU only: two tiny CPU servers
#
# What it does:
#   1. starts one server per GPU at once (`--device cuda:N`, port 0, each with
#      its own kernel cache dir and XDG_CACHE_HOME under KERNEL_CACHE_ROOT, or
#      all on one prepared cache with KERNEL_CACHE_DIR) and waits until every
#      one answers grpc.health.v1 Check("ember.v1.Inference") with SERVING;
#   2. for each workload N x M (a burst of N requests, M new tokens each,
#      `--no-stop-on-eos`, unique prompts, one warmup run), runs loadgen
#      against the first server alone, then against all of them with
#      `--balance least` (strong scaling: the same N over G servers), then
#      N x G requests against all of them (weak scaling: N per server);
#   3. writes $OUT/table.md (also printed): GPU model and count, per workload
#      completion tok/s, client TTFT p50/p99 and the strong scaling factor
#      (all / one), the weak scaling table (N x G on G servers / N on one:
#      G x for perfect scaling), and per target (from loadgen's `per_target`
#      JSON) requests, tok/s and their shares.
# Servers are always stopped on exit (SIGTERM, then SIGKILL after 15 s). The
# exit status is non-zero if a server does not become SERVING, a loadgen run
# fails (any failed request included), or the table cannot be made.
#
# The dry run (`--dry-run` or DRY_RUN=1) takes the same path on the CPU: two
# servers with `--device cpu --preset tiny`, workload 8 x 8, no nvidia-smi.
# ember-tests' `bench_multi_gpu` test runs it in CI.
#
# Environment knobs [default; dry run's default]:
#   GPUS               device indices, space- or comma-separated [every GPU
#                      nvidia-smi lists, or 0..k-1 for k entries in
#                      CUDA_VISIBLE_DEVICES; "0 1" (two CPU servers)]
#   WORKLOADS          NxM list [128x256 256x256; 8x8]
#   EMBER_BIN_DIR      dir with ember-server and loadgen [target/release]
#   OUT                output dir [bench-out-multi-gpu; bench-out-multi-gpu-dry]
#   PRESET             server --preset [gpt2; tiny]
#   SERVER_ARGS        more server flags [--max-batch-size 256 --max-pending 4096;
#                      --max-batch-size 8]
#   LOADGEN_ARGS       more loadgen flags (e.g. --channels 2) []
#   WARMUP_RUNS [1]  REPEAT_RUNS [1]  (figures are the median over the runs)
#   KERNEL_CACHE_ROOT  per-GPU caches live in KERNEL_CACHE_ROOT/gpuN
#                      [${XDG_CACHE_HOME:-$HOME/.cache}/ember/multi-gpu; a temp dir]
#   KERNEL_CACHE_DIR   one prepared (already warm) cache shared by every server
#                      instead of one per GPU []
#   T_SERVING          seconds for every server to become SERVING [900; 180]
#   T_LOADGEN          seconds per loadgen invocation [600; 120]
#   PYTHON             [python3] (stdlib only: parses loadgen's JSON)
#
# $OUT gets table.md, servers.tsv, server-<i>.log (stderr) and .out (stdout),
# loadgen-<workload>-<one|all>.{json,log}, and bench.log (everything printed).
# Needs python3 and curl (deploy/ember-healthcheck), or python's grpcio instead
# of curl, for the health checks; nvidia-smi except in the dry run.
set -u
set -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
REPO=$PWD

DRY_RUN=${DRY_RUN:-0}
for arg in "$@"; do
    case $arg in
        --dry-run) DRY_RUN=1 ;;
        -h | --help)
            sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "run_multi_gpu.sh: unknown argument '$arg' (--dry-run, --help)" >&2
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
REPEAT_RUNS=${REPEAT_RUNS:-1}
read -r -a LOADGEN_EXTRA <<<"${LOADGEN_ARGS:-}"
if [[ $DRY_RUN == 1 ]]; then
    OUT=${OUT:-$REPO/bench-out-multi-gpu-dry}
    WORKLOADS=${WORKLOADS:-8x8}
    PRESET=${PRESET:-tiny}
    read -r -a SERVER_EXTRA <<<"${SERVER_ARGS:---max-batch-size 8}"
    T_SERVING=${T_SERVING:-180}
    T_LOADGEN=${T_LOADGEN:-120}
else
    OUT=${OUT:-$REPO/bench-out-multi-gpu}
    WORKLOADS=${WORKLOADS:-128x256 256x256}
    PRESET=${PRESET:-gpt2}
    read -r -a SERVER_EXTRA <<<"${SERVER_ARGS:---max-batch-size 256 --max-pending 4096}"
    T_SERVING=${T_SERVING:-900}
    T_LOADGEN=${T_LOADGEN:-600}
fi

# ---- setup ---------------------------------------------------------------------
mkdir -p "$OUT" || exit 1
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

for b in "$SERVER_BIN" "$LOADGEN_BIN"; do
    [[ -x $b ]] || die "$b not found (build it, or set EMBER_BIN_DIR)"
done
command -v "$PY" >/dev/null 2>&1 || die "$PY not found (PYTHON=...)"

# ---- devices --------------------------------------------------------------------
if [[ $DRY_RUN == 1 ]]; then
    GPUS=${GPUS:-0 1}
    read -r -a gpus <<<"${GPUS//,/ }"
    GPU_MODEL="dry run: CPU (--device cpu --preset $PRESET), not a GPU measurement"
    GPU_COUNT=${#gpus[@]}
else
    command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found (a CPU-only machine? try --dry-run)"
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
if [[ -n ${KERNEL_CACHE_DIR:-} ]]; then
    CACHE_NOTE="one shared cache: $KERNEL_CACHE_DIR"
elif [[ $DRY_RUN == 1 ]]; then
    KERNEL_CACHE_ROOT=${KERNEL_CACHE_ROOT:-$WORK/cache}
    CACHE_NOTE="one per server under $KERNEL_CACHE_ROOT (unused on the CPU)"
else
    KERNEL_CACHE_ROOT=${KERNEL_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/ember/multi-gpu}
    CACHE_NOTE="one per GPU: $KERNEL_CACHE_ROOT/gpuN"
fi
say "Ember multi-GPU bench in $REPO: $GPU_COUNT server(s) (${gpus[*]}), workloads $WORKLOADS, output in $OUT"
((GPU_COUNT > 1)) || say "WARNING: one server only: the 'all' runs repeat the 'one' runs"
say "binaries: $SERVER_BIN ($("$SERVER_BIN" --version 2>/dev/null)), $LOADGEN_BIN"

# ---- 1. servers -------------------------------------------------------------------
# servers.tsv: index, device, address (filled in once each prints it).
SERVERS_TSV=$OUT/servers.tsv
: >"$SERVERS_TSV"
DEVICES=()
for i in "${!gpus[@]}"; do
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

# ---- 2. loadgen: one target, then all ----------------------------------------------
ALL_TARGETS=$(printf 'http://%s,' "${ADDRS[@]}")
ALL_TARGETS=${ALL_TARGETS%,}
RUNS_TSV=$WORK/runs.tsv # workload, mode, json
: >"$RUNS_TSV"
for wl in ${WORKLOADS//,/ }; do
    [[ $wl =~ ^([0-9]+)x([0-9]+)$ ]] || die "WORKLOADS: '$wl' is not NxM (e.g. 128x256)"
    n=${BASH_REMATCH[1]}
    m=${BASH_REMATCH[2]}
    for mode in one all weak; do
        requests=$n
        if [[ $mode == one ]]; then
            targets=http://${ADDRS[0]}
            balance=()
        else
            targets=$ALL_TARGETS
            balance=(--balance least)
            [[ $mode == weak ]] && requests=$((n * ${#ADDRS[@]}))
        fi
        json=$OUT/loadgen-$wl-$mode.json
        lg=(--target "$targets" "${balance[@]}" --num-requests "$requests" --max-new-tokens "$m"
            --submit-interval-ms 0 --no-stop-on-eos --unique-prompts --prompt Hello
            --warmup-runs "$WARMUP_RUNS" --repeat-runs "$REPEAT_RUNS" --progress off
            --json "$json" "${LOADGEN_EXTRA[@]}")
        say ">>> $wl on $mode: loadgen ${lg[*]}"
        timeout --kill-after=10 "$T_LOADGEN" "$LOADGEN_BIN" "${lg[@]}" 2>&1 |
            tee "$OUT/loadgen-$wl-$mode.log"
        rc=$?
        ((rc == 124 || rc == 137)) && die "loadgen ($wl, $mode) timed out after ${T_LOADGEN}s"
        ((rc == 0)) || die "loadgen ($wl, $mode) exited with $rc"
        for i in "${!PIDS[@]}"; do
            kill -0 "${PIDS[$i]}" 2>/dev/null || die "server $i [${DEVICES[$i]}] exited during the run"
        done
        printf '%s\t%s\t%s\n' "$wl" "$mode" "$json" >>"$RUNS_TSV"
    done
done

# ---- 3. the table ------------------------------------------------------------------------
say "making the table"
MG_GPU_MODEL=$GPU_MODEL MG_GPU_COUNT=$GPU_COUNT MG_DRY_RUN=$DRY_RUN MG_CACHE_NOTE=$CACHE_NOTE \
    MG_SERVER_CMD="ember-server --preset $PRESET ${SERVER_EXTRA[*]}" \
    MG_LOADGEN_CMD="--submit-interval-ms 0 --no-stop-on-eos --unique-prompts --prompt Hello --warmup-runs $WARMUP_RUNS --repeat-runs $REPEAT_RUNS${LOADGEN_EXTRA[*]:+ ${LOADGEN_EXTRA[*]}}" \
    MG_STARTED=$(date -u -d "@$T0" +%Y-%m-%dT%H:%MZ) \
    MG_COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown) \
    "$PY" - "$RUNS_TSV" "$SERVERS_TSV" "$OUT/table.md" <<'EOF' || die "the table could not be made"
import json, os, statistics, sys

runs_tsv, servers_tsv, table_path = sys.argv[1:4]
env = os.environ
dry_run = env["MG_DRY_RUN"] == "1"

device_of = {}
for line in open(servers_tsv):
    _, device, addr = line.rstrip("\n").split("\t")
    device_of["http://" + addr] = f"{device} ({addr})"

def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None

def num(v, digits=0):
    return "n/a" if v is None else f"{v:,.{digits}f}"

rows, per_target, weak = [], [], []
for line in open(runs_tsv):
    workload, mode, path = line.rstrip("\n").split("\t")
    doc = json.load(open(path))
    measured = [r for r in doc["runs"] if not r.get("warmup")]
    if not measured:
        sys.exit(f"{path}: no measured run")
    for r in measured:
        if r["failed"]:
            sys.exit(f"{path}: run {r['run']} had {r['failed']} failed requests")
    fig = {
        "tps": med(r["throughput_completion_tps"] for r in measured),
        "p50": med(r["metrics"]["ttft_ms"]["p50"] for r in measured),
        "p99": med(r["metrics"]["ttft_ms"]["p99"] for r in measured),
        "targets": len(doc["targets"]),
    }
    if mode == "weak":
        weak.append((workload, fig))
        continue
    rows.append((workload, mode, fig))
    if mode == "all":
        names = [t["target"] for t in measured[0]["per_target"]]
        pts = []
        for name in names:
            entries = [t for r in measured for t in r["per_target"] if t["target"] == name]
            pts.append((name, {
                "requests": med(t["requests"] for t in entries),
                "tps": med(t["throughput_completion_tps"] for t in entries),
                "p50": med(t["ttft_p50_ms"] for t in entries),
                "p99": med(t["ttft_p99_ms"] for t in entries),
            }))
        per_target.append((workload, pts))

one = {w: f["tps"] for w, m, f in rows if m == "one"}
out = []
out.append("## One server per GPU: scaling" + (" (DRY RUN on the CPU)" if dry_run else ""))
out.append("")
out.append(f"- GPUs: {env['MG_GPU_MODEL']}; {env['MG_GPU_COUNT']} server(s)" + (" (nvidia-smi)" if not dry_run else ""))
out.append(f"- run: {env['MG_STARTED']}, commit {env['MG_COMMIT']}, bench/run_multi_gpu.sh")
out.append(f"- servers: `{env['MG_SERVER_CMD']}`, one per device; kernel caches: {env['MG_CACHE_NOTE']}")
out.append(f"- loadgen: burst of N requests x M new tokens, `{env['MG_LOADGEN_CMD']}`; "
           "one target = the first server; all = every server, `--balance least`")
out.append(f"- figures: median over the measured runs; tok/s = completion tokens / run wall time; TTFT as the client sees it")
out.append("")
out.append("| workload (N x M) | targets | tok/s | TTFT p50 ms | TTFT p99 ms | scaling (all / one) |")
out.append("|---|---|---:|---:|---:|---:|")
for workload, mode, f in rows:
    label = "1 (first server)" if mode == "one" else f"{f['targets']} (--balance least)"
    base = one.get(workload)
    scale = f["tps"] / base if base and f["tps"] is not None else None
    scale_s = "n/a" if scale is None else f"{scale:.2f}x"
    out.append(f"| {workload.replace('x', ' x ')} | {label} | {num(f['tps'])} | "
               f"{num(f['p50'], 1)} | {num(f['p99'], 1)} | {scale_s} |")
out.append("")
out.append("Weak scaling: N requests per server, N x G against all G servers (`--balance least`) "
           "vs N against the first server alone; perfect scaling is G x:")
out.append("")
out.append("| per server (N x M) | servers | requests | tok/s (one: N) | tok/s (all: N x G) | TTFT p99 ms (all) | weak scaling (all / one) |")
out.append("|---|---:|---:|---:|---:|---:|---:|")
for workload, f in weak:
    base = one.get(workload)
    scale = f["tps"] / base if base and f["tps"] is not None else None
    n, m = workload.split("x")
    g = f["targets"]
    out.append(f"| {n} per server x {m} | {g} | {int(n) * g} | {num(base)} | {num(f['tps'])} | "
               f"{num(f['p99'], 1)} | {'n/a' if scale is None else f'{scale:.2f}x'} |")
out.append("")
out.append("Per target (all servers, `--balance least`; share = of the run's requests / completion tok/s):")
out.append("")
out.append("| workload (N x M) | target | requests | request share | tok/s | tok/s share | TTFT p50 ms | TTFT p99 ms |")
out.append("|---|---|---:|---:|---:|---:|---:|---:|")
for workload, pts in per_target:
    total_req = sum(p["requests"] or 0 for _, p in pts)
    total_tps = sum(p["tps"] or 0 for _, p in pts)
    for name, p in pts:
        rs = f"{100 * p['requests'] / total_req:.1f}%" if total_req else "n/a"
        ts = f"{100 * p['tps'] / total_tps:.1f}%" if total_tps and p["tps"] is not None else "n/a"
        out.append(f"| {workload.replace('x', ' x ')} | {device_of.get(name, name)} | {num(p['requests'])} | {rs} | "
                   f"{num(p['tps'])} | {ts} | {num(p['p50'], 1)} | {num(p['p99'], 1)} |")
text = "\n".join(out) + "\n"
open(table_path, "w").write(text)
print(text, end="")
EOF
say "table in $OUT/table.md"
