#!/usr/bin/env bash
# lm-evaluation-harness against Ember's OpenAI door: a local multiple-choice
# task (bench/lmeval/ember_mc.jsonl, 20 items, no hub access) scored by
# loglikelihood through `lm_eval --model local-completions`. From the repo
# root, with release builds of ember-server:
#
#   bash bench/run_lmeval.sh                  # tiny preset (random weights)
#   MODEL_DIR=/path/to/gpt2 bash bench/run_lmeval.sh
#   bash bench/run_lmeval.sh --dry-run        # or DRY_RUN=1: no lm_eval (below)
#
# Steps: start `ember-server --preset tiny` (or `--model-dir $MODEL_DIR`)
# with `--http-listen 127.0.0.1:0` on the CPU; bench/lmeval/probe.py checks
# the door against what lm_eval sends and reads (/v1/models, /tokenizer_info,
# /tokenize, /detokenize, and one loglikelihood request: `echo: true,
# logprobs: 1, max_tokens: 1`); a local Hugging Face tokenizer directory is
# written to $OUT/tokenizer (GPT-2's vocab.json + merges.txt from MODEL_DIR,
# else common/assets/gpt2/, and a tokenizer_config.json); then
#
#   lm_eval --model local-completions \
#     --model_args base_url=http://ADDR/v1/completions,model=NAME,\
#                  tokenizer_backend=huggingface,tokenizer=$OUT/tokenizer,\
#                  tokenized_requests=False,max_length=MAX_MODEL_LEN \
#     --batch_size B --include_path bench/lmeval --tasks ember_mc --output_path $OUT/results
#
# from the repo root (the task's data_files path is relative to it), with
# HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1, and prints the scores
# (acc, acc_norm). TOKENIZER_BACKEND=remote uses Ember's own /tokenize and
# /detokenize instead of the local directory (lm_eval's remote tokenizer).
#
# Dry run (--dry-run or DRY_RUN=1): the server and the probe (a refused
# echo request is a note, not a failure, until the server serves prompt
# logprobs), the tokenizer directory, and the lm_eval command printed, not
# run: no venv is needed. tests/tests/bench_scripts.rs runs it against the
# built binary.
#
# Environment knobs (defaults in brackets):
#   EMBER_BIN_DIR     dir holding ember-server [<repo>/target/release]
#   OUT               results dir [<repo>/bench-out-lmeval]
#   MODEL_DIR         a local GPT-2 directory [unset: --preset tiny]
#   LMEVAL_VENV       venv with lm_eval[api] + transformers, created if missing
#                     [$HOME/.cache/ember/lmeval-venv]
#   TOKENIZER_BACKEND huggingface | remote [huggingface]
#   BATCH_SIZE        lm_eval's batch_size: >1 sends lists of prompts [1]
#   LIMIT             lm_eval --limit (items) [unset: all 20]
#   API_KEY           start the server with --api-key API_KEY; the probe and
#                     lm_eval (OPENAI_API_KEY, auth_token) send it [unset]
#   SERVER_EXTRA_ARGS more ember-server flags (word-split)
#
# $OUT gets: server.log, probe.json, tokenizer/, results/ (lm_eval's JSON),
# lmeval.log, scores.md (the scores, also printed at the end).
set -uo pipefail

for arg in "$@"; do
    case $arg in
    --dry-run) DRY_RUN=1 ;;
    *) echo "usage: bash bench/run_lmeval.sh [--dry-run]" >&2; exit 2 ;;
    esac
done
DRY_RUN=${DRY_RUN:-0}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EMBER_BIN_DIR=${EMBER_BIN_DIR:-$REPO/target/release}
OUT=${OUT:-$REPO/bench-out-lmeval}
MODEL_DIR=${MODEL_DIR:-}
LMEVAL_VENV=${LMEVAL_VENV:-$HOME/.cache/ember/lmeval-venv}
TOKENIZER_BACKEND=${TOKENIZER_BACKEND:-huggingface}
BATCH_SIZE=${BATCH_SIZE:-1}
LIMIT=${LIMIT:-}
API_KEY=${API_KEY:-}
read -r -a SERVER_EXTRA <<<"${SERVER_EXTRA_ARGS:-}"
# What a new venv gets (plain PyPI wheels; an existing venv is reused as is).
LM_EVAL_PIN=0.4.13
TRANSFORMERS_PIN=5.24.0

SERVER_BIN=$EMBER_BIN_DIR/ember-server
mkdir -p "$OUT"
cd "$REPO" || exit 1
SERVER_PID=

# shellcheck disable=SC2329 # invoked by the trap
stop_server() {
    if [[ -n $SERVER_PID ]]; then
        kill "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
        SERVER_PID=
    fi
}

# Starts the server; sets HTTP_ADDR from its second stdout line.
start_server() {
    local -a model=(--preset tiny) key=()
    if [[ -n $MODEL_DIR ]]; then model=(--model-dir "$MODEL_DIR"); fi
    if [[ -n $API_KEY ]]; then key=(--api-key "$API_KEY"); fi
    rm -f "$OUT/server.out"
    "$SERVER_BIN" --device cpu "${model[@]}" --listen 127.0.0.1:0 \
        --http-listen 127.0.0.1:0 "${key[@]}" "${SERVER_EXTRA[@]}" \
        >"$OUT/server.out" 2>"$OUT/server.log" &
    SERVER_PID=$!
    local i
    for ((i = 0; i < 600; i++)); do
        HTTP_ADDR=$(sed -n 's/^http listening on //p' "$OUT/server.out" 2>/dev/null)
        if [[ -n $HTTP_ADDR ]]; then return 0; fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then break; fi
        sleep 0.1
    done
    echo "error: ember-server did not announce its HTTP address; its log:"
    tail -20 "$OUT/server.log"
    return 1
}

