#!/usr/bin/env python3
"""The Hugging Face `transformers` BF16 inference reference of `fp8train bench-infer` (issue 21):
the same model shape built with transformers' own classes (GPT2LMHeadModel, LlamaForCausalLM)
from a config, random weights (no download), BF16 on CUDA, SDPA attention; prefill and decode
tokens/s with a KV cache and the peak device memory, at the batch sizes, prompt length, decode
steps and repetitions of bench-infer. One JSON line per configuration on stdout:

  {"source": "transformers", "model": "gpt2-1.5b", "precision": "bf16", "batch": 64,
   "method": "loop", "prefill_tokens_per_s": ..., "decode_tokens_per_s": ..., "peak_bytes": ...,
   "ok": true, ...}

Timing mirrors bench-infer's: one untimed warm-up round (prefill + 2 decode steps; all of them
with --compile), then --repeat rounds on a fresh cache, the fastest prefill and the fastest
decode kept. prefill tokens/s = B * prompt_len / prefill time (the prompts in one forward, the
cache written, the last position's logits only where the model takes logits_to_keep, as
bench-infer computes only those); decode tokens/s = B * gen / time of gen steps of one token per
sequence against the cache. Like bench-infer, each step feeds a fixed token per sequence (no
sampling) and the device is synchronized once at the end of the timed steps, which can only
favour the reference. Two decode methods:
  loop      a manual loop of model(..., past_key_values=cache): DynamicCache, eager; with
            --compile a StaticCache and the forward compiled (mode reduce-overhead, CUDA graphs)
            for the decode steps (the prefill stays eager)
  generate  model.generate with min_new_tokens = max_new_tokens, greedy: prefill = generate of
            1 new token, decode = generate of gen + 1 tokens minus that (generate adds logits
            processors and a stopping check with a host sync per step)
Both by default; the table compares fp8train against the faster of the two (for each rate).
peak_bytes is torch.cuda.max_memory_allocated from the model's weights on, per batch (the
counter reset before each).

  hf_infer.py --model gpt2-1.5b --batch 1,64             both methods, eager
  hf_infer.py --model llama-1b --method loop --compile
  hf_infer.py --dry-run --model all                      the transformers configs, no torch
  hf_infer.py --table FILE...                            the markdown table of bench/gpu_infer.sh:
                                                         bench-infer --out JSON files and these
                                                         JSON lines

The shapes are bench/peers/pytorch_gpt.py's PRESETS (tests/test_peers_script.c checks them
against src/model/config.c): GPT-2 1.5B = GPT2Config(n_embd 1600, n_layer 48, n_head 25, vocab
50257, n_positions 1024, GELU tanh, tied head); llama-1b = Llama-3.2-1B's LlamaConfig (hidden
2048, intermediate 8192, 16 layers, 32 heads on 8 K/V heads, vocab 128256, RoPE theta 5e5 with
llama3 scaling factor 32, tied embeddings). torch and transformers are imported only to run a
model: --help, --dry-run and --table work without them.
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree for the import below
# the presets' shapes are pytorch_gpt.py's, one table for both peer scripts
from pytorch_gpt import NORM_EPS, PRESETS, param_count, rope_inv_freq  # noqa: E402

MODELS = ["gpt2-1.5b", "llama-1b"]


def hf_config_args(name):
    """The keyword arguments of the transformers config class of preset `name`: (class name,
    dict). Plain data, so --dry-run shows exactly what a run builds."""
    p = PRESETS[name]
    if p["arch"] == "gpt2":
        return "GPT2Config", dict(
            vocab_size=p["vocab"], n_positions=p["max_seq"], n_embd=p["n_embd"],
            n_layer=p["n_layer"], n_head=p["n_head"], n_inner=p["mlp_hidden"],
            activation_function="gelu_new", layer_norm_epsilon=NORM_EPS,
            tie_word_embeddings=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    rs = p["rope_scaling"]
    return "LlamaConfig", dict(
        vocab_size=p["vocab"], hidden_size=p["n_embd"], intermediate_size=p["mlp_hidden"],
        num_hidden_layers=p["n_layer"], num_attention_heads=p["n_head"],
        num_key_value_heads=p["n_kv_head"], head_dim=p["n_embd"] // p["n_head"],
        max_position_embeddings=p["max_seq"], rms_norm_eps=NORM_EPS,
        rope_theta=p["rope_theta"], hidden_act="silu", attention_bias=False, mlp_bias=False,
        tie_word_embeddings=True,
        rope_scaling=dict(rope_type="llama3", factor=rs["factor"], low_freq_factor=rs["low"],
                          high_freq_factor=rs["high"],
                          original_max_position_embeddings=rs["original_max_pos"]))


def build(torch, transformers, name):
    """The model on CUDA with transformers' own random init, then its parameters cast to BF16
    (the FP32 copy freed before anything is measured; nothing is read from the Hub)."""
    import inspect
    cls_name, kw = hf_config_args(name)
    cls = getattr(transformers, cls_name)
    if "rope_scaling" in kw and "rope_parameters" in inspect.signature(cls.__init__).parameters:
        # transformers 5 keeps theta and the scaling in one dict, rope_parameters
        kw = dict(kw)
        kw["rope_parameters"] = dict(kw.pop("rope_scaling"), rope_theta=kw.pop("rope_theta"))
    cfg = cls(**kw)
    try:
        cfg._attn_implementation = "sdpa"
    except (AttributeError, ValueError):
        pass  # the version's default (sdpa where torch has it)
    model_cls = (transformers.GPT2LMHeadModel if cls_name == "GPT2Config"
                 else transformers.LlamaForCausalLM)
    with torch.device("cuda"):
        model = model_cls(cfg)
    # the parameters only: the buffers (RoPE's FP32 frequencies) stay as transformers makes
    # them when it loads a BF16 checkpoint; the tied head is the embedding's Parameter (once)
    for prm in model.parameters():
        prm.data = prm.data.to(torch.bfloat16)
    model.eval()
    torch.cuda.empty_cache()
    p = PRESETS[name]
    if p["arch"] == "llama":  # the frequencies transformers built = fp8train's (theta, llama3)
        want = rope_inv_freq(p["n_embd"] // p["n_head"], p["rope_theta"], p["rope_scaling"])
        got = model.model.rotary_emb.inv_freq.float().cpu().tolist()
        if len(got) != len(want) or any(abs(a - b) > 1e-5 * abs(b) for a, b in zip(got, want)):
            raise RuntimeError("transformers' RoPE frequencies differ from the preset's")
    return model


def fwd_kwargs(model):
    """logits_to_keep=1 where the model takes it (older transformers: num_logits_to_keep)."""
    import inspect
    params = inspect.signature(model.forward).parameters
    for k in ("logits_to_keep", "num_logits_to_keep"):
        if k in params:
            return {k: 1}
    return {}


def static_cache(transformers, model, batch, max_len, torch):
    """A StaticCache across transformers versions: newer ones take (config, max_cache_len) and
    size the layers from the first update; older ones want the batch, device and dtype."""
    import inspect
    params = inspect.signature(transformers.StaticCache.__init__).parameters
    kw = dict(config=model.config, max_cache_len=max_len)
    for k in ("max_batch_size", "batch_size"):
        if k in params:
            kw[k] = batch
            break
    if "device" in params:
        kw["device"] = torch.device("cuda")
    if "dtype" in params:
        kw["dtype"] = torch.bfloat16
    return transformers.StaticCache(**kw)


def run_loop(torch, transformers, model, B, args, compiled):
    V = model.config.vocab_size
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    prompt = torch.randint(0, V, (B, args.prompt_len), device="cuda", generator=g)
    nxt = torch.randint(0, V, (B, 1), device="cuda", generator=g)
    kw = fwd_kwargs(model)
    P, G = args.prompt_len, args.gen
    best_p = best_d = math.inf
    # compiled: one StaticCache for every round (the CUDA graphs hold its addresses; a new
    # cache would recompile), cleared between rounds
    cache = static_cache(transformers, model, B, P + G, torch) if compiled else None
    for it in range(args.repeat + 1):
        if compiled:
            if hasattr(cache, "reset"):
                cache.reset()
            extra = dict(cache_position=torch.arange(P, device="cuda"))
        else:
            cache = transformers.DynamicCache()
            extra = {}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            model(input_ids=prompt, past_key_values=cache, use_cache=True, **kw, **extra)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        steps = G if (it > 0 or compiled) else min(G, 2)
        step_fn = compiled or model
        with torch.no_grad():
            for j in range(steps):
                if compiled:
                    pos = torch.full((1,), P + j, dtype=torch.long, device="cuda")
                    step_fn(input_ids=nxt, past_key_values=cache, use_cache=True,
                            cache_position=pos)
                else:
                    step_fn(input_ids=nxt, past_key_values=cache, use_cache=True)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if it > 0:
            best_p, best_d = min(best_p, t1 - t0), min(best_d, t2 - t1)
    return best_p, best_d, "logits_to_keep=1" if kw else "all positions"


def run_generate(torch, model, B, args):
    V = model.config.vocab_size
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    prompt = torch.randint(0, V, (B, args.prompt_len), device="cuda", generator=g)
    mask = torch.ones_like(prompt)

    def gen(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=n,
                                 min_new_tokens=n, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        assert out.shape[1] == args.prompt_len + n, "generate stopped early"
        return time.perf_counter() - t0

    gen(min(args.gen, 2) + 1)  # warm-up
    best_p = best_d = math.inf
    for _ in range(args.repeat):
        tp = gen(1)
        ta = gen(args.gen + 1)
        best_p, best_d = min(best_p, tp), min(best_d, max(ta - tp, 1e-9))
    return best_p, best_d, "generate's"


def run(args):
    try:
        import torch
        import transformers
    except ImportError as e:  # a line the table shows, not only a traceback
        for name in args.model:
            print(json.dumps(dict(source="transformers", precision="bf16", model=name,
                                  ok=False, error="import: %s" % e)), flush=True)
        return 1
    base = dict(source="transformers", precision="bf16", prompt_len=args.prompt_len,
                gen=args.gen, repeat=args.repeat, torch=torch.__version__,
                transformers=transformers.__version__)
    for name in args.model:
        try:
            torch.cuda.reset_peak_memory_stats()
            model = build(torch, transformers, name)
            n = sum(p.numel() for p in model.parameters())  # tied: counted once
            want = param_count(PRESETS[name])
            if n != want:
                raise RuntimeError("%d parameters, fp8train's preset has %d" % (n, want))
            wbytes = sum(p.numel() * p.element_size() for p in model.parameters())
            compiled = None
            if args.compile:
                compiled = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        except Exception as e:  # one line saying why, the other models still run
            print(json.dumps(dict(base, model=name, ok=False, error="build: %s" % e)),
                  flush=True)
            continue
        for B in args.batch:
            for method in args.method:
                row = dict(base, model=name, batch=B, method=method, params=n,
                           weight_bytes=wbytes,
                           attn=getattr(model.config, "_attn_implementation", None),
                           compile=bool(args.compile and method == "loop"))
                try:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                    if method == "loop":
                        p, d, logits = run_loop(torch, transformers, model, B, args, compiled)
                        row["cache"] = "StaticCache" if compiled else "DynamicCache"
                    else:
                        p, d, logits = run_generate(torch, model, B, args)
                        row["cache"] = "generate's default"
                    row.update(ok=True, prefill_logits=logits,
                               prefill_tokens_per_s=B * args.prompt_len / p,
                               decode_tokens_per_s=B * args.gen / d if args.gen else 0.0,
                               prefill_s=p, decode_s=d,
                               peak_bytes=torch.cuda.max_memory_allocated())
                except Exception as e:
                    row.update(ok=False, error="%s: %s" % (type(e).__name__, e))
                print(json.dumps(row), flush=True)
        del model, compiled
        torch.cuda.empty_cache()


# ---- the markdown table (no torch) ----

def load_results(paths):
    """Rows {model, batch, engine, ...} from bench-infer --out files (one JSON object with
    "results") and from this script's JSON lines."""
    rows = []
    for path in paths:
        with open(path) as f:
            text = f.read()
        try:
            whole = json.loads(text)
        except ValueError:
            whole = None
        if isinstance(whole, dict) and "results" in whole:
            for r in whole["results"]:
                rows.append(dict(r, model=whole.get("model"), engine="fp8train",
                                 prompt_len=whole.get("prompt_len"), gen=whole.get("gen")))
            continue
        for line in text.splitlines():
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("source") == "transformers":
                rows.append(dict(r, engine="transformers"))
    return rows


