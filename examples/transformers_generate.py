"""Generate with transformers' DeepSeek sparse attention models, with the
latent KV in hisparse: host memory for every position, a small hot buffer
per request on the device, and the model's own tokens.

    pip install '.[transformers]'
    python examples/transformers_generate.py                       # tiny random models, CPU or CUDA
    python examples/transformers_generate.py --model glm --dtype bfloat16 --hot-buffer-size 32
    python examples/transformers_generate.py --prompt-lengths 90 --prompt-lookup 3   # assisted decoding

It builds a tiny random DeepseekV32ForCausalLM (or GlmMoeDsaForCausalLM, whose
"shared" indexer layers become index-group followers), generates greedily for
a batch of prompts of different lengths with and without a HiSparseCache,
checks that the tokens agree, and prints hisparse's counters. With
--prompt-lookup N both runs use transformers' assisted decoding with n-gram
drafts (one prompt, whose second half repeats its first so that drafts are
proposed): verify forwards of up to 1 + N tokens, the rejected drafts cropped.
"""

from __future__ import annotations

import argparse
from typing import Sequence

import torch

VOCAB = 128


def tiny_model(kind: str, dtype: torch.dtype, device: str = "cpu", seed: int = 0):
    """A DeepseekV32ForCausalLM ("deepseek") or GlmMoeDsaForCausalLM ("glm") with random weights: 4 layers,
    kv_lora_rank 32, rope 16, index_topk 16 (GLM: indexers "full", "shared", "full", "shared")."""
    import transformers  # noqa: PLC0415

    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=16,
        v_head_dim=16, index_topk=16, index_head_dim=32, index_n_heads=2, max_position_embeddings=512,
        first_k_dense_replace=1, pad_token_id=0, bos_token_id=1, eos_token_id=None,
    )
    torch.manual_seed(seed)
    if kind == "glm":
        config = transformers.GlmMoeDsaConfig(**common, head_dim=16, indexer_types=["full", "shared", "full", "shared"])
        model = transformers.GlmMoeDsaForCausalLM(config)
    elif kind == "deepseek":
        model = transformers.DeepseekV32ForCausalLM(transformers.DeepseekV32Config(**common))
    else:
        raise ValueError(f"kind: expected 'deepseek' or 'glm', got {kind!r}")
    return model.to(device=device, dtype=dtype).eval()


def padded_prompts(lengths: Sequence[int], device: str = "cpu", seed: int = 1) -> tuple:
    """(input_ids, attention_mask) of random prompts of `lengths`, left-padded as generate pads them."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, width - n :] = torch.randint(2, VOCAB, (n,), generator=gen)
        mask[b, width - n :] = 1
    return ids.to(device), mask.to(device)


def main() -> int:
    from hisparse.integrations.transformers import HiSparseCache  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("deepseek", "glm"), default="deepseek")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--prompt-lengths", default="100,72,120", help="comma-separated prompt lengths")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--hot-buffer-size", type=int, default=None,
                        help="hot rows per request (>= index_topk 16 x (1 + drafts); default 32 or that)")
    parser.add_argument("--prompt-lookup", type=int, default=0, metavar="N",
                        help="assisted decoding with up to N n-gram drafts per forward (one prompt)")
    args = parser.parse_args()
    lengths = [int(n) for n in args.prompt_lengths.split(",")]
    if args.prompt_lookup < 0 or (args.prompt_lookup and len(lengths) != 1):
        parser.error("--prompt-lookup: expected N >= 0 drafts, and one prompt length (assisted decoding decodes "
                     "one request)")
    least = 16 * (1 + args.prompt_lookup)
    hot = max(32, least) if args.hot_buffer_size is None else args.hot_buffer_size
    if hot < least:
        parser.error(f"--hot-buffer-size: expected at least index_topk x (1 + drafts) = {least}, got {hot}")

    model = tiny_model(args.model, getattr(torch, args.dtype), args.device)
    input_ids, attention_mask = padded_prompts(lengths, args.device)
    drafts = {}
    if args.prompt_lookup:
        half = lengths[0] // 2
        input_ids[:, -half:] = input_ids[:, -2 * half : -half].clone()
        drafts = {"prompt_lookup_num_tokens": args.prompt_lookup}
    reference = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=args.new_tokens,
                               do_sample=False, **drafts)
    cache = HiSparseCache(model, hot_buffer_size=hot, max_batch_size=len(lengths),
                          max_cache_len=input_ids.shape[1] + args.new_tokens + args.prompt_lookup, hot_block_size=4,
                          block_size=8, num_speculative_tokens=args.prompt_lookup)
    tokens = model.generate(input_ids, attention_mask=attention_mask, cache=cache,
                            max_new_tokens=args.new_tokens, do_sample=False, **drafts)
    same = torch.equal(tokens, reference)
    print(f"{args.model} {args.dtype} on {args.device}: {len(lengths)} prompts of {lengths} tokens, "
          f"{args.new_tokens} new tokens each, {hot} hot rows per request"
          + (f", up to {args.prompt_lookup} drafts per forward" if args.prompt_lookup else ""))
    print("tokens identical to the model's own generate:", same)
    stats = cache.stats()
    total = stats["total"]
    print(f"hisparse: {total['hits']} hits, {total['misses']} misses (hit rate {total['hit_rate']:.3f}), "
          f"{total['bytes_moved']} bytes loaded from host memory")
    for group, entry in enumerate(stats["groups"]):
        print(f"  group {group} (layers {entry['layers']}): {entry['hits']} hits, {entry['misses']} misses")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
