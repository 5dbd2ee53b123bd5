#!/usr/bin/env python3
"""Ember vs peers: merge a bench run's JSON files and print ONE comparison table.

  summarize.py --collect DIR --results results.json --table table.md
      merges what bench/run_gpu.sh left in DIR (stages.tsv, engine.json,
      wl-NAME.json + wl-NAME.cmd.json, peer-cudagraph.json, peer-hf.json,
      env.txt, nvidia-smi.csv, python.txt) into results.json, then renders.
  summarize.py --results results.json [--table table.md]
      renders an existing results.json again.

The table (markdown) goes to stdout and to --table. Every input is optional and
every key is looked up tolerantly: a missing stage shows as "n/a", never as a
crash.
"""

import argparse
import csv
import glob
import json
import os
import statistics
import sys

# Issue 7's reference points (H200, GPT-2 124M fp16, random init).
REFERENCE_H200 = {
    "graph_ms_per_step": {1: 0.68, 64: 1.08, 256: 2.13},
    "hf_ms_per_step": {1: 9.7, 64: 8.0},
    "hf_tokens_per_s": {1: 103, 64: 7954},
    "seed044": {"throughput_completion_tps": 12000, "tpot_p50_ms": 5.2, "ttft_p99_ms": 34},
}

WORKLOAD_ORDER = ["seed044", "single_1x256", "seed045", "seed048_absolute", "seed048_relative"]
WORKLOAD_NOTES = {
    "seed044": "64 x 256 tok, burst, max-batch 64",
    "single_1x256": "1 x 256 tok",
    "seed045": "256 x 64 tok, burst, max-batch 64, prefill-batch 16",
    "seed048_absolute": "256 x ~260-tok prompts, 1 new tok, 1 ms apart (absolute), batch 16/16",
    "seed048_relative": "same as above, relative schedule",
}


def sampled_ratios(wls, names):
    """Lines of a table: each sampled variant's TPOT p50 over its greedy shape's
    (the same server, the same invocation), after the end-to-end table."""
    rows = []
    for n in names:
        base = next((g for g in WORKLOAD_ORDER if n.startswith(g + "_t")), None)
        if base is None or base not in wls:
            continue
        def tpot(name):
            rep = get(wls[name], "report")
            runs = [r for r in (get(rep, "runs") or []) if isinstance(r, dict) and not r.get("warmup")]
            return run_metric(runs, "tpot_ms", "p50") if runs else None
        rows.append(f"| {n} | {fmt(tpot(n), 3)} | {fmt(tpot(base), 3)} | {ratio(tpot(n), tpot(base))} |")
    if not rows:
        return []
    return ["", "## Sampled vs greedy (TPOT p50, ms; target <= 1.10x)", "",
            "| workload | sampled | greedy | ratio |", "|---|---:|---:|---:|"] + rows + [""]


def get(d, *path, default=None):
    """d[path[0]][path[1]]...; each step may be a key or a tuple of alternative keys."""
    for key in path:
        if not isinstance(d, dict):
            return default
        keys = key if isinstance(key, tuple) else (key,)
        for k in keys:
            if k in d and d[k] is not None:
                d = d[k]
                break
        else:
            return default
    return d


def num(x):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v == v else None  # NaN -> None


def fmt(x, digits=2):
    x = num(x)
    if x is None:
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}f}"


def ratio(a, b):
    a, b = num(a), num(b)
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"_error": f"{os.path.basename(path)}: {e}"} if os.path.exists(path) else None


def collect(d):
    """Merge run_gpu.sh's work dir into one results dict."""
    res = {"meta": {}, "stages": [], "engine": None, "workloads": {}, "peers": {},
           "reference_h200": {k: ({str(b): v for b, v in m.items()} if k != "seed044" else m)
                              for k, m in REFERENCE_H200.items()}}
    try:
        with open(os.path.join(d, "env.txt")) as f:
            for line in f:
                if "=" in line:
                    k, v = line.rstrip("\n").split("=", 1)
                    res["meta"][k] = v
    except OSError:
        pass
    try:
        with open(os.path.join(d, "nvidia-smi.csv")) as f:
            rows = list(csv.reader(f))
        if len(rows) >= 2:
            res["meta"]["gpus"] = [{h.strip(): v.strip() for h, v in zip(rows[0], r)} for r in rows[1:]]
    except OSError:
        pass
    try:
        with open(os.path.join(d, "python.txt")) as f:
            res["meta"]["python_env"] = [line.rstrip("\n") for line in f if line.strip()]
    except OSError:
        pass
    try:
        with open(os.path.join(d, "stages.tsv")) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                parts += [""] * (4 - len(parts))
                res["stages"].append({"name": parts[0], "rc": parts[1], "seconds": parts[2],
                                      "note": parts[3]})
    except OSError:
        pass
    res["engine"] = load_json(os.path.join(d, "engine.json"))
    for path in sorted(glob.glob(os.path.join(d, "wl-*.json"))):
        base = os.path.basename(path)
        if base.endswith(".cmd.json"):
            continue
        name = base[len("wl-"):-len(".json")]
        entry = load_json(os.path.join(d, f"wl-{name}.cmd.json")) or {}
        entry["report"] = load_json(path)
        res["workloads"][name] = entry
    for path in sorted(glob.glob(os.path.join(d, "wl-*.cmd.json"))):
        name = os.path.basename(path)[len("wl-"):-len(".cmd.json")]
        if name not in res["workloads"]:  # ran (or was meant to) but wrote no report
            entry = load_json(path) or {}
            entry["report"] = None
            res["workloads"][name] = entry
    for peer, fname in (("cudagraph", "peer-cudagraph.json"), ("hf", "peer-hf.json")):
        res["peers"][peer] = load_json(os.path.join(d, fname))
    return res


