#!/usr/bin/env python3
"""Joins braze's benchmark JSON with torch_baseline.py's JSON from the same run and prints one row
per workload: braze's time, PyTorch eager / torch.compile / best library path, the speedups, and
the fraction of the copy bandwidth measured in the same run.

    python3 compare.py braze.json torch.json [base.json]
    python3 compare.py --append braze.json braze-train.json     # adds the second file's rows to the first

With a third file (`braze bench` of an earlier build, run in the same call), a last column gives
this build's speed relative to that one (above 1: faster now). Rows with a peak memory
(`peak_mb`: the training workloads, from `braze bench` and `torch_train.py`) also get a line
comparing it with PyTorch's. braze's max-autotune rows (`braze compiled+autotune`) are set beside
torch.compile's max-autotune-no-cudagraphs where torch_baseline.py measured it (the sweeps), and
every row with a tuning time (`tuning_s`) gets a line comparing it with PyTorch's.
"""
import json, sys


def load(path):
    with open(path) as f:
        return json.load(f)["rows"]


def append(path, extra):
    """Adds extra's rows to path's file (a copy of extra where path is missing)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (FileNotFoundError, ValueError):
        doc = {"env": {}, "rows": []}
    try:
        more = load(extra)
    except (FileNotFoundError, ValueError) as e:
        print(f"compare.py --append: nothing added from {extra}: {e}")
        return
    doc["rows"] += more
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def main():
    if sys.argv[1] == "--append":
        append(sys.argv[2], sys.argv[3])
        return
    braze, torch = load(sys.argv[1]), load(sys.argv[2])
    base = {(r["workload"], r["shape"], r["dtype"], r["variant"]): r for r in load(sys.argv[3])} if len(sys.argv) > 3 else {}
    copy = next((r["gbps"] for r in torch if r["workload"] == "copy"), None)
    keyed = {}
    for r in torch:
        keyed.setdefault((r["workload"], r["shape"], r["dtype"]), {})[r["variant"]] = r
    print(f"copy bandwidth this run: {copy:.0f} GB/s" if copy else "copy bandwidth: not measured")
    head = f"{'workload':12s} {'shape':24s} {'dtype':5s} {'braze variant':24s} {'braze us':>10s} {'%copy':>6s} " \
           f"{'eager us':>10s} {'compile us':>10s} {'x eager':>8s} {'x compile':>9s} {'best lib':>10s} {'x lib':>7s}" \
           + (f" {'base us':>10s} {'x base':>7s}" if base else "")
    print(head)
    for r in braze:
        if r["variant"].startswith("info"):
            continue
        t = keyed.get((r["workload"], r["shape"], r["dtype"]), {})
        eager = t.get("eager", t.get("eager loop"))
        comp = t.get("compile", t.get("compile default"))
        if r["variant"] == "braze compiled+autotune":
            comp = t.get("compile max-autotune-no-cudagraphs", comp)
        libs = [v for k, v in t.items() if k in ("cat_segment_reduce", "foreach_norm(ord=1)", "compile reduce-overhead",
                                                 "compile max-autotune-no-cudagraphs") and v.get("us")]
        lib = min(libs, key=lambda v: v["us"]) if libs else None
        pct = f"{100 * r['gbps'] / copy:5.1f}%" if r.get("gbps") and copy else "     -"
        f = lambda x: f"{x['us']:10.1f}" if x else f"{'-':>10s}"
        ratio = lambda x, w: f"{x['us'] / r['us']:{w}.2f}" if x else f"{'-':>{w}s}"
        old = base.get((r["workload"], r["shape"], r["dtype"], r["variant"]))
        versus_base = f" {f(old)} {ratio(old, 7)}" if base else ""
        print(f"{r['workload']:12s} {r['shape']:24s} {r['dtype']:5s} {r['variant']:24s} {r['us']:10.1f} {pct} "
              f"{f(eager)} {f(comp)} {ratio(eager, 8)} {ratio(comp, 9)} {f(lib)} {ratio(lib, 7)}{versus_base}")
    for r in braze:
        if r.get("peak_mb") is not None:
            t = keyed.get((r["workload"], r["shape"], r["dtype"]), {})
            theirs = ", ".join(f"{k} {v['peak_mb']:.0f} MB" for k, v in t.items() if v.get("peak_mb") is not None)
            print(f"{r['workload']:12s} {r['shape']:24s} peak memory: braze {r['peak_mb']:.0f} MB; "
                  f"PyTorch {theirs or '-'}")
    for r in braze:
        if r.get("tuning_s") is not None:
            t = keyed.get((r["workload"], r["shape"], r["dtype"]), {})
            theirs = next((v["tuning_s"] for v in t.values() if v.get("tuning_s") is not None), None)
            print(f"{r['workload']:12s} {r['shape']:24s} {r['dtype']:5s} tuning: braze {r['tuning_s']:.2f} s; "
                  f"torch.compile max-autotune {f'{theirs:.2f} s' if theirs is not None else '-'}")
    for r in braze:
        if r["variant"].startswith("info"):
            print(f"{r['workload']:12s} {r['shape']:24s} {r['variant']:22s} {r.get('note', '')}")


if __name__ == "__main__":
    main()
