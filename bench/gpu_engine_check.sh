#!/usr/bin/env bash
# Engine checks and timings on the GPU machine (issues 10 and 11), in one
# invocation, from the repo root, with the stripped release binaries (built
# with --features ember-server/cuda,ember-engine-bench/cuda) in .device/:
#
#   OUT=/some/dir bash bench/gpu_engine_check.sh
#
# Stages (STAGES picks a subset, default "kernels ref engine peer profile"):
# - kernels: the CubeCL paged decode attention and KV-write kernels against
#   the tensor-op reference on random data (ember-engine-bench --check-kernels).
# - ref: f16 reference checks against transformers on the committed tiny
#   fixture (and, with REF_GPT2=1, a GPT-2 124M-shaped random fixture made
#   here), each generation run eager and then with every decode step replayed
#   from captured CUDA graphs, which must give the same tokens.
# - engine: decode steps at batch 1, 8, 64, 256 (context 256), eager and then
#   replayed as CUDA graphs on the same sequences (the whole engine step, host
#   included, and the GPU time alone: replays back to back, as the peer's
#   `loop mean ms`), and a 16 x 256 prefill.
#   SERVER_WARMUP=1 adds the server's startup warmup (every bucketed shape).
# - peer: bench/peer_cudagraph.py (hand-written PyTorch step in one CUDA graph)
#   at the same batches, in the same invocation, for the ratios.
# - profile: kernels per eager decode step at batch 64 from CubeCL's profiling
#   log of runs with 2 and 10 timed steps (the difference / 8 is one step).
#
# $OUT gets every JSON and log; a failed stage is logged and the rest go on.
# The kernel cache lives in $XDG_CACHE_HOME (default /tmp/ember-xdg).
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

STAGES=" ${STAGES:-kernels ref engine peer profile} "
want() { [[ $STAGES == *" $1 "* ]]; }
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/ember-xdg}
BATCHES=${BATCHES:-1,8,64,256}

want kernels && run check_kernels 180 "$BIN/ember-engine-bench" --device cuda --check-kernels \
    --json "$OUT/check_kernels.json"

want ref && run ref_tiny 180 "$BIN/ember-engine-bench" --device cuda --graphs \
    --reference engine/tests/fixtures/tiny-gpt2 --json "$OUT/ref_tiny.json"
if want ref && [[ ${REF_GPT2:-0} == 1 ]]; then
    run fixture_gpt2 180 python3 scripts/make_reference_fixtures.py --size gpt2 --out "$WORK/gpt2-ref"
    run ref_gpt2 240 "$BIN/ember-engine-bench" --device cuda --graphs \
        --reference "$WORK/gpt2-ref" --json "$OUT/ref_gpt2.json"
fi

ENGINE=(--device cuda --graphs --batch-sizes "$BATCHES" --context 256
    --steps 32 --warmup 4 --prefill "16,256" --prefill-chunk 32)
[[ ${SERVER_WARMUP:-0} == 1 ]] && ENGINE+=(--server-warmup)
want engine && run engine "${T_ENGINE:-300}" "$BIN/ember-engine-bench" "${ENGINE[@]}" --json "$OUT/engine.json"
du -sh "$XDG_CACHE_HOME/ember/kernels" 2>/dev/null

want peer && run peer_cudagraph 240 python3 bench/peer_cudagraph.py --batch-sizes "$BATCHES" \
    --contexts 256 --prefill 16x256 --json "$OUT/peer_cudagraph.json"

want profile && for n in 2 10; do
    CUBECL_DEBUG_OPTION=profile CUBECL_DEBUG_LOG="$OUT/profile_$n.txt" \
        run "profile_$n" 120 "$BIN/ember-engine-bench" --device cuda --batch-sizes 64 \
        --context 256 --steps "$n" --warmup 2 --json "$WORK/k.json"
done
ls -la "$OUT"
