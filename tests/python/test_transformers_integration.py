"""hisparse.integrations.transformers.HiSparseCache with transformers' tiny
random DeepseekV32ForCausalLM and GlmMoeDsaForCausalLM (examples/
transformers_generate.py builds them): greedy generation with the cache
gives the model's own tokens (float32 logits within float tolerance, bfloat16
identical) for one prompt and for a left-padded batch of three of different
lengths, with a hot buffer far smaller than the context (counters prove misses
and evictions), with and without resident pages, with the exact and the
sparse attention; assisted decoding (prompt lookup: verify forwards and
crops of rejected drafts) and chunked prefill give the tokens and logits of
the same decoding with the model's own cache; a prepared model still
generates as before with its own cache; the negative control (writes that
store the host rows only, as a plain mirror does) makes GLM's followers read
stale prefetched rows and the logits diverge; stats per group and in total,
reset; refusals. The CUDA variants run the same on a GPU."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from conftest import requires_cuda

torch = pytest.importorskip("torch")
# The integration refuses an older transformers at import (the extra asks for 5.24).
transformers = pytest.importorskip("transformers", minversion="5.24")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from hisparse.integrations.transformers import HiSparseCache  # noqa: E402

from transformers_generate import padded_prompts, tiny_model  # noqa: E402

NEW_TOKENS = 48
HOT = 32
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
_MODELS: dict = {}


def model_of(kind, dtype, device):
    """One model per (kind, dtype, device), prepared by the first cache built on it (that is harmless: a
    prepared model generates as before with any other cache)."""
    key = (kind, dtype, device)
    if key not in _MODELS:
        _MODELS[key] = tiny_model(kind, dtype, device)
    return _MODELS[key]


def generate(model, ids, mask, cache=None, new_tokens=NEW_TOKENS, **kwargs):
    if cache is not None:
        kwargs["cache"] = cache
    return model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, **kwargs)


def max_logit_difference(a, b):
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a.logits, b.logits))


def make_cache(model, ids, *, new_tokens=NEW_TOKENS, **kwargs):
    return HiSparseCache(model, hot_buffer_size=HOT, max_batch_size=4, max_cache_len=ids.shape[1] + new_tokens,
                         hot_block_size=4, block_size=8, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["deepseek", "glm"])
@pytest.mark.parametrize(("dtype", "attention"), [(torch.float32, "exact"), (torch.float32, "sparse"),
                                                  (torch.bfloat16, "exact")], ids=["float32", "float32-sparse",
                                                                                   "bfloat16"])
@pytest.mark.parametrize("lengths", [[110], [100, 72, 120]], ids=["batch1", "batch3"])
def test_generate_gives_the_models_tokens(device, kind, dtype, attention, lengths):
    """The exact attention (the model's own over the resolved rows at their
    positions) gives the model's logits bit for bit; the sparse one (over the
    k rows alone) the same up to summation order."""
    model = model_of(kind, dtype, device)
    ids, mask = padded_prompts(lengths, device)
    reference = generate(model, ids, mask)
    cache = make_cache(model, ids, attention=attention)
    out = generate(model, ids, mask, cache)
    assert torch.equal(out.sequences, reference.sequences), "hisparse changed the tokens"
    difference = max_logit_difference(out, reference)
    if attention == "sparse":
        assert difference < 1e-4, f"float32 logits differ by {difference}"
    else:
        assert difference == 0.0, f"{dtype} logits differ by {difference}"
    stats = cache.stats()
    total, groups = stats["total"], stats["groups"]
    assert len(groups) == (2 if kind == "glm" else 4)
    assert [g["layers"] for g in groups] == ([[0, 1], [2, 3]] if kind == "glm" else [[0], [1], [2], [3]])
    # Every decode step looks up index_topk = 16 positions per request per group.
    assert total["lookups"] == (NEW_TOKENS - 1) * len(lengths) * len(groups) * 16
    for g in groups:
        # More rows missed than the hot buffers hold: rows were evicted and loaded again.
        assert g["misses"] > HOT * len(lengths), f"too few misses to prove evictions: {g}"
        assert g["hits"] > 0 and g["bytes_moved"] == g["misses"] * g["group_row_bytes"]
    for key in ("lookups", "hits", "misses", "bytes_moved"):
        assert total[key] == sum(g[key] for g in groups)
    after = cache.stats(reset=True)["total"]
    assert after["misses"] == total["misses"] and cache.stats()["total"]["lookups"] == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["deepseek", "glm"])
def test_resident_newest_pages_serve_the_newest_tokens(device, kind):
    model = model_of(kind, torch.float32, device)
    ids, mask = padded_prompts([100, 72, 120], device)
    reference = generate(model, ids, mask)
    cache = make_cache(model, ids, resident_pages=2, resident_page_size=8)
    out = generate(model, ids, mask, cache)
    assert torch.equal(out.sequences, reference.sequences)
    assert max_logit_difference(out, reference) == 0.0
    total = cache.stats()["total"]
    assert total["resident"] > 0 and total["misses"] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_the_negative_control_catches_stale_rows(device, monkeypatch):
    """Writes that store the host rows and leave the hot copies alone (what a
    plain mirror does) let GLM's leader prefetch a follower's newest row before
    the follower wrote it: the follower then reads a stale (zero) row, and the
    logits diverge. The same run with the library's write is exact (above)."""
    model = model_of("glm", torch.float32, device)
    ids, mask = padded_prompts([100, 72, 120], device)
    reference = generate(model, ids, mask)
    cache = make_cache(model, ids)
    kv = cache.kv
    source = kv.table("source_block_table").long()
    block = kv.config.block_size

    def host_only_write(layer, rows, req_id_per_token, positions, *, stream=None):
        positions = positions.long()
        slots = source[req_id_per_token.long(), positions // block] * block + positions % block
        kv.host_cache[slots.cpu(), layer] = rows.cpu()

    monkeypatch.setattr(kv, "write", host_only_write)
    out = generate(model, ids, mask, cache)
    assert max_logit_difference(out, reference) > 1e-2, "stale rows went unnoticed"


@pytest.mark.parametrize("device", DEVICES)
def test_a_prepared_model_still_generates_with_its_own_cache_and_a_cache_is_reused(device):
    model = model_of("deepseek", torch.float32, device)
    ids, mask = padded_prompts([90, 64], device)
    before = generate(model, ids, mask)
    cache = make_cache(model, ids)
    assert model.config._attn_implementation == "hisparse"
    after = generate(model, ids, mask)
    assert torch.equal(after.sequences, before.sequences) and max_logit_difference(after, before) == 0.0
    first = generate(model, ids, mask, cache)
    cache.reset()
    second = generate(model, ids, mask, cache)
    assert torch.equal(first.sequences, second.sequences) and torch.equal(first.sequences, before.sequences)
    assert max_logit_difference(first, second) == 0.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["deepseek", "glm"])
