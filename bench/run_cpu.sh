#!/usr/bin/env bash
# Ember's engine vs PyTorch eager on the CPU, decode step by step, in one
# invocation. From the repo root, with a release build of ember-engine-bench:
#
#   bash bench/run_cpu.sh
#
# Workload (both sides): GPT-2 124M (GPT2Config defaults), f32, random weights;
# for each batch size B, B random prompts of CONTEXT tokens are prefilled, then
# WARMUP untimed and STEPS timed decode steps of one token per row (forward +
# greedy sampling). The figure compared is each side's p50 ms/step (nearest
# rank over the timed steps, computed the same way by both).
#
#   Ember:  $EMBER_BIN_DIR/ember-engine-bench --device cpu --preset gpt2
#           --batch-sizes B --context CONTEXT --steps STEPS --warmup WARMUP --json F
#   torch:  bench/peer_cpu.py (transformers GPT2LMHeadModel, eager,
#           past_key_values) with the same flags
#
# Order, for fairness on a shared machine: for each pass (PASSES, default 2),
# for each batch size: Ember, then torch. Every (pass, batch) pair is reported.
#
# Environment knobs (defaults in brackets):
#   EMBER_BIN_DIR      dir holding ember-engine-bench [<repo>/target/release]
#   OUT                results dir [<repo>/bench-out-cpu]
#   EMBER_BENCH_VENV   python venv with torch + transformers, created if missing
#                      or lacking them [$HOME/.cache/ember/bench-venv]
#   PYTHON             use this interpreter instead (no venv is made or touched)
#   BATCH_SIZES [1,16]  CONTEXT [128]  STEPS [32]  WARMUP [4]  PASSES [2]
#   TORCH_THREADS      peer_cpu.py --threads (default: torch's choice; Ember's
#                      rayon pool uses every logical CPU unless RAYON_NUM_THREADS)
#   ENGINE_EXTRA_ARGS  more flags for ember-engine-bench (word-split)
#   PEER_EXTRA_ARGS    more flags for peer_cpu.py (word-split)
#   STAGE_TIMEOUT_S    limit per engine/peer invocation [1800]
#
# $OUT gets: bench.log (everything), raw/{ember,torch}_p<pass>_b<batch>.json,
# results.json (merged), table.md (the table, also printed at the end) and
# pip-freeze.txt (the python environment used).
set -uo pipefail

# ---- paths and knobs -----------------------------------------------------------
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || exit 1
BIN_DIR=${EMBER_BIN_DIR:-$REPO/target/release}
OUT=${OUT:-$REPO/bench-out-cpu}
mkdir -p "$OUT/raw" || exit 1
OUT=$(cd "$OUT" && pwd) || exit 1          # relative to the caller's directory
if [[ -d $BIN_DIR ]]; then BIN_DIR=$(cd "$BIN_DIR" && pwd); fi
ENGINE_BIN=$BIN_DIR/ember-engine-bench
VENV=${EMBER_BENCH_VENV:-$HOME/.cache/ember/bench-venv}
BATCH_SIZES=${BATCH_SIZES:-1,16}
CONTEXT=${CONTEXT:-128}
STEPS=${STEPS:-32}
WARMUP=${WARMUP:-4}
PASSES=${PASSES:-2}
TORCH_THREADS=${TORCH_THREADS:-}
STAGE_TIMEOUT_S=${STAGE_TIMEOUT_S:-1800}
read -r -a ENGINE_EXTRA <<<"${ENGINE_EXTRA_ARGS:-}"
read -r -a PEER_EXTRA <<<"${PEER_EXTRA_ARGS:-}"

# The versions this script installs into a new venv (plain PyPI wheels; the
# download.pytorch.org index is not needed). An existing venv is reused as is.
TORCH_PIN=2.15.0
TRANSFORMERS_PIN=5.23.0

LOG=$OUT/bench.log
cd "$REPO" || exit 1

