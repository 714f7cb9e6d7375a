#!/usr/bin/env python3
"""Where an inference pass spends its GPU time, kernel by kernel, from Nsight Compute's CSV.

bench/gpu_infer_kernels.sh runs `fp8train bench-infer` under
`ncu --metrics gpu__time_duration.sum --csv` (each kernel timed alone, in launch order);
this script cuts that sequence into passes and tables them:

  * a pass starts at each embedding kernel (a prefill pass over R rows, or a decode step);
    kernels before the first one (the weights' conversion at load) are left out;
  * passes with the same sequence of kernel names form a group (a calibration pass runs other
    kernels than a timed prefill pass; every replayed decode step runs the same ones), and a
    pass with a decode-attention kernel is a decode step;
  * for each group: how many passes, their mean time (the sum of the kernels' durations: ncu
    serializes kernels, so this is the GPU time without overlap or launch gaps), and the
    kernels of its last pass, the most expensive first.

  python3 bench/infer_kernels.py FILE.csv [FILE.csv ...] [--title TEXT] [--top N]

Standard library only; FILE may be gzip-compressed (.gz).
"""
import argparse
import csv
import gzip
import sys

UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def short_name(name):
    """the kernel's name without its parameter list and return type (templates kept)"""
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            name = name[:i]
            break
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    return name


def read_kernels(path):
    """[(kernel, microseconds)] in launch order from ncu's --csv output (its ==PROF== and
    warning lines skipped)"""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    if not lines:
        raise ValueError(f"{path}: no CSV rows (was ncu run with --csv and a metric?)")
    rows = []
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "ns")
        if unit not in UNITS:
            raise ValueError(f"{path}: unknown time unit {unit!r}")
        value = float(r["Metric Value"].replace(",", ""))
        rows.append((short_name(r["Kernel Name"]), value * UNITS[unit]))
    if not rows:
        raise ValueError(f"{path}: no gpu__time_duration.sum rows")
    return rows


def passes(rows):
    """the kernels cut at each embedding kernel; those before the first dropped"""
    out, cur = [], None
    for name, us in rows:
        if "embedding" in name:
            if cur:
                out.append(cur)
            cur = []
        if cur is not None:
            cur.append((name, us))
    if cur:
        out.append(cur)
    return out


def groups(ps):
    """[(kind, [pass, ...])] in order of first appearance, passes grouped by their kernel
    sequence"""
    order, by_key = [], {}
    for p in ps:
        key = tuple(n for n, _ in p)
        if key not in by_key:
            kind = "decode step" if any("decode" in n for n in key) else "prefill pass"
            by_key[key] = (kind, [])
            order.append(key)
        by_key[key][1].append(p)
    return [by_key[k] for k in order]


def fmt(x):
    return f"{x:,.1f}"


def table(path, title, top):
    ps = passes(read_kernels(path))
    if not ps:
        raise ValueError(f"{path}: no embedding kernel: not an inference pass")
    gs = groups(ps)
    out = [f"## {title or path}", "",
           "| group | kind | passes | kernels per pass | GPU µs per pass (mean) |",
           "| --- | --- | --- | --- | --- |"]
    for i, (kind, members) in enumerate(gs):
        mean = sum(sum(us for _, us in p) for p in members) / len(members)
        out.append(f"| {i + 1} | {kind} | {len(members)} | {len(members[0])} | {fmt(mean)} |")
    for i, (kind, members) in enumerate(gs):
        last = members[-1]
        total = sum(us for _, us in last)
        agg = {}
        for name, us in last:
            c, t = agg.get(name, (0, 0.0))
            agg[name] = (c + 1, t + us)
        out += ["", f"### group {i + 1}, {kind}: its last pass, {fmt(total)} µs", "",
                "| kernel | calls | µs | µs per call | share |", "| --- | --- | --- | --- | --- |"]
        ranked = sorted(agg.items(), key=lambda kv: -kv[1][1])
        for name, (c, t) in ranked[:top]:
            out.append(f"| `{name}` | {c} | {fmt(t)} | {fmt(t / c)} | {100 * t / total:.1f}% |")
        if len(ranked) > top:
            rest = sum(t for _, (_, t) in ranked[top:])
            out.append(f"| ({len(ranked) - top} more) | | {fmt(rest)} | | "
                       f"{100 * rest / total:.1f}% |")
    return "\n".join(out)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="ncu --csv output (.csv or .csv.gz)")
    ap.add_argument("--title", action="append", default=[],
                    help="a heading per file, in order (default: the file name)")
    ap.add_argument("--top", type=int, default=12, help="kernels listed per pass (default 12)")
    a = ap.parse_args(argv)
    if a.top < 1:
        ap.error("--top must be at least 1")
    parts = []
    for i, f in enumerate(a.files):
        try:
            parts.append(table(f, a.title[i] if i < len(a.title) else "", a.top))
        except (OSError, ValueError, KeyError) as e:
            print(f"infer_kernels.py: {e}", file=sys.stderr)
            return 2
    print("\n\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
