#!/usr/bin/env python3
"""Check an fp8train Hugging Face export with `transformers` itself.

Computes the loss on exactly the token windows `fp8train eval` evaluated (its --dump-tokens)
and compares it with fp8train's FP32 loss of the same export. Prints both losses; exit status
0 when they agree within --tol (relative), 1 when not, 0 with a SKIP line when
torch/transformers are missing (the check is optional: CI has no torch).

How the export is loaded depends on what it is:
- BF16/FP32: AutoModelForCausalLM.from_pretrained, in FP32.
- per-tensor FP8 (export --dtype fp8): dequantized here with its weight_scale_inv, since
  transformers' own FP8 loader wants block scales.
- block-scaled FP8 (export --dtype fp8 --block 128, quantization_config.weight_block_size set):
  from_pretrained as it is, on the GPU: transformers' fine-grained FP8 support builds its
  FP8Linear modules and loads the E4M3 codes and weight_scale_inv into them (checked byte for
  byte against the file). Two losses:
    fp8   that model's own forward (BF16, dynamic 1x128 E4M3 activations), against fp8train's
          FP32 loss within --tol-fp8 (its activation and BF16 rounding);
    deq   from_pretrained again with FineGrainedFP8Config(dequantize=True) (transformers
          dequantizes code * scale_inv itself) in FP32, within --tol.
  transformers runs the FP8 matmul with kernels it fetches from the Hub (`kernels` package);
  where they cannot be had, the fp8 forward is reported as not run and the exit status is 3.

usage:
  tests/check_hf_transformers.py --fp8train build/fp8train --export DIR \
      [--batches 2 --batch 4 --seq-len 64] [--data SRC] [--tol 1e-4] [--tol-fp8 2e-2]
      [--device cpu|cuda]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fp8train", required=True, help="path of the fp8train binary")
    ap.add_argument("--export", required=True, help="directory written by fp8train export")
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--data", default=None, help="evaluation data (fp8train eval --data)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--tol", type=float, default=1e-4, help="relative tolerance on the loss")
    ap.add_argument("--tol-fp8", type=float, default=2e-2,
                    help="relative tolerance of the block-scaled export's FP8 forward")
    ap.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    args = ap.parse_args()

    try:
        import numpy as np
        import torch
        import transformers
        from safetensors.torch import load_file
    except ImportError as e:
        print(f"SKIP check_hf_transformers: {e.name or e} is not installed "
              "(pip install torch transformers safetensors numpy to run this check)")
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "tokens.npy")
        cmd = [args.fp8train, "eval", args.export, "--precision", "all", "--json",
               "--batches", str(args.batches), "--batch", str(args.batch),
               "--seq-len", str(args.seq_len), "--seed", str(args.seed), "--dump-tokens", dump]
        if args.data:
            cmd += ["--data", args.data]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode not in (0, 1):
            print(f"FAIL: {' '.join(cmd)} exited {r.returncode}\n{r.stderr}")
            return 1
        ours = json.loads(r.stdout.strip().splitlines()[-1])
        windows = np.load(dump)  # [batches, B, T+1] int32

    with open(os.path.join(args.export, "config.json")) as f:
        cfg = json.load(f)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False  # a true FP32 reference
    torch.backends.cudnn.allow_tf32 = False
    qc = cfg.pop("quantization_config", None)
    if qc is not None and qc.get("weight_block_size"):
        return check_block_fp8(args, cfg, windows, ours, device, torch, transformers, load_file)
    if qc is None:
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                args.export, dtype=torch.float32, attn_implementation="eager")
        except TypeError:  # transformers < 4.56 spells it torch_dtype
            model = transformers.AutoModelForCausalLM.from_pretrained(
                args.export, torch_dtype=torch.float32, attn_implementation="eager")
        how = "from_pretrained"
    else:
        # FP8 export: weight = float(fp8) * weight_scale_inv; input_scale is for FP8 runtimes
        sd = load_export_tensors(args.export, load_file)
        state = {}
        for name, t in sd.items():
            if name.endswith(".weight_scale_inv") or name.endswith(".input_scale"):
                continue
            if t.dtype == torch.float8_e4m3fn:
                t = t.float() * sd[name[: -len("weight")] + "weight_scale_inv"].float().reshape(())
            state[name] = t.float()
        cfg.pop("fp8train", None)
        config = transformers.AutoConfig.for_model(**cfg)
        config._attn_implementation = "eager"
        model = transformers.AutoModelForCausalLM.from_config(config).float()
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("lm_head.weight") and ".attn.bias" not in k
                   and "masked_bias" not in k]
        if missing or unexpected:
            print(f"FAIL: the FP8 export does not fit {type(model).__name__}: missing {missing[:5]}, "
                  f"unexpected {unexpected[:5]}")
            return 1
        model.tie_weights()
        how = "dequantized FP8 state dict"
    model.to(device).eval()

    hf = hf_loss(torch, model, windows, device)
    ref = ours["loss"]["fp32"]
    rel = abs(hf - ref) / abs(ref)
    print(f"export: {args.export} ({cfg.get('architectures', ['?'])[0]}, {how}, "
          f"transformers {transformers.__version__}, torch {torch.__version__}, {device})")
    print(f"tokens: {windows.shape[0]} batches of {windows.shape[1]} x {windows.shape[2] - 1}")
    print(f"fp8train eval loss: fp32 {ref:.6f}  bf16 {ours['loss']['bf16']:.6f}  fp8 {ours['loss']['fp8']:.6f}")
    print(f"transformers loss:  fp32 {hf:.6f}")
    print(f"relative difference (fp32): {rel:.2e} ({'ok' if rel <= args.tol else 'FAIL'}: tolerance {args.tol:g})")
    return 0 if rel <= args.tol else 1


def hf_loss(torch, model, windows, device):
    """Mean next-token cross entropy of model over the windows [batches, B, T+1]."""
    total = 0.0
    with torch.no_grad():
        for w in windows:
            x = torch.from_numpy(w.astype("int64")).to(device)
            logits = model(x[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     x[:, 1:].reshape(-1))
            total += loss.item()
    return total / len(windows)


def load_export_tensors(export, load_file):
    """Every tensor of the export (model.safetensors or its shards), on the CPU."""
    single = os.path.join(export, "model.safetensors")
    if os.path.exists(single):
        return load_file(single)
    with open(os.path.join(export, "model.safetensors.index.json")) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    sd = {}
    for shard in shards:
        sd.update(load_file(os.path.join(export, shard)))
    return sd


def from_pretrained(transformers, path, dtype, **kw):
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)
    except TypeError:  # transformers < 4.56 spells it torch_dtype
        return transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype, **kw)


def check_block_fp8(args, cfg, windows, ours, device, torch, transformers, load_file):
    """The block-scaled export through transformers' own fine-grained FP8 support."""
    if not device.startswith("cuda"):
        print("FAIL: transformers loads fine-grained FP8 checkpoints on a GPU only (--device cuda)")
        return 1
    sd = load_export_tensors(args.export, load_file)
    fp8_names = sorted(n[: -len(".weight")] for n, t in sd.items() if t.dtype == torch.float8_e4m3fn)
    hidden = [cfg.get("hidden_size"), cfg.get("intermediate_size")]
    if any(h is None or h % 128 for h in hidden):
        print(f"note: hidden_size/intermediate_size {hidden} are not multiples of 128; "
              "transformers' FP8 kernels quantize activations in whole 1x128 groups and may refuse")
    ref = ours["loss"]["fp32"]
    failed, not_run = False, False
    lines = []

    # 1. as it is: FP8Linear modules holding the file's codes and scales
    model, info = from_pretrained(transformers, args.export, torch.bfloat16, device_map=device,
                                  output_loading_info=True)
    ignorable = ("rotary_emb", "lm_head.weight")
    missing = [k for k in info.get("missing_keys", []) if not k.endswith(ignorable)]
    unexpected = [k for k in info.get("unexpected_keys", []) if not k.endswith(ignorable)]
    mods = {n: m for n, m in model.named_modules()
            if isinstance(getattr(m, "weight_scale_inv", None), torch.Tensor)
            and getattr(m, "weight", None) is not None and m.weight.dtype == torch.float8_e4m3fn}
    classes = sorted({type(m).__name__ for m in mods.values()})
    same = sorted(mods) == fp8_names and all(
        torch.equal(m.weight.detach().cpu().view(torch.uint8), sd[n + ".weight"].view(torch.uint8))
        and torch.equal(m.weight_scale_inv.detach().float().cpu(), sd[n + ".weight_scale_inv"].float())
        for n, m in mods.items())
    load_ok = same and not missing and not unexpected
    failed |= not load_ok
    lines.append(f"loaded as it is: {len(mods)} of {len(fp8_names)} FP8 matrices in {', '.join(classes) or 'no'} "
                 f"modules, codes and weight_scale_inv identical to the file: {'yes' if same else 'NO'}"
                 f"{'' if not missing else f'; missing {missing[:4]}'}"
                 f"{'' if not unexpected else f'; unexpected {unexpected[:4]}'}"
                 f" ({'ok' if load_ok else 'FAIL'})")
    model.eval()
    try:
        fp8 = hf_loss(torch, model, windows, device)
        rel = abs(fp8 - ref) / abs(ref)
        good = rel <= args.tol_fp8
        failed |= not good
        lines.append(f"transformers loss, fp8 (as loaded: BF16, E4M3 weights x 128x128 scales, dynamic "
                     f"1x128 activations): {fp8:.6f}  vs fp8train fp32 {ref:.6f}: relative {rel:.2e} "
                     f"({'ok' if good else 'FAIL'}: tolerance {args.tol_fp8:g})")
    except Exception as e:
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        # transformers fetches its FP8 matmul kernels from the Hub (`kernels` package): without
        # them (an offline machine) the forward cannot run; anything else is a failure
        if isinstance(e, ImportError) or "kernel" in str(e).lower():
            not_run = True
            lines.append(f"transformers loss, fp8: NOT RUN: {why} (transformers fetches its FP8 "
                         "matmul kernels from the Hub through the `kernels` package)")
        else:
            failed = True
            lines.append(f"transformers loss, fp8: FAILED: {why}")
    del model
    torch.cuda.empty_cache()

    # 2. transformers dequantizing the same files itself (FineGrainedFP8Config(dequantize=True))
    try:
        qc = transformers.FineGrainedFP8Config(dequantize=True)
        model = from_pretrained(transformers, args.export, torch.float32, device_map=device,
                                attn_implementation="eager", quantization_config=qc)
        model.eval()
        left = [n for n, p in model.named_parameters() if p.dtype == torch.float8_e4m3fn]
        if left:
            raise RuntimeError(f"dequantize=True left {len(left)} FP8 parameters ({left[0]}, ...)")
        deq = hf_loss(torch, model, windows, device)
        rel = abs(deq - ref) / abs(ref)
        good = rel <= args.tol
        failed |= not good
        lines.append(f"transformers loss, deq (FineGrainedFP8Config(dequantize=True), FP32): {deq:.6f}  vs "
                     f"fp8train fp32 {ref:.6f}: relative {rel:.2e} ({'ok' if good else 'FAIL'}: "
                     f"tolerance {args.tol:g})")
    except Exception as e:
        failed = True
        lines.append(f"transformers loss, deq: FAILED: {type(e).__name__}: {e}")

    print(f"export: {args.export} ({cfg.get('architectures', ['?'])[0]}, fine-grained FP8 "
          f"{cfg.get('fp8train', {}).get('fp8_weight_scales', '')}, transformers {transformers.__version__}, "
          f"torch {torch.__version__}, {device} {torch.cuda.get_device_name() if torch.cuda.is_available() else ''})")
    print(f"tokens: {windows.shape[0]} batches of {windows.shape[1]} x {windows.shape[2] - 1}")
    print(f"fp8train eval loss of the export: fp32 {ref:.6f}  bf16 {ours['loss']['bf16']:.6f}  "
          f"fp8 {ours['loss']['fp8']:.6f}")
    for line in lines:
        print(line)
    if failed:
        print("FAIL")
        return 1
    if not_run:
        print("INCOMPLETE: loaded as it is and dequantized by transformers alike, but its FP8 forward did not run")
        return 3
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
