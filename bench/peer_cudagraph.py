#!/usr/bin/env python3
"""Peer: the strongest hand-written PyTorch GPT-2 decode we can write.

GPT-2 124M (GPT2Config defaults: 12 layers, 12 heads, 768 wide, vocab 50257;
--model medium|large|xl|tiny, or an HF directory with --model-dir) in fp16 with
random weights (torch.manual_seed), a static KV cache, and ONE decode
step -- B rows, each at position p, attending over positions 0..p -- captured
in one torch.cuda.CUDAGraph and replayed. The graph feeds its greedy token back
into its input, so replays are a real autoregressive loop at a fixed context.

Measures, per (batch, context):
  median_ms     median of per-replay times (a CUDA event pair around each replay)
  p10_ms/p90_ms spread of the same
  mean_ms_loop  total / n of back-to-back replays (events around the whole loop)
  tokens_per_s  batch / median
and a prefill timing for N prompts x L tokens (one eager batched forward with
causal attention writing the KV cache, logits of the last position only).

Before timing it checks that its forward matches transformers' GPT2LMHeadModel
loaded with the same weights (skipped if transformers is missing). The weights,
the prefill and the check's pieces are gpt2_torch.py's, shared with
peer_compile.py (the same model under torch.compile).

Usage (GPU):  python3 bench/peer_cudagraph.py --json out.json
CPU smoke:    python3 bench/peer_cudagraph.py --device cpu --tiny --batch-sizes 1,4 \
                  --iters 5 --prefill 2x8
"""

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

import gpt2_torch as g
from gpt2_torch import Timer, csv_ints, pct, prefill


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--tiny", action="store_true", help="2-layer, 128-wide model (CPU smoke)")
    p.add_argument("--model", default="gpt2", help="gpt2 (124M), medium, large, xl or tiny")
    p.add_argument("--model-dir", help="an HF GPT-2 directory (config.json, model.safetensors)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-sizes", default="1,8,64,256")
    p.add_argument("--contexts", default="256",
                   help="comma-separated positions p each row decodes at (attends to p+1 tokens)")
    p.add_argument("--warmup", type=int, default=20, help="untimed replays per shape")
    p.add_argument("--iters", type=int, default=200, help="timed replays per shape")
    p.add_argument("--prefill", default="1x256,16x256,64x8,256x8",
                   help="comma-separated NxL prefill shapes ('' to skip)")
    p.add_argument("--prefill-iters", type=int, default=10)
    p.add_argument("--no-graph", action="store_true", help="time the eager step instead")
    p.add_argument("--no-check", action="store_true", help="skip the transformers cross-check")
    p.add_argument("--json", help="write results here")
    return p.parse_args()


