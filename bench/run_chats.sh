#!/usr/bin/env bash
# The 256-chat load of issue 33 as ONE loadgen command next to the curl
# baseline it must match: N chats, non-streaming, no max_tokens (the server
# decides: up to the context), against one ember-server, first as N parallel
# curl processes (one request each, all started at once), then as
#
#   loadgen --backend openai --endpoint chat --stream false --max-new-tokens none \
#           --num-requests N --unique-prompts --scrape-metrics URL --gpu-telemetry ...
#
# and prints both throughputs (completion tokens / wall, tokens from the
# responses' `usage`) and their ratio; the target is loadgen within 5% of
# curl. loadgen's --report shows running / waiting / KV usage over time (the
# server's /metrics) and, on a GPU, its utilization (NVML).
#
#   OUT=/some/dir bash bench/run_chats.sh            # the GPU run (gpt2, cuda:0)
#   bash bench/run_chats.sh --dry-run                # tiny preset on the CPU, N=8
#
# Environment knobs [default; dry run's default]:
#   N              chats [256; 8]
#   PRESET         --preset [gpt2; tiny]
#   DEVICE         --device [cuda:0; cpu]
#   SERVER_ARGS    more server flags [--max-batch-size 256 --max-pending 4096;
#                  --max-new-tokens-limit 24]
#   EMBER_BIN_DIR  ember-server and loadgen [target/release]
#   OUT            output dir [bench-out-chats; bench-out-chats-dry]
#   T_SERVING      seconds for the server to become SERVING [900; 180]
#   PROMPT         the chat message ["Tell me a story about a dragon."]
#   TEMPERATURE    both sides' temperature [0]; the sampled variant is
#                  TEMPERATURE=1.0 (OpenAI's default), run beside the greedy one
# $OUT gets result.md (printed), curl/ (each response), loadgen.json,
# loadgen.log, report/ (HTML), server.log. Needs curl and python3.
set -u
set -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
REPO=$PWD
DRY_RUN=${DRY_RUN:-0}
for arg in "$@"; do
    case $arg in
        --dry-run) DRY_RUN=1 ;;
        -h | --help) sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run_chats.sh: unknown argument '$arg' (--dry-run, --help)" >&2; exit 2 ;;
    esac
done
BIN_DIR=${EMBER_BIN_DIR:-$REPO/target/release}
PROMPT=${PROMPT:-Tell me a story about a dragon.}
TEMPERATURE=${TEMPERATURE:-0}
if [[ $DRY_RUN == 1 ]]; then
    N=${N:-8} PRESET=${PRESET:-tiny} DEVICE=${DEVICE:-cpu} T_SERVING=${T_SERVING:-180}
    SERVER_ARGS=${SERVER_ARGS:---max-new-tokens-limit 24}
    OUT=${OUT:-bench-out-chats-dry}
else
    N=${N:-256} PRESET=${PRESET:-gpt2} DEVICE=${DEVICE:-cuda:0} T_SERVING=${T_SERVING:-900}
    SERVER_ARGS=${SERVER_ARGS:---max-batch-size 256 --max-pending 4096}
    OUT=${OUT:-bench-out-chats}
fi
mkdir -p "$OUT/curl" || exit 1
OUT=$(cd "$OUT" && pwd)
export NO_COLOR=1
say() { printf '[chats] %s\n' "$*"; }
die() { say "FAILED: $*"; exit 1; }
for tool in curl python3; do command -v $tool >/dev/null || die "needs $tool"; done
[[ -x $BIN_DIR/ember-server && -x $BIN_DIR/loadgen ]] || die "no ember-server / loadgen in $BIN_DIR"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
MPORT=$(free_port)
# shellcheck disable=SC2086 # SERVER_ARGS is a list of flags
"$BIN_DIR/ember-server" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --metrics-port "$MPORT" \
    --preset "$PRESET" --device "$DEVICE" $SERVER_ARGS >"$OUT/server.out" 2>"$OUT/server.log" &
SPID=$!
trap 'kill $SPID 2>/dev/null; wait $SPID 2>/dev/null' EXIT
deadline=$(($(date +%s) + T_SERVING))
HTTP=
while [[ -z $HTTP ]]; do
    HTTP=$(sed -n 's/^http listening on //p' "$OUT/server.out")
    kill -0 $SPID 2>/dev/null || die "ember-server exited (see $OUT/server.log)"
    (($(date +%s) < deadline)) || die "no http address within ${T_SERVING}s"
    sleep 0.2
done
BASE=http://$HTTP
until curl -sf "$BASE/health" >/dev/null; do
    kill -0 $SPID 2>/dev/null || die "ember-server exited (see $OUT/server.log)"
    (($(date +%s) < deadline)) || die "not SERVING within ${T_SERVING}s"
    sleep 0.5