# ---- helpers -------------------------------------------------------------------
machine() {
    echo "# Ember vs torch, CPU decode"
    echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host:     $(uname -n) ($(uname -sr), $(uname -m))"
    echo "cpu:      $(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')"
    echo "nproc:    $(nproc)"
    if command -v lscpu >/dev/null; then
        lscpu | grep -E '^(Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|L3 cache):' |
            sed 's/  */ /g; s/^/          /'
    fi
    echo "memory:   $(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo 2>/dev/null)"
    echo "loadavg:  $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null) (at start)"
    echo "git:      $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' (dirty tree)')"
    echo "engine:   $ENGINE_BIN"
    echo "threads:  RAYON_NUM_THREADS=${RAYON_NUM_THREADS:-unset} OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset} TORCH_THREADS=${TORCH_THREADS:-default}"
    echo "workload: batch sizes $BATCH_SIZES, context $CONTEXT, $WARMUP warmup + $STEPS timed steps, $PASSES passes"
}

# Sets PY: $PYTHON, or the venv's python (made and filled if needed).
setup_python() {
    if [[ -n ${PYTHON:-} ]]; then
        PY=$PYTHON
    else
        PY=$VENV/bin/python
        if ! "$PY" -c 'import torch, transformers' 2>/dev/null; then
            echo "== venv: installing torch==$TORCH_PIN transformers==$TRANSFORMERS_PIN into $VENV"
            [[ -x $PY ]] || python3 -m venv "$VENV" || return 1
            "$PY" -m pip install --progress-bar off -q --upgrade pip || return 1
            "$PY" -m pip install --progress-bar off \
                "torch==$TORCH_PIN" "transformers==$TRANSFORMERS_PIN" || return 1
        fi
    fi
    "$PY" -c 'import sys, torch, transformers
print(f"python:   {sys.executable} {sys.version.split()[0]}")
print(f"torch:    {torch.__version__} (threads {torch.get_num_threads()}), transformers {transformers.__version__}")' || return 1
    "$PY" -m pip freeze >"$OUT/pip-freeze.txt" 2>/dev/null || true
}

FAILED=()
# run_stage NAME JSON CMD...: runs CMD under the stage limit; logs its exit code.
run_stage() {
    local name=$1 json=$2 rc=0 t0=$SECONDS
    shift 2
    echo
    echo "== $name: $*"
    rm -f "$json"
    timeout "$STAGE_TIMEOUT_S" "$@" || rc=$?
    echo "== $name: rc $rc, $((SECONDS - t0)) s"
    if [[ $rc -ne 0 || ! -s $json ]]; then FAILED+=("$name"); fi
}

merge() {
    "$PY" - "$OUT" <<'EOF'
"""Merges raw/{ember,torch}_p<pass>_b<batch>.json into results.json and table.md.

Reads from both files the row of the "decode" list whose "batch" is the batch
size, and its "p50_ms" (ember-engine-bench writes {"decode": [{"batch",
"p50_ms", "p10_ms", "p90_ms", "tokens_per_s"}]}; peer_cpu.py writes the same
keys). If the engine's JSON changes, the fallbacks below are tried in order and
the key actually read is printed under the table.
"""
import json, os, re, statistics, sys

out = sys.argv[1]
LISTS = ("decode", "decode_rows", "rows", "runs", "results")
BATCH = ("batch", "batch_size", "b")
MS = ("p50_ms", "median_ms", "ms_per_step", "mean_ms", "ms")
runs, keys_read, meta = {}, {}, {}
for name in sorted(os.listdir(os.path.join(out, "raw"))):
    m = re.fullmatch(r"(ember|torch)_p(\d+)_b(\d+)\.json", name)
    if not m:
        continue
    side, p, b = m.group(1), int(m.group(2)), int(m.group(3))
    try:
        with open(os.path.join(out, "raw", name)) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"warning: {name}: {e}", file=sys.stderr)
        continue
    meta.setdefault(side, {k: v for k, v in doc.items() if not isinstance(v, (list, dict))})
    rows = next((doc[k] for k in LISTS if isinstance(doc.get(k), list)), [])
    for row in rows:
        if not isinstance(row, dict):
            continue
        rb = next((row[k] for k in BATCH if k in row), None)
        if rb is None or int(rb) != b:
            continue
        key = next((k for k in MS if isinstance(row.get(k), (int, float))), None)
        if key is None:
            print(f"warning: {name}: batch {b} row has no ms figure: {row}", file=sys.stderr)
            continue
        lst = next(k for k in LISTS if isinstance(doc.get(k), list))
        keys_read.setdefault(side, set()).add(f"{lst}[].{key}")
        runs.setdefault((b, p), {})[side] = float(row[key])

