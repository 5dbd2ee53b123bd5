#!/usr/bin/env bash
# loadgen's own accuracy and punctuality at scale, against its built-in mock
# server (issue 40), in one table. From the repository root, with a release
# build of loadgen in target/release (or EMBER_BIN_DIR):
#
#   bash bench/run_loadgen_scale.sh            # the issue's sizes; < 8 min on 16 cores
#   bash bench/run_loadgen_scale.sh --dry-run  # small numbers (CI; seconds)
#
# What it runs:
#   1. `loadgen calibrate --mock-process` (the mock in its own process, as a
#      real server runs, so the CPU figures are loadgen's alone) at each of
#      CAL_STREAMS streams through each door in DOORS: grpc (Ember's gRPC,
#      HTTP/2) and http (the OpenAI door, HTTP/1.1 + SSE unless CAL_HTTP=2).
#      Up to 1,000 streams: calibrate's defaults (TTFT 500 ms, ITL 50 ms, 16
#      tokens, opened 0.5 ms apart = 2,000 streams/s); above: opened 0.1 ms
#      apart (10,000/s) with TTFT 2,000 ms and ITL 250 ms, so all are open at
#      once (docs/loadgen.md). Error = client - mock (TTFT, and every gap);
#      target: both p99 < 1 ms.
#   2. An open loop: one `loadgen mock` (TTFT OPEN_TTFT_MS, ITL OPEN_ITL_MS),
#      then for each rate in OPEN_RATES and door in DOORS a fixed absolute
#      schedule (`--submit-interval-ms 1000/RATE`) of RATE x OPEN_SECONDS
#      requests of OPEN_TOKENS tokens, after one warmup run of the same;
#      target: achieved rate within 1% of the asked, submit lag p99 < 0.1 ms.
#   3. $OUT/table.md (printed too): host CPU model and cores, load average,
#      and per row: door, streams or rate, error p50/p99 (calibrate), submit
#      lag p50/p99, achieved vs asked rate, loadgen's CPU (seconds of user +
#      system over the measured run, and that over the run's wall time =
#      cores kept busy; loadgen measures it itself with getrusage), targets.
#
# Environment knobs [default; dry run's default]:
#   CAL_STREAMS     streams per calibration [1000 10000; 100 400]
#   CAL_HTTP        HTTP version of the http door's calibration [1]
#   CAL_EXTRA       more `loadgen calibrate` flags for every calibration [;
#                   --ttft-ms 100 --itl-ms 20 --tokens 4]
#   OPEN_RATES      open-loop rates, requests/s [10000; 500 2000]
#   OPEN_SECONDS    seconds of each open-loop run [10; 1]
#   OPEN_TOKENS     tokens per open-loop request [4]
#   OPEN_TTFT_MS    the open-loop mock's TTFT [10]
#   OPEN_ITL_MS     the open-loop mock's ITL [10]
#   OPEN_EXTRA      more loadgen flags for the open-loop runs []
#   DOORS           grpc and/or http [grpc http]
#   T_STEP          seconds one step may take [300; 60]
#   EMBER_BIN_DIR   dir with loadgen [target/release]
#   OUT             output dir [bench-out-loadgen-scale; bench-out-loadgen-scale-dry]
# $OUT gets table.md, cal-<streams>-<door>.{json,log}, open-<rate>-<door>.{json,log},
# mock.log and bench.log (everything printed). Exit status: non-zero if a
# step fails or a request fails; a missed target is reported, not an error.
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
            echo "run_loadgen_scale.sh: unknown argument '$arg' (--dry-run, --help)" >&2
            exit 2
            ;;
    esac
done

LOADGEN=${EMBER_BIN_DIR:-$REPO/target/release}/loadgen
CAL_HTTP=${CAL_HTTP:-1}
OPEN_TOKENS=${OPEN_TOKENS:-4}
OPEN_TTFT_MS=${OPEN_TTFT_MS:-10}
OPEN_ITL_MS=${OPEN_ITL_MS:-10}
DOORS=${DOORS:-grpc http}
read -r -a OPEN_EXTRA_ARGS <<<"${OPEN_EXTRA:-}"
if [[ $DRY_RUN == 1 ]]; then
    CAL_STREAMS=${CAL_STREAMS:-100 400}
    read -r -a CAL_EXTRA_ARGS <<<"${CAL_EXTRA---ttft-ms 100 --itl-ms 20 --tokens 4}"
    OPEN_RATES=${OPEN_RATES:-500 2000}
    OPEN_SECONDS=${OPEN_SECONDS:-1}
    T_STEP=${T_STEP:-60}
    OUT=${OUT:-$REPO/bench-out-loadgen-scale-dry}
else
    CAL_STREAMS=${CAL_STREAMS:-1000 10000}
    read -r -a CAL_EXTRA_ARGS <<<"${CAL_EXTRA:-}"
    OPEN_RATES=${OPEN_RATES:-10000}
    OPEN_SECONDS=${OPEN_SECONDS:-10}
    T_STEP=${T_STEP:-300}
    OUT=${OUT:-$REPO/bench-out-loadgen-scale}