# GPT-2's tokenizer as a local Hugging Face directory (no hub).
write_tokenizer() {
    local src=common/assets/gpt2 dir=$OUT/tokenizer
    if [[ -n $MODEL_DIR && -f $MODEL_DIR/vocab.json && -f $MODEL_DIR/merges.txt ]]; then src=$MODEL_DIR; fi
    mkdir -p "$dir"
    cp "$src/vocab.json" "$src/merges.txt" "$dir/"
    cat >"$dir/tokenizer_config.json" <<JSON
{"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
 "unk_token": "<|endoftext|>", "add_prefix_space": false, "model_max_length": ${MAX_LEN}}
JSON
    echo "tokenizer: $dir (from $src)"
}

# Sets PY: the venv's python, made and filled if needed.
setup_venv() {
    PY=$LMEVAL_VENV/bin/python
    if ! "$PY" -c 'import lm_eval, transformers, aiohttp, tenacity' 2>/dev/null; then
        echo "== venv: installing lm_eval[api]==$LM_EVAL_PIN transformers==$TRANSFORMERS_PIN into $LMEVAL_VENV"
        [[ -x $PY ]] || python3 -m venv "$LMEVAL_VENV" || return 1
        "$PY" -m pip install --progress-bar off -q \
            "lm_eval[api]==$LM_EVAL_PIN" "transformers==$TRANSFORMERS_PIN" || return 1
    fi
    "$PY" -m pip freeze >"$OUT/pip-freeze.txt" 2>/dev/null || true
}

main() {
    # main runs in the pipeline's subshell: the trap must be set there.
    trap stop_server EXIT
    echo "# lm-evaluation-harness against Ember"
    echo "date:   $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host:   $(uname -n), $(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs"
    echo "git:    $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' (dirty tree)')"
    echo "model:  ${MODEL_DIR:-preset tiny (random weights: scores are chance)}"
    if [[ ! -x $SERVER_BIN ]]; then
        echo "error: $SERVER_BIN not found (cargo build --release -p ember-server)"
        return 1
    fi
    start_server || return 1
    echo "server: http://$HTTP_ADDR (pid $SERVER_PID)"
    local -a require=(--require-echo)
    if [[ $DRY_RUN == 1 ]]; then require=(); fi
    if [[ -n $API_KEY ]]; then require+=(--api-key "$API_KEY"); fi
    python3 bench/lmeval/probe.py --base "http://$HTTP_ADDR" "${require[@]}" \
        --json "$OUT/probe.json" || { echo "error: the probe failed"; return 1; }
    local model
    model=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"])' "$OUT/probe.json") || return 1
    MAX_LEN=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["max_model_len"])' "$OUT/probe.json") || return 1
    write_tokenizer || return 1
    local args="base_url=http://$HTTP_ADDR/v1/completions,model=$model,tokenized_requests=False,max_length=$MAX_LEN"
    case $TOKENIZER_BACKEND in
    huggingface) args+=",tokenizer_backend=huggingface,tokenizer=$OUT/tokenizer" ;;
    remote) args+=",tokenizer_backend=remote${API_KEY:+,auth_token=$API_KEY}" ;;
    *) echo "error: TOKENIZER_BACKEND must be huggingface or remote, got $TOKENIZER_BACKEND"; return 1 ;;
    esac
    local -a cmd=(lm_eval --model local-completions --model_args "$args" --batch_size "$BATCH_SIZE"
        --include_path bench/lmeval --tasks ember_mc --output_path "$OUT/results")
    if [[ -n $LIMIT ]]; then cmd+=(--limit "$LIMIT"); fi
    echo "command: HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 ${cmd[*]}"
    if [[ $DRY_RUN == 1 ]]; then
        echo "DRY RUN: lm_eval not run"
        return 0
    fi
    setup_venv || { echo "error: no venv with lm_eval ($LMEVAL_VENV)"; return 1; }
    rm -rf "$OUT/results"
    OPENAI_API_KEY=$API_KEY HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PATH="$LMEVAL_VENV/bin:$PATH" \
        "${cmd[@]}" 2>&1 | tee "$OUT/lmeval.log"
    local rc=${PIPESTATUS[0]}
    if [[ $rc -ne 0 ]]; then
        echo "error: lm_eval exited $rc"
        return 1
    fi
    "$PY" - "$OUT" <<'PY' | tee "$OUT/scores.md"
import glob, json, sys
files = sorted(glob.glob(f"{sys.argv[1]}/results/**/results_*.json", recursive=True))
if not files:
    sys.exit("no lm_eval results file under results/")
r = json.load(open(files[-1]))["results"]["ember_mc"]
print("| task | acc | acc_stderr | acc_norm | acc_norm_stderr |")
print("|---|---|---|---|---|")
print(f"| ember_mc | {r['acc,none']:.4f} | {r['acc_stderr,none']:.4f} | {r['acc_norm,none']:.4f} | {r['acc_norm_stderr,none']:.4f} |")
PY
}

main 2>&1 | tee "$OUT/run.log"
exit "${PIPESTATUS[0]}"
