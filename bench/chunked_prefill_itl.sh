#!/usr/bin/env bash
# What chunked prefill does to running streams: inter-token latency of STREAMS
# decoding requests while LONG prompts arrive, once per --prefill-max-tokens
# value, on the CPU. From the repo root, with a release build of the binaries:
#
#   bash bench/chunked_prefill_itl.sh
#
# Workload (a `loadgen --arrival trace` dataset written to $OUT/trace.jsonl):
# STREAMS requests of 16 random tokens generating STREAM_TOKENS tokens each, all
# at t = 0; then LONG requests of LONG_LEN random tokens generating 4 tokens,
# one every GAP_MS from FIRST_MS. Greedy, EOS ignored, prefix cache off (the
# prompts are random anyway). Each budget gets a fresh server
# (`loadgen --spawn-server`); ITL is taken from the streams' client receive
# times only, TTFT from the long requests only ($OUT/summary.md).
#
# Environment knobs (defaults in brackets):
#   BIN_DIR      dir holding loadgen and ember-server [<repo>/target/release]
#   OUT          results dir [<repo>/bench-out-itl]
#   BUDGETS      --prefill-max-tokens values [8192,256,128]
#   PRESET       --preset of the server [gpt2]
#   STREAMS [8]  STREAM_TOKENS [400]  LONG [4]  LONG_LEN [900]
#   FIRST_MS [1000]  GAP_MS [1500]
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN_DIR=${BIN_DIR:-$REPO/target/release}
OUT=${OUT:-$REPO/bench-out-itl}
BUDGETS=${BUDGETS:-8192,256,128}
PRESET=${PRESET:-gpt2}
STREAMS=${STREAMS:-8}
STREAM_TOKENS=${STREAM_TOKENS:-400}
LONG=${LONG:-4}
LONG_LEN=${LONG_LEN:-900}
FIRST_MS=${FIRST_MS:-1000}
GAP_MS=${GAP_MS:-1500}
mkdir -p "$OUT"

python3 - "$OUT/trace.jsonl" <<PY
import json, sys
with open(sys.argv[1], "w") as f:
    for _ in range($STREAMS):
        f.write(json.dumps({"input_length": 16, "max_new_tokens": $STREAM_TOKENS, "timestamp": 0}) + "\n")
    for k in range($LONG):
        f.write(json.dumps({"input_length": $LONG_LEN, "max_new_tokens": 4, "timestamp": $FIRST_MS + k * $GAP_MS}) + "\n")
PY

IFS=, read -ra budgets <<<"$BUDGETS"
for b in "${budgets[@]}"; do
    echo "=== --prefill-max-tokens $b ===" | tee -a "$OUT/bench.log"
    "$BIN_DIR/loadgen" --spawn-server --server-bin "$BIN_DIR/ember-server" \
        --dataset "$OUT/trace.jsonl" --arrival trace --num-requests $((STREAMS + LONG)) \
        --no-stop-on-eos --progress off --requests-out "$OUT/requests_$b.jsonl" \
        --server-log "$OUT/server_$b.log" \
        -- --preset "$PRESET" --device cpu --no-prefix-cache --prefill-max-tokens "$b" \
        2>&1 | tee -a "$OUT/bench.log"
done

python3 - "$OUT" "$BUDGETS" "$LONG_LEN" <<'PY' | tee "$OUT/summary.md"
import json, sys
out, budgets, long_len = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, -(-p * len(xs) // 100) - 1))]

print("| --prefill-max-tokens | stream ITL p50 | p99 | max | long-prompt TTFT p50 | max | prefill chunks |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for b in budgets:
    rows = [json.loads(l) for l in open(f"{out}/requests_{b}.jsonl")]
    itl, ttft, chunks = [], [], set()
    for r in rows:
        t = r["token_recv_ns"]
        if r["prompt_tokens"] == long_len:
            ttft.append((r["first_token_ns"] - r["submit_start_ns"]) / 1e6)
            chunks.add((r.get("server") or {}).get("prefill_chunks"))
        else:
            itl += [(b2 - a) / 1e6 for a, b2 in zip(t, t[1:])]
    print(f"| {b} | {pct(itl, 50):.1f} ms | {pct(itl, 99):.1f} ms | {max(itl):.1f} ms "
          f"| {pct(ttft, 50):.0f} ms | {max(ttft):.0f} ms | {sorted(c for c in chunks if c is not None) or 'n/a'} |")
PY
