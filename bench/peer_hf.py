#!/usr/bin/env python3
"""Peer: transformers' GPT-2 `generate`, eager (no torch.compile, no CUDA graphs).

GPT-2 124M (GPT2Config defaults) in fp16 with random weights
(torch.manual_seed), greedy, min_new_tokens = max_new_tokens so no request
stops early at EOS. For each batch size B: one untimed warmup generate, then
--repeats timed ones; the median wall time (synchronized) gives
  ms_per_step   wall / new_tokens   (one step = one token for every row; the
                                     prompt's prefill is included, as a client sees)
  tokens_per_s  B * new_tokens / wall

Usage (GPU):  python3 bench/peer_hf.py --json out.json
CPU smoke:    python3 bench/peer_hf.py --device cpu --tiny --batch-sizes 1,2 --new-tokens 8
"""

import argparse
import json
import statistics
import sys
import time

import torch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--tiny", action="store_true", help="2-layer, 128-wide model (CPU smoke)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-sizes", default="1,64")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=8,
                   help="prompt tokens per row (the seeds' prompts are a few tokens)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--attn-implementation", default=None,
                   help="transformers attn_implementation (default: the library's choice)")
    p.add_argument("--json", help="write results here")
    return p.parse_args()


def main():
    args = parse_args()
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA requested but torch.cuda.is_available() is False")
    dtype = getattr(torch, args.dtype)

    torch.manual_seed(args.seed)
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=128) if args.tiny else GPT2Config()
    kwargs = {}
    if args.attn_implementation:
        kwargs["attn_implementation"] = args.attn_implementation
    model = GPT2LMHeadModel(cfg, **kwargs).to(device=device, dtype=dtype).eval()
    attn_impl = getattr(model.config, "_attn_implementation", None)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    n_params = sum(p.numel() for p in model.parameters())
    print(f"# peer_hf: {dev_name}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}, {args.dtype}, {n_params / 1e6:.1f}M params, "
          f"attn={attn_impl}", flush=True)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    out = {
        "peer": "hf-generate-eager",
        "device": dev_name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": args.dtype,
        "attn_implementation": attn_impl,
        "model": {"n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd,
                  "vocab": cfg.vocab_size, "params": n_params,
                  "weights": f"random, torch.manual_seed({args.seed})"},
        "method": "model.generate greedy, min_new_tokens=max_new_tokens, median wall of repeats",
        "runs": [],
    }
    print("| batch | new tokens | median s | ms/step | tok/s |", flush=True)
    print("|---:|---:|---:|---:|---:|", flush=True)
    N = args.new_tokens
    for B in (int(x) for x in args.batch_sizes.split(",") if x.strip()):
        try:
            g = torch.Generator(device="cpu").manual_seed(args.seed + B)
            ids = torch.randint(0, cfg.vocab_size, (B, args.prompt_len), generator=g).to(device)
            mask = torch.ones_like(ids)
            gen = dict(attention_mask=mask, max_new_tokens=N, min_new_tokens=N, do_sample=False,
                       num_beams=1, use_cache=True, pad_token_id=cfg.eos_token_id)
            times = []
            with torch.inference_mode():
                for i in range(args.repeats + 1):  # the first one is the warmup
                    sync()
                    t0 = time.perf_counter()
                    res = model.generate(ids, **gen)
                    sync()
                    dt = time.perf_counter() - t0
                    if res.shape != (B, args.prompt_len + N):
                        raise RuntimeError(f"generate returned shape {tuple(res.shape)}, "
                                           f"expected {(B, args.prompt_len + N)}")
                    if i > 0:
                        times.append(dt)
            med = statistics.median(times)
            row = {"batch": B, "prompt_len": args.prompt_len, "new_tokens": N, "median_s": med,
                   "ms_per_step": med / N * 1e3, "tokens_per_s": B * N / med, "all_s": times}
            print(f"| {B} | {N} | {med:.3f} | {row['ms_per_step']:.2f} | "
                  f"{row['tokens_per_s']:.0f} |", flush=True)
        except Exception as e:  # noqa: BLE001 - one batch size failing must not lose the rest
            row = {"batch": B, "new_tokens": N, "error": repr(e)}
            print(f"| {B} | {N} | error: {e!r} |", flush=True)
        out["runs"].append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 1 if any("error" in r for r in out["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
