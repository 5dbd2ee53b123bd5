#!/usr/bin/env python3
"""bench/run_family.sh's helper (issue 41): model directories, what fits, the table.

  write DIR SIZE...   one random-weight HF GPT-2 directory per size (gpt2,
                      medium, large, xl, tiny) under DIR/SIZE: config.json and
                      one model.safetensors, what `ember-engine-bench
                      --model-dir`, `ember-server --model-dir` and
                      peer_compile.py read (no tokenizer: the server then uses
                      its embedded GPT-2 vocabulary). With torch and
                      transformers: GPT2LMHeadModel(GPT2Config(...)) from
                      torch.manual_seed(--seed), cast to --dtype, then
                      save_pretrained (the tied lm_head is not stored, as
                      Ember's loader allows). Without torch (a CPU dry run in
                      CI), `tiny` only: the same files written with the
                      standard library. A directory whose config already has
                      the size's shape is kept.
  fit                 the decode batches whose KV cache fits in --mem-mib
                      beside the weights; prints them comma-separated and
                      writes the others, with the reason, to --skipped.
  table               reads run_family.sh's raw JSON and stage list and prints
                      one markdown table (see `table`'s docstring).

Everything but `write`'s torch path runs on the standard library.
"""

import argparse
import array
import glob
import json
import os
import random
import shutil
import struct
import sys
import time

from gpt2_torch import LAYER_NAMES, N_POSITIONS, SIZES, VOCAB

MIB = 1 << 20
GIB = 1 << 30


# ---- write ----------------------------------------------------------------------------


def hf_config(size):
    n_layer, n_head, n_embd = SIZES[size]
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": n_layer,
            "n_head": n_head, "n_embd": n_embd, "n_positions": N_POSITIONS, "n_ctx": N_POSITIONS,
            "vocab_size": VOCAB, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
            "bos_token_id": 50256, "eos_token_id": 50256, "tie_word_embeddings": True}


def is_written(d, size):
    try:
        with open(os.path.join(d, "config.json")) as f:
            have = json.load(f)
    except (OSError, ValueError):
        return False
    want = hf_config(size)
    return os.path.isfile(os.path.join(d, "model.safetensors")) and all(
        have.get(k) == want[k] for k in ("n_layer", "n_head", "n_embd", "vocab_size"))


def write_torch(tmp, size, seed, dtype, device):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    c = hf_config(size)
    cfg = GPT2Config(n_layer=c["n_layer"], n_head=c["n_head"], n_embd=c["n_embd"],
                     n_positions=c["n_positions"], vocab_size=c["vocab_size"])
    torch.manual_seed(seed)
    with torch.device(device):  # GPT-2's init on the GPU: seconds for XL, not minutes
        model = GPT2LMHeadModel(cfg)
    model.to(getattr(torch, dtype)).save_pretrained(tmp, max_shard_size="100GB")


