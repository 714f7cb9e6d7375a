#!/usr/bin/env python3
"""Which folder of src/ calls which: the linked symbols of a build's object files (nm), in the
layer order (README's "Layout").

    scripts/layer_graph.py [BUILD_DIR]          the table (markdown; calls into a later folder
                                                in bold); default BUILD_DIR: build
    scripts/layer_graph.py --check BUILD_DIR [OBJ FOLDER]
                                                one line "FOLDER -> LATER symbol" per call into
                                                a later folder (OBJ: one more object file, as if
                                                it were FOLDER's); exit 1 when there is any
tests/test_layers.sh runs the check.
"""
import collections
import os
import subprocess
import sys

ORDER = ["util", "numerics", "backend", "model", "io", "instrument", "train", "tools", "cli"]
RANK = {f: i for i, f in enumerate(ORDER)}


def objects(build):
    """(folder, path) of every object under BUILD/src whose source still exists"""
    root = os.path.join(build, "src")
    if not os.path.isdir(root):
        sys.exit(f"layer_graph: no object files under {root}: build first (make)")
    for d, _, files in os.walk(root):
        for fn in files:
            if not fn.endswith(".o"):
                continue
            rel = os.path.relpath(os.path.join(d, fn), root)[:-2]
            if any(os.path.exists(os.path.join("src", rel + e)) for e in (".c", ".cu")):
                yield rel.split("/")[0], os.path.join(d, fn)


def symbols(objs):
    """defined: symbol -> folder; undef: folder -> symbols it uses"""
    defined, undef = {}, collections.defaultdict(set)
    for folder, o in objs:
        out = subprocess.run(["nm", "-P", o], capture_output=True, text=True).stdout
        for line in out.splitlines():
            p = line.split()
            if len(p) < 2:
                continue
            if p[1] in "TDBR":
                defined[p[0]] = folder
            elif p[1] == "U":
                undef[folder].add(p[0])
    return defined, undef


def later(f, d):
    return RANK.get(d, 99) > RANK.get(f, 99)


def main():
    args = sys.argv[1:]
    check = bool(args) and args[0] == "--check"
    if check:
        args = args[1:]
    objs = list(objects(args[0] if args else "build"))
    if check and len(args) == 3:
        objs.append((args[2], args[1]))
    defined, undef = symbols(objs)
    if check:
        bad = sorted((f, defined[u], u) for f, us in undef.items() for u in us
                     if u in defined and f in RANK and defined[u] in RANK and later(f, defined[u]))
        for f, d, u in bad:
            print(f"{f} -> {d} {u}")
        sys.exit(1 if bad else 0)
    print("| folder | calls into (distinct symbols) |\n|---|---|")
    for f in sorted({f for f, _ in objs}, key=lambda x: RANK.get(x, 99)):
        c = collections.Counter(defined[u] for u in undef[f] if u in defined and defined[u] != f)
        cells = [("**%s (%d)**" if later(f, d) else "%s (%d)") % (d, n)
                 for d, n in sorted(c.items(), key=lambda kv: RANK.get(kv[0], 99))]
        print(f"| {f} | {', '.join(cells) or '-'} |")


if __name__ == "__main__":
    main()