def fmt_tps(x):
    return "{:,.0f}".format(x) if x is not None else "n/a"


def fmt_gib(b):
    return "%.2f" % (b / 2**30) if b is not None else "n/a"


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt_ratio(x):
    return "%.2f×" % x if x is not None else "n/a"


def table(paths, out=sys.stdout):
    rows = load_results(paths)
    models = []
    for r in rows:
        if r.get("model") not in models:
            models.append(r.get("model"))

    def ok_rows(model, batch, engine, precision):
        return [r for r in rows if r.get("model") == model and r.get("batch") == batch
                and r["engine"] == engine and r.get("precision") == precision and r.get("ok")]

    def pick(model, batch, engine, precision):
        c = ok_rows(model, batch, engine, precision)
        return c[0] if c else None

    def best(model, batch, key):
        """transformers' best value of key at (model, batch) over its methods"""
        v = [r.get(key) for r in ok_rows(model, batch, "transformers", "bf16")]
        v = [x for x in v if x is not None]
        return max(v) if v else None

    def val(r, k):
        return r.get(k) if r else None

    w = out.write
    w("| model | batch | run | prefill tok/s | decode tok/s | peak GiB |\n")
    w("| --- | --- | --- | --- | --- | --- |\n")
    for m in models:
        batches = sorted({r["batch"] for r in rows if r.get("model") == m and "batch" in r})
        for b in batches:
            f8 = pick(m, b, "fp8train", "fp8")
            how = [x for x in (
                f8 and f8.get("fp8_activations"),
                f8 and f8.get("kv_cache") and "KV " + f8["kv_cache"],
                f8 and f8.get("fp8_head") and "head fp8") if x]
            runs = [("fp8train BF16", pick(m, b, "fp8train", "bf16")),
                    ("fp8train FP8" + (" (%s)" % ", ".join(how) if how else ""), f8)]
            ref = ok_rows(m, b, "transformers", "bf16")
            for r in ref:  # one row per decode method
                runs.append(("transformers BF16 (%s%s)" % (
                    r.get("method"), ", compiled" if r.get("compile") else ""), r))
            if not ref:
                runs.append(("transformers BF16", None))
            for label, r in runs:
                w("| %s | %d | %s | %s | %s | %s |\n" % (
                    m, b, label, fmt_tps(val(r, "prefill_tokens_per_s")),
                    fmt_tps(val(r, "decode_tokens_per_s")), fmt_gib(val(r, "peak_bytes"))))
    w("\n| model | batch | FP8/BF16 prefill | FP8/BF16 decode | FP8/BF16 peak "
      "| BF16 peak − weights − KV (GB) | fp8train/transformers BF16 decode "
      "| fp8train/transformers BF16 prefill | targets (issue 21) |\n")
    w("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
    for m in models:
        batches = sorted({r["batch"] for r in rows if r.get("model") == m and "batch" in r})
        for b in batches:
            b16, f8 = pick(m, b, "fp8train", "bf16"), pick(m, b, "fp8train", "fp8")
            rp = ratio(val(f8, "prefill_tokens_per_s"), val(b16, "prefill_tokens_per_s"))
            rd = ratio(val(f8, "decode_tokens_per_s"), val(b16, "decode_tokens_per_s"))
            rm = ratio(val(f8, "peak_bytes"), val(b16, "peak_bytes"))
            over = None
            if b16 and b16.get("peak_bytes") is not None:
                over = (b16["peak_bytes"] - b16.get("weight_bytes", 0) -
                        b16.get("other_bytes", 0) - b16.get("kv_cache_bytes", 0)) / 1e9
            hd = ratio(val(b16, "decode_tokens_per_s"), best(m, b, "decode_tokens_per_s"))
            hp = ratio(val(b16, "prefill_tokens_per_s"), best(m, b, "prefill_tokens_per_s"))
            # the targets: FP8 peak <= 0.6x BF16; BF16 peak <= weights + KV + 2 GB; at batch
            # >= 64 FP8 >= 1.5x BF16 in prefill and decode; fp8train BF16 decode >= transformers
            checks = [("FP8 peak ≤ 0.6×", rm, rm is not None and rm <= 0.6),
                      ("BF16 overhead ≤ 2 GB", over, over is not None and over <= 2.0)]
            if b >= 64:
                checks.append(("FP8 ≥ 1.5× BF16", rp if rp is None or rd is None
                               else min(rp, rd),
                               rp is not None and rd is not None and min(rp, rd) >= 1.5))
            checks.append(("BF16 decode ≥ transformers", hd, hd is not None and hd >= 1.0))
            missed = [n + (" (n/a)" if v is None else "") for n, v, ok in checks if not ok]
            w("| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n" % (
                m, b, fmt_ratio(rp), fmt_ratio(rd), fmt_ratio(rm),
                "%.2f" % over if over is not None else "n/a", fmt_ratio(hd), fmt_ratio(hp),
                "all met" if not missed else "missed: " + ", ".join(missed)))
    ref = [r for r in rows if r["engine"] == "transformers" and r.get("ok")]
    ref = [r for r in rows if r["engine"] == "transformers" and r.get("ok")]
    if ref:
        w("\ntransformers %s, torch %s. fp8train/transformers: against the faster transformers "
          "method of each row (loop: a manual decode loop on a KV cache; generate: "
          "model.generate).\n" % (ref[0].get("transformers"), ref[0].get("torch")))
    for r in rows:
        if not r.get("ok"):
            what = [r["engine"], str(r.get("model")), r.get("precision", "")]
            if "batch" in r:
                what.append("batch %s" % r["batch"])
            w("failed: %s%s\n" % (" ".join(x for x in what if x),
                                   ": " + r["error"] if r.get("error") else ""))


def batch_list(s):
    try:
        v = [int(x) for x in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("expected batch sizes such as 1,64")
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError("expected batch sizes such as 1,64")
    return v


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2-1.5b",
                    help="comma-separated of %s, or all (default gpt2-1.5b)" % ", ".join(MODELS))
    ap.add_argument("--batch", type=batch_list, default=[1, 64],
                    help="batch sizes (default 1,64, as bench-infer)")
    ap.add_argument("--prompt-len", type=int, default=128, help="prompt tokens (default 128)")
    ap.add_argument("--gen", type=int, default=32, help="decode steps timed (default 32)")
    ap.add_argument("--repeat", type=int, default=2, help="timed rounds, fastest kept (2)")
    ap.add_argument("--seed", type=int, default=1337, help="prompt tokens (default 1337)")
    ap.add_argument("--method", default="loop,generate",
                    help="comma-separated of loop, generate (default both)")
    ap.add_argument("--compile", action="store_true",
                    help="loop: StaticCache and the decode step under torch.compile "
                         "(reduce-overhead)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print each model's transformers config and parameter count")
    ap.add_argument("--table", nargs="+", metavar="FILE",
                    help="print the markdown table of bench-infer JSON files and these lines")
    args = ap.parse_args(argv)
    if args.table:
        try:
            table(args.table)
        except OSError as e:
            ap.exit(2, "hf_infer.py: %s\n" % e)
        return 0
    args.model = MODELS if args.model == "all" else args.model.split(",")
    args.method = args.method.split(",")
    for m in args.model:
        if m not in MODELS:
            ap.error("--model %s: expected one of %s or all" % (m, ", ".join(MODELS)))
    for m in args.method:
        if m not in ("loop", "generate"):
            ap.error("--method %s: expected loop, generate" % m)
    if args.prompt_len < 1 or args.gen < 0 or args.repeat < 1:
        ap.error("--prompt-len >= 1, --gen >= 0 and --repeat >= 1 expected")
    for m in args.model:
        if args.prompt_len + args.gen > PRESETS[m]["max_seq"]:
            ap.error("--prompt-len + --gen exceed %s's %d positions" % (m, PRESETS[m]["max_seq"]))
    if args.dry_run:
        for m in args.model:
            cls, kw = hf_config_args(m)
            print(json.dumps(dict(model=m, config_class=cls, config=kw,
                                  params=param_count(PRESETS[m]))))
        return 0
    return run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
