#!/usr/bin/env bash
# Where loadgen's own time goes in an open loop against its mock (issue 40):
# `perf record` of the whole loadgen process (every thread) while it fires a
# fixed-rate absolute schedule at `loadgen mock`, folded into stacks with the
# thread's name at the root. From the repository root, with a release build:
#
#   RATE=10000 bash bench/profile_loadgen.sh
#
# Prints the run's submit lag p50/p99 and achieved rate (from the profiled
# run's --json: perf's sampling costs a little, so take the figures of an
# unprofiled run from bench/run_loadgen_scale.sh), then the CPU samples per
# thread, the hottest functions (self), and the share of the samples under a
# few frames (inclusive). $OUT gets perf.data, folded.txt (one line per stack:
# `thread;outer;...;inner count`, the input of any flame graph tool) and,
# when `inferno-flamegraph` or `flamegraph.pl` is on the PATH, flame.svg.
#
# Knobs: RATE [10000] requests/s, SECONDS_ [5] of firing, TOKENS [4],
# MOCK_TTFT_MS [10], MOCK_ITL_MS [10], DOOR [grpc; or http], FREQ [997] Hz,
# LOADGEN_EXTRA [] (more loadgen flags), EMBER_BIN_DIR [target/release],
# OUT [bench-out-loadgen-profile]. Needs `perf` (Debian: linux-perf) and
# permission to profile one's own processes (kernel.perf_event_paranoid <= 2).
# Release builds have no frame pointers, so the call graph is taken with
# DWARF unwinding (--call-graph dwarf): perf.data grows ~1 GB a minute.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || exit 1
LOADGEN=${EMBER_BIN_DIR:-$REPO/target/release}/loadgen
RATE=${RATE:-10000}
SECS=${SECONDS_:-5}
TOKENS=${TOKENS:-4}
DOOR=${DOOR:-grpc}
FREQ=${FREQ:-997}
OUT=${OUT:-$REPO/bench-out-loadgen-profile}
read -r -a EXTRA <<<"${LOADGEN_EXTRA:-}"
mkdir -p "$OUT" || exit 1
command -v perf >/dev/null || { echo "error: perf not found (apt-get install linux-perf)" >&2; exit 1; }
[[ -x $LOADGEN ]] || { echo "error: $LOADGEN not built" >&2; exit 1; }
export NO_COLOR=1

echo "cpu:   $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
echo "load:  $(cut -d' ' -f1-3 /proc/loadavg)"

"$LOADGEN" mock --ttft-ms "${MOCK_TTFT_MS:-10}" --itl-ms "${MOCK_ITL_MS:-10}" \
    >"$OUT/mock.out" 2>"$OUT/mock.log" &
MOCK=$!
trap 'kill $MOCK 2>/dev/null; wait $MOCK 2>/dev/null' EXIT
for _ in $(seq 1 100); do
    grep -q '^http listening on ' "$OUT/mock.out" 2>/dev/null && break
    sleep 0.1
done
if [[ $DOOR == grpc ]]; then
    to=(--target "$(sed -n 's/^grpc listening on //p' "$OUT/mock.out")")
else
    to=(--backend openai --base-url "http://$(sed -n 's/^http listening on //p' "$OUT/mock.out")" --model mock)
fi
interval=$(python3 -c "print(repr(1000 / $RATE))")
perf record -F "$FREQ" --call-graph dwarf,16384 -o "$OUT/perf.data" -- \
    "$LOADGEN" "${to[@]}" --num-requests $((RATE * SECS)) --submit-interval-ms "$interval" \
    --max-new-tokens "$TOKENS" --no-stop-on-eos --progress off --json "$OUT/run.json" "${EXTRA[@]}" \
    >"$OUT/loadgen.log" 2>&1 || { echo "error: loadgen or perf failed: see $OUT/loadgen.log" >&2; exit 1; }
python3 - "$OUT/run.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
lag = r["metrics"]["submit_lag_ms"]
print(f"run:   {r['requests']} requests, submit lag p50 {lag['p50']:.3f} / p99 {lag['p99']:.3f} ms, "
      f"achieved {r['achieved_rate_rps']:.0f} of {r['requested_rate_rps']:.0f} req/s, "
      f"loadgen CPU {r['client_cpu_s']:.2f} s = {r['client_cpu_cores']:.2f} cores (under perf)")
EOF

perf script -i "$OUT/perf.data" -F comm,tid,ip,sym 2>/dev/null | python3 -c '
import re, sys
from collections import Counter
stacks = Counter()
thread, frames = None, []
def flush():
    if thread is not None:
        stacks[";".join([thread] + frames[::-1])] += 1
for line in sys.stdin:
    if not line.strip():
        flush()
        thread, frames = None, []
    elif not line[0].isspace():
        flush()
        # "comm tid": the thread name without its number suffix (workers).
        thread, frames = re.sub(r"\s+\d+\s*$", "", line.rstrip()).strip(), []
        thread = re.sub(r"-\d+$", "", thread) or "?"
    else:
        parts = line.split(None, 1)
        sym = parts[1].strip() if len(parts) > 1 else "[unknown]"
        sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
        sym = re.sub(r"::h[0-9a-f]{16}$", "", sym).replace(";", ":")
        frames.append(sym)
flush()
for stack, n in stacks.most_common():
    print(stack, n)
' >"$OUT/folded.txt"

python3 - "$OUT/folded.txt" <<'EOF'
import sys
from collections import Counter
total, threads, selfs, under = 0, Counter(), Counter(), Counter()
FRAMES = [  # inclusive shares worth seeing at a glance (substring match;
    # fire_at and the backends' execute are inlined into these frames)
    ("firing loop (waiting for each due time, spawning)", "measure::runner::fire::"),
    ("clock reads, anywhere (mostly the firing spin)", "clock_gettime"),
    ("request tasks (submit, read the stream, record)", "runner::TaskCtx::run"),
    ("hyper/h2 (connection and streams)", "h2::"),
    ("tonic (buffer, codec)", "tonic::"),
    ("building requests (workload)", "workload::"),
    ("tokio worker parking (futex, epoll)", "park"),
    ("allocation (malloc/free)", "malloc"),
    ("statistics after the run", "measure::stats"),
]
for line in open(sys.argv[1]):
    stack, n = line.rstrip("\n").rsplit(" ", 1)
    n = int(n)
    frames = stack.split(";")
    total += n
    threads[frames[0]] += n
    selfs[frames[-1]] += n
    for name, pat in FRAMES:
        if any(pat in f for f in frames[1:]):
            under[name] += n
if not total:
    sys.exit("no samples")
print(f"\n{total} samples. By thread:")
for t, n in threads.most_common(8):
    print(f"  {100 * n / total:5.1f}%  {t}")
print("\nHottest functions (self):")
for f, n in selfs.most_common(20):
    print(f"  {100 * n / total:5.1f}%  {f[:140]}")
print("\nUnder these frames (inclusive):")
for name, _ in FRAMES:
    print(f"  {100 * under[name] / total:5.1f}%  {name}")
EOF

if command -v inferno-flamegraph >/dev/null; then
    inferno-flamegraph <"$OUT/folded.txt" >"$OUT/flame.svg" && echo "flame graph: $OUT/flame.svg"
elif command -v flamegraph.pl >/dev/null; then
    flamegraph.pl "$OUT/folded.txt" >"$OUT/flame.svg" && echo "flame graph: $OUT/flame.svg"
else
    echo "folded stacks: $OUT/folded.txt (no inferno-flamegraph or flamegraph.pl for an SVG)"
fi
