#!/usr/bin/env python3
"""The tables of bench/run_cpu.sh: Ember in each weight format vs torch per
(batch, pass), and each Ember step against its weight-read floor.

Usage: python3 bench/cpu_table.py OUT   (reads OUT/raw/*.json, writes
OUT/table.md and OUT/results.json, prints the tables)

Reads, and nothing else (a missing key is an error naming the file and the
key, and the exit status is 1, so a schema change cannot turn the table into
dashes again):

- raw/ember_<weights>_p<pass>_b<batch>.json (ember-engine-bench, and
  raw/base_<weights>_p<pass>_b<batch>.json from the baseline binary when
  run_cpu.sh had BASELINE_BIN_DIR): decode[].batch, decode[].eager.p50_ms,
  weight_bytes_per_step, memory_read.best_gb_s and .median_gb_s (its own
  --membw-mib probe, run in the same process just before the model loads),
  cpu.{model, simd, isa, weights, threads}.
- raw/torch_p<pass>_b<batch>.json (bench/peer_cpu.py): decode[].batch,
  decode[].p50_ms, torch, transformers, threads, peer.

Weight-read floor = weight_bytes_per_step / best read bandwidth of that run;
"floor / step" = floor / Ember's p50 step (100% = the step reads its weights
as fast as the probe read memory).

The first table has one row per (batch, pass) and only numbers: torch, then
Ember's ms/step in each format, then each format's floor / step. The second
sums up each (batch, format) over the passes: mean ms/step, the ratio to
torch, the floor, Ember's step against its batch 1 beside torch's (issue
49: how a batch scales, both measured in the same run), and the baseline
binary's mean with the change when there is one.
"""

import json
import os
import re
import statistics
import sys

