#!/usr/bin/env bash
# Issue 46's first deploy, in one invocation: ONE ember-server started on an
# EMPTY --kernel-cache-dir, then, as soon as health says SERVING, a Poisson
# mix of every request kind at once through its OpenAI door, for DURATION:
#
#   chat_stream     streamed chats, greedy
#   chat_sampled    non-streamed chats, temperature 1.0
#   n2              completions with n=2, temperature 1.0
#   penalties       chats with frequency / presence / repetition penalties
#   json            chats with response_format json_object
#   echo_logprobs   completions with echo, logprobs 2 and prompt_logprobs 1
#   disconnects     streamed chats whose client gives up after 50 ms
#
# Prints the seconds from launch to SERVING, the kernel autotunings and
# compilations the server ran after SERVING (`ember:autotune_while_serving_total`
# and `ember:kernel_compiles_while_serving_total` on /metrics, each named in a
# WARN line of server.log), and TTFT p50/p99 over every request of the
# window (streamed requests: the client's; non-streamed ones, whose only
# "first token" is the whole response: the server timeline returned with
# it; their latency is in its own column). Exits 1 when a kernel was tuned or compiled after SERVING (the
# target is none) or a group failed.
#
#   OUT=/some/dir bash bench/run_first_deploy.sh       # the GPU run (gpt2, cuda:0)
#   bash bench/run_first_deploy.sh --dry-run           # tiny preset on the CPU, short
#
# Environment knobs [default; dry run's default]:
#   RATE           total requests per second, split over the groups [60; 7]
#   DURATION       loadgen --duration [25s; 3s]
#   PRESET         --preset [gpt2; tiny]
#   DEVICE         --device [cuda:0; cpu]
#   SERVER_ARGS    more server flags [--max-batch-size 256; --max-new-tokens-limit 24]
#   EMBER_BIN_DIR  ember-server and loadgen [target/release]
#   OUT            output dir [bench-out-first-deploy; bench-out-first-deploy-dry]
#   T_SERVING      seconds for the server to become SERVING [600; 120]
# $OUT gets result.md (printed), each group's loadgen JSON, requests and log,
# server.log, the metrics page after the run, and kernel-cache/ (emptied first).
set -u
set -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
REPO=$PWD
DRY_RUN=${DRY_RUN:-0}
for arg in "$@"; do
    case $arg in
        --dry-run) DRY_RUN=1 ;;
        -h | --help) sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run_first_deploy.sh: unknown argument '$arg' (--dry-run, --help)" >&2; exit 2 ;;
    esac
done
BIN_DIR=${EMBER_BIN_DIR:-$REPO/target/release}
if [[ $DRY_RUN == 1 ]]; then
    RATE=${RATE:-7} DURATION=${DURATION:-3s} PRESET=${PRESET:-tiny} DEVICE=${DEVICE:-cpu}
    SERVER_ARGS=${SERVER_ARGS:---max-new-tokens-limit 24} T_SERVING=${T_SERVING:-120}
    OUT=${OUT:-bench-out-first-deploy-dry} LENS=(--input-len uniform:4..40 --output-len uniform:2..16)
else
    RATE=${RATE:-60} DURATION=${DURATION:-25s} PRESET=${PRESET:-gpt2} DEVICE=${DEVICE:-cuda:0}
    SERVER_ARGS=${SERVER_ARGS:---max-batch-size 256} T_SERVING=${T_SERVING:-600}
    OUT=${OUT:-bench-out-first-deploy} LENS=(--input-len uniform:10..500 --output-len uniform:16..256)
fi
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
export NO_COLOR=1
say() { printf '[first-deploy] %s\n' "$*"; }
die() { say "FAILED: $*"; exit 1; }
command -v python3 >/dev/null || die "needs python3"
[[ -x $BIN_DIR/ember-server && -x $BIN_DIR/loadgen ]] || die "no ember-server / loadgen in $BIN_DIR"

read -r -a SERVER_EXTRA <<<"$SERVER_ARGS"
if ! { rm -rf "$OUT/kernel-cache" && mkdir -p "$OUT/kernel-cache"; }; then
    die "cannot empty $OUT/kernel-cache"
fi
MPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# shellcheck source=bench/door_lib.sh
source "$REPO/bench/door_lib.sh"
T_LAUNCH=$(date +%s.%N)
start_http_server "$OUT" "$T_SERVING" --metrics-port "$MPORT" --preset "$PRESET" \
    --device "$DEVICE" --max-pending 4096 --kernel-cache-dir "$OUT/kernel-cache" "${SERVER_EXTRA[@]}"
T_SERVING_S=$(python3 -c "import sys; print(f'{$(date +%s.%N) - $T_LAUNCH:.1f}')")
say "ember-server SERVING at http://$HTTP after ${T_SERVING_S}s on an empty kernel cache"

