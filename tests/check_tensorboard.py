#!/usr/bin/env python3
"""Reads a run's --tensorboard directory with the `tensorboard` Python package, as TensorBoard
itself does, and checks it against the run's metrics.jsonl and stats.jsonl.

usage: check_tensorboard.py RUN_DIR TB_DIR [--serve]

  1. EventAccumulator (TensorBoard's own event-file loader): every metrics.jsonl row's loss,
     lr, grad_norm, val_loss and tokens_per_s at its step, every stats.jsonl statistic
     (micro-batch 0) under inspect/layerNN.module.gemm.tensor/stat, equal as float32.
  2. --serve: starts `tensorboard --logdir TB_DIR` on a free local port and asks its HTTP API
     for the tags and the loss series, as the browser does.

Prints PASS/FAIL lines (suite tensorboard_py); exit status 0 when everything passed, 3 when the
package is missing (the caller prints SKIP)."""
import json
import math
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request

SUITE = "tensorboard_py"
failures = 0


def check(name, ok, why=""):
    global failures
    if ok:
        print(f"PASS {SUITE}: {name}")
    else:
        failures += 1
        print(f"FAIL {SUITE}: {name}: {why}")


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_accumulator(run, tb):
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(tb, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    series = {t: {e.step: e.value for e in acc.Scalars(t)} for t in tags}
    rows = jsonl(os.path.join(run, "metrics.jsonl"))
    keys = ["loss", "lr", "grad_norm", "tokens_per_s"]
    if any(r.get("val_loss") is not None for r in rows):
        keys.append("val_loss")
    for key in keys:
        check(f"tag {key}", key in tags, f"tags: {sorted(tags)[:10]}")
    # after a resume into the directory, the steps it re-ran must be there once: TensorBoard
    # purged the first take (the session START event)
    loss_steps = [e.step for e in acc.Scalars("loss")] if "loss" in tags else []
    check("each step once", len(loss_steps) == len(set(loss_steps)),
          f"steps {loss_steps}")
    bad = []
    for row in rows:
        for key in ("loss", "lr", "grad_norm", "val_loss"):
            if row.get(key) is None:
                continue
            got = series.get(key, {}).get(row["step"])
            if got is None or got != f32(row[key]):
                bad.append((row["step"], key, got, row[key]))
        got = series.get("tokens_per_s", {}).get(row["step"])
        if got is None or abs(got - row["tokens_per_s"]) > 1e-5 * row["tokens_per_s"]:
            bad.append((row["step"], "tokens_per_s", got, row["tokens_per_s"]))
    check(f"metrics.jsonl ({len(rows)} steps) equals the scalars", rows and not bad, str(bad[:5]))
    n = 0
    bad = []
    stats_path = os.path.join(run, "stats.jsonl")
    if not os.path.exists(stats_path):
        return
    # a resumed run appends the rows of the steps it re-runs: the last row of a site wins
    last = {}
    for row in jsonl(stats_path):
        if row["micro"] != 0:
            continue
        layer = "head" if row["layer"] < 0 else "layer%02d" % row["layer"]
        site = f"{layer}.{row['module']}.{row['gemm']}.{row['tensor']}"
        last[(row["step"], site)] = row
    for (_, site), row in last.items():
        for stat in ("underflow_pct", "saturation_pct", "sqnr_db", "scale", "amax"):
            want = row.get(stat)
            # None (null), or beyond float32 (1e300: the SQNR of an exact image): left out
            if want is None or not math.isfinite(want) or abs(want) > 3.4028234663852886e38:
                continue
            n += 1
            got = series.get(f"inspect/{site}/{stat}", {}).get(row["step"])
            if got is None or got != f32(want):
                bad.append((row["step"], site, stat, got, want))
    check(f"stats.jsonl ({n} values) equals the inspect/ scalars", n > 0 and not bad,
          str(bad[:5]) if bad else "no statistics")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def check_server(run, tb):
    port = free_port()
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", tb, "--port", str(port),
           "--host", "127.0.0.1", "--reload_interval", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        tags = None
        deadline = time.time() + 90
        while time.time() < deadline and proc.poll() is None:
            try:
                tags = get(base + "/data/plugin/scalars/tags")
                if tags and any("loss" in t for t in tags.values()):
                    break
            except OSError:
                pass
            time.sleep(1)
        check("tensorboard server lists the run's scalar tags",
              tags and any("loss" in t for t in tags.values()),
              f"tags {tags!r}; server exit {proc.poll()}")
        if not tags:
            return
        run_name = next(r for r, t in tags.items() if "loss" in t)
        pts = get(f"{base}/data/plugin/scalars/scalars?run={run_name}&tag=loss")
        rows = jsonl(os.path.join(run, "metrics.jsonl"))
        want = [(r["step"], f32(r["loss"])) for r in rows if r.get("loss") is not None]
        got = [(p[1], p[2]) for p in pts]
        check("tensorboard server's loss series equals metrics.jsonl", got == want,
              f"{got[:3]} vs {want[:3]}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return 3
    run, tb = sys.argv[1], sys.argv[2]
    check_accumulator(run, tb)
    if "--serve" in sys.argv[3:]:
        check_server(run, tb)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