FORMAT_ORDER = ["f32", "bf16"]


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
    best = float(need(doc, ["memory_read", "best_gb_s"], name))
    weight_bytes = int(need(doc, ["weight_bytes_per_step"], name))
    floor = weight_bytes / (best * 1e9) * 1e3
    return {
        "ms": ms,
        "weight_bytes": weight_bytes,
        "best_gb_s": best,
        "median_gb_s": float(need(doc, ["memory_read", "median_gb_s"], name)),
        "floor_ms": floor,
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
    """{(batch, pass): {"torch": run, "ember": {weights: run}, "base": {weights: run}}}"""
    runs = {}
    for name in sorted(os.listdir(os.path.join(out, "raw"))):
        m = re.fullmatch(r"(?:(ember|base)_(\w+?)|(torch))_p(\d+)_b(\d+)\.json", name)
        if not m:
            continue
        side = m.group(1) or m.group(3)
        p, b = int(m.group(4)), int(m.group(5))
        with open(os.path.join(out, "raw", name)) as f:
            doc = json.load(f)
        cell = runs.setdefault((b, p), {"ember": {}, "base": {}})
        if side == "torch":
            cell["torch"] = torch_run(doc, b, name)
        else:
            cell[side][m.group(2)] = ember_run(doc, b, name)
    if not runs:
        raise SchemaError(f"{out}/raw: no ember_*/torch_* results")
    return runs


def ms(x):
    """Two decimals, or two significant digits below 0.1 ms (the dry run's stub)."""
    return f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"


def formats_of(runs):
    seen = {w for r in runs.values() for w in r["ember"]}
    return sorted(seen, key=lambda w: (FORMAT_ORDER.index(w) if w in FORMAT_ORDER else 99, w))


def per_pass_table(runs, formats):
    head = (["batch", "pass", "torch ms/step"] + [f"Ember {w} ms/step" for w in formats]
            + [f"{w} floor / step" for w in formats])
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    rows = []
    for (b, p) in sorted(runs):
        r = runs[(b, p)]
        missing = [w for w in formats if w not in r["ember"]] + ([] if "torch" in r else ["torch"])
        if missing:
            raise SchemaError(f"batch {b} pass {p}: no result for {', '.join(missing)}")
        t = r["torch"]["ms"]
        cells = [str(b), str(p), ms(t)] + [ms(r["ember"][w]["ms"]) for w in formats]
        cells += [f"{100 * r['ember'][w]['floor_ms'] / r['ember'][w]['ms']:.0f}%" for w in formats]
        lines.append("| " + " | ".join(cells) + " |")
        for w in formats:
            e = r["ember"][w]
            base = r["base"].get(w)
            rows.append({"batch": b, "pass": p, "weights": w, "ember_ms": e["ms"], "torch_ms": t,
                         "ratio": e["ms"] / t, "floor_ms": e["floor_ms"],
                         "floor_share": e["floor_ms"] / e["ms"], "isa": e["cpu"].get("isa", "?"),
                         "read_gb_s_best": e["best_gb_s"], "read_gb_s_median": e["median_gb_s"],
                         "baseline_ms": base["ms"] if base else None})
    return lines, rows


def summary_table(rows, formats):
    has_base = any(r["baseline_ms"] is not None for r in rows)
    head = ["batch", "weights", "Ember ms/step", "torch ms/step", "Ember / torch",
            "weight floor ms", "floor / Ember", "Ember vs batch 1", "torch vs batch 1"]
    if has_base:
        head += ["baseline ms/step", "change"]
    lines = ["| " + " | ".join(head) + " |", "|---:|---|" + "---:|" * (len(head) - 2)]
    mean, mean_torch = {}, {}
    for b in sorted({r["batch"] for r in rows}):
        for w in formats:
            mine = [r for r in rows if r["batch"] == b and r["weights"] == w]
            e = statistics.fmean(r["ember_ms"] for r in mine)
            t = statistics.fmean(r["torch_ms"] for r in mine)
            floor = statistics.fmean(r["floor_ms"] for r in mine)
            mean[(b, w)] = e
            mean_torch.setdefault(b, t)
            one, torch_one = mean.get((1, w)), mean_torch.get(1)
            cells = [str(b), w, ms(e), ms(t), f"{e / t:.2f}", ms(floor), f"{100 * floor / e:.0f}%",
                     f"{e / one:.2f}x" if one else "-", f"{t / torch_one:.2f}x" if torch_one else "-"]
            if has_base:
                bases = [r["baseline_ms"] for r in mine if r["baseline_ms"] is not None]
                base = statistics.fmean(bases) if bases else None
                cells += [ms(base), f"{100 * (e / base - 1):+.0f}%"] if base else ["-", "-"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def notes(runs, rows, formats):
    any_t = next(r["torch"] for r in runs.values() if "torch" in r)
    first = next(iter(runs.values()))["ember"]
    cpu = first[formats[0]]["cpu"]
    isas = ", ".join(f"{w}: {first[w]['cpu'].get('isa', '?')}" for w in formats)
    sizes = ", ".join(f"{w} {first[w]['weight_bytes'] / 1e6:.1f} MB" for w in formats)
    bws = [r["read_gb_s_best"] for r in rows]
    meds = [r["read_gb_s_median"] for r in rows]
    return [
        "",
        f"CPU: {cpu.get('model', '?')}; SIMD: {cpu.get('simd', '?')}; Ember kernels ({isas}), "
        f"{cpu.get('threads', '?')} threads ({first[formats[0]]['device']}).",
        f"torch: {any_t['meta']['torch']} / transformers {any_t['meta']['transformers']}, "
        f"{any_t['meta']['threads']} threads (peer: {any_t['meta']['peer']}), f32.",
        f"Weights read per decode step: {sizes}; memory read bandwidth (each Ember run's probe, "
        f"{len(bws)} runs): best {min(bws):.1f}-{max(bws):.1f} GB/s, medians "
        f"{min(meds):.1f}-{max(meds):.1f} GB/s.",
        "ms/step: p50 (nearest rank) of the timed decode steps. Weight floor: weight bytes / "
        "that run's best read bandwidth.",
    ]


def render(runs):
    formats = formats_of(runs)
    if not formats:
        raise SchemaError("no Ember results")
    first, rows = per_pass_table(runs, formats)
    text = first + [""] + summary_table(rows, formats) + notes(runs, rows, formats)
    return "\n".join(text) + "\n", rows


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
