#!/usr/bin/env python3
"""Reference fixtures for Ember's GPT-2 engine tests (engine/tests/fixtures/tiny-gpt2).

Builds a small random GPT-2 with Hugging Face transformers (CPU, float32, fixed
seed), saves it the way transformers does (config.json + model.safetensors), and
records what transformers computes for a few prompts in reference.json:

  - logits at the last position of each prompt (prefill path),
  - a 16-token greedy continuation of each prompt (no EOS stopping),
  - the logits that chose the last continuation token (decode path),
  - the smallest top-1/top-2 logit margin seen, to show greedy is not a near-tie.

Every parameter is randomized (biases and LayerNorm weights too, not left at
0/1), so a swapped or skipped tensor in the loader changes the logits.

Run (needs torch + transformers; no network):
    python3 scripts/make_reference_fixtures.py --out engine/tests/fixtures/tiny-gpt2

`--size gpt2` makes the same kind of fixture at GPT-2 124M's full shape (12
layers, 768 wide, 50257 tokens, 1024 positions; ~500 MB, not committed): the
f16 check on a GPU runs the engine at the size it serves (bench/run_gpu.sh).

`--controls` leaves the model as it is and writes controls.json beside it:
what the committed model does under the per-request controls, computed here
with vLLM's semantics on transformers' logits (greedy, float32):

  - greedy continuations under repetition / frequency / presence penalties
    (vLLM's order: logit_bias, then repetition over prompt and output tokens,
    then frequency and presence over output tokens), under a logit_bias, and
    under min_tokens (a stop token id banned until min_tokens tokens);
  - prompt logprobs: each prompt token's log-probability given the tokens
    before it (log_softmax of the raw logits) and the top-5 alternatives.

    python3 scripts/make_reference_fixtures.py --controls --out engine/tests/fixtures/tiny-gpt2

`--filters` writes filters.json beside it: for each reference case's
last-position logits (reference.json's `last_logits`, so the tests read the
same numbers), the tokens transformers' sampling warpers keep, in the order
`generate` applies them (TemperatureLogitsWarper, TopKLogitsWarper,
TopPLogitsWarper, MinPLogitsWarper; so top-k and top-p keep their
intersection):

    python3 scripts/make_reference_fixtures.py --filters --out engine/tests/fixtures/tiny-gpt2
"""

import argparse
import json
import os
import random

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel


def greedy(model, prompt, new_tokens):
    """Greedy continuation by explicit full forward passes (no generate() quirks)."""
    ids = list(prompt)
    min_margin = float("inf")
    last_logits = None
    for _ in range(new_tokens):
        logits = model(torch.tensor([ids])).logits[0, -1]
        top2 = torch.topk(logits, 2).values
        min_margin = min(min_margin, float(top2[0] - top2[1]))
        last_logits = logits
        ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):], last_logits, min_margin


def controlled(model, prompt, new_tokens, opts, eos):
    """Greedy continuation with vLLM's logit controls (see the module docs).
    Stops at a stop token id (not emitted) or EOS (not emitted)."""
    ids, out = list(prompt), []
    stops = set(opts.get("stop_token_ids", []))
    for _ in range(new_tokens):
        logits = model(torch.tensor([ids])).logits[0, -1].clone()
        for tok, bias in opts.get("logit_bias", {}).items():
            logits[int(tok)] += bias
        rep = opts.get("repetition_penalty", 1.0)
        if rep != 1.0:
            for t in set(prompt) | set(out):
                logits[t] = logits[t] / rep if logits[t] > 0 else logits[t] * rep
        counts = {}
        for t in out:
            counts[t] = counts.get(t, 0) + 1
        for t, c in counts.items():
            logits[t] -= opts.get("frequency_penalty", 0.0) * c + opts.get("presence_penalty", 0.0)
        if len(out) < opts.get("min_tokens", 0):
            for t in stops | {eos}:
                logits[t] = float("-inf")
        tok = int(torch.argmax(logits))
        if tok in stops or tok == eos:
            break
        out.append(tok)
        ids.append(tok)
    return out


def prompt_logprobs(model, prompt, top):
    """Per prompt position i >= 1: logprob of prompt[i] given prompt[:i], top alternatives."""
    lp = torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), dim=-1)
    rows = []
    for i in range(1, len(prompt)):
        values, ids = torch.topk(lp[i - 1], top)
        rows.append({"logprob": float(lp[i - 1, prompt[i]]),
                     "top": [[int(t), float(v)] for t, v in zip(ids, values)]})
    return rows


def write_controls(out_dir, new_tokens):
    """controls.json for the committed model in `out_dir` (see the docs)."""
    model = GPT2LMHeadModel.from_pretrained(out_dir).eval()
    eos = model.config.eos_token_id
    with open(os.path.join(out_dir, "reference.json")) as f:
        cases = json.load(f)["cases"]
    controls = []
    with torch.no_grad():
        for case in cases[2:]:
            prompt, plain = case["prompt"], case["greedy"]
            settings = {
                "repetition": {"repetition_penalty": 1.3},
                "frequency_presence": {"frequency_penalty": 0.7, "presence_penalty": 0.5},
                "all_penalties": {"repetition_penalty": 1.2, "frequency_penalty": 0.4,
                                  "presence_penalty": 0.6},
                "logit_bias": {"logit_bias": {str(plain[0]): -100.0, str(plain[3]): 4.0,
                                              "17": 2.5}},
                "min_tokens": {"stop_token_ids": [plain[1]], "min_tokens": 6},
                "stop_without_min_tokens": {"stop_token_ids": [plain[1]]},
            }
            for name, opts in settings.items():
                controls.append({"name": name, "prompt": prompt, "options": opts,
                                 "tokens": controlled(model, prompt, new_tokens, opts, eos)})
        logprob_cases = [{"prompt": c["prompt"], "top": 5,
                          "logprobs": prompt_logprobs(model, c["prompt"], 5)} for c in cases[1:]]
    doc = {"generator": "scripts/make_reference_fixtures.py --controls",
           "torch": torch.__version__, "transformers": transformers.__version__,
           "new_tokens": new_tokens, "eos_token_id": eos,
           "cases": controls, "prompt_logprobs": logprob_cases}
    with open(os.path.join(out_dir, "controls.json"), "w") as f:
        json.dump(doc, f)
    for c in controls:
        print(c["name"], len(c["prompt"]), c["tokens"])


