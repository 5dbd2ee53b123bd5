#!/usr/bin/env bash
# What the request options of issue 31 cost on the GPU, in one invocation:
# seed044's load (64 streams x 256 tokens, --max-batch-size 64, all sent at
# once, --no-stop-on-eos) through the OpenAI door of ONE ember-server, four
# ways, each a warmup run and REPEATS measured runs:
#
#   plain          64 plain requests (the baseline)
#   penalty_all    64 with frequency_penalty 0.5 (loadgen --extra-inputs)
#   penalty_half   32 plain + 32 with the penalty (two loadgens started together)
#   json_one       63 plain + 1 with response_format json_object (two loadgens)
#   json_all       64 with response_format json_object
#   bias_all       64 with a logit_bias of three tokens (issue 47)
#
# and prints TPOT p50 (median over the runs) of each group, with the ratios the
# issue targets: penalty_all within 10% of plain, penalty_half no slower than
# penalty_all, json_one's 63 plain requests within 10% of plain, json_all
# within 1.2x of plain (issue 45) and bias_all within 10% of plain (issue 47).
#
#   OUT=/some/dir bash bench/run_options.sh          # the GPU run (gpt2, cuda:0)
#   bash bench/run_options.sh --dry-run              # tiny preset on the CPU, small
#
# Environment knobs [default; dry run's default]:
#   N              requests of the plain load [64; 8]
#   TOKENS         max_tokens [256; 16]
#   REPEATS        measured runs per case [3; 1]
#   PRESET         --preset [gpt2; tiny]
#   DEVICE         --device [cuda:0; cpu]
#   EMBER_BIN_DIR  ember-server and loadgen [target/release]
#   OUT            output dir [bench-out-options; bench-out-options-dry]
#   T_SERVING      seconds for the server to become SERVING [600; 120]
# $OUT gets result.md (printed), one loadgen JSON and log per group, server.log.
set -u
set -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
REPO=$PWD
DRY_RUN=${DRY_RUN:-0}
for arg in "$@"; do
    case $arg in
        --dry-run) DRY_RUN=1 ;;
        -h | --help) sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run_options.sh: unknown argument '$arg' (--dry-run, --help)" >&2; exit 2 ;;
    esac
done
BIN_DIR=${EMBER_BIN_DIR:-$REPO/target/release}
if [[ $DRY_RUN == 1 ]]; then
    N=${N:-8} TOKENS=${TOKENS:-16} REPEATS=${REPEATS:-1} PRESET=${PRESET:-tiny}
    DEVICE=${DEVICE:-cpu} T_SERVING=${T_SERVING:-120} OUT=${OUT:-bench-out-options-dry}
else
    N=${N:-64} TOKENS=${TOKENS:-256} REPEATS=${REPEATS:-3} PRESET=${PRESET:-gpt2}
    DEVICE=${DEVICE:-cuda:0} T_SERVING=${T_SERVING:-600} OUT=${OUT:-bench-out-options}
fi
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
export NO_COLOR=1
say() { printf '[options] %s\n' "$*"; }
die() { say "FAILED: $*"; exit 1; }
command -v python3 >/dev/null || die "needs python3"
[[ -x $BIN_DIR/ember-server && -x $BIN_DIR/loadgen ]] || die "no ember-server / loadgen in $BIN_DIR"

# shellcheck source=bench/door_lib.sh
source "$REPO/bench/door_lib.sh"
start_http_server "$OUT" "$T_SERVING" --preset "$PRESET" --device "$DEVICE" \
    --max-batch-size "$N" --max-pending 4096
say "ember-server SERVING at http://$HTTP"

# One loadgen group: NAME COUNT [extra loadgen args...]; run in the background.
group() {
    local name=$1 count=$2
    shift 2
    "$BIN_DIR/loadgen" --backend openai --base-url "http://$HTTP" --num-requests "$count" \
        --max-new-tokens "$TOKENS" --submit-interval-ms 0 --no-stop-on-eos --unique-prompts \
        --prompt Hello --warmup-runs 1 --repeat-runs "$REPEATS" --progress off \
        --json "$OUT/$name.json" "$@" >"$OUT/$name.log" 2>&1
}
run_case() {
    local name=$1
    say "case $name"
    case $name in
        plain) group plain "$N" || return 1 ;;
        penalty_all) group penalty_all "$N" --extra-inputs frequency_penalty:0.5 || return 1 ;;
        penalty_half)
            group penalty_half.plain $((N / 2)) & local a=$!
            group penalty_half.penalized $((N - N / 2)) --extra-inputs frequency_penalty:0.5 & local b=$!
            wait $a && wait $b || return 1 ;;
        json_one)
            group json_one.plain $((N - 1)) & local a=$!
            group json_one.json 1 --extra-inputs 'response_format:{"type":"json_object"}' \
                --extra-inputs ignore_eos:false & local b=$!
            wait $a && wait $b || return 1 ;;
        json_all) group json_all "$N" --extra-inputs 'response_format:{"type":"json_object"}' \
            --extra-inputs ignore_eos:false || return 1 ;;
        bias_all) group bias_all "$N" --extra-inputs 'logit_bias:{"13":2.0,"198":-1.5,"262":0.5}' \
            || return 1 ;;
    esac
}
for c in plain penalty_all penalty_half json_one json_all bias_all; do
    run_case "$c" || die "case $c (see $OUT/$c*.log)"
done

python3 - "$OUT" "$N" "$TOKENS" "$PRESET" "$DEVICE" >"$OUT/result.md" <<'PY' || die "no result"
import json, statistics, sys, os
out, n, tokens, preset, device = sys.argv[1:6]
def tpot(name):
    doc = json.load(open(os.path.join(out, name + ".json")))
    vals = [r["metrics"]["tpot_ms"]["p50"] for r in doc["runs"] if r["metrics"].get("tpot_ms")]
    fails = sum(r["failed"] for r in doc["runs"])
    return statistics.median(vals), fails
rows = ["plain", "penalty_all", "penalty_half.plain", "penalty_half.penalized", "json_one.plain", "json_one.json", "json_all", "bias_all"]
t = {r: tpot(r) for r in rows}
base = t["plain"][0]
print(f"## Request options under seed044's load ({n} x {tokens} tokens, {preset} on {device})\n")
print("| group | TPOT p50 ms (median of runs) | vs plain | failed |")
print("|---|---:|---:|---:|")
for r in rows:
    print(f"| {r} | {t[r][0]:.3f} | {t[r][0] / base:.3f} | {t[r][1]} |")
verdict = lambda ok: "met" if ok else "MISSED"
pa, ph = t["penalty_all"][0], max(t["penalty_half.plain"][0], t["penalty_half.penalized"][0])
jp = t["json_one.plain"][0]
print(f"\npenalty on every request / plain: {pa / base:.3f} (target <= 1.10: {verdict(pa <= 1.10 * base)})")
print(f"penalty on half (slower group) / penalty on all: {ph / pa:.3f} (target <= 1.0 within noise: {verdict(ph <= 1.03 * pa)})")
print(f"63 plain beside 1 json_object / plain: {jp / base:.3f} (target <= 1.10: {verdict(jp <= 1.10 * base)})")
ja = t["json_all"][0]
print(f"json_object on every request / plain: {ja / base:.3f} (target <= 1.2: {verdict(ja <= 1.2 * base)})")
ba = t["bias_all"][0]
print(f"logit_bias on every request / plain: {ba / base:.3f} (target <= 1.10: {verdict(ba <= 1.10 * base)})")
PY
cat "$OUT/result.md"
