#!/usr/bin/env python3
"""The table of bench/run_cpu.sh: Ember vs torch per (batch, pass), and each
Ember step against its weight-read floor.

Usage: python3 bench/cpu_table.py OUT   (reads OUT/raw/*.json, writes
OUT/table.md and OUT/results.json, prints the table)

Reads, and nothing else (a missing key is an error naming the file and the
key, and the exit status is 1, so a schema change cannot turn the table into
dashes again):

- raw/ember_p<pass>_b<batch>.json (ember-engine-bench): decode[].batch,
  decode[].eager.p50_ms, weight_bytes_per_step, memory_read.best_gb_s and
  .median_gb_s (its own --membw-mib probe, run in the same process just before
  the model loads), cpu.{model, simd, isa, threads}.
- raw/torch_p<pass>_b<batch>.json (bench/peer_cpu.py): decode[].batch,
  decode[].p50_ms, torch, transformers, threads, peer.

Weight-read floor = weight_bytes_per_step / best read bandwidth of that run;
"floor / step" = floor / Ember's p50 step (100% = the step reads its weights
as fast as the probe read memory).
"""

import json
import os
import re
import statistics
import sys


class SchemaError(Exception):
    pass


def need(doc, path, name):
    """doc[path[0]][path[1]]..., or SchemaError naming the file and the key."""
    cur = doc
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            raise SchemaError(f"{name}: missing {'.'.join(path)}")
        cur = cur[key]
    return cur


def decode_row(doc, batch, name):
    rows = need(doc, ["decode"], name)
    for row in rows:
        if isinstance(row, dict) and row.get("batch") == batch:
            return row
    raise SchemaError(f"{name}: no decode row with batch {batch}")


def ember_run(doc, batch, name):
    row = decode_row(doc, batch, name)
    ms = float(need(row, ["eager", "p50_ms"], f"{name} decode[batch={batch}]"))
    return {
        "ms": ms,
        "weight_bytes": int(need(doc, ["weight_bytes_per_step"], name)),
        "best_gb_s": float(need(doc, ["memory_read", "best_gb_s"], name)),
        "median_gb_s": float(need(doc, ["memory_read", "median_gb_s"], name)),
        "cpu": need(doc, ["cpu"], name),
        "device": need(doc, ["device"], name),
    }


def torch_run(doc, batch, name):
    row = decode_row(doc, batch, name)
    if "error" in row:
        raise SchemaError(f"{name}: batch {batch} failed: {row['error']}")
    return {"ms": float(need(row, ["p50_ms"], f"{name} decode[batch={batch}]")),
            "meta": {k: doc.get(k, "?") for k in ("peer", "torch", "transformers", "threads")}}


def load(out):
    runs = {}
    for name in sorted(os.listdir(os.path.join(out, "raw"))):
        m = re.fullmatch(r"(ember|torch)_p(\d+)_b(\d+)\.json", name)
        if not m:
            continue
        side, p, b = m.group(1), int(m.group(2)), int(m.group(3))
        with open(os.path.join(out, "raw", name)) as f:
            doc = json.load(f)
        read = ember_run if side == "ember" else torch_run
        runs.setdefault((b, p), {})[side] = read(doc, b, name)
    if not runs:
        raise SchemaError(f"{out}/raw: no ember_*/torch_* results")
    return runs


def ms(x):
    """Two decimals, or two significant digits below 0.1 ms (the dry run's stub)."""
    return f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"


def render(runs):
    lines = ["| batch | pass | Ember ms/step | torch ms/step | Ember / torch "
             "| weight floor ms | floor / Ember step |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    rows = []
    for (b, p) in sorted(runs):
        r = runs[(b, p)]
        if "ember" not in r or "torch" not in r:
            raise SchemaError(f"batch {b} pass {p}: only {sorted(r)} ran")
        e, t = r["ember"], r["torch"]
        floor = e["weight_bytes"] / (e["best_gb_s"] * 1e9) * 1e3
        row = {"batch": b, "pass": p, "ember_ms": e["ms"], "torch_ms": t["ms"],
               "ratio": e["ms"] / t["ms"], "floor_ms": floor, "floor_share": floor / e["ms"],
               "read_gb_s_best": e["best_gb_s"], "read_gb_s_median": e["median_gb_s"]}
        rows.append(row)
        lines.append(f"| {b} | {p} | {ms(e['ms'])} | {ms(t['ms'])} | {row['ratio']:.2f} "
                     f"| {ms(floor)} | {100 * row['floor_share']:.0f}% |")
    for b in sorted({row["batch"] for row in rows}):
        mine = [row for row in rows if row["batch"] == b]
        if len(mine) > 1:
            e = statistics.fmean(row["ember_ms"] for row in mine)
            t = statistics.fmean(row["torch_ms"] for row in mine)
            floor = statistics.fmean(row["floor_ms"] for row in mine)
            lines.append(f"| {b} | mean | {ms(e)} | {ms(t)} | {e / t:.2f} | {ms(floor)} "
                         f"| {100 * floor / e:.0f}% |")
    any_e = next(r["ember"] for r in runs.values() if "ember" in r)
    any_t = next(r["torch"] for r in runs.values() if "torch" in r)
    cpu = any_e["cpu"]
    bws = [r["read_gb_s_best"] for r in rows]
    notes = [
        "",
        f"CPU: {cpu.get('model', '?')}; SIMD: {cpu.get('simd', '?')}; "
        f"Ember kernels: {cpu.get('isa', '?')}, {cpu.get('weights', '?')} weights, "
        f"{cpu.get('threads', '?')} threads ({any_e['device']}).",
        f"torch: {any_t['meta']['torch']} / transformers {any_t['meta']['transformers']}, "
        f"{any_t['meta']['threads']} threads (peer: {any_t['meta']['peer']}).",
        f"Weights read per decode step: {any_e['weight_bytes'] / 1e6:.1f} MB; memory read "
        f"bandwidth (each Ember run's probe, {len(bws)} runs): best {min(bws):.1f}-{max(bws):.1f} GB/s, "
        f"medians {min(r['read_gb_s_median'] for r in rows):.1f}-"
        f"{max(r['read_gb_s_median'] for r in rows):.1f} GB/s.",
        "ms/step: p50 (nearest rank) of the timed decode steps. Weight floor: weight bytes / "
        "that run's best read bandwidth.",
    ]
    return "\n".join(lines + notes) + "\n", rows


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    try:
        table, rows = render(load(out))
    except (SchemaError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"rows": rows}, f, indent=2)
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
