#!/usr/bin/env python3
"""Peer (issue 39): hand-written GPT-2 under torch.compile, replayed as ONE CUDA graph.

The model is `gpt2_torch`'s (plain fp16 tensors, HF's Conv1D layout): a preset
size (`--model gpt2|medium|large|xl`, seeded random init) or an HF directory
(`--model-dir`: its config.json and model.safetensors, the files Ember loads).

Decode, per (batch B, context p): one static KV cache tensor per layer, K and V
each [B, H, p+1, D], filled with random values; one step feeds B tokens at
position p, writes each row's K/V into the cache in place
(`cache[rows, :, pos] = k`, an index_put_ that Inductor keeps in place on the
graph input: the `scatter_` of peer_cudagraph.py made Inductor copy the whole
cache every step), attends over positions 0..pos[b] of its row (SDPA with a
boolean mask), and takes the greedy token, which it writes back as the next
step's input. Prefill, per N x L: N prompts of L tokens, causal SDPA, the last
position's logits, the greedy ids.

What is compiled (`--compile-scope`): `block` (default) compiles one
transformer block, one embedding and one head function, each reused by every
layer and call (dynamo guards on shapes, not on tensor identity), so compile
time does not grow with depth; `step` compiles the whole unrolled step.
`dynamic=False`, `fullgraph=True`; `--compile-mode` max-autotune-no-cudagraphs
(default: Inductor autotunes its matmul templates against cuBLAS) or default.
reduce-overhead is not offered: it captures its own CUDA graphs, which cannot
nest inside ours; our one graph per shape is what it would do. After a
warmup (which compiles), the step is captured in one torch.cuda.CUDAGraph.

Measured per shape, after --warmup replays:
  median_ms     median over --iters of replay + `.cpu()` of the [B] greedy ids
                (Ember's step reads its ids back the same way), wall clock,
                with torch.cuda.synchronize() before each clock read; p10/p90
  mean_ms_loop  GPU only: --iters replays back to back between two CUDA events
  compile_s     warmup (compilation on a new shape) + capture
Prefill rows: median_ms (graph replay + ids.cpu()) and compiled_ms (the
compiled call without a graph + ids.cpu()).

Before timing it checks itself against transformers' GPT2LMHeadModel with the
same weights (from the directory itself with --model-dir): the reference
prefill's and the compiled, graphed decode step's logits at the first context
(batch: the smallest >= 2), and the compiled, graphed prefill's at the first
prefill shape. The JSON is rewritten after every row, so a run cut short by a
time limit keeps what it measured. A shape whose cache does not fit in free
GPU memory is skipped (its row says why).

GPU:      python3 bench/peer_compile.py --json out.json
          python3 bench/peer_compile.py --model-dir /path/xl --contexts 256,1000 --json out.json
CPU:      python3 bench/peer_compile.py --dry-run       (tiny, float32, few iterations)
No torch: python3 bench/peer_compile.py --stub --json out.json  (the same JSON, an empty
          step timed: bench/run_family.sh --dry-run uses it where torch is missing)
"""

import argparse
import json
import statistics
import sys
import time

import gpt2_torch as g
from gpt2_torch import F, torch  # None where torch is missing (--stub needs neither)

DRY_RUN = dict(device="cpu", model="tiny", dtype="float32", batch_sizes="1,2", contexts="8",
               prefill="2x8", warmup=1, iters=3, prefill_iters=2, compile_mode="default")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--model", default="gpt2", help="gpt2 (124M), medium, large, xl or tiny")
    p.add_argument("--model-dir", help="an HF GPT-2 directory (config.json, model.safetensors)")
    p.add_argument("--seed", type=int, default=0, help="random init seed (no --model-dir)")
    p.add_argument("--batch-sizes", default="1,8,64,256")
    p.add_argument("--contexts", default="256,1000",
                   help="positions p each row decodes at (attends to p+1 tokens); "
                        "at most n_positions - 1")
    p.add_argument("--prefill", default="1x256,16x256", help="NxL prefill shapes ('' to skip)")
    p.add_argument("--warmup", type=int, default=20, help="untimed replays per shape")
    p.add_argument("--iters", type=int, default=200, help="timed replays per shape")
    p.add_argument("--prefill-iters", type=int, default=20)
    p.add_argument("--compile-mode", default="max-autotune-no-cudagraphs",
                   choices=["max-autotune-no-cudagraphs", "default"])
    p.add_argument("--compile-scope", default="block", choices=["block", "step"])
    p.add_argument("--no-graph", action="store_true", help="time the compiled step, no graph")
    p.add_argument("--no-check", action="store_true", help="skip the transformers check")
    p.add_argument("--stub", action="store_true", help="no torch: time an empty step")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU smoke: " + ", ".join(f"{k}={v}" for k, v in DRY_RUN.items()))
    p.add_argument("--json", help="write results here (after every row)")
    pre, _ = p.parse_known_args()
    if pre.dry_run:
        p.set_defaults(**DRY_RUN)
    return p.parse_args()


