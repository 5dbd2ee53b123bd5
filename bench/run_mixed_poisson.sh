#!/usr/bin/env bash
# Issue 38's traffic target: a Poisson load of streamed chats at RATE req/s
# where half the requests sample (temperature 1.0, OpenAI's default) and half
# are greedy, against ONE ember-server through its OpenAI door, as two
# loadgens started together (RATE/2 each, different seeds), for DURATION:
#
#   loadgen --backend openai --endpoint chat --stream true --arrival poisson \
#       --request-rate RATE/2 --duration DURATION --input-len uniform:10..500 \
#       --output-len uniform:16..512 [--temperature 1.0] --scrape-metrics URL
#
# Prompts are random token ids of 10-500 tokens (about 8-400 words), answers
# 16-512 tokens. Prints TTFT p50/p99, TPOT p50 and queue wait p99 per group and
# the server's largest waiting queue (its /metrics, scraped every 250 ms); the
# targets: TTFT p50 < 20 ms in both groups and a flat queue (the largest
# waiting count under one second's arrivals).
#
#   OUT=/some/dir bash bench/run_mixed_poisson.sh      # the GPU run (gpt2, cuda:0)
#   bash bench/run_mixed_poisson.sh --dry-run          # tiny preset on the CPU, short
#
# Environment knobs [default; dry run's default]:
#   RATE           total requests per second [30; 4]
#   DURATION       loadgen --duration [60s; 3s]
#   PRESET         --preset [gpt2; tiny]
#   DEVICE         --device [cuda:0; cpu]
#   SERVER_ARGS    more server flags [--max-batch-size 256; --max-new-tokens-limit 24]
#   EMBER_BIN_DIR  ember-server and loadgen [target/release]
#   OUT            output dir [bench-out-mixed; bench-out-mixed-dry]
#   T_SERVING      seconds for the server to become SERVING [600; 120]
# $OUT gets result.md (printed), each group's loadgen JSON and log, server.log.
set -u
set -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
REPO=$PWD
DRY_RUN=${DRY_RUN:-0}
for arg in "$@"; do
    case $arg in
        --dry-run) DRY_RUN=1 ;;
        -h | --help) sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run_mixed_poisson.sh: unknown argument '$arg' (--dry-run, --help)" >&2; exit 2 ;;
    esac
done
BIN_DIR=${EMBER_BIN_DIR:-$REPO/target/release}
if [[ $DRY_RUN == 1 ]]; then
    RATE=${RATE:-4} DURATION=${DURATION:-3s} PRESET=${PRESET:-tiny} DEVICE=${DEVICE:-cpu}
    SERVER_ARGS=${SERVER_ARGS:---max-new-tokens-limit 24} T_SERVING=${T_SERVING:-120}
    OUT=${OUT:-bench-out-mixed-dry} LENS=(--input-len uniform:4..40 --output-len uniform:2..16)
else
    RATE=${RATE:-30} DURATION=${DURATION:-60s} PRESET=${PRESET:-gpt2} DEVICE=${DEVICE:-cuda:0}
    SERVER_ARGS=${SERVER_ARGS:---max-batch-size 256} T_SERVING=${T_SERVING:-600}
    OUT=${OUT:-bench-out-mixed} LENS=(--input-len uniform:10..500 --output-len uniform:16..512)
fi
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
export NO_COLOR=1
say() { printf '[mixed] %s\n' "$*"; }
die() { say "FAILED: $*"; exit 1; }
command -v python3 >/dev/null || die "needs python3"
[[ -x $BIN_DIR/ember-server && -x $BIN_DIR/loadgen ]] || die "no ember-server / loadgen in $BIN_DIR"

read -r -a SERVER_EXTRA <<<"$SERVER_ARGS"
MPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# shellcheck source=bench/door_lib.sh
source "$REPO/bench/door_lib.sh"
start_http_server "$OUT" "$T_SERVING" --metrics-port "$MPORT" --preset "$PRESET" \
    --device "$DEVICE" --max-pending 4096 "${SERVER_EXTRA[@]}"
say "ember-server SERVING at http://$HTTP (metrics on port $MPORT)"
"$BIN_DIR/loadgen" --backend openai --base-url "http://$HTTP" --endpoint chat --num-requests 4 \
    --max-new-tokens 4 --temperature 1.0 --progress off >/dev/null 2>&1 || die "warmup failed"

# One group: NAME SEED [extra loadgen args...]; at half the rate.
group() {
    local name=$1 seed=$2
    shift 2
    "$BIN_DIR/loadgen" --backend openai --base-url "http://$HTTP" --endpoint chat --stream true \
        --arrival poisson --request-rate "$(python3 -c "print($RATE / 2)")" --duration "$DURATION" \
        "${LENS[@]}" --seed "$seed" --progress off \
        --scrape-metrics "http://127.0.0.1:$MPORT/metrics" --scrape-interval-ms 250 --json "$OUT/$name.json" "$@" \
        >"$OUT/$name.log" 2>&1
}
say "two groups at $RATE req/s together for $DURATION"
group greedy 1 & a=$!
group sampled 2 --temperature 1.0 & b=$!
wait $a || die "greedy group failed (see $OUT/greedy.log)"
wait $b || die "sampled group failed (see $OUT/sampled.log)"

python3 - "$OUT" "$RATE" "$DURATION" "$PRESET" "$DEVICE" >"$OUT/result.md" <<'PY' || die "no result"
import json, sys, os
out, rate, duration, preset, device = sys.argv[1:6]
print(f"## Poisson chats at {rate} req/s for {duration}, half sampled (temperature 1.0), {preset} on {device}\n")
print("| group | ok | failed | achieved req/s | TTFT p50 / p99 ms | TPOT p50 ms | queue wait p99 ms | server waiting max |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
ttft50, waiting = [], []
for name in ("greedy", "sampled"):
    r = json.load(open(os.path.join(out, name + ".json")))["runs"][0]
    m, s = r["metrics"], r.get("server_metrics") or {}
    g = lambda k, p: (m.get(k) or {}).get(p)
    ttft50.append(g("ttft_ms", "p50"))
    waiting.append(s.get("max_waiting"))
    print(f"| {name} | {r['ok']} | {r['failed']} | {r.get('achieved_rps', r.get('request_throughput', 'n/a'))} | "
          f"{g('ttft_ms', 'p50')} / {g('ttft_ms', 'p99')} | {g('tpot_ms', 'p50')} | {g('queue_wait_ms', 'p99')} | {s.get('max_waiting')} |")
ok_ttft = all(t is not None and t < 20 for t in ttft50)
known = [w for w in waiting if w is not None]
ok_queue = bool(known) and max(known) <= float(rate)
verdict = lambda ok: "met" if ok else "MISSED"
print(f"\nTTFT p50 < 20 ms in both groups: {verdict(ok_ttft)}; queue flat (waiting max <= {rate}): "
      f"{verdict(ok_queue) if known else 'n/a (no server metrics)'}")
PY
cat "$OUT/result.md"
