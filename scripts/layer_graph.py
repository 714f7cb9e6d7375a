#!/usr/bin/env python3
"""Which folder of src/ calls which: the linked symbols of a build's object files (nm), as a
markdown table in the layer order (README's "Layout"). tests/test_layers.sh checks the same
property (no call into a later folder); this prints the whole picture.

    scripts/layer_graph.py [BUILD_DIR]      (default build; e.g. build-cpu)
"""
import collections
import os
import subprocess
import sys

ORDER = ["util", "numerics", "backend", "model", "io", "instrument", "train", "tools", "cli"]


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    root = os.path.join(build, "src")
    if not os.path.isdir(root):
        sys.exit(f"layer_graph: no object files under {root}: build first (make)")
    objs = collections.defaultdict(list)
    for d, _, files in os.walk(root):
        for fn in files:
            if not fn.endswith(".o"):
                continue
            rel = os.path.relpath(os.path.join(d, fn), root)[:-2]
            if not any(os.path.exists(os.path.join("src", rel + e)) for e in (".c", ".cu")):
                continue  # stale: its source moved or went away
            objs[rel.split("/")[0]].append(os.path.join(d, fn))
    defined, undef = {}, collections.defaultdict(set)
    for folder, files in objs.items():
        for o in files:
            out = subprocess.run(["nm", "-P", o], capture_output=True, text=True).stdout
            for line in out.splitlines():
                p = line.split()
                if len(p) < 2:
                    continue
                if p[1] in "TDBR":
                    defined[p[0]] = folder
                elif p[1] == "U":
                    undef[folder].add(p[0])
    rank = {f: i for i, f in enumerate(ORDER)}
    print("| folder | calls into (distinct symbols) |\n|---|---|")
    for f in sorted(objs, key=lambda x: rank.get(x, 99)):
        c = collections.Counter(defined[u] for u in undef[f] if u in defined and defined[u] != f)
        cells = [f"{'**' if rank.get(d, 99) > rank.get(f, 99) else ''}{d} ({n})"
                 f"{'**' if rank.get(d, 99) > rank.get(f, 99) else ''}"
                 for d, n in sorted(c.items(), key=lambda kv: rank.get(kv[0], 99))]
        print(f"| {f} | {', '.join(cells) or '-'} |")


if __name__ == "__main__":
    main()