def shapes(args):
    return g.csv_ints(args.batch_sizes), g.csv_ints(args.contexts), g.prefill_shapes(args.prefill)


class Output:
    """The run's JSON, rewritten after every row."""

    def __init__(self, path, head):
        self.path = path
        self.doc = dict(head, decode=[], prefill=[])

    def add(self, kind, row):
        self.doc[kind].append(row)
        self.save()

    def save(self):
        if self.path:
            with open(self.path, "w") as f:
                json.dump(self.doc, f, indent=2)

    def failed(self):
        return self.doc.get("check", {}).get("status") == "FAILED" or any(
            "error" in r for r in self.doc["decode"] + self.doc["prefill"])


def decode_row(B, ctx, per_ms, loop_ms, compile_s, graph):
    med = statistics.median(per_ms)
    return {"batch": B, "context": ctx, "median_ms": med, "p10_ms": g.pct(per_ms, 0.1),
            "p90_ms": g.pct(per_ms, 0.9), "mean_ms_loop": loop_ms, "tokens_per_s": B / med * 1e3 if med > 0 else 0.0,
            "iters": len(per_ms), "compile_s": compile_s, "graph": graph}


def prefill_row(N, L, per_ms, compiled_ms, compile_s, graph):
    med = statistics.median(per_ms)
    return {"n": N, "len": L, "median_ms": med, "compiled_ms": statistics.median(compiled_ms),
            "tokens_per_s": N * L / med * 1e3 if med > 0 else 0.0, "compile_s": compile_s, "graph": graph}


def print_decode(row):
    if "median_ms" not in row:
        print(f"decode B={row['batch']:>4} ctx={row['context']:>5}: "
              f"{row.get('error') or row.get('skipped')}", flush=True)
        return
    what, loop = ("replay", "GPU only") if row["graph"] else ("compiled step", "loop mean")
    print(f"decode B={row['batch']:>4} ctx={row['context']:>5}: {row['median_ms']:8.3f} ms "
          f"({what} + ids.cpu(); p10 {row['p10_ms']:.3f}, p90 {row['p90_ms']:.3f}), {loop} "
          f"{row['mean_ms_loop']:.3f} ms, {row['tokens_per_s']:.0f} tok/s, compile+capture "
          f"{row['compile_s']:.1f} s", flush=True)


def print_prefill(row):
    if "median_ms" not in row:
        print(f"prefill {row['n']} x {row['len']}: {row.get('error') or row.get('skipped')}",
              flush=True)
        return
    what = "graph replay" if row["graph"] else "compiled step"
    print(f"prefill {row['n']} x {row['len']}: {row['median_ms']:.3f} ms ({what} + ids.cpu()), "
          f"compiled without graph {row['compiled_ms']:.3f} ms, {row['tokens_per_s']:.0f} prompt "
          f"tok/s, compile+capture {row['compile_s']:.1f} s", flush=True)


def stub(args):
    """The JSON a real run writes, with an empty step's timings: no torch needed."""
    batches, contexts, prefills = shapes(args)
    out = Output(args.json, {"peer": "stub", "device": "none (stub)", "torch": "stub",
                             "dtype": args.dtype, "check": {"status": "skipped",
                                                            "reason": "stub: no torch"}})

    def times(n):
        ms = []
        for _ in range(n):
            t = time.perf_counter()
            ms.append((time.perf_counter() - t) * 1e3)
        return ms

    for ctx in contexts:
        for B in batches:
            row = decode_row(B, ctx, times(args.iters), 0.0, 0.0, False)
            out.add("decode", row)
            print_decode(row)
    for N, L in prefills:
        row = prefill_row(N, L, times(args.prefill_iters), times(args.prefill_iters), 0.0, False)
        out.add("prefill", row)
        print_prefill(row)
    return 0