@pytest.mark.parametrize(("resident_pages", "attention"), [(0, "exact"), (2, "exact"), (2, "sparse")])
def test_assisted_decoding_verifies_drafts_and_crops_the_rejected_ones(device, kind, resident_pages, attention):
    """Prompt lookup decoding (transformers' assisted decoding with n-gram drafts): verify forwards of up to
    1 + 3 tokens whose rejected drafts are cropped, so that the next forward's length falls back, often
    into an earlier resident page. The tokens and logits are those of the same decoding with the model's
    own cache."""
    model = model_of(kind, torch.float32, device)
    ids, _ = padded_prompts([60], device)
    ids = torch.cat((ids, ids[:, -30:]), dim=1)  # repeated n-grams: drafts to verify
    mask = torch.ones_like(ids)
    reference = generate(model, ids, mask, prompt_lookup_num_tokens=3)
    cache = HiSparseCache(model, hot_buffer_size=16 * 4, max_batch_size=1, max_cache_len=ids.shape[1] + NEW_TOKENS + 3,
                          hot_block_size=4, block_size=8, num_speculative_tokens=3, resident_pages=resident_pages,
                          resident_page_size=4 if resident_pages else None, attention=attention)
    forwards, crops = [], []
    begin_forward, crop = cache._begin_forward, cache.crop
    cache._begin_forward = lambda batch, num_tokens: (forwards.append(num_tokens), begin_forward(batch, num_tokens))
    cache.crop = lambda tokens_to_remove: (crops.append(tokens_to_remove), crop(tokens_to_remove))
    out = generate(model, ids, mask, cache, prompt_lookup_num_tokens=3)
    assert torch.equal(out.sequences, reference.sequences), "hisparse changed the tokens"
    difference = max_logit_difference(out, reference)
    assert difference < 1e-4 if attention == "sparse" else difference == 0.0, f"logits differ by {difference}"
    assert forwards.count(4) >= 3 and min(crops) < 0, (forwards, crops)
    assert cache.get_seq_length() == out.sequences.shape[1] - 1
    if resident_pages:
        assert cache.stats()["total"]["resident"] > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["deepseek", "glm"])
