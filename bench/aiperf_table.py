"""The table of bench/run_aiperf_compare.sh: per load and tool, what each
tool reports (TTFT p50/p99, TPOT p50, output tok/s) beside the server's own
per-request log lines of that run (its TTFT p50) and, for the closed loops,
the re-issue delay seen by the server: a slot's next request received minus
the end of the request that freed it (k-th received vs (k - C)-th ended).

Usage: aiperf_table.py RUNS_TSV N RATE CONC ISL OSL  (stdlib only)."""
import datetime
import json
import os
import statistics
import sys


def find(doc, name):
    """The first dict under a key containing `name` (AIPerf's export)."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if name in k and isinstance(v, dict):
                return v
        for v in doc.values():
            hit = find(v, name)
            if hit is not None:
                return hit
    elif isinstance(doc, list):
        for v in doc:
            hit = find(v, name)
            if hit is not None:
                return hit
    return None


def aiperf_figures(d):
    path = next((os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs
                 if f.endswith("aiperf.json")), None)
    if path is None:
        return None
    doc = json.load(open(path))
    ttft, itl = find(doc, "time_to_first_token"), find(doc, "inter_token_latency")
    tput = find(doc, "output_token_throughput")
    g = lambda m, k: None if m is None else m.get(k)
    return {"ttft_p50": g(ttft, "p50"), "ttft_p99": g(ttft, "p99"), "tpot_p50": g(itl, "p50"),
            "tps": g(tput, "avg")}


def loadgen_figures(d):
    r = json.load(open(os.path.join(d, "loadgen.json")))["runs"][0]
    m = r["metrics"]
    return {"ttft_p50": m["ttft_ms"]["p50"], "ttft_p99": m["ttft_ms"]["p99"],
            "tpot_p50": m["tpot_ms"]["p50"], "tps": r["throughput_completion_tps"]}


def server_figures(d, c):
    ends, recvs, ttfts = [], [], []
    for line in open(os.path.join(d, "server.log")):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        span = doc.get("span") or {}
        if "total_ms" not in span or "ttft_ms" not in span:
            continue
        end = datetime.datetime.fromisoformat(doc["timestamp"].replace("Z", "+00:00")).timestamp() * 1e3
        ends.append(end)
        recvs.append(end - float(span["total_ms"]))
        ttfts.append(float(span["ttft_ms"]))
    ends.sort()
    recvs.sort()
    delays = [recvs[k] - ends[k - c] for k in range(c, len(recvs))] if c else []
    med = lambda v: statistics.median(v) if v else None
    return {"n": len(ttfts), "ttft_p50": med(ttfts), "reissue_p50": med(delays),
            "reissue_max": max(delays) if delays else None}


def f(v, d=2):
    return "n/a" if v is None else f"{v:,.{d}f}"


def main():
    runs, n, rate, conc, isl, osl = sys.argv[1:7]
    print(f"## loadgen vs AIPerf on one pinned server (tiny preset, CPU)\n")
    print(f"{n} requests per run, {isl} prompt tokens, {osl} new tokens (ignore_eos, temperature 0, "
          f"streaming /v1/completions, the same prompts for both tools, no prefix cache); loads: "
          f"c1 = concurrency 1, rate = constant {rate} req/s (open loop), conc = closed loop of {conc}.\n")
    print("| load | tool | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | output tok/s | server TTFT p50 ms (its log) | re-issue delay p50 / max ms (server log) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for line in open(runs):
        scenario, tool, d, c = line.rstrip("\n").split("\t")
        fig = loadgen_figures(d) if tool == "loadgen" else aiperf_figures(d)
        if fig is None:
            fig = {}
        s = server_figures(d, int(c))
        reissue = "n/a (open loop)" if int(c) == 0 else f"{f(s['reissue_p50'], 3)} / {f(s['reissue_max'], 3)}"
        print(f"| {scenario} | {tool} | {f(fig.get('ttft_p50'))} | {f(fig.get('ttft_p99'))} | "
              f"{f(fig.get('tpot_p50'))} | {f(fig.get('tps'), 1)} | {f(s['ttft_p50'])} ({s['n']} req) | {reissue} |")


main()