fi

mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/bench.log") 2>&1
TEE_PID=$!
export NO_COLOR=1
T0=$(date +%s)
MOCK_PID=
say() { printf '[loadgen-scale %4ds] %s\n' "$(($(date +%s) - T0))" "$*"; }
die() {
    say "FAILED: $*"
    exit 1
}
cleanup() {
    local rc=$?
    if [[ -n $MOCK_PID ]]; then
        kill -TERM "$MOCK_PID" 2>/dev/null
        wait "$MOCK_PID" 2>/dev/null
    fi
    say "exit $rc after $(($(date +%s) - T0))s; files in $OUT"
    exec >&- 2>&-
    wait "$TEE_PID" 2>/dev/null
    exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

[[ -x $LOADGEN ]] || die "$LOADGEN not found (build it, or set EMBER_BIN_DIR)"
command -v python3 >/dev/null 2>&1 || die "python3 not found"
for door in $DOORS; do
    [[ $door == grpc || $door == http ]] || die "DOORS: '$door' is neither grpc nor http"
done

CPU_MODEL=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')
CORES=$(nproc)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)
say "host: ${CPU_MODEL:-unknown CPU}, $CORES cores, load average $LOAD_BEFORE; $("$LOADGEN" --version)"
ROWS=$OUT/rows.tsv # kind, door, size, json
: >"$ROWS"

# step NAME CMD...: runs one loadgen command with the step's time limit, its
# output in $OUT/NAME.log (and here).
step() {
    local name=$1 rc
    shift
    say ">>> $name: ${*#"$REPO/"}"
    timeout --kill-after=10 "$T_STEP" "$@" 2>&1 | tee "$OUT/$name.log"
    rc=$?
    ((rc == 124 || rc == 137)) && die "$name: timed out after ${T_STEP}s"
    ((rc == 0)) || die "$name: exited with $rc"
}

# ---- 1. calibrate ---------------------------------------------------------------
for streams in $CAL_STREAMS; do
    [[ $streams =~ ^[0-9]+$ ]] || die "CAL_STREAMS: '$streams' is not a number"
    sizing=()
    ((streams > 1000)) && sizing=(--interval-ms 0.1 --ttft-ms 2000 --itl-ms 250)
    for door in $DOORS; do
        via=()
        [[ $door == http ]] && via=(--backend openai --http "$CAL_HTTP")
        json=$OUT/cal-$streams-$door.json
        step "cal-$streams-$door" "$LOADGEN" calibrate --mock-process --streams "$streams" \
            "${via[@]}" "${sizing[@]}" "${CAL_EXTRA_ARGS[@]}" --json "$json"
        printf 'cal\t%s\t%s\t%s\n' "$door" "$streams" "$json" >>"$ROWS"
    done
done