def write_stdlib(tmp, size, seed):
    """config.json + model.safetensors (f32) without torch: GPT-2's init shape
    (normal std 0.02, biases 0, LayerNorm 1/0), from a 64 Ki-value block of
    seeded normals repeated (a dry run's weights only need to be finite)."""
    c = hf_config(size)
    C, L = c["n_embd"], c["n_layer"]
    shapes = {"transformer.wte.weight": [VOCAB, C], "transformer.wpe.weight": [N_POSITIONS, C],
              "transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]}
    per_layer = dict(ln1_w=[C], ln1_b=[C], attn_w=[C, 3 * C], attn_b=[3 * C], proj_w=[C, C],
                     proj_b=[C], ln2_w=[C], ln2_b=[C], fc_w=[C, 4 * C], fc_b=[4 * C],
                     fcproj_w=[4 * C, C], fcproj_b=[C])
    for i in range(L):
        for ours, theirs in LAYER_NAMES.items():
            shapes[f"transformer.h.{i}.{theirs}"] = per_layer[ours]
    rng = random.Random(seed)
    block = array.array("f", (rng.gauss(0.0, 0.02) for _ in range(1 << 16)))
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape in shapes.items():
        n = 1
        for s in shape:
            n *= s
        if name.endswith("bias"):
            values = array.array("f", bytes(4 * n))
        elif len(shape) == 1:  # LayerNorm scale
            values = array.array("f", [1.0]) * n
        else:
            values = (block * (n // len(block) + 1))[:n]
        data = values.tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(os.path.join(tmp, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for data in blobs:
            f.write(data)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(c, f, indent=2)


def cmd_write(args):
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    for size in args.sizes:
        if size not in SIZES:
            sys.exit(f"unknown size {size!r}; known: {', '.join(SIZES)}")
        d = os.path.join(args.dir, size)
        if is_written(d, size):
            print(f"{size}: {d} already written", flush=True)
            continue
        if not have_torch and size != "tiny":
            sys.exit(f"{size}: torch and transformers are needed for any size but tiny")
        t = time.time()
        tmp = f"{d}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        if have_torch:
            write_torch(tmp, size, args.seed, args.dtype, args.device)
        else:
            write_stdlib(tmp, size, args.seed)
        if not os.path.isfile(os.path.join(tmp, "model.safetensors")):
            sys.exit(f"{size}: no single model.safetensors in {tmp}: {os.listdir(tmp)}")
        shutil.rmtree(d, ignore_errors=True)
        os.replace(tmp, d)
        mb = os.path.getsize(os.path.join(d, "model.safetensors")) / MIB
        how = f"transformers, {args.dtype}" if have_torch else "standard library, float32"
        print(f"{size}: wrote {d} ({mb:.0f} MiB, {how}, seed {args.seed}) in "
              f"{time.time() - t:.1f} s", flush=True)
    return 0


# ---- fit ------------------------------------------------------------------------------


def cmd_fit(args):
    with open(os.path.join(args.model_dir, "config.json")) as f:
        c = json.load(f)
    L, C, V, P = c["n_layer"], c["n_embd"], c["vocab_size"], c["n_positions"]
    weights = (L * 12 * C * C + (V + P) * C) * args.elem_bytes
    positions = -(-args.positions // args.block_size) * args.block_size
    fits, skipped = [], []
    for b in args.batches:
        kv = 2 * L * b * positions * C * args.elem_bytes
        need = kv + weights + args.headroom_gib * GIB
        if args.mem_mib <= 0 or need <= args.mem_mib * MIB:
            fits.append(b)
        else:
            skipped.append({"batch": b, "reason": f"KV {kv / GIB:.1f} GiB + weights "
                            f"{weights / GIB:.1f} GiB + {args.headroom_gib} GiB > "
                            f"{args.mem_mib / 1024:.0f} GiB"})
    if args.skipped:
        with open(args.skipped, "w") as f:
            json.dump(skipped, f, indent=2)
    for s in skipped:
        print(f"skip B={s['batch']}: {s['reason']}", file=sys.stderr)
    print(",".join(str(b) for b in fits))
    return 0


# ---- table ----------------------------------------------------------------------------


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_stages(path):
    """run_family.sh's stage list: name, exit status, seconds, note (TSV)."""
    out = []
    for line in open(path) if os.path.exists(path) else []:
        name, rc, secs, note = (line.rstrip("\n").split("\t") + ["", "", "", ""])[:4]
        out.append({"name": name, "rc": rc, "seconds": secs, "note": note})
    return out


def stage_note(stages, name):
    """Why a stage left no numbers ('' if it exited 0 or never ran)."""
    for s in stages:
        if s["name"] == name and s["rc"] != "0":
            return f"{name}: {s['note'] or 'exit ' + s['rc']}"
    return ""


def find(rows, **key):
    return next((r for r in rows or [] if all(r.get(k) == v for k, v in key.items())), None)


def ember_prefill(doc):
    """One engine-bench prefill row as the server runs that step: replayed
    from its captured graph where the shape has one (the replay checked
    against the eager step), else the eager step."""
    doc = doc or {}
    graph = doc.get("prefill_graph") or {}
    if graph.get("graph_vs_eager_max_logit_diff") is not None:
        return graph
    return doc.get("prefill")


def ember_decode(doc):
    """(step ms, overlapped step ms, GPU-only ms) of one engine-bench decode row:
    the synchronous graph step when there is one, else the eager one; the
    overlapped loop's step (the server's default) when the bench ran it."""
    if not doc:
        return None, None, None
    step = (doc.get("graph") or doc.get("eager") or {}).get("p50_ms")
    return step, (doc.get("overlap") or {}).get("p50_ms"), doc.get("graph_replay_ms")


def size_rows(args, size, stages):
    """The table rows of one size (dicts) and its peer's check."""
    raw = args.raw
    peer = load(f"{raw}/peer-{size}.json") or {}
    peer_note = stage_note(stages, f"peer:{size}")
    embers = {ctx: load(f"{raw}/ember-{size}-c{ctx}.json") or {} for ctx in args.contexts}
    wbytes = next((e["weight_bytes_per_step"] for e in embers.values()
                   if e.get("weight_bytes_per_step")), None)
    floor = wbytes / (args.hbm_tbs * 1e12) * 1e3 if wbytes and args.hbm_tbs > 0 else None
    rows = []
    for ctx in args.contexts:
        skipped = load(f"{raw}/ember-{size}-c{ctx}.skipped.json") or []
        for b in args.batches:
            e_ms, e_overlap, e_gpu = ember_decode(find(embers[ctx].get("decode"), batch=b))
            p = find(peer.get("decode"), batch=b, context=ctx) or {}
            notes = [f"Ember: {s['reason']}" for s in skipped if s["batch"] == b]
            if e_ms is None and not notes:
                notes.append(stage_note(stages, f"ember:{size}:c{ctx}") or "Ember: no row")
            if "median_ms" not in p:
                notes.append(f"peer: {p.get('skipped') or p.get('error') or peer_note or 'no row'}")
            rows.append(dict(size=size, shape=f"B={b}, ctx {ctx}", ember_ms=e_ms,
                             ember_overlap_ms=e_overlap, ember_gpu_ms=e_gpu, peer_ms=p.get("median_ms"),
                             peer_gpu_ms=p.get("mean_ms_loop"),
                             floor_ms=floor if b == 1 else None, notes="; ".join(notes)))
    prefills = [ember_prefill(load(f)) for f in sorted(glob.glob(f"{raw}/ember-{size}-*.json"))
                if not f.endswith(".skipped.json")]
    for shape in args.prefills.split():
        n, length = (int(x) for x in shape.lower().split("x"))
        e = find(prefills, sequences=n, prompt_len=length) or {}
        p = find(peer.get("prefill"), n=n, len=length) or {}
        notes = [] if "p50_ms" in e else ["Ember: no row"]
        if e.get("graph_vs_eager_max_logit_diff"):
            # A replay runs the eager step's kernels: any difference is a bug.
            notes.append(f"Ember: replayed logits differ from eager by {e['graph_vs_eager_max_logit_diff']:.3g}")
        if "median_ms" not in p:
            notes.append(f"peer: {p.get('skipped') or p.get('error') or peer_note or 'no row'}")
        rows.append(dict(size=size, shape=f"prefill {n}x{length}", ember_ms=e.get("p50_ms"),
                         ember_overlap_ms=None, ember_gpu_ms=e.get("gpu_ms"), peer_ms=p.get("median_ms"),
                         peer_gpu_ms=None,
                         floor_ms=None, notes="; ".join(notes)))
    for r in rows:
        # The server's loop: the overlapped step where the bench ran it.
        ember = r["ember_overlap_ms"] or r["ember_ms"]
        r["ratio"] = ember / r["peer_ms"] if ember and r["peer_ms"] else None
    device = next((e["device"] for e in embers.values() if e.get("device")), peer.get("device"))
    return rows, peer, device


def cell(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def cold_lines(args, stages):
    got = {s["name"]: s for s in stages if s["name"].startswith("server_start:")}
    out = []
    for label, what in (("cold", "empty --kernel-cache-dir"), ("restart", "same cache, warm")):
        s = got.get(f"server_start:{label}_{args.cold_size}")
        secs = f"{float(s['seconds']):.1f} s" if s and s["rc"] == "0" else (
            f"failed ({s['note']})" if s else "not run")
        out.append(f"{label} ({what}): {secs}")
    return f"- {args.cold_size} start to health SERVING: " + "; ".join(out)


def cmd_table(args):
    stages = read_stages(args.stages)
    rows, checks, device = [], [], None
    for size in args.sizes:
        size_table, peer, size_device = size_rows(args, size, stages)
        rows += size_table
        device = device or size_device
        check = peer.get("check") or {}
        worst = max((r.get("max_abs_err", 0) / r["tolerance"] for r in check.get("results", [])
                     if r.get("tolerance")), default=None)
        why = f" ({check['reason']})" if check.get("reason") else (
            f" (worst error {worst:.1%} of tolerance)" if worst is not None else "")
        checks.append(f"{size} {check.get('status', 'not run')}{why}")
    hbm = f"{args.hbm_tbs:g} TB/s" if args.hbm_tbs > 0 else "unknown (HBM_TBS)"
    lines = [f"## GPT-2 family: Ember vs torch.compile peer ({device or 'device unknown'}, "
             f"HBM {hbm})", "",
             "| size | shape | Ember step ms | Ember overlapped ms | Ember GPU-only ms | peer ms "
             "| peer GPU-only ms | Ember / peer | weight floor ms | notes |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['size']} | {r['shape']} | {cell(r['ember_ms'])} "
                     f"| {cell(r['ember_overlap_ms'])} "
                     f"| {cell(r['ember_gpu_ms'])} | {cell(r['peer_ms'])} "
                     f"| {cell(r['peer_gpu_ms'])} | {cell(r['ratio'], 2)} "
                     f"| {cell(r['floor_ms']) if r['floor_ms'] else ''} | {r['notes']} |")
    lines += ["", f"- peer check vs transformers: {'; '.join(checks)}"]
    if args.cold_size:
        lines.append(cold_lines(args, stages))
    if args.notes:
        lines.append(f"- {args.notes}")
    bad = [f"{s['name']} ({s['note'] or 'exit ' + s['rc']})" for s in stages
           if s["rc"] not in ("0", "skipped") or s["note"] == "no time left"]
    lines.append(f"- stages not clean: {', '.join(bad) if bad else 'none'}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    with open(args.table, "w") as f:
        f.write(text)
    raw = {os.path.basename(f): load(f) for f in sorted(glob.glob(f"{args.raw}/*.json"))}
    with open(args.results, "w") as f:
        json.dump({"device": device, "hbm_tbs": args.hbm_tbs, "rows": rows, "stages": stages,
                   "raw": raw}, f, indent=2)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="random-weight HF directories")
    w.add_argument("dir")
    w.add_argument("sizes", nargs="+")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    w.add_argument("--device", default="cuda", help="where GPT-2's init runs (torch path)")
    f = sub.add_parser("fit", help="decode batches whose KV cache fits")
    f.add_argument("--model-dir", required=True)
    f.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",") if x], required=True)
    f.add_argument("--positions", type=int, required=True, help="cache positions per sequence")
    f.add_argument("--mem-mib", type=int, default=0, help="GPU memory (0: everything fits)")
    f.add_argument("--elem-bytes", type=int, default=2)
    f.add_argument("--block-size", type=int, default=16)
    f.add_argument("--headroom-gib", type=int, default=6)
    f.add_argument("--skipped", help="write the batches left out here (JSON)")
    t = sub.add_parser("table", help="the markdown table")
    t.add_argument("--raw", required=True, help="run_family.sh's raw/ directory")
    t.add_argument("--stages", required=True, help="run_family.sh's stage list (TSV)")
    t.add_argument("--sizes", required=True, nargs="+")
    t.add_argument("--contexts", required=True, type=lambda s: [int(x) for x in s.split()])
    t.add_argument("--prefills", default="", help="'1x256 16x256'")
    t.add_argument("--batches", required=True, type=lambda s: [int(x) for x in s.split(",")])
    t.add_argument("--hbm-tbs", type=float, default=0.0, help="HBM bandwidth, TB/s (0: unknown)")
    t.add_argument("--cold-size", default="", help="the size the cold start used")
    t.add_argument("--notes", default="", help="a line printed under the table")
    t.add_argument("--table", required=True, help="write the markdown here")
    t.add_argument("--results", required=True, help="write everything as JSON here")
    a = p.parse_args()
    sys.exit({"write": cmd_write, "fit": cmd_fit, "table": cmd_table}[a.cmd](a))
