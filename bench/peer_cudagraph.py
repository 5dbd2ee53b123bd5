#!/usr/bin/env python3
"""Peer: the strongest hand-written PyTorch GPT-2 decode we can write.

GPT-2 124M (GPT2Config defaults: 12 layers, 12 heads, 768 wide, vocab 50257) in
fp16 with random weights (torch.manual_seed), a static KV cache, and ONE decode
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
loaded with the same weights (skipped if transformers is missing).

Usage (GPU):  python3 bench/peer_cudagraph.py --json out.json
CPU smoke:    python3 bench/peer_cudagraph.py --device cpu --tiny --batch-sizes 1,4 \
                  --iters 5 --prefill 2x8
"""

import argparse
import json
import math
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

GPT2_124M = dict(n_layer=12, n_head=12, n_embd=768, vocab=50257, n_positions=1024)
TINY = dict(n_layer=2, n_head=4, n_embd=128, vocab=50257, n_positions=1024)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--tiny", action="store_true", help="2-layer, 128-wide model (CPU smoke)")
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


def csv_ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


class Weights:
    """GPT-2 parameters as plain tensors, in HF's Conv1D layout (y = x @ W + b)."""

    def __init__(self, cfg, device, dtype, seed):
        torch.manual_seed(seed)
        C, V, L = cfg["n_embd"], cfg["vocab"], cfg["n_layer"]

        def normal(*shape, std=0.02):
            return (torch.randn(*shape, device=device, dtype=torch.float32) * std).to(dtype)

        def zeros(*shape):
            return torch.zeros(*shape, device=device, dtype=dtype)

        def ones(*shape):
            return torch.ones(*shape, device=device, dtype=dtype)

        self.cfg = cfg
        self.wte = normal(V, C)
        self.wpe = normal(cfg["n_positions"], C, std=0.01)
        proj_std = 0.02 / math.sqrt(2 * L)
        self.layers = []
        for _ in range(L):
            self.layers.append(dict(
                ln1_w=ones(C), ln1_b=zeros(C),
                attn_w=normal(C, 3 * C), attn_b=zeros(3 * C),
                proj_w=normal(C, C, std=proj_std), proj_b=zeros(C),
                ln2_w=ones(C), ln2_b=zeros(C),
                fc_w=normal(C, 4 * C), fc_b=zeros(4 * C),
                fcproj_w=normal(4 * C, C, std=proj_std), fcproj_b=zeros(C),
            ))
        self.lnf_w = ones(C)
        self.lnf_b = zeros(C)
        self.wte_t = self.wte.t().contiguous()  # tied LM head, [C, V]

    def param_count(self):
        n = self.wte.numel() + self.wpe.numel() + self.lnf_w.numel() + self.lnf_b.numel()
        return n + sum(t.numel() for layer in self.layers for t in layer.values())


