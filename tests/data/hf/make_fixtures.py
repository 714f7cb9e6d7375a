#!/usr/bin/env python3
"""Make the small Hugging Face fixtures of tests/test_hf_llama_qwen.c with transformers itself.

Each fixture is a directory written by save_pretrained (sharded through max_shard_size, so
model.safetensors.index.json + shards) plus expected.json: fixed token windows and the loss
transformers computes on them in FP32 (eager attention). The C test imports the directory and
must get the same loss to 1e-5 relative; no Python runs at test time.

Weights are drawn wider than transformers' N(0, 0.02) init (norm weights 1 +- 0.3, the rest
N(0, 0.15)) so the loss is far from ln(vocab) and depends on every tensor: a wrong K/V head
grouping, RoPE frequency or head tie changes it visibly.

usage: tests/data/hf/make_fixtures.py [OUT_DIR]   (default: the directory of this script)
needs: pip install torch transformers safetensors
"""
import json
import os
import sys

import torch
import transformers

FIXTURES = {
    # GQA 4:1 (one K/V head for four query heads), untied head, Llama-3 RoPE scaling; rope_theta
    # 100 with head size 16 puts the frequencies in all three llama3 bands (kept, blended,
    # divided by factor) for original_max_position_embeddings 32. FP32 shards.
    "llama_gqa4_untied_rope3": dict(
        cls="LlamaForCausalLM", dtype=torch.float32,
        config=dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                    max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_theta=100.0,
                    rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0,
                                      high_freq_factor=4.0,
                                      original_max_position_embeddings=32))),
    # GQA 2:1, tied head, plain RoPE; BF16 shards (the loss is transformers' on the BF16
    # weights widened to FP32, which is what an import holds).
    "llama_gqa2_tied_bf16": dict(
        cls="LlamaForCausalLM", dtype=torch.bfloat16,
        config=dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                    max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
                    rope_theta=10000.0)),
    # Qwen2: q/k/v biases, GQA 2:1, untied head as in the larger Qwen2 models. FP32 shards.
    "qwen2_gqa2_untied": dict(
        cls="Qwen2ForCausalLM", dtype=torch.float32,
        config=dict(model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_theta=1000000.0, use_sliding_window=False)),
}

B, T, N_WINDOWS = 2, 32, 2  # windows [N_WINDOWS][B][T + 1]


def randomize(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))


def make(out_root, name, spec, seed):
    gen = torch.Generator().manual_seed(seed)
    cfg = transformers.AutoConfig.for_model(**spec["config"])
    cfg._attn_implementation = "eager"
    model = getattr(transformers, spec["cls"])(cfg).float()
    randomize(model, gen)
    model = model.to(spec["dtype"])
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):  # only what an earlier run of this script wrote
        if f.endswith(".safetensors") or f.endswith(".json"):
            os.remove(os.path.join(out, f))
    model.save_pretrained(out, max_shard_size="150KB", safe_serialization=True)
    # the reference: the saved weights, widened to FP32, loaded back by transformers
    try:
        ref = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                                attn_implementation="eager")
    except TypeError:
        ref = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32,
                                                                attn_implementation="eager")
    ref.eval()
    windows = torch.randint(0, cfg.vocab_size, (N_WINDOWS, B, T + 1), generator=gen)
    losses = []
    with torch.no_grad():
        for w in windows:
            logits = ref(w[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     w[:, 1:].reshape(-1))
            losses.append(loss.item())
    exp = dict(windows=windows.tolist(), B=B, T=T, losses=losses,
               loss=sum(losses) / len(losses), architecture=spec["cls"],
               num_key_value_heads=cfg.num_key_value_heads,
               num_attention_heads=cfg.num_attention_heads,
               tie_word_embeddings=cfg.tie_word_embeddings,
               dtype=str(spec["dtype"]).replace("torch.", ""),
               transformers=transformers.__version__, torch=torch.__version__)
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(exp, f)
        f.write("\n")
    shards = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    print(f"{name}: {len(shards)} shard(s), loss {exp['loss']:.6f} ({losses})")


def main():
    out_root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    torch.manual_seed(0)
    for i, (name, spec) in enumerate(FIXTURES.items()):
        make(out_root, name, spec, 1000 + i)


if __name__ == "__main__":
    main()
