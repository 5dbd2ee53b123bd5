#!/usr/bin/env bash
# Engine checks on the GPU machine (issue 10), in one invocation, from the repo
# root, with the stripped release binaries (built with --features
# ember-server/cuda) in .device/:
#
#   OUT=/some/dir bash bench/gpu_engine_check.sh
#
# 1. f16 reference checks against transformers: the committed tiny fixture, and
#    a GPT-2 124M-shaped random fixture made here (scripts/make_reference_fixtures.py
#    --size gpt2): max |logit| difference and greedy continuations token by token.
# 2. The server's startup warmup (every bucketed shape, fusion + autotune on)
#    with an empty kernel cache, then again with the cache it left (a restart),
#    each followed by decode steps at batch 1, 8, 64, 256 (context 256) and a
#    16 x 256 prefill.
# 3. Kernels per decode step at batch 64: CubeCL's profiling log of runs with 2
#    and 10 timed steps (the difference / 8 is one step's kernel launches).
#
# $OUT gets every JSON and log; a failed stage is logged and the rest go on.
# STAGES (default "ref cold warm kernels") picks stages, so the run can be split
# across calls of at most 10 minutes; the kernel cache lives in $XDG_CACHE_HOME
# (default /tmp/ember-xdg), which the warm stage reuses.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
BIN=${EMBER_BIN_DIR:-.device}
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export NO_COLOR=1
if [[ -z ${CUDA_PATH:-} ]]; then
    for d in /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-13; do
        [[ -f $d/include/cuda_runtime.h ]] && export CUDA_PATH=$d && break
    done
fi
echo "CUDA_PATH=${CUDA_PATH:-<not found>} date=$(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

run() { # run NAME TIMEOUT CMD...
    local name=$1 t=$2 start rc
    shift 2
    start=$(date +%s.%N)
    echo ">>> $name: $*"
    timeout --kill-after=5 "$t" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    echo "<<< $name: exit $rc after $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $start }") s"
    grep -vE 'WARN|^\s*$' "$OUT/$name.log" | tail -n 12
}

STAGES=" ${STAGES:-ref cold warm kernels} "
want() { [[ $STAGES == *" $1 "* ]]; }

want ref && run ref_tiny 120 "$BIN/ember-engine-bench" --device cuda \
    --reference server/tests/fixtures/tiny-gpt2 --json "$OUT/ref_tiny.json"
want ref && run fixture_gpt2 180 python3 scripts/make_reference_fixtures.py --size gpt2 --out "$WORK/gpt2-ref"
want ref && run ref_gpt2 150 "$BIN/ember-engine-bench" --device cuda \
    --reference "$WORK/gpt2-ref" --json "$OUT/ref_gpt2.json"

ENGINE=(--device cuda --server-warmup --batch-sizes "${BATCHES:-1,8,64,256}" --context 256
    --steps 32 --warmup 4 --prefill "16,256" --prefill-chunk 32)
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/ember-xdg}
want cold && rm -rf "$XDG_CACHE_HOME/ember/kernels" && run engine_cold "${T_COLD:-300}" "$BIN/ember-engine-bench" "${ENGINE[@]}" --json "$OUT/engine_cold.json"
want warm && run engine_warm "${T_WARM:-200}" "$BIN/ember-engine-bench" "${ENGINE[@]}" --json "$OUT/engine_warm.json"
du -sh "$XDG_CACHE_HOME/ember/kernels" 2>/dev/null

want kernels && for n in 2 10; do
    CUBECL_DEBUG_OPTION=profile CUBECL_DEBUG_LOG="$OUT/profile_$n.txt" \
        run "kernels_$n" 120 "$BIN/ember-engine-bench" --device cuda --batch-sizes 64 \
        --context 256 --steps "$n" --warmup 2 --json "$WORK/k.json"
done
ls -la "$OUT"
