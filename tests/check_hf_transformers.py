#!/usr/bin/env python3
"""Check an fp8train Hugging Face export with `transformers` itself.

Loads the export with AutoModelForCausalLM (an FP8 export is dequantized here with its
weight_scale_inv, since transformers' own FP8 loader expects 128x128 block scales), computes the
loss on exactly the token windows `fp8train eval` evaluated (its --dump-tokens), and compares
it with fp8train's FP32 loss of the same export. Prints both losses; exit status 0 when they
agree within --tol (relative), 1 when not, 0 with a SKIP line when torch/transformers are
missing (the check is optional: CI has no torch).

usage:
  tests/check_hf_transformers.py --fp8train build/fp8train --export DIR \
      [--batches 2 --batch 4 --seq-len 64] [--data SRC] [--tol 1e-4] [--device cpu|cuda]
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
        single = os.path.join(args.export, "model.safetensors")
        if os.path.exists(single):
            sd = load_file(single)
        else:  # sharded (export --max-shard-size): every shard the index names
            with open(os.path.join(args.export, "model.safetensors.index.json")) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            sd = {}
            for shard in shards:
                sd.update(load_file(os.path.join(args.export, shard)))
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

    total = 0.0
    with torch.no_grad():
        for w in windows:
            x = torch.from_numpy(w.astype("int64")).to(device)
            logits = model(x[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     x[:, 1:].reshape(-1))
            total += loss.item()
    hf = total / len(windows)
    ref = ours["loss"]["fp32"]
    rel = abs(hf - ref) / abs(ref)
    print(f"export: {args.export} ({cfg.get('architectures', ['?'])[0]}, {how}, "
          f"transformers {transformers.__version__}, torch {torch.__version__}, {device})")
    print(f"tokens: {windows.shape[0]} batches of {windows.shape[1]} x {windows.shape[2] - 1}")
    print(f"fp8train eval loss: fp32 {ref:.6f}  bf16 {ours['loss']['bf16']:.6f}  fp8 {ours['loss']['fp8']:.6f}")
    print(f"transformers loss:  fp32 {hf:.6f}")
    print(f"relative difference (fp32): {rel:.2e} ({'ok' if rel <= args.tol else 'FAIL'}: tolerance {args.tol:g})")
    return 0 if rel <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
