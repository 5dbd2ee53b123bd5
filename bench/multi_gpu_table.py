#!/usr/bin/env python3
"""The table of bench/run_multi_gpu.sh: weak scaling per workload, sampling,
server count and loadgen mode, merged over every loadgen process of a run,
and each server's split.

    python3 bench/multi_gpu_table.py RUNS_TSV SERVERS_TSV TABLE_MD

RUNS_TSV: workload, sampling, servers, mode, run (w0, r0, ...), the run's
loadgen JSON files (comma-separated, one per process). SERVERS_TSV: index,
device, address. The setup lines come from MG_* environment variables (the
script sets them). Stdlib only.

A run's processes are lined up on the wall clock: each loadgen JSON run has
its t0 (`t0_unix_s`), its wall time from t0 to its last request's end, and
per target that target's own last end (`per_target[].wall_s`). The run's
span is the first t0 to the last end over every process; tok/s is all
completion tokens over that span (for one process, its own wall time: the
same figure loadgen prints). The start skew is the spread of the processes'
t0s, the drain skew that of the servers' last ends.
"""

import json
import os
import sys
from collections import defaultdict

MODE_NAMES = {
    "one": "1 process",
    "per-server": "one per server",
    "shared": "one for all (--balance least)",
    "strong": "one for all (--balance least)",
}


def measured_run(path):
    """The one measured run of a loadgen JSON; fails on a failed request."""
    doc = json.load(open(path))
    runs = [r for r in doc["runs"] if not r.get("warmup")]
    if len(runs) != 1:
        sys.exit(f"{path}: expected one measured run, found {len(runs)}")
    run = runs[0]
    if run["failed"]:
        sys.exit(f"{path}: {run['failed']} failed requests")
    return run


def merge(paths):
    """One run over all its processes: totals and the per-server split."""
    servers, tokens, cpu, t0s, ends = [], 0, 0.0, [], []
    for path in paths:
        run = measured_run(path)
        t0 = run["t0_unix_s"]
        t0s.append(t0)
        ends.append(t0 + run["wall_s"])
        tokens += run["completion_tokens"]
        cpu = None if cpu is None or run.get("client_cpu_s") is None else cpu + run["client_cpu_s"]
        for t in run["per_target"]:
            servers.append({
                "target": t["target"],
                "requests": t["requests"],
                "tokens": t["completion_tokens"],
                "t0": t0,
                "end": t0 + t["wall_s"],
                "p50": t["ttft_p50_ms"],
                "p99": t["ttft_p99_ms"],
            })
    start, end = min(t0s), max(ends)
    span = end - start
    server_ends = [s["end"] for s in servers]
    p99s = [s["p99"] for s in servers if s["p99"] is not None]
    return {
        "tps": tokens / span if span > 0 else 0.0,
        "tokens": tokens,
        "span": span,
        "start": start,
        "start_skew_ms": 1e3 * (max(t0s) - start),
        "drain_skew_ms": 1e3 * (max(server_ends) - min(server_ends)),
        "worst_p99": max(p99s) if p99s else None,
        "cpu_cores": cpu / span if cpu is not None and span > 0 else None,
        "servers": servers,
    }


def num(v, digits=0):
    return "n/a" if v is None else f"{v:,.{digits}f}"