FILTER_SETTINGS = [
    {"temperature": 1.0, "min_p": 0.05},
    {"temperature": 0.7, "min_p": 0.1},
    {"temperature": 1.5, "min_p": 0.02},
    {"temperature": 1.0, "top_k": 50, "min_p": 0.05},
    {"temperature": 1.0, "top_p": 0.8, "min_p": 0.02},
    {"temperature": 1.0, "top_k": 3, "top_p": 0.9},
    {"temperature": 0.8, "top_k": 20, "top_p": 0.5},
    {"temperature": 1.2, "top_p": 0.9},
    {"temperature": 1.0, "top_k": 10},
]


def kept_by_warpers(logits, opts):
    """Token ids transformers' warpers keep for `opts`."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
    warpers = [TemperatureLogitsWarper(opts["temperature"])]
    if opts.get("top_k"):
        warpers.append(TopKLogitsWarper(opts["top_k"]))
    if opts.get("top_p", 1.0) < 1.0:
        warpers.append(TopPLogitsWarper(opts["top_p"]))
    if opts.get("min_p"):
        warpers.append(MinPLogitsWarper(opts["min_p"]))
    scores = logits.clone().unsqueeze(0)
    ids = torch.zeros((1, 1), dtype=torch.long)
    for w in warpers:
        scores = w(ids, scores)
    return torch.nonzero(torch.isfinite(scores[0])).flatten().tolist()


def write_filters(out_dir):
    """filters.json for the reference cases in `out_dir` (see the docs)."""
    with open(os.path.join(out_dir, "reference.json")) as f:
        cases = json.load(f)["cases"]
    filters = []
    for i, case in enumerate(cases):
        logits = torch.tensor(case["last_logits"], dtype=torch.float32)
        for opts in FILTER_SETTINGS:
            kept = kept_by_warpers(logits, opts)
            filters.append({"case": i, "options": opts, "kept": kept})
    doc = {"generator": "scripts/make_reference_fixtures.py --filters",
           "torch": torch.__version__, "transformers": transformers.__version__,
           "filters": filters}
    with open(os.path.join(out_dir, "filters.json"), "w") as f:
        json.dump(doc, f)
    for c in filters:
        print(c["case"], c["options"], len(c["kept"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="engine/tests/fixtures/tiny-gpt2")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--size", choices=["tiny", "gpt2"], default="tiny",
                    help="tiny (2 layers, 64 wide; the committed fixture) or gpt2 (124M shape)")
    ap.add_argument("--controls", action="store_true",
                    help="write controls.json for the model already in --out (see the docs)")
    ap.add_argument("--filters", action="store_true",
                    help="write filters.json for the reference cases in --out (see the docs)")
    args = ap.parse_args()
    if args.filters:
        write_filters(args.out)
        return
    if args.controls:
        write_controls(args.out, args.new_tokens)
        return

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    shape = (dict(n_layer=2, n_head=4, n_embd=64, n_positions=128, vocab_size=1000)
             if args.size == "tiny" else
             dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257))
    config = GPT2Config(
        **shape,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=shape["vocab_size"] - 1,
        eos_token_id=shape["vocab_size"] - 1,
    )
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.05)
            elif ".ln_" in name or name.startswith("transformer.ln_f"):
                p.normal_(1.0, 0.1)
            else:
                # Wider than GPT-2's 0.02 so logits are spread and greedy is not a
                # near-tie (at full width, 0.05 keeps the residual stream f16-sized).
                p.normal_(0.0, 0.1 if args.size == "tiny" else 0.05)

    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out)  # config.json + model.safetensors (tied lm_head omitted)

    lengths = [1, 5, 12, 37]
    prompts = [[rng.randrange(config.vocab_size - 1) for _ in range(n)] for n in lengths]
    cases = []
    with torch.no_grad():
        for prompt in prompts:
            last = model(torch.tensor([prompt])).logits[0, -1]
            tokens, final_logits, margin = greedy(model, prompt, args.new_tokens)
            cases.append(
                {
                    "prompt": prompt,
                    "last_logits": [float(x) for x in last],
                    "greedy": tokens,
                    "final_logits": [float(x) for x in final_logits],
                    "min_greedy_margin": margin,
                }
            )

    reference = {
        "generator": "scripts/make_reference_fixtures.py",
        "seed": args.seed,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "new_tokens": args.new_tokens,
        "cases": cases,
    }
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(reference, f)
    for c in cases:
        print(len(c["prompt"]), c["greedy"], "min margin %.4f" % c["min_greedy_margin"])
    for name in sorted(os.listdir(args.out)):
        print("wrote", name, os.path.getsize(os.path.join(args.out, name)), "bytes")


if __name__ == "__main__":
    main()