# ---- the model, in pieces torch.compile sees -------------------------------------------


def embed(wte, wpe, tok, pos):
    return wte[tok] + wpe[pos]


def decode_block(cfg, layer, x, kc, vc, pos, mask):
    """x [B, C] -> x [B, C]; writes row b's K/V at kc/vc[b, :, pos[b]]."""
    B, C = x.shape
    H = cfg["n_head"]
    h = F.layer_norm(x, (C,), layer["ln1_w"], layer["ln1_b"], cfg["eps"])
    qkv = torch.addmm(layer["attn_b"], h, layer["attn_w"]).view(B, 3, H, C // H)
    q, k, v = qkv.unbind(1)  # [B, H, D] each
    rows = torch.arange(B, device=x.device)
    kc[rows, :, pos] = k  # index_put_: in place on the cache (see the module doc)
    vc[rows, :, pos] = v
    y = F.scaled_dot_product_attention(q[:, :, None], kc, vc, attn_mask=mask)  # [B, H, 1, D]
    x = x + torch.addmm(layer["proj_b"], y.reshape(B, C), layer["proj_w"])
    return g.mlp(cfg, layer, x)


def prefill_block(cfg, layer, x, kc, vc):
    """x [N*L, C] -> x [N*L, C]; writes K/V into kc/vc[:, :, :L] (each [N, H, T>=L, D])."""
    N, H, _, D = kc.shape
    C = H * D
    L = x.shape[0] // N
    h = F.layer_norm(x, (C,), layer["ln1_w"], layer["ln1_b"], cfg["eps"])
    qkv = torch.addmm(layer["attn_b"], h, layer["attn_w"]).view(N, L, 3, H, D)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [N, H, L, D] each
    kc[:, :, :L] = k
    vc[:, :, :L] = v
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(N * L, C)
    x = x + torch.addmm(layer["proj_b"], y, layer["proj_w"])
    return g.mlp(cfg, layer, x)


def head(cfg, x, lnf_w, lnf_b, wte_t):
    """x [R, C] -> logits [R, V], greedy ids [R]."""
    x = F.layer_norm(x, (x.shape[-1],), lnf_w, lnf_b, cfg["eps"])
    logits = x @ wte_t
    return logits, logits.argmax(dim=-1)


class Compiled:
    """The compiled decode and prefill steps (see the module doc's `--compile-scope`)."""

    def __init__(self, w, mode, scope):
        opts = dict(dynamic=False, fullgraph=True, mode=None if mode == "default" else mode)
        c = (lambda f: torch.compile(f, **opts))
        self.w = w
        block = scope == "block"
        self.embed = c(embed) if block else embed
        self.decode_block = c(decode_block) if block else decode_block
        self.prefill_block = c(prefill_block) if block else prefill_block
        self.head = c(head) if block else head
        self.decode = self._decode if block else c(self._decode)
        self.prefill = self._prefill if block else c(self._prefill)

    def _decode(self, caches, tok, pos, arange_t):
        w = self.w
        x = self.embed(w.wte, w.wpe, tok, pos)
        mask = (arange_t[None, :] <= pos[:, None])[:, None, None, :]  # [B, 1, 1, T]
        for layer, (kc, vc) in zip(w.layers, caches):
            x = self.decode_block(w.cfg, layer, x, kc, vc, pos, mask)
        return self.head(w.cfg, x, w.lnf_w, w.lnf_b, w.wte_t)

    def _prefill(self, caches, tokens, arange_l):
        w = self.w
        N, L = tokens.shape
        x = self.embed(w.wte, w.wpe, tokens, arange_l[None]).reshape(N * L, -1)
        for layer, (kc, vc) in zip(w.layers, caches):
            x = self.prefill_block(w.cfg, layer, x, kc, vc)
        return self.head(w.cfg, x.view(N, L, -1)[:, -1], w.lnf_w, w.lnf_b, w.wte_t)


def new_caches(cfg, rows, length, device, dtype):
    """One K and one V tensor [rows, H, length, D] per layer, random (what a prompt
    would have left there: attention reads real numbers)."""
    H = cfg["n_head"]
    shape = (rows, H, length, cfg["n_embd"] // H)
    return [(torch.empty(shape, device=device, dtype=dtype).normal_(0.0, 0.5),
             torch.empty(shape, device=device, dtype=dtype).normal_(0.0, 0.5))
            for _ in range(cfg["n_layer"])]


class Graphed:
    """One shape's static buffers, its step, and that step captured in one CUDA graph."""

    def __init__(self, fn, inputs, ids):
        self.fn, self.inputs, self.ids = fn, inputs, ids
        self.graph = None
        self.logits = None

    def step(self):
        self.logits, ids = self.fn(*self.inputs)
        self.ids.copy_(ids)

    def capture(self, use_graph):
        """Warmup (compiles on a new shape) and capture; returns the seconds taken."""
        t = time.perf_counter()
        if not use_graph:
            self.step()
            return time.perf_counter() - t
        self.graph = g.capture_graph(self.step)
        return time.perf_counter() - t

    def run(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self.step()


def decoder(comp, B, ctx, device, dtype):
    cfg = comp.w.cfg
    tok = torch.randint(0, cfg["vocab"], (B,), device=device)
    pos = torch.full((B,), ctx, device=device, dtype=torch.long)
    caches = new_caches(cfg, B, ctx + 1, device, dtype)
    # The step's greedy ids become its next input: tok is both.
    return Graphed(comp.decode, (caches, tok, pos, torch.arange(ctx + 1, device=device)), tok)


def prefiller(comp, N, L, device, dtype):
    cfg = comp.w.cfg
    tokens = torch.randint(0, cfg["vocab"], (N, L), device=device)
    caches = new_caches(cfg, N, L, device, dtype)
    ids = torch.zeros(N, dtype=torch.long, device=device)
    return Graphed(comp.prefill, (caches, tokens, torch.arange(L, device=device)), ids)


def wall_ms(timer, run, read_back, n):
    """n times: sync, clock, run, read the ids back to the host, sync, clock."""
    per = []
    for _ in range(n):
        timer.sync()
        t = time.perf_counter()
        run()
        read_back.cpu()
        timer.sync()
        per.append((time.perf_counter() - t) * 1e3)
    return per


def no_room(cfg, rows, length, dtype, device):
    """Why a cache of rows x length positions cannot be made here, or None."""
    if device.type != "cuda":
        return None
    need = 2 * cfg["n_layer"] * rows * length * cfg["n_embd"] * torch.finfo(dtype).bits // 8
    free, _ = torch.cuda.mem_get_info(device)
    if need + (2 << 30) <= free:
        return None
    return f"KV cache {need / 2**30:.1f} GiB + 2 GiB > free {free / 2**30:.1f} GiB"


def time_decode(comp, args, B, ctx, timer, use_graph):
    dtype, device = comp.w.wte.dtype, comp.w.wte.device
    why = no_room(comp.w.cfg, B, ctx + 1, dtype, device)
    if why:
        return {"batch": B, "context": ctx, "skipped": why}
    dec = decoder(comp, B, ctx, device, dtype)
    compile_s = dec.capture(use_graph)
    for _ in range(args.warmup):
        dec.run()
    per = wall_ms(timer, dec.run, dec.ids, args.iters)
    a = timer.mark()
    for _ in range(args.iters):
        dec.run()
    b = timer.mark()
    timer.sync()
    return decode_row(B, ctx, per, timer.elapsed(a, b) / args.iters, compile_s,
                      dec.graph is not None)


def time_prefill(comp, args, N, L, timer, use_graph):
    dtype, device = comp.w.wte.dtype, comp.w.wte.device
    why = no_room(comp.w.cfg, N, L, dtype, device)
    if why:
        return {"n": N, "len": L, "skipped": why}
    pf = prefiller(comp, N, L, device, dtype)
    compile_s = pf.capture(use_graph)
    for _ in range(3):
        pf.run()
    per = wall_ms(timer, pf.run, pf.ids, args.prefill_iters)
    compiled = wall_ms(timer, pf.step, pf.ids, args.prefill_iters)
    return prefill_row(N, L, per, compiled, compile_s, pf.graph is not None)


def run_checks(comp, batches, contexts, prefills, use_graph):
    """The reference prefill, the compiled decode step and the compiled prefill
    against transformers (see the module doc)."""
    w = comp.w
    cfg, dtype, device = w.cfg, w.wte.dtype, w.wte.device
    model, why = g.hf_model(w)
    if model is None:
        return {"status": "skipped", "reason": why}
    results = []
    Bc, c = min([b for b in batches if b >= 2], default=min(batches)), contexts[0]
    tokens = g.check_tokens(cfg, Bc, c + 1, device)
    ref = model(tokens).logits[:, c - 1:].float()  # positions c - 1 and c
    dec = decoder(comp, Bc, c, device, dtype)
    caches = dec.inputs[0]
    ours = g.prefill(w, tokens[:, :c], [k for k, _ in caches], [v for _, v in caches])
    results.append(g.compare(f"reference prefill {Bc} x {c}", ours, ref[:, 0], dtype))
    dec.capture(use_graph)  # its warmup steps write position c only
    dec.ids.copy_(tokens[:, c])  # the step's input token
    dec.run()
    results.append(g.compare(f"compiled decode step B={Bc} at position {c}"
                             f"{' (graph)' if use_graph else ''}", dec.logits, ref[:, 1], dtype))
    del dec, caches
    if prefills:
        N, L = prefills[0]
        tokens = g.check_tokens(cfg, N, L, device)
        ref = model(tokens).logits[:, -1].float()
        pf = prefiller(comp, N, L, device, dtype)
        pf.inputs[1].copy_(tokens)
        pf.capture(use_graph)
        pf.run()
        results.append(g.compare(f"compiled prefill {N} x {L}{' (graph)' if use_graph else ''}",
                                 pf.logits, ref, dtype))
    del model
    status = "ok" if all(r["status"] == "ok" for r in results) else "FAILED"
    return {"status": status, "results": results}


def guarded(key, fn, *a):
    """fn(*a), or a row that names the error: one shape failing must not lose the rest."""
    try:
        return fn(*a)
    except Exception as e:  # noqa: BLE001
        return dict(key, error=repr(e))
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def setup(args):
    """Device, dtype, weights and compiled steps; the JSON's head."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA requested but torch.cuda.is_available() is False")
    dtype = getattr(torch, args.dtype)
    cfg = g.model_config(args.model, args.model_dir)
    for name in ("recompile_limit", "cache_size_limit"):  # one compile per shape
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    w = g.Weights(cfg, device, dtype, args.seed, args.model_dir)
    comp = Compiled(w, args.compile_mode, args.compile_scope)
    use_graph = device.type == "cuda" and not args.no_graph
    head = {"peer": "torch-compile" + ("+cudagraph" if use_graph else ""),
            "device": g.device_name(device), "torch": torch.__version__,
            "cuda": torch.version.cuda, "dtype": args.dtype,
            "model": dict(cfg, params=w.param_count(), weights=w.describe(args.seed)),
            "compile": {"mode": args.compile_mode, "scope": args.compile_scope,
                        "dynamic": False, "fullgraph": True},
            "method": "decode: replay of one CUDA graph + .cpu() of the greedy ids, wall clock "
                      "between CUDA syncs (median_ms); replays back to back between CUDA events "
                      "(mean_ms_loop)" if use_graph else "compiled step without a graph (CPU)"}
    return comp, device, use_graph, head


def main():
    args = parse_args()
    if args.stub:
        return stub(args)
    if torch is None:
        sys.exit("torch is not importable here (--stub tests the plumbing without it)")
    batches, contexts, prefills = shapes(args)
    comp, device, use_graph, head = setup(args)
    cfg = comp.w.cfg
    bad = [c for c in contexts if not 0 < c < cfg["n_positions"]]
    if bad:
        sys.exit(f"contexts {bad} are not within 1..{cfg['n_positions'] - 1} (n_positions - 1)")
    out = Output(args.json, head)
    timer = g.Timer(device)
    print(f"# peer_compile: {head['device']}, torch {torch.__version__}, {args.dtype}, "
          f"{cfg['name']} ({head['model']['params'] / 1e6:.0f}M params), compile "
          f"{args.compile_mode}/{args.compile_scope}, graph={use_graph}", flush=True)
    with torch.no_grad():
        if not args.no_check:
            out.doc["check"] = guarded({"status": "FAILED"}, run_checks, comp, batches, contexts,
                                       prefills, use_graph)
            out.save()
            print(f"# check vs transformers GPT2LMHeadModel: {out.doc['check']}", flush=True)
        for ctx in contexts:
            for B in batches:
                row = guarded({"batch": B, "context": ctx}, time_decode, comp, args, B, ctx,
                              timer, use_graph)
                out.add("decode", row)
                print_decode(row)
        for N, L in prefills:
            row = guarded({"n": N, "len": L}, time_prefill, comp, args, N, L, timer, use_graph)
            out.add("prefill", row)
            print_prefill(row)
    return 1 if out.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
