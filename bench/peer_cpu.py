#!/usr/bin/env python3
"""Peer: PyTorch eager GPT-2 KV-cache decode on the CPU, step by step.

The CPU counterpart of `ember-engine-bench --device cpu`: the same workload,
timed the same way. GPT-2 124M (transformers GPT2Config defaults), float32 by
default, random weights (torch.manual_seed(--seed)), eval mode, under
torch.inference_mode, no torch.compile. For each batch size B:

  prefill   B random prompts of --context tokens in one forward
            (use_cache=True); untimed
  warmup    --warmup untimed decode steps
  timed     --steps decode steps, each timed alone with time.perf_counter

One decode step is what a server does per step: model(next_ids [B, 1],
past_key_values=past, use_cache=True), then greedy argmax over the last
position's logits and the B new token ids read out as Python ints (the engine's
step likewise ends with its one device->host read of the sampled tokens). Every
row decodes one token per step; none stops (there is no EOS handling).

Reported per batch size, over the timed steps (milliseconds per step):
  p50_ms        nearest-rank median, as ember-engine-bench computes it
                (index round(0.5 * (n - 1)) of the sorted samples)
  median_ms     statistics.median; mean_ms, p10_ms, p90_ms, min_ms
  tokens_per_s  B / p50
plus torch and transformers versions, torch.get_num_threads(), the dtype and
the attention implementation. Prints a markdown table; --json writes the
numbers with a "decode" list whose rows carry the same keys as the engine
bench's ("batch", "p50_ms", "p10_ms", "p90_ms", "tokens_per_s").

Usage (CPU):  python3 bench/peer_cpu.py --json peer_cpu.json
Smoke:        python3 bench/peer_cpu.py --tiny --batch-sizes 1,2 --steps 4 --warmup 1
Stub:         python3 bench/peer_cpu.py --stub ...  (no torch: times an empty step and
              writes the same JSON, marked "peer": "stub"; run_cpu.sh --dry-run uses it
              to test the script's plumbing on machines without torch)
"""

import argparse
import gc
import json
import platform
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", default="1,16", help="comma-separated decode batch sizes")
    p.add_argument("--context", type=int, default=128, help="prompt tokens per row")
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per batch size")
    p.add_argument("--warmup", type=int, default=4, help="untimed decode steps before timing")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: torch's own choice)")
    p.add_argument("--tiny", action="store_true", help="2-layer, 128-wide model (smoke run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attn-implementation", default=None,
                   help="transformers attn_implementation (default: the library's choice)")
    p.add_argument("--json", help="write results here")
    p.add_argument("--stub", action="store_true",
                   help="no torch: time an empty step (tests the plumbing only)")
    return p.parse_args()


def percentile(sorted_ms, p):
    """Nearest rank, as ember-engine-bench: index round(p/100 * (n-1)), halves away from 0."""
    if not sorted_ms:
        return float("nan")
    i = int(p / 100.0 * (len(sorted_ms) - 1) + 0.5)
    return sorted_ms[min(i, len(sorted_ms) - 1)]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def stub(args):
    """The JSON a real run writes, with the timings of an empty step: no torch."""
    batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    out = {"peer": "stub", "device": f"cpu ({cpu_model()})", "torch": "stub",
           "transformers": "stub", "dtype": args.dtype, "threads": 0,
           "context": args.context, "steps": args.steps, "warmup": args.warmup,
           "decode": []}
    for B in batch_sizes:
        ms = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            sum(range(B))
            ms.append((time.perf_counter() - t0) * 1e3)
        s = sorted(ms)
        p50 = percentile(s, 50)
        out["decode"].append({"batch": B, "p50_ms": p50, "p10_ms": percentile(s, 10),
                              "p90_ms": percentile(s, 90), "tokens_per_s": B / (p50 / 1e3)})
        print(f"| {B} | stub | {p50:.4f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {args.json}", flush=True)
    return 0


