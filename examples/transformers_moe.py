#!/usr/bin/env python3
"""epkit inside a Hugging Face transformers model, on one GPU, with no NVSHMEM bootstrap.

Builds a small model of the DeepSeek-V3 architecture from a config (random weights, nothing is
downloaded), then generates the same tokens with transformers' experts implementations and with
epkit's:

  eager, grouped_mm   transformers' own (bf16 experts; generate() itself switches grouped_mm to
                      batched_mm for the decoding steps)
  epkit               model.set_experts_implementation("epkit"): the model's router, epkit's FP8
                      grouped GEMMs for the routed experts
  patch_moe           epkit.transformers.patch_moe(model): every DeepseekV3MoE block (router, experts,
                      shared expert) becomes one epkit.MoELayer

and prints, for each, tokens per second and how its logits agree with eager's (relative Frobenius
distance of the prompt's logits, the share of positions with the same top-1 token, and the
generated tokens equal to eager's). epkit computes the experts in FP8 (weights in 128x128 tiles,
activations in 1x128 blocks), so a few percent of logit difference is expected on random weights.

    pip install '.[transformers]'        # epkit with transformers
    python3 examples/transformers_moe.py [--batch 4] [--prompt 64] [--new 32] [--layers 4]
"""
import argparse
import time

import torch
import transformers

import epkit.transformers as et  # registers the experts implementation "epkit"


def small_deepseek_v3(layers: int, experts: int) -> transformers.DeepseekV3ForCausalLM:
    cfg = transformers.DeepseekV3Config(
        vocab_size=8192, hidden_size=2048, intermediate_size=4096, moe_intermediate_size=512,
        num_hidden_layers=layers, first_k_dense_replace=1, num_attention_heads=16, num_key_value_heads=16,
        q_lora_rank=512, kv_lora_rank=256, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64,
        n_routed_experts=experts, n_group=8, topk_group=4, num_experts_per_tok=8, n_shared_experts=1,
        routed_scaling_factor=2.5, num_mtp_layers=0, max_position_embeddings=4096)
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = transformers.DeepseekV3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    for m in model.modules():  # as from_pretrained keeps it (DeepSeek-V3's _keep_in_fp32_modules_strict)
        if hasattr(m, "e_score_correction_bias"):
            m.e_score_correction_bias = torch.randn_like(m.e_score_correction_bias, dtype=torch.float32) * 0.05
    return model.eval()


def generate(model, ids, new_tokens):
    return model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                          pad_token_id=0, eos_token_id=None)


def run(name, model, ids, new_tokens, ref):
    with torch.no_grad():
        generate(model, ids, 2)  # warm-up: epkit quantizes the expert weights on first use
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = generate(model, ids, new_tokens)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        logits = model(ids).logits.float()
    tps = ids.shape[0] * new_tokens / dt
    new = out[:, ids.shape[1]:]
    if ref is None:
        print(f"{name:10s} {tps:9.1f} tokens/s   (reference)")
        return logits, new
    ref_logits, ref_new = ref
    rel = float((logits - ref_logits).norm() / ref_logits.norm())
    top1 = float((logits.argmax(-1) == ref_logits.argmax(-1)).float().mean())
    same = float((new == ref_new).float().mean())
    print(f"{name:10s} {tps:9.1f} tokens/s   logits vs eager: {100 * rel:5.2f}% (rel. Frobenius), "
          f"top-1 equal {100 * top1:5.1f}%, generated tokens equal {100 * same:5.1f}%")
    return logits, new


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=32, help="tokens to generate")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (the first is dense)")
    ap.add_argument("--experts", type=int, default=64, help="routed experts per MoE layer")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("transformers_moe.py needs a CUDA GPU (Hopper: epkit's FP8 kernels are built for sm_90a)")
        return
    model = small_deepseek_v3(args.layers, args.experts)
    ids = torch.randint(2, model.config.vocab_size, (args.batch, args.prompt), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(1))
    print(f"DeepSeek-V3 architecture, {args.layers} layers, {args.experts} experts (top-8 of 8 groups, 4 kept), "
          f"batch {args.batch}, prompt {args.prompt}, {args.new} new tokens, on {torch.cuda.get_device_name()}")
    model.set_experts_implementation("eager")
    ref = run("eager", model, ids, args.new, None)
    model.set_experts_implementation("grouped_mm")
    run("grouped_mm", model, ids, args.new, ref)
    model.set_experts_implementation("epkit")
    run("epkit", model, ids, args.new, ref)
    patched = et.patch_moe(model, max_tokens=args.batch * args.prompt)
    run("patch_moe", model, ids, args.new, ref)
    print(f"(patch_moe replaced {len(patched)} blocks: {', '.join(patched)})")


if __name__ == "__main__":
    main()
