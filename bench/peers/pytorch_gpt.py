#!/usr/bin/env python3
"""The PyTorch reference of fp8train's GPU benchmark (issue 14): the same model shapes trained
the way PyTorch users train them -- torch.compile, autocast BF16 over FP32 master weights, fused
AdamW, gradient clipping, F.scaled_dot_product_attention -- on synthetic tokens, and, when
torchao is importable, torchao's float8 training (tensorwise scaling, the LM head left in BF16
as fp8train leaves it). One JSON line per run on stdout:

  {"model": "gpt2-124m", "batch": 32, "seq": 1024, "precision": "bf16", "tokens_per_s": ...,
   "peak_gib": ..., "step_ms": ..., "params": ..., "compile": "regional", "torch": "2.11.0"}

tokens/s is B*T over the median time of the timed steps (each step synchronized, as
gpu_bench's), after the warm-up steps (the first of which compiles); peak_gib is
torch.cuda.max_memory_allocated over the whole run (weights, AdamW state, activations).

  pytorch_gpt.py --model gpt2-124m --batch 32                  bf16, and torchao fp8 if present
  pytorch_gpt.py --model llama-1b --batch 16 --precision bf16
  pytorch_gpt.py --dry-run --model all                         shapes and parameter counts only
  pytorch_gpt.py --table RESULTS.jsonl                         the markdown table of bench/gpu.sh

The shapes mirror src/model/config.c's presets: GPT-2 (LayerNorm, GELU tanh, learned positions,
biases, head tied to wte) and llama-1b (Llama-3.2-1B: RMSNorm, SwiGLU, RoPE theta 5e5 with
Llama-3 scaling, 32 query heads on 8 K/V heads, tied head). --compile regional (the default)
compiles one transformer block, shared by every layer, and the head + loss: the compile time
does not grow with depth, so the four models of bench/gpu.sh --peers fit a few minutes;
--compile full compiles the whole model as one graph.

torch is imported only to run a model: --help, --dry-run and --table work without it.
"""
import argparse
import json
import math
import statistics
import sys
import time

# ---- the presets (src/model/config.c) ----

PRESETS = {
    "gpt2-124m": dict(arch="gpt2", n_layer=12, n_embd=768, n_head=12, n_kv_head=12,
                      vocab=50257, mlp_hidden=3072, max_seq=1024),
    "gpt2-350m": dict(arch="gpt2", n_layer=24, n_embd=1024, n_head=16, n_kv_head=16,
                      vocab=50257, mlp_hidden=4096, max_seq=1024),
    "gpt2-1.5b": dict(arch="gpt2", n_layer=48, n_embd=1600, n_head=25, n_kv_head=25,
                      vocab=50257, mlp_hidden=6400, max_seq=1024),
    "llama-1b": dict(arch="llama", n_layer=16, n_embd=2048, n_head=32, n_kv_head=8,
                     vocab=128256, mlp_hidden=8192, max_seq=2048, rope_theta=500000.0,
                     rope_scaling=dict(factor=32.0, low=1.0, high=4.0, original_max_pos=8192)),
}
NORM_EPS = 1e-5


def param_count(cfg):
    """Parameters of the model build_model makes (the tied head counted once), by arithmetic:
    --dry-run checks it against fp8train's parameter table without torch, and a run checks it
    against the module's own count."""
    C, L, V, F = cfg["n_embd"], cfg["n_layer"], cfg["vocab"], cfg["mlp_hidden"]
    D = C // cfg["n_head"]
    qkv_out = (cfg["n_head"] + 2 * cfg["n_kv_head"]) * D
    if cfg["arch"] == "gpt2":
        per_layer = (2 * C + C * qkv_out + qkv_out + C * C + C + 2 * C + C * F + F + F * C + C)
        return V * C + cfg["max_seq"] * C + L * per_layer + 2 * C
    per_layer = C + C * qkv_out + C * C + C + 3 * C * F
    return V * C + L * per_layer + C


