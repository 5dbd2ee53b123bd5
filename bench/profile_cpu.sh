#!/usr/bin/env bash
# Where a CPU decode step's time goes, by op: `perf` samples of
# ember-engine-bench's timed decode steps only (it attaches after the
# warmup steps, so model init and the prefill are not in it), grouped by
# the op each hot symbol belongs to. From the repo root, with a release build:
#
#   BATCH=1 bash bench/profile_cpu.sh
#
# Knobs: BATCH [1], CONTEXT [128], SECONDS_ [8] (perf record time),
# EMBER_BIN_DIR [target/release], ENGINE_EXTRA_ARGS (e.g. --cpu-weights bf16),
# OUT [bench-out-cpu-profile]. Needs `perf` (and permission to attach:
# root, or kernel.perf_event_paranoid <= 1).
#
# Prints the step's p50 (from a separate untraced run of the same binary,
# so perf's overhead is not in it) and a table: op group, share of the
# samples, and that share of the p50 in ms. Groups are by symbol name
# (the `case` list in `group` below); unknown symbols count as "other".
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || exit 1
BIN=${EMBER_BIN_DIR:-$REPO/target/release}/ember-engine-bench
BATCH=${BATCH:-1}
CONTEXT=${CONTEXT:-128}
SECS=${SECONDS_:-8}
OUT=${OUT:-$REPO/bench-out-cpu-profile}
read -r -a EXTRA <<<"${ENGINE_EXTRA_ARGS:-}"
mkdir -p "$OUT" || exit 1
command -v perf >/dev/null || { echo "error: perf not found" >&2; exit 1; }
[[ -x $BIN ]] || { echo "error: $BIN not built" >&2; exit 1; }

echo "cpu:   $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "load:  $(cut -d' ' -f1-3 /proc/loadavg)"

# 1. The step time, untraced.
"$BIN" --device cpu --batch-sizes "$BATCH" --context "$CONTEXT" --steps 32 --warmup 4 \
    --json "$OUT/untraced.json" "${EXTRA[@]}" 2>/dev/null | grep -E '^(cpu:| +batch| +[0-9])'
P50=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["decode"][0]["eager"]["p50_ms"])' \
    "$OUT/untraced.json") || exit 1

# 2. perf on the timed steps of a long run (enough steps to outlast SECS).
STEPS=$((1024 - CONTEXT - 8))
"$BIN" --device cpu --batch-sizes "$BATCH" --context "$CONTEXT" --steps "$STEPS" --warmup 2 \
    --json "$OUT/traced.json" "${EXTRA[@]}" >"$OUT/traced.out" 2>"$OUT/traced.err" &
PID=$!
until grep -q "warmup steps" "$OUT/traced.err" 2>/dev/null; do
    kill -0 "$PID" 2>/dev/null || { echo "error: bench exited early" >&2; exit 1; }
    sleep 0.2
done
perf record -F 999 -g -p "$PID" -o "$OUT/perf.data" -- sleep "$SECS" >/dev/null 2>&1
kill "$PID" 2>/dev/null
wait "$PID" 2>/dev/null
perf report -i "$OUT/perf.data" --no-children --sort symbol --stdio 2>/dev/null |
    grep -E '^ +[0-9.]+%' >"$OUT/symbols.txt"

# 3. Group the symbols.
python3 - "$OUT/symbols.txt" "$P50" "$BATCH" <<'EOF'
import re, sys
path, p50, batch = sys.argv[1], float(sys.argv[2]), sys.argv[3]
GROUPS = [  # first match wins
    ("projections + LM head (ops/cpu/gemv)", r"ember_engine::ops::cpu::gemv"),
    ("Flex matmul (gemm crate)", r"gemm_|gemm::"),
    ("attention (ops/cpu/paged_attention, tiled_attention)", r"paged_attention|tiled_attention|flex_slices::(dot|axpy)"),
    ("KV write (ops/cpu/kv_write; select_assign where shared)", r"select_assign|kv_write::"),
    ("argmax / sampling", r"argmax|sampl"),
    ("element-wise and reductions (LayerNorm, embeddings, casts)",
     r"burn_flex::(ops::(binary|unary|reduce|float|activation|comparison|gather)|zip|tensor::copy)|macerator|__(exp|tanh|log)"),
    ("allocation, copies, page faults", r"mi_|malloc|free|memmove|memcpy|memset|clear_page|page_fault|folio"),
    ("thread hand-offs (rayon, scheduler, futex)",
     r"rayon|sched|futex|finish_task_switch|syscall|spin_unlock|irqentry|__rseq|_raw_spin"),
]
totals, other = {}, []
for line in open(path):
    m = re.match(r"\s*([0-9.]+)%\s+\[[.k]\]\s+(.*?)\s{2,}", line + "  ")
    if not m:
        continue
    pct, sym = float(m.group(1)), m.group(2)
    for name, pat in GROUPS:
        if re.search(pat, sym):
            totals[name] = totals.get(name, 0.0) + pct
            break
    else:
        totals["other"] = totals.get("other", 0.0) + pct
        other.append((pct, sym))
print(f"\ndecode step, batch {batch}: p50 {p50:.2f} ms (untraced run); perf samples of the timed steps:\n")
print("| op | share of samples | ms of the p50 |")
print("|---|---:|---:|")
for name, pct in sorted(totals.items(), key=lambda kv: -kv[1]):
    print(f"| {name} | {pct:.1f}% | {p50 * pct / 100:.2f} |")
print("\nlargest 'other' symbols: " + "; ".join(f"{s} {p:.1f}%" for p, s in sorted(other, reverse=True)[:6]))
EOF