def decode_rows(rows, context=None):
    """{batch: row} from a list of decode rows, preferring the given context."""
    out = {}
    for r in rows or []:
        if not isinstance(r, dict):
            continue
        b = get(r, ("batch", "batch_size", "b"))
        if b is None:
            continue
        b = int(b)
        ctx = get(r, ("context", "ctx", "context_len"))
        if b in out and context is not None and num(ctx) != context:
            continue
        out[b] = r
    return out


def step_ms(r):
    return num(get(r, ("median_ms", "p50_ms", "ms_per_step", "step_ms", "ms")))


def cell(ms, tps):
    if num(ms) is None:
        return "n/a"
    return f"{fmt(ms, 3 if num(ms) < 10 else 2)} ms ({fmt(tps)} tok/s)" if num(tps) else f"{fmt(ms)} ms"


def run_metric(runs, metric, pctl):
    """Median over the measured runs of metrics.<metric>.<pctl>."""
    vals = [num(get(r, "metrics", metric, pctl)) for r in runs]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def run_value(runs, key):
    vals = [num(get(r, key)) for r in runs]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def render(res):
    L = []
    meta = res.get("meta") or {}
    gpu = (get(meta, "gpus") or [{}])[0]
    gpu_name = get(gpu, "name") or get(res, "peers", "cudagraph", "device") or "unknown GPU"
    L.append("# Ember vs PyTorch: GPT-2 124M, fp16, random weights")
    L.append("")
    L.append(f"- device: {gpu_name}, driver {get(gpu, 'driver_version', default='?')}, "
             f"{get(gpu, 'memory.total [MiB]', default='?')}; host {meta.get('host', '?')}, "
             f"{meta.get('cpus', '?')} CPUs; {meta.get('date_utc', '?')}")
    for line in get(meta, "python_env") or []:
        L.append(f"- {line}")
    L.append("- Ember: engine bench (no gRPC) and ember-server + loadgen over gRPC on 127.0.0.1. "
             "Peers: transformers `generate` eager; hand-written static-KV decode step in one CUDA graph.")
    L.append("- Reference columns: issue 7's H200 numbers (not this run).")

    # ---- decode ----
    eng = res.get("engine") or {}
    eng_dec = decode_rows(get(eng, ("decode", "decode_steps")), context=256)
    cg = get(res, "peers", "cudagraph") or {}
    cg_dec = decode_rows(get(cg, "decode"), context=256)
    hf = get(res, "peers", "hf") or {}
    hf_dec = decode_rows(get(hf, "runs"))
    batches = sorted(set(eng_dec) | set(cg_dec) | set(hf_dec))
    L.append("")
    L.append("## Decode step, ms/step (tokens/s), context ~256")
    L.append("")
    L.append("| batch | Ember engine | torch + CUDA graph | HF generate eager | Ember / graph "
             "| Ember / HF | ref graph (H200) | ref HF (H200) |")
    L.append("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b in batches:
        e, g, h = eng_dec.get(b, {}), cg_dec.get(b, {}), hf_dec.get(b, {})
        e_tps = get(e, ("tokens_per_s", "tok_s", "tokens_per_sec"))
        if e_tps is None and step_ms(e):
            e_tps = b / step_ms(e) * 1e3
        L.append("| {} | {} | {} | {} | {} | {} | {} | {} |".format(
            b, cell(step_ms(e), e_tps), cell(step_ms(g), get(g, "tokens_per_s")),
            cell(num(get(h, "ms_per_step")), get(h, "tokens_per_s")),
            ratio(step_ms(e), step_ms(g)), ratio(step_ms(e), num(get(h, "ms_per_step"))),
            fmt(REFERENCE_H200["graph_ms_per_step"].get(b)), fmt(REFERENCE_H200["hf_ms_per_step"].get(b))))
    if not batches:
        L.append("| n/a | no decode results | | | | | | |")
    L.append("")
    L.append("Ratios are of times: above 1.00x Ember is slower. HF ms/step = generate wall time / "
             "new tokens (prefill included). Graph: median of per-replay CUDA-event times; "
             "Ember engine: its own median.")

    # ---- prefill ----
    eng_pf = {(int(get(r, ("n", "prompts"), default=0)), int(get(r, ("len", "length", "l"), default=0))): r
              for r in get(eng, "prefill") or [] if isinstance(r, dict)}
    cg_pf = {(int(get(r, "n", default=0)), int(get(r, "len", default=0))): r
             for r in get(cg, "prefill") or [] if isinstance(r, dict)}
    shapes = sorted(set(eng_pf) | set(cg_pf))
    if shapes:
        L.append("")
        L.append("## Prefill, ms (N prompts x L tokens)")
        L.append("")
        L.append("| N x L | Ember engine | torch eager (SDPA) | Ember / torch |")
        L.append("|---|---:|---:|---:|")
        for s in shapes:
            e, g = eng_pf.get(s, {}), cg_pf.get(s, {})
            L.append(f"| {s[0]} x {s[1]} | {fmt(step_ms(e), 3)} | {fmt(step_ms(g), 3)} "
                     f"| {ratio(step_ms(e), step_ms(g))} |")

    # ---- end to end ----
    wls = res.get("workloads") or {}
    names = []
    for n in WORKLOAD_ORDER:
        # Each greedy shape, then its sampled variants (NAME_t1, NAME_t1_p09, ...).
        names += [n] if n in wls else []
        names += sorted(v for v in wls if v.startswith(n + "_t"))
    names += sorted(n for n in wls if n not in names)
    L.append("")
    L.append("## End to end: ember-server + loadgen (median over measured runs)")
    L.append("")
    L.append("| workload | runs | completion tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
             "| ITL p99 ms | server TTFT p50 ms | queue wait p50 ms | failed |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in names:
        rep = get(wls[n], "report")
        runs = [r for r in (get(rep, "runs") or []) if isinstance(r, dict) and not r.get("warmup")]
        label = f"{n} ({WORKLOAD_NOTES[n]})" if n in WORKLOAD_NOTES else n
        if not runs:
            why = get(rep, "_error") or "no report"
            L.append(f"| {label} | 0 | {why} | | | | | | |")
            continue
        failed = sum(int(num(get(r, "failed", default=0)) or 0) for r in runs)
        L.append("| {} | {} | {} | {} / {} | {} / {} | {} | {} | {} | {} |".format(
            label, len(runs), fmt(run_value(runs, "throughput_completion_tps")),
            fmt(run_metric(runs, "ttft_ms", "p50")), fmt(run_metric(runs, "ttft_ms", "p99")),
            fmt(run_metric(runs, "tpot_ms", "p50")), fmt(run_metric(runs, "tpot_ms", "p99")),
            fmt(run_metric(runs, "itl_ms", "p99")), fmt(run_metric(runs, "server_ttft_ms", "p50")),
            fmt(run_metric(runs, "queue_wait_ms", "p50")), failed))
    if not names:
        L.append("| n/a | | no end-to-end results | | | | | | |")
    ref = REFERENCE_H200["seed044"]
    L.append(f"| ref: seed 044, the seeds' server (H200) | | {fmt(ref['throughput_completion_tps'])} "
             f"| n/a / {fmt(ref['ttft_p99_ms'])} | {fmt(ref['tpot_p50_ms'])} / n/a | | | | |")
    h64 = hf_dec.get(64, {})
    if num(get(h64, "tokens_per_s")):
        L.append(f"| peer: HF generate 64 x 256 (no server) | | {fmt(get(h64, 'tokens_per_s'))} "
                 f"| | {fmt(get(h64, 'ms_per_step'))} / n/a | | | | |")
    g64 = cg_dec.get(64, {})
    if step_ms(g64):
        L.append(f"| peer: torch + CUDA graph, B=64 decode only | | {fmt(get(g64, 'tokens_per_s'))} "
                 f"| | {fmt(step_ms(g64), 3)} / n/a | | | | |")

    L += sampled_ratios(wls, names)

    # ---- checks and stages ----
    check = get(cg, "check")
    if check:
        L.append("")
        L.append(f"CUDA-graph peer vs transformers GPT2LMHeadModel (same weights): "
                 f"{get(check, 'status')} (max abs logit error prefill "
                 f"{fmt(get(check, 'max_abs_err_prefill'), 4)}, decode "
                 f"{fmt(get(check, 'max_abs_err_decode'), 4)}).")
    stages = res.get("stages") or []
    if stages:
        L.append("")
        L.append("## Stages")
        L.append("")
        L.append("| stage | exit | seconds | note |")
        L.append("|---|---:|---:|---|")
        for s in stages:
            L.append(f"| {s.get('name')} | {s.get('rc')} | {s.get('seconds')} | {s.get('note', '')} |")
    return "\n".join(L) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--collect", metavar="DIR", help="run_gpu.sh's work dir to merge")
    p.add_argument("--results", metavar="PATH", required=True,
                   help="results.json to write (with --collect) or read")
    p.add_argument("--table", metavar="PATH", help="also write the markdown table here")
    args = p.parse_args()
    if args.collect:
        res = collect(args.collect)
        with open(args.results, "w") as f:
            json.dump(res, f, indent=2)
    else:
        with open(args.results) as f:
            res = json.load(f)
    table = render(res)
    sys.stdout.write(table)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