done
say "ember-server SERVING at $BASE (metrics on :$MPORT)"
# One small warm run, so neither measured run pays first-request costs.
"$BIN_DIR/loadgen" --backend openai --base-url "$BASE" --endpoint chat --num-requests 4 \
    --max-new-tokens 4 --progress off >/dev/null 2>&1 || die "warmup failed"

# ---- 1. N curl processes at once ------------------------------------------------
NONCE=$(date +%s%N | tail -c 7)
body() {
    python3 -c 'import json,sys; print(json.dumps({"model": sys.argv[1], "messages": [{"role": "user", "content": sys.argv[2]}], "temperature": float(sys.argv[3])}))' \
        "$PRESET" "[c$NONCE.$1] $PROMPT" "$TEMPERATURE"
}
for i in $(seq 0 $((N - 1))); do body "$i" >"$OUT/curl/req-$i.json"; done
t0=$(date +%s.%N)
CURL_PIDS=()
for i in $(seq 0 $((N - 1))); do
    curl -s -o "$OUT/curl/resp-$i.json" -H 'content-type: application/json' \
        --data-binary "@$OUT/curl/req-$i.json" "$BASE/v1/chat/completions" &
    CURL_PIDS+=("$!")
done
wait "${CURL_PIDS[@]}" 2>/dev/null
t1=$(date +%s.%N)
CURL=$(python3 - "$OUT/curl" "$N" "$t0" "$t1" <<'PY'
import json, sys, os
d, n, t0, t1 = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
tokens = ok = 0
for i in range(n):
    try:
        doc = json.load(open(os.path.join(d, f"resp-{i}.json")))
        tokens += doc["usage"]["completion_tokens"]; ok += 1
    except Exception:
        pass
print(f"{ok} {tokens} {t1 - t0:.3f} {tokens / (t1 - t0):.1f}")
PY
) || die "curl responses unreadable"
read -r CURL_OK CURL_TOKENS CURL_WALL CURL_TPS <<<"$CURL"
((CURL_OK == N)) || die "only $CURL_OK of $N curl requests answered"
say "curl: $CURL_TOKENS tokens in $CURL_WALL s = $CURL_TPS tok/s"

# ---- 2. the same load as one loadgen command -------------------------------------
LG=(--backend openai --base-url "$BASE" --endpoint chat --stream false --max-new-tokens none
    --num-requests "$N" --unique-prompts --prompt "$PROMPT" --progress off --temperature "$TEMPERATURE"
    --scrape-metrics "http://127.0.0.1:$MPORT/metrics" --scrape-interval-ms 250 --gpu-telemetry
    --json "$OUT/loadgen.json" --report "$OUT/report")
say "loadgen ${LG[*]}"
"$BIN_DIR/loadgen" "${LG[@]}" >"$OUT/loadgen.log" 2>&1 || die "loadgen failed (see $OUT/loadgen.log)"
python3 - "$OUT/loadgen.json" "$CURL_TPS" "$CURL_WALL" "$CURL_TOKENS" "$N" "$PRESET" "$DEVICE" "$TEMPERATURE" >"$OUT/result.md" <<'PY' || die "no result"
import json, sys
doc = json.load(open(sys.argv[1])); r = doc["runs"][0]
curl_tps, curl_wall, curl_tokens, n = float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
m = r.get("server_metrics") or {}
ratio = r["throughput_completion_tps"] / curl_tps if curl_tps else float("nan")
print(f"## {n} chats, non-streaming, no max_tokens ({sys.argv[6]} on {sys.argv[7]}, temperature {sys.argv[8]})\n")
print("| client | requests ok | completion tokens | wall s | tok/s |")
print("|---|---:|---:|---:|---:|")
print(f"| {n} curl processes | {n} | {curl_tokens} | {curl_wall:.3f} | {curl_tps:,.1f} |")
print(f"| loadgen (one command) | {r['ok']} | {r['completion_tokens']} | {r['wall_s']:.3f} | {r['throughput_completion_tps']:,.1f} |")
print(f"\nloadgen / curl: {ratio:.3f} (target: within 5%: {'met' if abs(ratio - 1) <= 0.05 else 'MISSED'})")
print(f"loadgen submit lag p99 {r['metrics']['submit_lag_ms']['p99']} ms (the client is not the bottleneck when this is ~0)")
print(f"server: running max {m.get('max_running')}, waiting max {m.get('max_waiting')}, KV usage max {m.get('max_kv_cache_usage')}; "
      f"GPU: {m.get('gpu_note') or str(m.get('gpu_util_mean_pct')) + '% mean utilization'}")
PY
PREEMPTIONS=$(curl -s "http://127.0.0.1:$MPORT/metrics" | awk '/^vllm:num_preemptions_total/ {s += $NF} END {print s + 0}')
echo "server: preemptions (vllm:num_preemptions_total, both runs) $PREEMPTIONS; KV: $(grep -m1 -o 'KV cache sized.*' "$OUT/server.log" || true)" >>"$OUT/result.md"
cat "$OUT/result.md"