def main():
    args = parse_args()
    if args.stub:
        return stub(args)
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    if args.steps < 1 or args.warmup < 0 or args.context < 1 or not batch_sizes:
        sys.exit("need --steps >= 1, --warmup >= 0, --context >= 1 and a batch size")

    torch.manual_seed(args.seed)
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=128) if args.tiny else GPT2Config()
    if args.context + args.warmup + args.steps + 1 > cfg.n_positions:
        sys.exit(f"context {args.context} + {args.warmup + args.steps + 1} steps exceeds "
                 f"n_positions {cfg.n_positions}")
    kwargs = {}
    if args.attn_implementation:
        kwargs["attn_implementation"] = args.attn_implementation
    model = GPT2LMHeadModel(cfg, **kwargs).to(dtype=dtype).eval()
    attn_impl = getattr(model.config, "_attn_implementation", None)
    n_params = sum(p.numel() for p in model.parameters())
    threads = torch.get_num_threads()
    cpu = cpu_model()
    print(f"# peer_cpu: {cpu}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}, {args.dtype}, {n_params / 1e6:.1f}M params, "
          f"threads {threads}, attn={attn_impl}, context {args.context}, "
          f"{args.warmup} warmup + {args.steps} timed steps", flush=True)

    out = {
        "peer": "torch-eager-cpu-decode",
        "device": f"cpu ({cpu})",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "dtype": args.dtype,
        "threads": threads,
        "interop_threads": torch.get_num_interop_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "mkl": torch.backends.mkl.is_available(),
        "attn_implementation": attn_impl,
        "model": {"n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd,
                  "vocab_size": cfg.vocab_size, "params": n_params,
                  "weights": f"random, torch.manual_seed({args.seed})"},
        "context": args.context,
        "steps": args.steps,
        "warmup": args.warmup,
        "method": "prefill B x context (use_cache=True, untimed); warmup steps; each timed "
                  "step = model(next_ids[B,1], past_key_values, use_cache=True) + argmax of "
                  "last logits + tolist(); perf_counter per step",
        "decode": [],
    }
    print("| batch | prefill ms | p50 ms | median ms | mean ms | p10 ms | p90 ms | tok/s |",
          flush=True)
    print("|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    for B in batch_sizes:
        past = None
        try:
            g = torch.Generator(device="cpu").manual_seed(args.seed + B)
            prompt = torch.randint(0, cfg.vocab_size, (B, args.context), generator=g)
            ms = []
            with torch.inference_mode():
                t0 = time.perf_counter()
                o = model(prompt, use_cache=True)
                past = o.past_key_values
                next_ids = o.logits[:, -1, :].argmax(dim=-1, keepdim=True)
                next_ids.view(-1).tolist()
                del o
                prefill_ms = (time.perf_counter() - t0) * 1e3
                for i in range(args.warmup + args.steps):
                    t0 = time.perf_counter()
                    o = model(next_ids, past_key_values=past, use_cache=True)
                    past = o.past_key_values
                    next_ids = o.logits[:, -1, :].argmax(dim=-1, keepdim=True)
                    next_ids.view(-1).tolist()
                    dt = (time.perf_counter() - t0) * 1e3
                    del o
                    if i >= args.warmup:
                        ms.append(dt)
            if tuple(next_ids.shape) != (B, 1):
                raise RuntimeError(f"decode returned ids of shape {tuple(next_ids.shape)}")
            s = sorted(ms)
            p50 = percentile(s, 50)
            row = {"batch": B, "p50_ms": p50, "median_ms": statistics.median(ms),
                   "mean_ms": statistics.fmean(ms), "p10_ms": percentile(s, 10),
                   "p90_ms": percentile(s, 90), "min_ms": s[0],
                   "tokens_per_s": B / (p50 / 1e3), "prefill_ms": prefill_ms, "all_ms": ms}
            print(f"| {B} | {prefill_ms:.0f} | {p50:.2f} | {row['median_ms']:.2f} | "
                  f"{row['mean_ms']:.2f} | {row['p10_ms']:.2f} | {row['p90_ms']:.2f} | "
                  f"{row['tokens_per_s']:.0f} |", flush=True)
        except Exception as e:  # noqa: BLE001 - one batch size failing must not lose the rest
            row = {"batch": B, "error": repr(e)}
            print(f"| {B} | error: {e!r} |", flush=True)
        out["decode"].append(row)
        del past
        gc.collect()

    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {args.json}", flush=True)
    return 1 if any("error" in r for r in out["decode"]) else 0


if __name__ == "__main__":
    sys.exit(main())