# ---- 2. open loop against `loadgen mock` ------------------------------------------
if [[ -n ${OPEN_RATES// /} ]]; then
    "$LOADGEN" mock --ttft-ms "$OPEN_TTFT_MS" --itl-ms "$OPEN_ITL_MS" \
        >"$OUT/mock.out" 2>"$OUT/mock.log" &
    MOCK_PID=$!
    for _ in $(seq 1 100); do
        grep -q '^http listening on ' "$OUT/mock.out" 2>/dev/null && break
        kill -0 "$MOCK_PID" 2>/dev/null || die "loadgen mock exited (see $OUT/mock.log)"
        sleep 0.1
    done
    GRPC=$(sed -n 's/^grpc listening on //p' "$OUT/mock.out")
    HTTP=$(sed -n 's/^http listening on //p' "$OUT/mock.out")
    [[ -n $GRPC && -n $HTTP ]] || die "loadgen mock did not print its addresses"
    say "loadgen mock: gRPC $GRPC, HTTP $HTTP (TTFT $OPEN_TTFT_MS ms, ITL $OPEN_ITL_MS ms)"
    for rate in $OPEN_RATES; do
        if ! [[ $rate =~ ^[0-9]+$ ]] || ((rate == 0)); then
            die "OPEN_RATES: '$rate' is not a rate"
        fi
        interval=$(python3 -c "print(repr(1000 / $rate))")
        n=$((rate * OPEN_SECONDS))
        for door in $DOORS; do
            if [[ $door == grpc ]]; then
                to=(--target "$GRPC")
            else
                to=(--backend openai --base-url "http://$HTTP" --model mock)
            fi
            json=$OUT/open-$rate-$door.json
            step "open-$rate-$door" "$LOADGEN" "${to[@]}" --num-requests "$n" \
                --submit-interval-ms "$interval" --max-new-tokens "$OPEN_TOKENS" \
                --no-stop-on-eos --warmup-runs 1 --progress off --json "$json" \
                "${OPEN_EXTRA_ARGS[@]}"
            printf 'open\t%s\t%s\t%s\n' "$door" "$rate" "$json" >>"$ROWS"
        done
    done
fi

# ---- 3. the table -------------------------------------------------------------------
LS_CPU="$CPU_MODEL" LS_CORES=$CORES LS_LOAD_BEFORE="$LOAD_BEFORE" \
    LS_LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" LS_DRY_RUN=$DRY_RUN \
    LS_DATE="$(date -u +%Y-%m-%dT%H:%MZ)" LS_CAL_HTTP=$CAL_HTTP \
    LS_CAL_EXTRA="${CAL_EXTRA_ARGS[*]}" \
    LS_OPEN="mock TTFT $OPEN_TTFT_MS ms, ITL $OPEN_ITL_MS ms; $OPEN_TOKENS tokens a request, $OPEN_SECONDS s a run" \
    LS_COMMIT="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    python3 - "$ROWS" "$OUT/table.md" <<'EOF' || die "the table could not be made"
import json, os, sys

rows_path, table_path = sys.argv[1:3]
env = os.environ

def ms(v):
    return "n/a" if v is None else f"{v:.3f}"

def pair(d):
    return f"{ms(d.get('p50'))} / {ms(d.get('p99'))}"

def rate(v):
    return "n/a" if v is None else f"{v:,.0f}"

def cpu(s, cores):
    if s is None or cores is None:
        return "n/a"
    return f"{s:.2f} s, {cores:.2f} cores"

out = []
out.append("## loadgen at scale against its mock" + (" (DRY RUN: small numbers)" if env["LS_DRY_RUN"] == "1" else ""))
out.append("")
out.append(f"- host: {env['LS_CPU'] or 'unknown CPU'}, {env['LS_CORES']} cores (nproc); "
           f"load average {env['LS_LOAD_BEFORE']} before, {env['LS_LOAD_AFTER']} after")
out.append(f"- run: {env['LS_DATE']}, commit {env['LS_COMMIT']}, bench/run_loadgen_scale.sh")
extra = f" {env['LS_CAL_EXTRA']}" if env["LS_CAL_EXTRA"] else ""
out.append(f"- calibrate: `loadgen calibrate --mock-process --streams N{extra}` (above 1,000 streams "
           f"`--interval-ms 0.1 --ttft-ms 2000 --itl-ms 250`); http = `--backend openai --http {env['LS_CAL_HTTP']}`; "
           "error = client - mock, TTFT and every inter-token gap")
out.append(f"- open loop: `loadgen --submit-interval-ms 1000/RATE --num-requests RATE x seconds` "
           f"against `loadgen mock` ({env['LS_OPEN']}), one warmup run")
out.append("- loadgen CPU: its own user + system time over the measured run (getrusage), "
           "and that over the run's wall time")
out.append("")
out.append("| run | door | streams or rate | TTFT error p50 / p99 ms | ITL error p50 / p99 ms | "
           "submit lag p50 / p99 ms | achieved / asked req/s | loadgen CPU | target |")
out.append("|---|---|---:|---|---|---|---|---|---|")
for line in open(rows_path):
    kind, door, size, path = line.rstrip("\n").split("\t")
    doc = json.load(open(path))
    if kind == "cal":
        r = doc["run"]
        verdict = "met" if doc["pass"] else "missed"
        out.append(f"| calibrate | {door} | {int(size):,} streams | {pair(doc['ttft_error_ms'])} | "
                   f"{pair(doc['itl_error_ms'])} | {pair(r['submit_lag_ms'])} | "
                   f"{rate(r['achieved_rate_rps'])} / {rate(r['requested_rate_rps'])} | "
                   f"{cpu(r['client_cpu_s'], r['client_cpu_cores'])} | error p99 < 1 ms: {verdict} |")
        if doc["ok"] != int(size):
            sys.exit(f"{path}: {doc['ok']} of {size} streams finished OK")
        continue
    runs = [r for r in doc["runs"] if not r.get("warmup")]
    if len(runs) != 1 or runs[0]["failed"]:
        sys.exit(f"{path}: expected one measured run without failures")
    r = runs[0]
    lag = r["metrics"]["submit_lag_ms"]
    achieved, asked = r["achieved_rate_rps"], r["requested_rate_rps"]
    within = achieved is not None and asked and abs(achieved - asked) <= 0.01 * asked
    punctual = lag.get("p99") is not None and lag["p99"] < 0.1
    verdict = ("met" if within and punctual else "missed") + \
        f" (rate {'within' if within else 'not within'} 1%, lag p99 {'<' if punctual else '>='} 0.1 ms)"
    out.append(f"| open loop | {door} | {int(size):,} req/s | n/a | n/a | {pair(lag)} | "
               f"{rate(achieved)} / {rate(asked)} | {cpu(r['client_cpu_s'], r['client_cpu_cores'])} | {verdict} |")
text = "\n".join(out) + "\n"
open(table_path, "w").write(text)
print(text, end="")
EOF
say "table in $OUT/table.md"