def mlp(w, layer, x):
    C = w.cfg["n_embd"]
    h = F.layer_norm(x, (C,), layer["ln2_w"], layer["ln2_b"])
    h = F.gelu(torch.addmm(layer["fc_b"], h, layer["fc_w"]), approximate="tanh")
    return x + torch.addmm(layer["fcproj_b"], h, layer["fcproj_w"])


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
            h = F.layer_norm(x, (C,), layer["ln1_w"], layer["ln1_b"])
            qkv = torch.addmm(layer["attn_b"], h, layer["attn_w"]).view(B, 3, H, D)
            q, k, v = qkv.unbind(1)  # [B, H, D] each
            self.k[i].scatter_(2, self.pos_idx, k[:, :, None, :])  # cache[b, :, pos[b]] = k[b]
            self.v[i].scatter_(2, self.pos_idx, v[:, :, None, :])
            y = F.scaled_dot_product_attention(q[:, :, None, :], self.k[i], self.v[i],
                                               attn_mask=mask)  # [B, H, 1, D]
            x = x + torch.addmm(layer["proj_b"], y.reshape(B, C), layer["proj_w"])
            x = mlp(w, layer, x)
        x = F.layer_norm(x, (C,), w.lnf_w, w.lnf_b)
        logits = x @ w.wte_t  # [B, V]
        self.tok.copy_(logits.argmax(dim=-1))
        return logits

    def capture(self):
        # Warm up on a side stream (cuBLAS handles, SDPA kernel choice), then capture.
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                self.step()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step()
        torch.cuda.synchronize()

    def run(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self.step()


def prefill(w, tokens, k_cache, v_cache):
    """Batched prefill of N prompts of L tokens; returns last-position logits [N, V]."""
    cfg = w.cfg
    N, L = tokens.shape
    H = cfg["n_head"]
    C = cfg["n_embd"]
    D = C // H
    pos = torch.arange(L, device=tokens.device)
    x = (w.wte[tokens] + w.wpe[pos][None]).reshape(N * L, C)
    for i, layer in enumerate(w.layers):
        h = F.layer_norm(x, (C,), layer["ln1_w"], layer["ln1_b"])
        qkv = torch.addmm(layer["attn_b"], h, layer["attn_w"]).view(N, L, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [N, H, L, D] each
        k_cache[i, :N, :, :L] = k
        v_cache[i, :N, :, :L] = v
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [N, H, L, D]
        y = y.transpose(1, 2).reshape(N * L, C)
        x = x + torch.addmm(layer["proj_b"], y, layer["proj_w"])
        x = mlp(w, layer, x)
    last = x.view(N, L, C)[:, -1]
    last = F.layer_norm(last, (C,), w.lnf_w, w.lnf_b)
    return last @ w.wte_t


class Timer:
    """CUDA events on a GPU, perf_counter on the CPU; times in ms."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def elapsed(self, a, b):
        if self.cuda:
            return a.elapsed_time(b)
        return (b - a) * 1e3

    def sync(self, device):
        if self.cuda:
            torch.cuda.synchronize(device)


def pct(xs, q):
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
    return xs[i]


def cross_check(w, device, dtype):
    """Our forward vs transformers' GPT2LMHeadModel with the same weights."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except Exception as e:  # noqa: BLE001 - report any import problem, go on
        return {"status": "skipped", "reason": f"transformers not importable: {e}"}
    cfg = w.cfg
    hf_cfg = GPT2Config(n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],
                        vocab_size=cfg["vocab"], n_positions=cfg["n_positions"])
    model = GPT2LMHeadModel(hf_cfg).to(device=device, dtype=dtype).eval()
    sd = {"transformer.wte.weight": w.wte, "transformer.wpe.weight": w.wpe,
          "transformer.ln_f.weight": w.lnf_w, "transformer.ln_f.bias": w.lnf_b,
          "lm_head.weight": w.wte}
    names = dict(ln1_w="ln_1.weight", ln1_b="ln_1.bias", attn_w="attn.c_attn.weight",
                 attn_b="attn.c_attn.bias", proj_w="attn.c_proj.weight", proj_b="attn.c_proj.bias",
                 ln2_w="ln_2.weight", ln2_b="ln_2.bias", fc_w="mlp.c_fc.weight",
                 fc_b="mlp.c_fc.bias", fcproj_w="mlp.c_proj.weight", fcproj_b="mlp.c_proj.bias")
    for i, layer in enumerate(w.layers):
        for ours, theirs in names.items():
            sd[f"transformer.h.{i}.{theirs}"] = layer[ours]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not m.endswith(".attn.bias") and not m.endswith("masked_bias")]
    if missing or unexpected:
        return {"status": "FAILED", "reason": f"state dict: missing {missing} unexpected {unexpected}"}

    N, L = 2, 12
    g = torch.Generator(device="cpu").manual_seed(1)
    tokens = torch.randint(0, cfg["vocab"], (N, L), generator=g).to(device)
    with torch.no_grad():
        ref = model(tokens).logits.float()  # [N, L, V]
        T = L + 1
        shape = (cfg["n_layer"], N, cfg["n_head"], T, cfg["n_embd"] // cfg["n_head"])
        kc = torch.zeros(shape, device=device, dtype=dtype)
        vc = torch.zeros_like(kc)
        # Prefill the first L-1 tokens, then decode token L-1 at position L-1.
        ours_prefill = prefill(w, tokens[:, : L - 1], kc, vc).float()
        dec = Decoder(w, N, L - 1, device, dtype)
        dec.k[:, :, :, : L - 1] = kc[:, :, :, : L - 1]
        dec.v[:, :, :, : L - 1] = vc[:, :, :, : L - 1]
        dec.tok.copy_(tokens[:, L - 1])
        ours_decode = dec.step().float()
    scale = ref.abs().max().item()
    err_p = (ours_prefill - ref[:, L - 2]).abs().max().item()
    err_d = (ours_decode - ref[:, L - 1]).abs().max().item()
    tol = 2e-2 * scale if dtype != torch.float32 else 1e-3 * scale
    ok = err_p <= tol and err_d <= tol
    del model
    return {"status": "ok" if ok else "FAILED", "max_abs_err_prefill": err_p,
            "max_abs_err_decode": err_d, "tolerance": tol, "logit_scale": scale}


def main():
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA requested but torch.cuda.is_available() is False")
    dtype = getattr(torch, args.dtype)
    cfg = TINY if args.tiny else GPT2_124M
    use_graph = device.type == "cuda" and not args.no_graph
    timer = Timer(device)
    torch.backends.cuda.matmul.allow_tf32 = True

    w = Weights(cfg, device, dtype, args.seed)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    out = {
        "peer": "torch-cudagraph" if use_graph else "torch-eager-step",
        "device": dev_name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "dtype": args.dtype,
        "model": dict(cfg, params=w.param_count(), weights=f"random, torch.manual_seed({args.seed})"),
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