def fmt(x):
    return f"{x:.2f}" if x is not None else "-"

def ratio(e, t):
    return f"{e / t:.2f}" if e is not None and t else "-"

lines = ["| batch | pass | Ember ms/step | torch ms/step | ratio (Ember/torch) |",
         "|---:|---:|---:|---:|---:|"]
results = []
for b in sorted({b for b, _ in runs}):
    passes = sorted(p for bb, p in runs if bb == b)
    for p in passes:
        r = runs[(b, p)]
        e, t = r.get("ember"), r.get("torch")
        lines.append(f"| {b} | {p} | {fmt(e)} | {fmt(t)} | {ratio(e, t)} |")
        results.append({"batch": b, "pass": p, "ember_ms": e, "torch_ms": t,
                        "ratio": e / t if e is not None and t else None})
    es = [runs[(b, p)]["ember"] for p in passes if "ember" in runs[(b, p)]]
    ts = [runs[(b, p)]["torch"] for p in passes if "torch" in runs[(b, p)]]
    if len(passes) > 1:
        e = statistics.fmean(es) if es else None
        t = statistics.fmean(ts) if ts else None
        lines.append(f"| {b} | mean | {fmt(e)} | {fmt(t)} | {ratio(e, t)} |")
notes = ["", "ms/step: p50 (nearest rank) of the timed decode steps of each run.",
         "Ember: " + str(meta.get("ember", {}).get("device", "?")) + "; read "
         + ", ".join(sorted(keys_read.get("ember", []))) if "ember" in meta else "Ember: no results",
         ("torch: {torch} / transformers {transformers}, {dtype}, {threads} threads; read ".format(
             **{k: meta["torch"].get(k, "?") for k in ("torch", "transformers", "dtype", "threads")})
          + ", ".join(sorted(keys_read.get("torch", [])))) if "torch" in meta else "torch: no results"]
table = "\n".join(lines + notes) + "\n"
with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table)
with open(os.path.join(out, "results.json"), "w") as f:
    json.dump({"rows": results, "meta": meta,
               "keys_read": {k: sorted(v) for k, v in keys_read.items()}}, f, indent=2)
print(table, end="")
EOF
}

main() {
    machine
    if ! setup_python; then
        echo "error: no python with torch + transformers (venv $VENV)"
        return 1
    fi
    if [[ ! -x $ENGINE_BIN ]]; then
        echo "warning: $ENGINE_BIN not found or not executable: Ember columns will be empty"
        FAILED+=("ember (no binary at $ENGINE_BIN)")
    fi
    local pass b ej tj
    local -a batches torch_threads=()
    IFS=, read -r -a batches <<<"$BATCH_SIZES"
    if [[ -n $TORCH_THREADS ]]; then torch_threads=(--threads "$TORCH_THREADS"); fi
    for ((pass = 1; pass <= PASSES; pass++)); do
        for b in "${batches[@]}"; do
            ej=$OUT/raw/ember_p${pass}_b$b.json
            tj=$OUT/raw/torch_p${pass}_b$b.json
            if [[ -x $ENGINE_BIN ]]; then
                run_stage "ember pass $pass batch $b" "$ej" "$ENGINE_BIN" --device cpu \
                    --preset gpt2 --batch-sizes "$b" --context "$CONTEXT" --steps "$STEPS" \
                    --warmup "$WARMUP" --json "$ej" "${ENGINE_EXTRA[@]}"
            fi
            run_stage "torch pass $pass batch $b" "$tj" "$PY" bench/peer_cpu.py \
                --batch-sizes "$b" --context "$CONTEXT" --steps "$STEPS" --warmup "$WARMUP" \
                --dtype float32 "${torch_threads[@]}" --json "$tj" "${PEER_EXTRA[@]}"
        done
    done
    echo
    echo "loadavg:  $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null) (at end)"
    echo
    merge || echo "error: merge failed"
    if ((${#FAILED[@]})); then
        printf 'failed stage: %s\n' "${FAILED[@]}"
        return 1
    fi
}

main 2>&1 | tee "$LOG"