GROUPS_RUN=(chat_stream chat_sampled n2 penalties json echo_logprobs disconnects)
PER_GROUP=$(python3 -c "print($RATE / ${#GROUPS_RUN[@]})")
# One group: NAME SEED ENDPOINT [extra loadgen args...], in the background.
group() {
    local name=$1 seed=$2 endpoint=$3
    shift 3
    "$BIN_DIR/loadgen" --backend openai --base-url "http://$HTTP" --endpoint "$endpoint" \
        --arrival poisson --request-rate "$PER_GROUP" --duration "$DURATION" "${LENS[@]}" \
        --seed "$seed" --progress off --json "$OUT/$name.json" \
        --requests-out "$OUT/$name.requests.jsonl" "$@" >"$OUT/$name.log" 2>&1
}
say "${#GROUPS_RUN[@]} groups at $RATE req/s together for $DURATION, from SERVING on"
PIDS=()
group chat_stream 1 chat --stream true & PIDS+=($!)
group chat_sampled 2 chat --stream false --temperature 1.0 & PIDS+=($!)
group n2 3 completions --stream true --temperature 1.0 --extra-inputs n:2 & PIDS+=($!)
group penalties 4 chat --stream true --extra-inputs frequency_penalty:0.5 \
    --extra-inputs presence_penalty:0.3 --extra-inputs repetition_penalty:1.1 & PIDS+=($!)
group json 5 chat --stream true --extra-inputs 'response_format:{"type":"json_object"}' \
    --extra-inputs ignore_eos:false & PIDS+=($!)
group echo_logprobs 6 completions --stream false --extra-inputs echo:true \
    --extra-inputs logprobs:2 --extra-inputs prompt_logprobs:1 & PIDS+=($!)
group disconnects 7 chat --stream true --timeout 0.05 --allow-errors & PIDS+=($!)
FAILED=()
for i in "${!PIDS[@]}"; do
    wait "${PIDS[$i]}" || FAILED+=("${GROUPS_RUN[$i]}")
done
curl -sf "http://127.0.0.1:$MPORT/metrics" >"$OUT/metrics.txt" || die "no /metrics"
((${#FAILED[@]} == 0)) || die "groups failed: ${FAILED[*]} (see $OUT/<group>.log)"

python3 - "$OUT" "$RATE" "$DURATION" "$PRESET" "$DEVICE" "$T_SERVING_S" "${GROUPS_RUN[@]}" \
    >"$OUT/result.md" <<'PY'
# Exit status: 0 nothing tuned after SERVING, 3 something was (or no counter).
import json, os, sys
out, rate, duration, preset, device, serving = sys.argv[1:7]
groups = sys.argv[7:]
def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))] if xs else None
def counter(name):
    return next((float(l.split()[-1]) for l in open(os.path.join(out, "metrics.txt"))
                 if l.startswith(name)), None)
tuned = counter("ember:autotune_while_serving_total")
compiled = counter("ember:kernel_compiles_while_serving_total")
warned = [l.strip() for l in open(os.path.join(out, "server.log"), errors="replace")
          if "autotuned while serving" in l or "compiled while serving" in l]
print(f"## First deploy: empty kernel cache, {rate} req/s of every request kind for {duration}, "
      f"{preset} on {device}\n")
print("| group | requests | ok | errors | TTFT from | TTFT p50 / p99 ms | latency p99 ms |")
print("|---|---:|---:|---:|---|---:|---:|")
# A streamed request's TTFT is the client's (its first token's arrival); a
# non-streamed one's client "first token" is the whole response, so its TTFT
# is the one in the timeline the server returns with it.
def ttft_ms(r):
    if r.get("streamed"):
        return r["client_ttft_ns"] / 1e6 if r.get("client_ttft_ns") is not None else None
    server = r.get("server") or {}
    return server["server_ttft_ns"] / 1e6 if server.get("server_ttft_ns") is not None else None
every = []
for g in groups:
    recs = [json.loads(l) for l in open(os.path.join(out, g + ".requests.jsonl")) if l.strip()]
    recs = [r for r in recs if not r.get("warmup")]
    ttft = [t for t in map(ttft_ms, recs) if t is not None]
    latency = [r["latency_ns"] / 1e6 for r in recs if r["ok"] and r.get("latency_ns") is not None]
    source = "client" if any(r.get("streamed") for r in recs) else "server timeline"
    every += ttft
    ok = sum(1 for r in recs if r["ok"])
    print(f"| {g} | {len(recs)} | {ok} | {len(recs) - ok} | {source} | "
          f"{pct(ttft, 50) or 0:.2f} / {pct(ttft, 99) or 0:.2f} | {pct(latency, 99) or 0:.0f} |")
p50, p99 = pct(every, 50), pct(every, 99)
print(f"\n- time to SERVING on an empty kernel cache: {serving} s")
print(f"- kernel autotunings after SERVING (ember:autotune_while_serving_total): "
      f"{'missing' if tuned is None else int(tuned)}")
print(f"- kernels compiled after SERVING (ember:kernel_compiles_while_serving_total): "
      f"{'missing' if compiled is None else int(compiled)}")
for l in warned[:20]:
    print(f"  - {l[:240]}")
print(f"- TTFT over every request of the window: p50 {p50 or 0:.2f} ms, p99 {p99 or 0:.2f} ms "
      f"({len(every)} requests with a first token; non-streamed ones from the server's timeline)")
ok = tuned == 0 and compiled == 0
print(f"- verdict: {'nothing tuned or compiled after SERVING' if ok else 'TUNED OR COMPILED AFTER SERVING'}")
sys.exit(0 if ok else 3)
PY
status=$?
cat "$OUT/result.md"
case $status in
    0) ;;
    3) die "a kernel was autotuned or compiled after SERVING (or /metrics lacks a counter)" ;;
    *) die "no result (python exited $status)" ;;
esac