def main():
    runs_tsv, servers_tsv, table_path = sys.argv[1:4]
    env = os.environ
    dry_run = env.get("MG_DRY_RUN") == "1"
    device_of = {}
    for line in open(servers_tsv):
        _, device, addr = line.rstrip("\n").split("\t")
        device_of["http://" + addr] = f"{device} ({addr})"

    groups = defaultdict(list)  # (workload, sampling, servers, mode) -> merged runs
    order = []
    for line in open(runs_tsv):
        workload, sampling, g, mode, run, files = line.rstrip("\n").split("\t")
        if not run.startswith("r"):
            continue  # a warmup
        key = (workload, sampling, int(g), mode)
        if key not in groups:
            order.append(key)
        groups[key].append(merge(files.split(",")))
    if not order:
        sys.exit(f"{runs_tsv}: no measured run")

    median = {}
    for key in order:
        ranked = sorted(groups[key], key=lambda r: r["tps"])
        median[key] = ranked[len(ranked) // 2]
    base = {(w, s): median[(w, s, 1, "one")]["tps"] for (w, s, g, m) in order if g == 1}

    out = []
    out.append("## One server per GPU: weak scaling" + (" (DRY RUN on the CPU)" if dry_run else ""))
    out.append("")
    out.append(f"- servers: {env.get('MG_GPU_MODEL', '?')}; {env.get('MG_GPU_COUNT', '?')} in all")
    out.append(f"- run: {env.get('MG_STARTED', '?')}, commit {env.get('MG_COMMIT', '?')}, bench/run_multi_gpu.sh")
    out.append(f"- server: `{env.get('MG_SERVER_CMD', '?')}`, one per device; kernel caches: {env.get('MG_CACHE_NOTE', '?')}")
    out.append(f"- loadgen: a burst of N x G requests x M new tokens on G servers, "
               f"`{env.get('MG_LOADGEN_CMD', '?')}`; every run its own process(es), started "
               f"{env.get('MG_START_DELAY', '?')} s ahead of a common `--start-at`; {env.get('MG_RUNS', '?')} runs")
    out.append("- tok/s = all completion tokens / (last request end - first t0), over every process; "
               "figures of the run with the median tok/s; weak scaling = tok/s on G servers / on 1 "
               "(G x is perfect); skews: spread of the processes' t0s and of the servers' last ends; "
               "loadgen CPU = the processes' CPU time / the span")
    out.append("")
    out.append("| per server (N x M) | sampling | servers | loadgen | requests | tok/s | tok/s of each run | "
               "worst TTFT p99 ms | weak scaling | start skew ms | drain skew ms | loadgen CPU cores |")
    out.append("|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for key in order:
        workload, sampling, g, mode = key
        if mode == "strong":
            continue
        r = median[key]
        n, m = workload.split("x")
        b = base.get((workload, sampling))
        scale = f"{r['tps'] / b:.2f}x" if b else "n/a"
        each = " / ".join(num(x["tps"]) for x in groups[key])
        requests = sum(s["requests"] for s in r["servers"])
        out.append(f"| {n} x {m} | {sampling} | {g} | {MODE_NAMES[mode]} | {requests} | {num(r['tps'])} | "
                   f"{each} | {num(r['worst_p99'], 1)} | {scale} | {num(r['start_skew_ms'], 1)} | "
                   f"{num(r['drain_skew_ms'], 1)} | {num(r['cpu_cores'], 2)} |")
    out.append("")
    out.append("Per server (the median run; tok/s = its tokens / its own span, from its process's t0 to "
               "its last request's end; starts and ends from the run's first t0):")
    out.append("")
    out.append("| per server (N x M) | sampling | servers | loadgen | server | requests | tok/s | token share | "
               "TTFT p50 / p99 ms | starts at ms | last end s |")
    out.append("|---|---|---:|---|---|---:|---:|---:|---|---:|---:|")
    for key in order:
        workload, sampling, g, mode = key
        if g == 1:
            continue
        r = median[key]
        for s in r["servers"]:
            own = s["end"] - s["t0"]
            tps = s["tokens"] / own if own > 0 else None
            share = f"{100 * s['tokens'] / r['tokens']:.1f}%" if r["tokens"] else "n/a"
            out.append(f"| {workload.replace('x', ' x ')} | {sampling} | {g} | {MODE_NAMES[mode]} | "
                       f"{device_of.get(s['target'], s['target'])} | {s['requests']} | {num(tps)} | {share} | "
                       f"{num(s['p50'], 1)} / {num(s['p99'], 1)} | {num(1e3 * (s['t0'] - r['start']), 1)} | "
                       f"{num(s['end'] - r['start'], 3)} |")
    strong = [k for k in order if k[3] == "strong"]
    if strong:
        out.append("")
        out.append("Strong scaling: N requests over all servers, one loadgen process (`--balance least`), "
                   "vs N on one server:")
        out.append("")
        out.append("| workload (N x M) | sampling | servers | tok/s | strong scaling |")
        out.append("|---|---|---:|---:|---:|")
        for key in strong:
            workload, sampling, g, _ = key
            b = base.get((workload, sampling))
            tps = median[key]["tps"]
            out.append(f"| {workload.replace('x', ' x ')} | {sampling} | {g} | {num(tps)} | "
                       f"{f'{tps / b:.2f}x' if b else 'n/a'} |")
    text = "\n".join(out) + "\n"
    open(table_path, "w").write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