class Decoder:
    """Static buffers and the decode step for one (batch, context) shape."""

    def __init__(self, w, batch, context, device, dtype):
        cfg = w.cfg
        self.w = w
        self.B = batch
        self.T = context + 1  # cache length: positions 0..context
        self.H = cfg["n_head"]
        self.D = cfg["n_embd"] // cfg["n_head"]
        L = cfg["n_layer"]
        shape = (L, batch, self.H, self.T, self.D)
        # Filled with small random values: what the attention reads, like a real
        # prompt's cache would be (zeros would be as fast, but less honest).
        self.k = (torch.randn(shape, device=device) * 0.5).to(dtype)
        self.v = (torch.randn(shape, device=device) * 0.5).to(dtype)
        self.tok = torch.randint(0, cfg["vocab"], (batch,), device=device)
        self.pos = torch.full((batch,), context, device=device, dtype=torch.long)
        # Where each row's new K/V goes: a view of pos, so it follows pos's contents.
        self.pos_idx = self.pos.view(batch, 1, 1, 1).expand(batch, self.H, 1, self.D)
        self.arange_t = torch.arange(self.T, device=device)
        self.graph = None

    def step(self):
        """One decode step: tok/pos [B] -> next tok written back into self.tok."""
        w, B, H, D = self.w, self.B, self.H, self.D
        C = H * D
        x = w.wte[self.tok] + w.wpe[self.pos]  # [B, C]
        # Row b attends to cache positions 0..pos[b].
        mask = (self.arange_t[None, :] <= self.pos[:, None])[:, None, None, :]  # [B,1,1,T]
        for i, layer in enumerate(w.layers):
            h = F.layer_norm(x, (C,), layer["ln1_w"], layer["ln1_b"], w.cfg["eps"])
            qkv = torch.addmm(layer["attn_b"], h, layer["attn_w"]).view(B, 3, H, D)
            q, k, v = qkv.unbind(1)  # [B, H, D] each
            self.k[i].scatter_(2, self.pos_idx, k[:, :, None, :])  # cache[b, :, pos[b]] = k[b]
            self.v[i].scatter_(2, self.pos_idx, v[:, :, None, :])
            y = F.scaled_dot_product_attention(q[:, :, None, :], self.k[i], self.v[i],
                                               attn_mask=mask)  # [B, H, 1, D]
            x = x + torch.addmm(layer["proj_b"], y.reshape(B, C), layer["proj_w"])
            x = g.mlp(w.cfg, layer, x)
        x = F.layer_norm(x, (C,), w.lnf_w, w.lnf_b, w.cfg["eps"])
        logits = x @ w.wte_t  # [B, V]
        self.tok.copy_(logits.argmax(dim=-1))
        return logits

    def capture(self):
        # Warm up on a side stream (cuBLAS handles, SDPA kernel choice), then capture.
        self.graph = g.capture_graph(self.step)

    def run(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self.step()


def cross_check(w, device, dtype):
    """Our prefill and decode step vs transformers' GPT2LMHeadModel with the same weights."""
    model, why = g.hf_model(w)
    if model is None:
        return {"status": "skipped", "reason": why}
    cfg = w.cfg
    N, L = 2, 12
    tokens = g.check_tokens(cfg, N, L, device)
    ref = model(tokens).logits.float()  # [N, L, V]
    del model
    shape = (cfg["n_layer"], N, cfg["n_head"], L, cfg["n_embd"] // cfg["n_head"])
    kc = torch.zeros(shape, device=device, dtype=dtype)
    vc = torch.zeros_like(kc)
    # Prefill the first L-1 tokens, then decode token L-1 at position L-1.
    ours_prefill = prefill(w, tokens[:, : L - 1], kc, vc)
    dec = Decoder(w, N, L - 1, device, dtype)
    dec.k[:, :, :, : L - 1] = kc[:, :, :, : L - 1]
    dec.v[:, :, :, : L - 1] = vc[:, :, :, : L - 1]
    dec.tok.copy_(tokens[:, L - 1])
    results = [g.compare("prefill", ours_prefill, ref[:, L - 2], dtype),
               g.compare("decode step", dec.step(), ref[:, L - 1], dtype)]
    status = "ok" if all(r["status"] == "ok" for r in results) else "FAILED"
    return {"status": status, "max_abs_err_prefill": results[0]["max_abs_err"],
            "max_abs_err_decode": results[1]["max_abs_err"], "results": results}


def main():
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA requested but torch.cuda.is_available() is False")
    dtype = getattr(torch, args.dtype)
    cfg = g.model_config("tiny" if args.tiny else args.model, args.model_dir)
    use_graph = device.type == "cuda" and not args.no_graph
    timer = Timer(device)
    torch.backends.cuda.matmul.allow_tf32 = True

    w = g.Weights(cfg, device, dtype, args.seed, args.model_dir)
    dev_name = g.device_name(device)
    out = {
        "peer": "torch-cudagraph" if use_graph else "torch-eager-step",
        "device": dev_name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "dtype": args.dtype,
        "model": dict(cfg, params=w.param_count(), weights=w.describe(args.seed)),
        "method": ("one decode step (B rows at position p, attending 0..p, static KV cache, "
                   "greedy token fed back) captured in one CUDA graph; per-replay CUDA events"
                   if use_graph else "eager decode step"),
        "decode": [],
        "prefill": [],
    }
    print(f"# peer_cudagraph: {dev_name}, torch {torch.__version__}, {args.dtype}, "
          f"{w.param_count() / 1e6:.1f}M params, graph={use_graph}", flush=True)

    if not args.no_check:
        out["check"] = cross_check(w, device, dtype)
        print(f"# cross-check vs transformers GPT2LMHeadModel: {out['check']}", flush=True)

    with torch.no_grad():
        print("| batch | context | median ms/step | p10 | p90 | loop mean ms | tok/s |", flush=True)
        print("|---:|---:|---:|---:|---:|---:|---:|", flush=True)
        for ctx in csv_ints(args.contexts):
            for B in csv_ints(args.batch_sizes):
                dec = None
                try:
                    dec = Decoder(w, B, ctx, device, dtype)
                    if use_graph:
                        dec.capture()
                    for _ in range(args.warmup):
                        dec.run()
                    timer.sync(device)
                    marks = []
                    for _ in range(args.iters):
                        a = timer.mark()
                        dec.run()
                        marks.append((a, timer.mark()))
                    timer.sync(device)
                    per = [timer.elapsed(a, b) for a, b in marks]
                    a = timer.mark()
                    for _ in range(args.iters):
                        dec.run()
                    b = timer.mark()
                    timer.sync(device)
                    loop_mean = timer.elapsed(a, b) / args.iters
                    med = statistics.median(per)
                    row = {"batch": B, "context": ctx, "median_ms": med,
                           "p10_ms": pct(per, 0.1), "p90_ms": pct(per, 0.9),
                           "mean_ms_loop": loop_mean, "tokens_per_s": B / med * 1e3,
                           "iters": args.iters}
                    print(f"| {B} | {ctx} | {med:.3f} | {row['p10_ms']:.3f} | {row['p90_ms']:.3f} "
                          f"| {loop_mean:.3f} | {row['tokens_per_s']:.0f} |", flush=True)
                except Exception as e:  # noqa: BLE001 - one shape failing must not lose the rest
                    row = {"batch": B, "context": ctx, "error": repr(e)}
                    print(f"| {B} | {ctx} | error: {e!r} |", flush=True)
                out["decode"].append(row)
                dec = None  # frees the cache and the graph's memory pool
                if device.type == "cuda":
                    torch.cuda.empty_cache()

        shapes = [s for s in args.prefill.split(",") if s.strip()]
        if shapes:
            print("\n| prefill N x L | median ms | prompt tok/s |", flush=True)
            print("|---|---:|---:|", flush=True)
        for s in shapes:
            N, L = (int(x) for x in s.lower().split("x"))
            try:
                H, D = cfg["n_head"], cfg["n_embd"] // cfg["n_head"]
                kc = torch.empty((cfg["n_layer"], N, H, L, D), device=device, dtype=dtype)
                vc = torch.empty_like(kc)
                tokens = torch.randint(0, cfg["vocab"], (N, L), device=device)
                for _ in range(3):
                    prefill(w, tokens, kc, vc)
                timer.sync(device)
                per = []
                for _ in range(args.prefill_iters):
                    a = timer.mark()
                    prefill(w, tokens, kc, vc)
                    b = timer.mark()
                    timer.sync(device)
                    per.append(timer.elapsed(a, b))
                med = statistics.median(per)
                row = {"n": N, "len": L, "median_ms": med, "tokens_per_s": N * L / med * 1e3}
                print(f"| {N} x {L} | {med:.3f} | {row['tokens_per_s']:.0f} |", flush=True)
                del kc, vc
            except Exception as e:  # noqa: BLE001
                row = {"n": N, "len": L, "error": repr(e)}
                print(f"| {N} x {L} | error: {e!r} |", flush=True)
            out["prefill"].append(row)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    failed = out.get("check", {}).get("status") == "FAILED" or any(
        "error" in r for r in out["decode"] + out["prefill"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