def rope_inv_freq(head_dim, theta, scaling):
    """RoPE frequencies, with Llama 3's scaling: wavelengths beyond original_max_pos / low are
    stretched by factor, those below original_max_pos / high kept, the band between blended."""
    inv = [theta ** (-2.0 * i / head_dim) for i in range(head_dim // 2)]
    if not scaling:
        return inv
    factor, lo, hi = scaling["factor"], scaling["low"], scaling["high"]
    orig = scaling["original_max_pos"]
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < orig / hi:
            out.append(f)
        elif wavelen > orig / lo:
            out.append(f / factor)
        else:
            smooth = (orig / wavelen - lo) / (hi - lo)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


# ---- the model (torch is passed in: the module imports without it) ----

def build_model(torch, cfg, seq):
    nn, F = torch.nn, torch.nn.functional
    C, H, HKV = cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"]
    D = C // H
    gpt2 = cfg["arch"] == "gpt2"

    def rope(x, cos, sin):  # x [B, h, T, D], cos/sin [T, D/2]: rotate the two halves (the
        x1, x2 = x[..., : D // 2], x[..., D // 2:]  # Hugging Face layout), pair i with i + D/2
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            norm = (lambda: nn.LayerNorm(C, eps=NORM_EPS)) if gpt2 else \
                (lambda: nn.RMSNorm(C, eps=NORM_EPS))
            self.ln1, self.ln2 = norm(), norm()
            self.qkv = nn.Linear(C, (H + 2 * HKV) * D, bias=gpt2)
            self.proj = nn.Linear(C, C, bias=gpt2)
            if gpt2:
                self.fc1 = nn.Linear(C, cfg["mlp_hidden"])
                self.fc2 = nn.Linear(cfg["mlp_hidden"], C)
            else:
                self.gate = nn.Linear(C, cfg["mlp_hidden"], bias=False)
                self.up = nn.Linear(C, cfg["mlp_hidden"], bias=False)
                self.down = nn.Linear(cfg["mlp_hidden"], C, bias=False)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split([H * D, HKV * D, HKV * D], dim=-1)
            q = q.view(B, T, H, D).transpose(1, 2)
            k = k.view(B, T, HKV, D).transpose(1, 2)
            v = v.view(B, T, HKV, D).transpose(1, 2)
            if not gpt2:
                q, k = rope(q, cos, sin), rope(k, cos, sin)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=HKV != H)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            h = self.ln2(x)
            if gpt2:
                return x + self.fc2(F.gelu(self.fc1(h), approximate="tanh"))
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(cfg["vocab"], C)
            self.wpe = nn.Embedding(cfg["max_seq"], C) if gpt2 else None
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["n_layer"]))
            self.ln_f = nn.LayerNorm(C, eps=NORM_EPS) if gpt2 else nn.RMSNorm(C, eps=NORM_EPS)
            self.lm_head = nn.Linear(C, cfg["vocab"], bias=False)
            self.lm_head.weight = self.wte.weight  # tied, as every preset here
            if gpt2:
                cos = sin = torch.zeros(1)
            else:
                inv = torch.tensor(rope_inv_freq(D, cfg["rope_theta"], cfg["rope_scaling"]),
                                   dtype=torch.float64)
                ang = torch.outer(torch.arange(seq, dtype=torch.float64), inv)  # [T, D/2]
                cos, sin = ang.cos().float(), ang.sin().float()
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

        def head_loss(self, x, targets):
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

        def forward(self, idx, targets):
            x = self.wte(idx)
            if gpt2:
                x = x + self.wpe(torch.arange(idx.size(1), device=idx.device))
            for b in self.blocks:
                x = b(x, self.cos, self.sin)
            return self.head_loss(x, targets)

    model = GPT()
    # GPT-2's initialisation (fp8train's too, src/model/init.c): N(0, 0.02) weights and
    # embeddings, N(0, 0.02/sqrt(2L)) for the projections into the residual stream, zero
    # biases, unit norm weights. PyTorch's defaults (N(0, 1) embeddings, which the tied head then
    # uses) start the loss near 90 instead of ln(V).
    resid = {id(getattr(b, n)) for b in model.blocks for n in ("proj", "fc2", "down")
             if hasattr(b, n)}
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                std = 0.02 / math.sqrt(2 * cfg["n_layer"]) if id(mod) in resid else 0.02
                nn.init.normal_(mod.weight, mean=0.0, std=std)
            if isinstance(mod, nn.Linear) and mod.bias is not None:
                nn.init.zeros_(mod.bias)
    return model


# ---- one run ----

def torchao_available():
    import importlib.util
    return importlib.util.find_spec("torchao") is not None


def run(torch, name, cfg, args, precision):
    import gc
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    B, T = args.batch, args.seq
    with torch.device("cuda"):
        model = build_model(torch, cfg, T)
    n_params = sum(p.numel() for p in model.parameters())
    if n_params != param_count(cfg):
        raise RuntimeError(f"{n_params} parameters, param_count says {param_count(cfg)}")
    if precision == "torchao-fp8":
        from torchao.float8 import convert_to_float8_training
        # tensorwise dynamic scaling (the default config); the head stays BF16 (its weight is
        # the embedding's, and fp8train's head defaults to BF16)
        def fp8_ok(m, fqn):
            return (isinstance(m, torch.nn.Linear) and fqn != "lm_head"
                    and m.in_features % 16 == 0 and m.out_features % 16 == 0)
        convert_to_float8_training(model, module_filter_fn=fp8_ok)
    if args.compile == "full":
        model = torch.compile(model)
    elif args.compile == "regional":
        for b in model.blocks:  # one compiled graph, reused by every layer
            b.compile()
        model.head_loss = torch.compile(model.head_loss)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    g = torch.Generator(device="cuda").manual_seed(1337)
    idx = torch.randint(0, cfg["vocab"], (B, T), device="cuda", generator=g)
    tgt = torch.roll(idx, -1, dims=1)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.perf_counter()
    for _ in range(args.warmup):
        loss = step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    out = dict(model=name, batch=B, seq=T, precision=precision, tokens_per_s=round(B * T / med),
               peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2),
               step_ms=round(med * 1e3, 2), params=n_params, loss=round(float(loss.detach()), 4),
               warmup_s=round(warm_s, 1), compile=args.compile, torch=torch.__version__)
    del model, opt
    return out


