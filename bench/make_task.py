#!/usr/bin/env python3
"""A multiple-choice task in llm.c's eval format (the one `fp8train eval --task` reads) from an
llm.c token shard: each example is a passage of --ctx tokens, and the choices are the --comp
tokens that really follow it and --choices - 1 spans taken from elsewhere in the shard. A model
that has learned the text prefers the true continuation; chance is 1 / --choices.

  make_task.py SHARD OUT [--examples N] [--ctx 24] [--comp 8] [--choices 4] [--seed S]

SHARD: an llm.c shard as `fp8train tokenize` writes it (header of 256 int32: magic 20240520,
version 1 (uint16 tokens) or 2 (uint32), token count; then the tokens). Tokens must be below
65535 (the eval format stores uint16). Standard library only.

Eval format (src/train/eval_task.c): header 256 int32 (magic 20240522, version 1, examples,
longest example in bytes); per example uint16: 65535, its size in bytes, index, label, number of
completions, context length, the context, then per completion its length and tokens.
"""
import argparse
import random
import struct
import sys


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 1024:
        sys.exit(f"make_task.py: {path}: shorter than an llm.c shard header")
    magic, version, n = struct.unpack_from("<3i", data, 0)
    if magic != 20240520 or version not in (1, 2):
        sys.exit(f"make_task.py: {path}: not an llm.c token shard (magic {magic}, version {version})")
    width = 2 if version == 1 else 4
    if len(data) < 1024 + n * width:
        sys.exit(f"make_task.py: {path}: {n} tokens announced, the file is shorter")
    fmt = "<%d%s" % (n, "H" if width == 2 else "I")
    return list(struct.unpack_from(fmt, data, 1024))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shard")
    ap.add_argument("out")
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--ctx", type=int, default=24)
    ap.add_argument("--comp", type=int, default=8)
    ap.add_argument("--choices", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    tok = read_shard(a.shard)
    span = a.ctx + a.comp
    if len(tok) < span * (a.choices + 1):
        sys.exit(f"make_task.py: {len(tok)} tokens are too few for examples of {span}")
    if max(tok) >= 65535:
        sys.exit("make_task.py: tokens >= 65535 do not fit the eval format's uint16")
    rng = random.Random(a.seed)
    # passages on a regular grid (no two share tokens), in a shuffled order
    starts = list(range(0, len(tok) - span, span))
    rng.shuffle(starts)
    n = min(a.examples, len(starts))
    body, longest = [], 0
    for i in range(n):
        p = starts[i]
        ctx = tok[p:p + a.ctx]
        true = tok[p + a.ctx:p + span]
        comps = [true]
        while len(comps) < a.choices:  # spans from elsewhere, none the true one
            q = rng.randrange(0, len(tok) - a.comp)
            c = tok[q:q + a.comp]
            if abs(q - (p + a.ctx)) >= a.comp and c not in comps:
                comps.append(c)
        label = rng.randrange(a.choices)
        comps[0], comps[label] = comps[label], comps[0]
        vals = [i & 0xFFFF, label, len(comps), len(ctx)] + ctx
        for c in comps:
            vals += [len(c)] + c
        nbytes = 2 * (len(vals) + 2)  # with the start and size fields
        ex = struct.pack("<2H", 65535, nbytes) + struct.pack("<%dH" % len(vals), *vals)
        body.append(ex)
        longest = max(longest, nbytes)
    header = struct.pack("<4i", 20240522, 1, n, longest) + b"\0" * (1024 - 16)
    with open(a.out, "wb") as f:
        f.write(header + b"".join(body))
    print(f"make_task.py: {n} examples of {a.ctx} context + {a.comp} tokens, {a.choices} choices "
          f"(chance {100.0 / a.choices:.0f}%), from {len(tok)} tokens of {a.shard} -> {a.out}")


if __name__ == "__main__":
    main()