def test_chunked_prefill_reads_the_earlier_chunks_back_from_the_host(device, kind):
    """prefill_chunk_size: every chunk after the first attends over all earlier positions, read back from
    the host cache; tokens and logits are those of the same chunked prefill with the model's own cache."""
    model = model_of(kind, torch.float32, device)
    ids, mask = padded_prompts([100, 72, 120], device)
    reference = generate(model, ids, mask, prefill_chunk_size=32)
    cache = make_cache(model, ids, resident_pages=2, resident_page_size=8)
    forwards = []
    begin_forward = cache._begin_forward
    cache._begin_forward = lambda batch, num_tokens: (forwards.append(num_tokens), begin_forward(batch, num_tokens))
    out = generate(model, ids, mask, cache, prefill_chunk_size=32)
    assert forwards[:5] == [32, 32, 32, 24, 1], forwards[:5]
    assert torch.equal(out.sequences, reference.sequences), "hisparse changed the tokens"
    assert max_logit_difference(out, reference) == 0.0


def test_refusals_name_what_is_wrong():
    model = model_of("deepseek", torch.float32, "cpu")
    ids, mask = padded_prompts([20, 10, 15], "cpu")
    cache = HiSparseCache(model, hot_buffer_size=HOT, max_batch_size=2, max_cache_len=64, hot_block_size=4,
                          block_size=8)
    with pytest.raises(ValueError, match="more than max_batch_size = 2"):
        generate(model, ids, mask, cache, new_tokens=2)
    cache = HiSparseCache(model, hot_buffer_size=HOT, max_batch_size=3, max_cache_len=24, hot_block_size=4,
                          block_size=8)
    with pytest.raises(ValueError, match="more than max_cache_len = 24"):
        generate(model, ids, mask, cache, new_tokens=8)
    cache.reset()
    with torch.no_grad():
        model(ids, attention_mask=mask, cache=cache)
        model(ids[:, :1], attention_mask=torch.ones((3, 21), dtype=torch.long), cache=cache)
        with pytest.raises(NotImplementedError, match=r"2 tokens per request while decoding; at most 1 \+ "
                                                      r"num_speculative_tokens = 1"):
            model(ids[:, :2], attention_mask=torch.ones((3, 23), dtype=torch.long), cache=cache)
    cache.crop(-1)
    for bad in (1, -21):
        with pytest.raises(ValueError, match=rf"tokens_to_remove: expected .* between -20 and 0 .* got {bad}"):
            cache.crop(bad)
    assert cache.get_seq_length() == 20
    cache.crop(-5)
    assert [cache.get_seq_length(layer) for layer in range(cache.num_layers)] == [15] * cache.num_layers
    with pytest.raises(ValueError, match=r"hot_buffer_size: expected at least .* = 16 .* got 8"):
        HiSparseCache(model, hot_buffer_size=8, max_batch_size=1, max_cache_len=64)
    with pytest.raises(ValueError, match=r"hot_buffer_size: .* 16 x 4 = 64 .* got 63"):
        HiSparseCache(model, hot_buffer_size=63, max_batch_size=1, max_cache_len=64, num_speculative_tokens=3)
    with pytest.raises(TypeError, match="model: expected a DeepseekV32 or GlmMoeDsa model"):
        HiSparseCache(torch.nn.Linear(2, 2), hot_buffer_size=HOT, max_batch_size=1, max_cache_len=64)
    layers = cache.num_layers
    with pytest.raises(ValueError, match=f"layer_idx: expected 0 <= layer_idx < {layers}"):
        cache.update(torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), layers)


def test_an_older_transformers_is_refused_at_import():
    """A transformers older than the extra's (transformers 5.17's Cache makes
    max_cache_len a read-only property) fails at import, naming the version
    expected and the one found, not deep inside a forward."""
    from hisparse.integrations import transformers as integration

    # A pre-release of 5.24 precedes 5.24, as pip orders them.
    for version in ("5.17.0", "5.23.9", "5.24.0.dev0", "4.57.1"):
        with pytest.raises(ImportError, match=rf"expected transformers >= 5\.24, got {re.escape(version)} "):
            integration._require_transformers(version)
    for version in ("5.24.0", "5.24.1", "5.30.1", "6.0"):
        integration._require_transformers(version)
    integration._require_transformers(transformers.__version__)