# ---- the markdown table of bench/gpu.sh --peers ----

def table(path):
    """Rows of {"source": "fp8train"|"peer", model, batch, precision, tokens_per_s, peak_gib}
    (one JSON object a line) as issue 14's table, with the ratios to PyTorch BF16."""
    rows = {}
    order = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            key = (r["model"], int(r["batch"]))
            if key not in rows:
                rows[key] = {}
                order.append(key)
            col = {"bf16": "bf16", "fp8-delayed": "fp8", "torchao-fp8": "fp8"}.get(r["precision"])
            if col and r.get("tokens_per_s"):
                rows[key][(r.get("source", "peer"), col)] = r

    def cell(r):
        if not r:
            return "n/a"
        tps = r["tokens_per_s"]
        s = f"{tps / 1e3:.1f}K" if tps < 1e5 else f"{tps / 1e3:.0f}K"
        return f"{s}, {r['peak_gib']:.1f} GiB"

    def ratio(a, b, field):
        return f"{a[field] / b[field]:.2f}" if a and b and b[field] else "n/a"

    lines = ["| model, batch | fp8train BF16 | fp8train FP8 delayed | PyTorch BF16 | torchao FP8 "
             "| speed BF16 / FP8 vs PyTorch BF16 | memory BF16 / FP8 vs PyTorch BF16 |",
             "|---|---|---|---|---|---|---|"]
    for key in order:
        c = rows[key]
        fb, ff = c.get(("fp8train", "bf16")), c.get(("fp8train", "fp8"))
        pb, pf = c.get(("peer", "bf16")), c.get(("peer", "fp8"))
        lines.append(f"| {key[0]}, {key[1]} | {cell(fb)} | {cell(ff)} | {cell(pb)} | {cell(pf)} "
                     f"| {ratio(fb, pb, 'tokens_per_s')} / {ratio(ff, pb, 'tokens_per_s')} "
                     f"| {ratio(fb, pb, 'peak_gib')} / {ratio(ff, pb, 'peak_gib')} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2-124m",
                    help="comma-separated presets (%s) or all" % ", ".join(PRESETS))
    ap.add_argument("--batch", type=int, default=32, help="sequences per step (default 32)")
    ap.add_argument("--seq", type=int, default=1024, help="tokens per sequence (default 1024)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps, compile included")
    ap.add_argument("--steps", type=int, default=8, help="timed steps (default 8)")
    ap.add_argument("--precision", default="auto",
                    help="comma-separated: bf16, torchao-fp8; auto = bf16, and torchao-fp8 "
                         "when torchao is importable")
    ap.add_argument("--compile", choices=["regional", "full", "none"], default="regional")
    ap.add_argument("--dry-run", action="store_true",
                    help="print each model's shape and parameter count; no torch needed")
    ap.add_argument("--table", metavar="JSONL", help="print the markdown table of these results")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    names = list(PRESETS) if args.model == "all" else args.model.split(",")
    for n in names:
        if n not in PRESETS:
            ap.error(f"--model {n}: not one of {', '.join(PRESETS)}")
        if args.seq > PRESETS[n]["max_seq"]:
            ap.error(f"--seq {args.seq} exceeds {n}'s {PRESETS[n]['max_seq']} positions")
    if args.batch < 1 or args.seq < 1 or args.warmup < 1 or args.steps < 1:
        ap.error("--batch, --seq, --warmup and --steps must be at least 1")
    if args.dry_run:
        for n in names:
            print(json.dumps(dict(model=n, params=param_count(PRESETS[n]), **PRESETS[n])))
        return 0
    precs = args.precision.split(",")
    if precs == ["auto"]:
        precs = ["bf16"] + (["torchao-fp8"] if torchao_available() else [])
        for n in names if len(precs) == 1 else []:
            print(json.dumps(dict(model=n, batch=args.batch, seq=args.seq,
                                  precision="torchao-fp8", skipped="torchao not importable")))
    for p in precs:
        if p not in ("bf16", "torchao-fp8"):
            ap.error(f"--precision {p}: expected bf16 or torchao-fp8")
    try:
        import torch
    except ImportError:
        print("pytorch_gpt.py: PyTorch is not installed (pip install torch)", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("pytorch_gpt.py: no CUDA device", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    status = 0
    for n in names:
        for p in precs:
            try:
                print(json.dumps(run(torch, n, PRESETS[n], args, p)), flush=True)
            except Exception as e:  # an OOM or a missing kernel: report it, go on
                print(json.dumps(dict(model=n, batch=args.batch, seq=args.seq, precision=p,
                                      error=f"{type(e).__name__}: {str(e)[:300]}")), flush=True)
                status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
