#!/usr/bin/env bash
# loadgen and AIPerf, alternately, against ONE ember-server (issue 33): the
# server pinned to its own core(s) with taskset, both clients to the others,
# the tiny preset on the CPU, `--no-prefix-cache` (both tools send the same
# prompts). Three loads, each run by AIPerf, then by loadgen with AIPerf's
# very prompts (its inputs.json as loadgen's --dataset; without AIPerf,
# synthetic --input-len ones), the same shape (ISL tokens in, OSL tokens out,
# ignore_eos, temperature 0, streaming /v1/completions):
#   c1    concurrency 1 (a closed loop of one);
#   rate  an open-loop constant RATE req/s (loadgen --submit-interval-ms
#         1000/RATE; AIPerf --request-rate RATE --arrival-pattern constant);
#   conc  a closed loop of CONC (loadgen --max-concurrency; AIPerf
#         --concurrency).
# For each run: TTFT p50/p99, TPOT p50 and output tok/s as each tool
# reports them, the server's own TTFT p50 from its per-request log lines of
# that run, and the re-issue delay of the closed loops from the server's log
# (a slot's next request received - the request that freed it ended: how
# late the tool refills a slot), written to $OUT/table.md (printed).
#
#   bash bench/run_aiperf_compare.sh              # N=64, the full comparison
#   bash bench/run_aiperf_compare.sh --dry-run    # N=8: the path, quickly
#
# Knobs [default; dry run]: N [64; 8] requests per run, RATE [20; 10],
# CONC [4; 2], ISL [64] OSL [32; 8], SERVER_CPUS [0] CLIENT_CPUS [1],
# AIPERF [~/.cache/aiperf-venv/bin/aiperf: `python3 -m venv
# ~/.cache/aiperf-venv && ~/.cache/aiperf-venv/bin/pip install aiperf==0.13.0`],
# EMBER_BIN_DIR [target/release], OUT [bench-out-aiperf; bench-out-aiperf-dry].
# AIPerf runs with --use-server-token-count, --extra-inputs temperature:0 (the
# HTTP default is 1.0), --num-dataset-entries N (else prompts repeat) and
# --tokenizer with the GPT-2 vocabulary ember-common embeds (no network). Without AIPerf the script still runs
# loadgen's side and says AIPerf is missing.
set -u
set -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
REPO=$PWD
DRY_RUN=${DRY_RUN:-0}
for arg in "$@"; do
    case $arg in
        --dry-run) DRY_RUN=1 ;;
        -h | --help) sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run_aiperf_compare.sh: unknown argument '$arg'" >&2; exit 2 ;;
    esac
done
BIN_DIR=${EMBER_BIN_DIR:-$REPO/target/release}
AIPERF=${AIPERF:-$HOME/.cache/aiperf-venv/bin/aiperf}
SERVER_CPUS=${SERVER_CPUS:-0} CLIENT_CPUS=${CLIENT_CPUS:-1}
ISL=${ISL:-64}
if [[ $DRY_RUN == 1 ]]; then
    N=${N:-8} RATE=${RATE:-10} CONC=${CONC:-2} OSL=${OSL:-8} OUT=${OUT:-bench-out-aiperf-dry}
else
    N=${N:-64} RATE=${RATE:-20} CONC=${CONC:-4} OSL=${OSL:-32} OUT=${OUT:-bench-out-aiperf}
fi
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
export NO_COLOR=1
say() { printf '[aiperf-compare] %s\n' "$*"; }
die() { say "FAILED: $*"; exit 1; }
PIN_S=() PIN_C=()
if command -v taskset >/dev/null; then PIN_S=(taskset -c "$SERVER_CPUS") PIN_C=(taskset -c "$CLIENT_CPUS"); fi
"${PIN_S[@]}" "$BIN_DIR/ember-server" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --preset tiny \
    --device cpu --log-format json --max-batch-size 8 --no-prefix-cache >"$OUT/server.out" 2>"$OUT/server.log" &
SPID=$!
trap 'kill $SPID 2>/dev/null; wait $SPID 2>/dev/null' EXIT
for _ in $(seq 600); do
    HTTP=$(sed -n 's/^http listening on //p' "$OUT/server.out")
    [[ -n $HTTP ]] && curl -sf "http://$HTTP/health" >/dev/null && break
    kill -0 $SPID 2>/dev/null || die "ember-server exited (see $OUT/server.log)"
    sleep 0.3
done
BASE=http://$HTTP
curl -sf "$BASE/health" >/dev/null || die "server not SERVING"
say "ember-server (cpus $SERVER_CPUS) at $BASE; clients on cpus $CLIENT_CPUS"
"${PIN_C[@]}" "$BIN_DIR/loadgen" --backend openai --base-url "$BASE" --num-requests 4 \
    --max-new-tokens 4 --progress off >/dev/null 2>&1 || die "warmup failed"
# A local GPT-2 tokenizer for AIPerf (its `builtin` one downloads tiktoken's
# files): the vocabulary ember-common embeds, as a transformers directory.
TOK=$OUT/gpt2-tokenizer
mkdir -p "$TOK"
cp "$REPO/common/assets/gpt2/vocab.json" "$REPO/common/assets/gpt2/merges.txt" "$TOK/"
echo '{"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024}' >"$TOK/tokenizer_config.json"
echo '{"model_type": "gpt2"}' >"$TOK/config.json"
HAVE_AIPERF=1
[[ -x $AIPERF ]] || { HAVE_AIPERF=0; say "no AIPerf at $AIPERF: loadgen's side only"; }

RUNS=$OUT/runs.tsv
: >"$RUNS"
for scenario in c1 rate conc; do
    case $scenario in
        c1) lg_load=(--max-concurrency 1) ap_load=(--concurrency 1) c=1 ;;
        rate) lg_load=(--submit-interval-ms "$(python3 -c "print(1000 / $RATE)")")
              ap_load=(--request-rate "$RATE" --arrival-pattern constant) c=0 ;;
        conc) lg_load=(--max-concurrency "$CONC") ap_load=(--concurrency "$CONC") c=$CONC ;;
    esac
    for tool in aiperf loadgen; do
        [[ $tool == aiperf && $HAVE_AIPERF == 0 ]] && continue
        before=$(wc -l <"$OUT/server.log")
        dir=$OUT/$scenario-$tool
        mkdir -p "$dir"
        if [[ $tool == loadgen ]]; then
            prompts=(--input-len "$ISL")
            inputs=$OUT/$scenario-aiperf/inputs.json
            if [[ -f $inputs ]]; then
                python3 -c 'import json, sys
for s in json.load(open(sys.argv[1]))["data"]:
    for p in s["payloads"]:
        print(json.dumps({"prompt": p["prompt"], "max_new_tokens": p.get("max_tokens")}))' \
                    "$inputs" >"$dir/prompts.jsonl" || die "cannot read $inputs"
                prompts=(--dataset "$dir/prompts.jsonl")
            fi
            "${PIN_C[@]}" "$BIN_DIR/loadgen" --backend openai --base-url "$BASE" --endpoint completions \
                "${prompts[@]}" --max-new-tokens "$OSL" --no-stop-on-eos --num-requests "$N" \
                "${lg_load[@]}" --progress off --json "$dir/loadgen.json" >"$dir/log" 2>&1 ||
                die "loadgen $scenario failed (see $dir/log)"
        else
            "${PIN_C[@]}" "$AIPERF" profile --model tiny --url "$BASE" --endpoint-type completions \
                --streaming --tokenizer "$TOK" --prompt-input-tokens-mean "$ISL" \
                --prompt-input-tokens-stddev 0 --prompt-output-tokens-mean "$OSL" \
                --extra-inputs ignore_eos:true --extra-inputs temperature:0 --use-server-token-count \
                --num-dataset-entries "$N" --request-count "$N" --random-seed 1 "${ap_load[@]}" \
                --output-artifact-dir "$dir" --ui none >"$dir/log" 2>&1 ||
                die "aiperf $scenario failed (see $dir/log)"
        fi
        sleep 1 # the last requests' log lines
        after=$(wc -l <"$OUT/server.log")
        sed -n "$((before + 1)),${after}p" "$OUT/server.log" >"$dir/server.log"
        printf '%s\t%s\t%s\t%s\n' "$scenario" "$tool" "$dir" "$c" >>"$RUNS"
        say "$scenario by $tool done"
    done
done
python3 "$REPO/bench/aiperf_table.py" "$RUNS" "$N" "$RATE" "$CONC" "$ISL" "$OSL" >"$OUT/table.md" ||
    die "no table (see $OUT)"
cat "$OUT/table.md"
