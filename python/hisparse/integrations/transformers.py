"""hisparse for transformers' DeepSeek sparse attention models.

``HiSparseCache(model, hot_buffer_size=..., max_batch_size=..., max_cache_len=...)``
is a transformers ``Cache`` that keeps the latent MLA KV of every layer of a
``DeepseekV32ForCausalLM`` or ``GlmMoeDsaForCausalLM`` (transformers >= 5.24)
in a :class:`hisparse.KVCache`: the rows of every position in host memory,
and per request a hot buffer of ``hot_buffer_size`` rows on the model's device
that holds the positions the indexer selects. Building it prepares the
model: the "hisparse" attention implementation (registered with transformers'
``AttentionInterface``, with its mask function), and one index group per
indexer (GLM's ``"shared"`` layers follow the ``"full"`` layer before them).

    cache = HiSparseCache(model, hot_buffer_size=2048, max_batch_size=8, max_cache_len=8192)
    out = model.generate(input_ids, attention_mask=mask, cache=cache, max_new_tokens=64)

Prefill attends over the prompt's own rows as the model does; every decode
step, the layer's new row goes through :meth:`hisparse.KVCache.write`, the
indexer's top-k goes through :meth:`hisparse.KVCache.swap_in` (positions the
attention mask excludes are dropped first), and the attention reads only the
rows hisparse resolved (:meth:`hisparse.KVCache.read`): by default the
model's own attention over those rows at their positions (its result bit for
bit), or (``attention="sparse"``) a reference MLA sparse attention in torch
over the k latent rows alone. docs/integration.md says how a FlashMLA-style
sparse kernel takes the attention indices and the paged view instead.
With another cache (or none) the prepared model computes what it computed
before: the attention implementation it had, with the indexer's mask.

Only what hisparse exports is used here: the integration is an example of
its public API as much as a feature.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any, List, Optional

import torch
import transformers
from packaging.version import Version
from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

import hisparse

__all__ = ["HiSparseCache", "hisparse_attention"]

# The oldest transformers whose Cache and models this module follows (the
# `hisparse[transformers]` extra). Older ones differ in ways that fail deep
# inside a forward (in 5.17 a Cache's max_cache_len is a read-only property).
MIN_TRANSFORMERS = "5.24"


def _require_transformers(version: str) -> None:
    """ImportError unless `version` (a transformers version string) satisfies
    the extra's requirement, by pip's rules (packaging, a dependency of
    transformers)."""
    if Version(version) < Version(MIN_TRANSFORMERS):
        raise ImportError(f"hisparse.integrations.transformers: expected transformers >= {MIN_TRANSFORMERS}, "
                          f"got {version} (pip install 'transformers>={MIN_TRANSFORMERS}')")


_require_transformers(transformers.__version__)

# The implementation a prepared model runs, by the implementation it had: its
# mask and its attention when the cache of a forward is not a HiSparseCache.
_IMPLEMENTATIONS = {"sdpa": "hisparse", "eager": "hisparse_eager"}
_ORIGINAL = {name: original for original, name in _IMPLEMENTATIONS.items()}

# The layer whose update() ran last in this thread, and the step it belongs
# to: the attention call of the same layer that follows takes it.
_pending = threading.local()


def _text_config(model: Any) -> Any:
    config = model.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def _attention_modules(model: Any) -> List[nn.Module]:
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise TypeError(
            f"model: expected a DeepseekV32 or GlmMoeDsa model with .model.layers, got {type(model).__name__}"
        )
    modules = [getattr(layer, "self_attn", None) for layer in layers]
    for i, module in enumerate(modules):
        if module is None or not all(hasattr(module, name) for name in ("kv_b_proj", "kv_lora_rank", "layer_idx")):
            raise TypeError(f"model: layer {i} has no MLA attention with a sparse indexer (kv_b_proj, kv_lora_rank)")
    return modules


def _layer_groups(config: Any, num_layers: int) -> List[int]:
    """One group per indexer: a "shared" layer joins the group of the layer before it."""
    kinds = getattr(config, "indexer_types", None)
    if kinds is None:
        return list(range(num_layers))
    if len(kinds) < num_layers:
        raise ValueError(f"model: config.indexer_types has {len(kinds)} entries for {num_layers} layers")
    groups: List[int] = []
    for layer in range(num_layers):
        if kinds[layer] == "shared":
            if layer == 0:
                raise ValueError("model: layer 0 is a 'shared' indexer layer; it has no full layer to follow")
            groups.append(groups[-1])
        elif kinds[layer] == "full":
            groups.append(groups[-1] + 1 if groups else 0)
        else:
            raise ValueError(f"model: config.indexer_types[{layer}] is {kinds[layer]!r}, expected 'full' or 'shared'")
    return groups


def _register() -> None:
    """The prepared models' implementations, with transformers (idempotent)."""
    AttentionInterface.register("hisparse", hisparse_attention)
    AttentionInterface.register("hisparse_eager", hisparse_attention)
    AttentionMaskInterface.register("hisparse", sdpa_mask)
    AttentionMaskInterface.register("hisparse_eager", eager_mask)


class _Step:
    """What one layer's update() leaves for that layer's attention call."""

    def __init__(self, cache: "HiSparseCache", layer: int, past: int, num_tokens: int) -> None:
        self.cache = cache
        self.layer = layer
        self.past = past
        self.num_tokens = num_tokens


class HiSparseLayer(CacheLayerMixin):
    """One layer's view of a :class:`HiSparseCache` (what transformers' Cache machinery asks a layer)."""

    is_sliding = False
    is_compileable = False
    is_croppable = True
    supports_early_init = False

    def __init__(self, cache: "HiSparseCache", layer: int) -> None:
        super().__init__()
        # A proxy: the cache holds its layers, and no cycle keeps it alive.
        self._cache = weakref.proxy(cache)
        self._layer = layer
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        return self._cache.update(key_states, value_states, self._layer)

    def get_mask_sizes(self, query_length: int) -> tuple:
        return self._cache.layer_length(self._layer) + query_length, 0

    def get_seq_length(self) -> int:
        return self._cache.layer_length(self._layer)

    def get_max_length(self) -> int:
        return self._cache.max_cache_len

    def reset(self) -> None:
        pass

    def crop(self, tokens_to_remove: int) -> None:
        self._cache._crop_layer(self._layer, tokens_to_remove)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("HiSparseCache does not reorder requests (beam search): use greedy or sampling")


class HiSparseCache(Cache):
    """A transformers Cache whose latent KV lives in a :class:`hisparse.KVCache`.

    ``model``: a ``DeepseekV32ForCausalLM`` or ``GlmMoeDsaForCausalLM`` (or
    their base model); it is prepared when the cache is built. Sizes:
    ``hot_buffer_size`` hot rows per request (at least the indexer's
    ``index_topk``), ``max_batch_size`` requests, ``max_cache_len``
    positions per request (prompt plus new tokens, padding included).
    ``block_size`` positions per host block, ``hot_block_size`` rows per
    hot block, ``resident_pages`` newest pages per request kept on the
    device (of ``resident_page_size`` positions, a multiple of
    ``hot_block_size``; 0 = every row through the hot buffer). ``host_pool``
    and ``host_event`` are :class:`hisparse.KVCache`'s (a shared pool of
    tensor-parallel ranks and the writer's interprocess event).
    ``num_speculative_tokens``: draft tokens a forward may verify after the
    prompt (assisted decoding: ``prompt_lookup_num_tokens`` or an
    ``assistant_model`` proposing at most that many): such a forward has up
    to ``1 + num_speculative_tokens`` tokens per request, and ``crop`` rolls
    the rejected ones back (the next forward writes those positions again;
    lengths may fall back into earlier resident pages). The hot buffer then
    holds the union of a request's token rows: ``hot_buffer_size`` at least
    ``index_topk x (1 + num_speculative_tokens)``.
    ``prefetch``: the leader of a GLM group stages its followers' rows
    while the followers run. ``fused_gather`` (default ``True``): the resolve
    copies the leader's own rows in its automatic schedule. ``attention``: how a decode step attends over the
    rows hisparse resolved (both read those rows and nothing else):
    ``"exact"`` places them at their positions and runs the model's own
    attention and mask over them, so the result is the model's bit for bit;
    ``"sparse"`` expands the k rows and attends over them alone
    (:func:`mla_sparse_attention`), the computation a sparse kernel makes.

    One batch at a time: a forward with no past starts a new batch (its
    prompts, left-padded as ``generate`` pads them); later forwards add one
    token per request, or up to ``1 + num_speculative_tokens`` (a verify
    forward), both attending over the rows hisparse resolves. A later
    forward of more tokens is a prefill chunk (``prefill_chunk_size``): it
    attends as the model does, over every earlier position, whose rows it
    reads back from the host cache (a transient copy of the layer's rows of
    the batch on the device, as the model's own cache would hold).
    ``reset()`` ends a batch. Not compileable as a whole
    (its bookkeeping is host-side); the decode-path ops are torch custom ops
    (``hisparse.torch_ops``) for engines that compile.
    """

    def __init__(
        self,
        model: Any,
        *,
        hot_buffer_size: int,
        max_batch_size: int,
        max_cache_len: int,
        block_size: int = 16,
        hot_block_size: int = 16,
        resident_pages: int = 0,
        resident_page_size: Optional[int] = None,
        num_speculative_tokens: int = 0,
        host_pool: Any = None,
        host_event: Any = None,
        prefetch: bool = True,
        fused_gather: bool = hisparse._C.DEFAULT_FUSED_GATHER == 1,
        attention: str = "exact",
    ) -> None:
        modules = _attention_modules(model)
        if attention not in ("exact", "sparse"):
            raise ValueError(f"attention: expected 'exact' or 'sparse', got {attention!r}")
        self.attention = attention
        config = _text_config(model)
        for name in ("kv_lora_rank", "qk_rope_head_dim", "index_topk"):
            if not isinstance(getattr(config, name, None), int):
                raise TypeError(f"model: config.{name} is missing; expected a DeepSeek sparse attention config")
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.num_layers = len(modules)
        self.latent_width = config.kv_lora_rank
        self.row_width = config.kv_lora_rank + config.qk_rope_head_dim
        self.top_k = config.index_topk
        self.max_cache_len = hisparse._args.require_int("max_cache_len", max_cache_len, 1)
        self.max_batch_size = hisparse._args.require_int("max_batch_size", max_batch_size, 1)
        self.num_speculative_tokens = hisparse._args.require_int("num_speculative_tokens", num_speculative_tokens,
                                                                 0, bits=32)
        hisparse._args.require_bool("prefetch", prefetch)
        hisparse._args.require_bool("fused_gather", fused_gather)
        self.prefetch, self.fused_gather = prefetch, fused_gather
        groups = _layer_groups(config, self.num_layers)
        hot_buffer_size = hisparse._args.require_int("hot_buffer_size", hot_buffer_size, 1, bits=32)
        union = self.top_k * (1 + self.num_speculative_tokens)
        if hot_buffer_size < union:
            raise ValueError(f"hot_buffer_size: expected at least index_topk x (1 + num_speculative_tokens) = "
                             f"{self.top_k} x {1 + self.num_speculative_tokens} = {union} (the rows a forward's "
                             f"top-k may select per request), got {hot_buffer_size}")
        hot_block_size = min(hot_block_size, hot_buffer_size)
        hs_config = hisparse.Config(top_k=self.top_k, device_buffer_size=hot_buffer_size, row_width=self.row_width,
                                    dtype=self.dtype, block_size=block_size, hot_block_size=hot_block_size,
                                    num_speculative_tokens=self.num_speculative_tokens)
        self.kv = hisparse.KVCache(hs_config, num_layers=self.num_layers, layer_groups=groups,
                                   max_requests=self.max_batch_size, max_seq_len=self.max_cache_len,
                                   resident_pages=resident_pages, resident_page_size=resident_page_size,
                                   device=self.device, host_pool=host_pool, host_event=host_event,
                                   max_swap_rows=self.max_batch_size * (1 + self.num_speculative_tokens))
        self._leaders = [self.kv.leader_of(layer) == layer for layer in range(self.num_layers)]
        # The indexer's keys stay on the device, as in the model's own caches.
        self._index_keys: dict = {}
        self._index_shape = {
            m.layer_idx: (self.max_batch_size, self.max_cache_len, config.index_head_dim)
            for m in modules
            if getattr(m, "indexer", None) is not None
        }
        self._lengths = [0] * self.num_layers
        self._batch = 0
        self._decoding = False  # a forward of at most 1 + num_speculative_tokens tokens has run since the prompt
        self._rows = torch.arange(self.max_batch_size, dtype=torch.int32, device=self.device)
        super().__init__(layers=[HiSparseLayer(self, layer) for layer in range(self.num_layers)])
        self._prepare(model)

    # ------------------------------------------------------------------ the model
    def _prepare(self, model: Any) -> None:
        _register()
        current = model.config._attn_implementation
        if current not in _ORIGINAL:
            if current not in _IMPLEMENTATIONS:
                raise ValueError(
                    f"model: attention implementation {current!r}; HiSparseCache prepares models that run 'sdpa' or "
                    "'eager' (load the model with attn_implementation='sdpa')"
                )
            model.set_attn_implementation(_IMPLEMENTATIONS[current])

    # ------------------------------------------------------------------ lengths
    def layer_length(self, layer: int) -> int:
        return self._lengths[layer]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._lengths[layer_idx] if 0 <= layer_idx < self.num_layers else 0

    def get_max_length(self, layer_idx: Optional[int] = None) -> int:
        return self.max_cache_len

    @property
    def is_compileable(self) -> bool:
        return False

    def reset(self) -> None:
        """End the batch: release its requests (their hot state is reset) and forget the lengths."""
        for row in range(self._batch):
            self.kv.release(row)
        self._batch = 0
        self._decoding = False
        self._lengths = [0] * self.num_layers
        for keys in self._index_keys.values():
            keys.zero_()

    def crop(self, tokens_to_remove: int) -> None:
        """Roll every layer back by ``-tokens_to_remove`` positions (transformers' convention: a count
        <= 0); the next forward writes those positions again."""
        for layer in range(self.num_layers):
            self._crop_layer(layer, tokens_to_remove)

    def _crop_layer(self, layer: int, tokens_to_remove: int) -> None:
        """One layer's crop (:meth:`crop` rolls back every layer; a forward needs them all at one length)."""
        tokens_to_remove = hisparse._args.require_int("tokens_to_remove", tokens_to_remove, bits=64)
        length = self._lengths[layer]
        if tokens_to_remove > 0 or -tokens_to_remove > length:
            raise ValueError(f"tokens_to_remove: expected minus the number of positions to remove, between "
                             f"{-length} and 0 (layer {layer} holds {length}), got {tokens_to_remove}")
        self._lengths[layer] = length + tokens_to_remove

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("HiSparseCache does not expand requests (num_return_sequences > 1, beams)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("HiSparseCache does not select requests of a batch")

    # ------------------------------------------------------------------ the forward
    def _begin_forward(self, batch: int, num_tokens: int) -> None:
        past = self._lengths[0]
        if past == 0:
            if batch > self.max_batch_size:
                raise ValueError(f"HiSparseCache: a batch of {batch} requests, more than max_batch_size = "
                                 f"{self.max_batch_size}")
            self.reset()
            for row in range(batch):
                self.kv.admit(row)
            self._batch = batch
        elif batch != self._batch:
            raise ValueError(f"HiSparseCache: a forward of {batch} requests in a batch of {self._batch}; call "
                             "reset() to start a new batch")
        elif num_tokens <= 1 + self.num_speculative_tokens:
            self._decoding = True
        elif self._decoding:
            # Past the prompt's chunks a longer forward is a verify forward the cache was not sized for;
            # read back from the host as a chunk it would bypass the hot buffer at every step.
            raise NotImplementedError(
                f"HiSparseCache: a forward of {num_tokens} tokens per request while decoding; at most 1 + "
                f"num_speculative_tokens = {1 + self.num_speculative_tokens} (set num_speculative_tokens to the most "
                "drafts a forward verifies); only the prompt's chunks may be longer"
            )
        if past + num_tokens > self.max_cache_len:
            raise ValueError(f"HiSparseCache: {past + num_tokens} positions per request, more than max_cache_len = "
                             f"{self.max_cache_len}")
        lengths = torch.zeros(self.max_batch_size, dtype=torch.int32)
        lengths[:batch] = past + num_tokens
        self.kv.begin_forward(lengths.to(self.device))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any):
        """Store this forward's latent rows of the layer (``key_states`` = the normalised latent [B, 1, S,
        kv_lora_rank], ``value_states`` = the rotated key [B, 1, S, rope]) and return the forward's own rows,
        which the attention of a prompt reads; a decode step's attention reads hisparse's rows instead."""
        if not 0 <= layer_idx < len(self._lengths):
            raise ValueError(f"layer_idx: expected 0 <= layer_idx < {len(self._lengths)} (the model's layers), "
                             f"got {layer_idx}")
        batch, _, num_tokens, _ = key_states.shape
        if layer_idx == 0:
            self._begin_forward(batch, num_tokens)
        past = self._lengths[layer_idx]
        if layer_idx != 0 and past != self._lengths[0] - num_tokens:
            raise RuntimeError(f"HiSparseCache: layer {layer_idx} is at position {past}, layer 0 at "
                               f"{self._lengths[0] - num_tokens}; every layer runs once per forward, in order")
        own = torch.cat((key_states[:, 0], value_states[:, 0]), dim=-1).to(self.dtype)
        req = self._rows[:batch].repeat_interleave(num_tokens)
        positions = (torch.arange(num_tokens, dtype=torch.int32, device=self.device) + past).repeat(batch)
        self.kv.write(layer_idx, own.reshape(-1, self.row_width).contiguous(), req, positions)
        self._lengths[layer_idx] = past + num_tokens
        if past > 0 and num_tokens > 1 + self.num_speculative_tokens:
            # A prefill chunk attends as the model does, over every earlier position: read back from the host.
            _pending.step = None
            rows = torch.cat((self._host_rows(layer_idx, batch, past), own), dim=1).unsqueeze(1)
            # Contiguous, as the model's own cache hands them over, so that the expansion runs the same GEMM.
            return rows[..., : self.latent_width].contiguous(), rows[..., self.latent_width :].contiguous()
        _pending.step = _Step(self, layer_idx, past, num_tokens)
        return key_states, value_states

    def _host_rows(self, layer: int, batch: int, length: int) -> torch.Tensor:
        """The layer's rows of positions [0, length) of the batch's requests, [batch, length, W] on the
        model's device, from the host cache (every row is there once its forward's writes are done)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        block = self.kv.config.block_size
        positions = torch.arange(length)
        source = self.kv.table("source_block_table")[:batch, : (length + block - 1) // block].cpu().long()
        slots = source[:, positions // block] * block + positions % block
        return self.kv.host_cache[slots, layer].to(self.device)

    def update_indexer(self, indexer_key_states: torch.Tensor, layer_idx: int) -> torch.Tensor:
        keys = self._index_keys.get(layer_idx)
        if keys is None:
            shape = self._index_shape.get(layer_idx)
            if shape is None:
                raise ValueError(f"HiSparseCache: layer {layer_idx} has no indexer")
            keys = torch.zeros(shape, dtype=indexer_key_states.dtype, device=indexer_key_states.device)
            self._index_keys[layer_idx] = keys
        batch, num_tokens, _ = indexer_key_states.shape
        end = self._lengths[layer_idx]
        keys[:batch, end - num_tokens : end] = indexer_key_states
        return keys[:batch, :end].contiguous()

    # ------------------------------------------------------------------ decode attention
    def sparse_attention(self, module: nn.Module, step: _Step, query: torch.Tensor, attention_mask: torch.Tensor,
                         indices: torch.Tensor, scaling: float) -> torch.Tensor:
        """Attention of one decode step over the latent rows hisparse resolved for the layer."""
        batch, heads, num_tokens, _ = query.shape
        layer = step.layer
        tokens = batch * num_tokens
        if self._leaders[layer]:
            positions = indices.reshape(tokens, -1).to(torch.int32)
            # Positions the attention mask excludes (padding) are never loaded.
            allowed = torch.gather(attention_mask[:, 0].reshape(tokens, -1), 1, positions.long().clamp(min=0))
            allowed = allowed if allowed.dtype == torch.bool else allowed == 0
            positions = torch.where(allowed & (positions >= 0), positions, -1)
            req = self._rows[:batch].repeat_interleave(num_tokens)
            attention = self.kv.swap_in(layer, positions, req, prefetch=self.prefetch, fused_gather=self.fused_gather)
        else:
            attention = self.kv.swap_in(layer, num_tokens=tokens)[:, : indices.shape[-1]]
        rows = self.kv.read(layer, attention)
        if self.attention == "sparse":
            return mla_sparse_attention(module, query, rows, attention >= 0, scaling, self.latent_width)
        return positioned_attention(module, query, rows, attention, indices, attention_mask, scaling,
                                    self.latent_width)

    # ------------------------------------------------------------------ counters
    def stats(self, *, reset: bool = False) -> dict:
        """hisparse's counters: ``{"total": {...}, "groups": [{..., "layers": [...]}, ...]}``, each with
        lookups, hits, misses, resident, invalid, hit_rate and bytes_moved; with ``reset`` they are zeroed
        after reading."""
        stats = self.kv.stats()
        for group, entry in enumerate(stats["groups"]):
            entry["layers"] = [layer for layer in range(self.num_layers) if self.kv.group_of(layer) == group]
        if reset:
            self.reset_stats()
        return stats

    def reset_stats(self) -> None:
        self.kv.reset_stats()

    def __repr__(self) -> str:
        return (f"HiSparseCache({self.num_layers} layers in {self.kv.num_groups} groups, "
                f"{self.max_batch_size} requests x {self.max_cache_len} positions, {self.kv.config.device_buffer_size} "
                f"hot rows, device={self.device}, dtype={self.dtype})")


def mla_sparse_attention(module: nn.Module, query: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor,
                         scaling: float, latent_width: int) -> torch.Tensor:
    """Reference MLA attention over gathered latent rows.

    ``query`` [B, H, S, nope + rope]; ``rows`` [B*S, k, kv_lora_rank + rope]
    (the latent row and the rotated key of each selected position); ``valid``
    [B*S, k]. Each row is expanded through the layer's ``kv_b_proj`` into its
    key and value, exactly as the model expands its cache, and the query
    attends over the k rows. Returns [B, S, H, v_head_dim].
    """
    batch, heads, num_tokens, _ = query.shape
    tokens, k, _ = rows.shape
    nope, v_dim = module.qk_nope_head_dim, module.v_head_dim
    latent, k_rot = rows[..., :latent_width], rows[..., latent_width:]
    expanded = module.kv_b_proj(latent).view(tokens, k, heads, nope + v_dim)
    k_nope, value = expanded.split((nope, v_dim), dim=-1)
    key = torch.cat((k_nope, k_rot.unsqueeze(2).expand(tokens, k, heads, k_rot.shape[-1])), dim=-1)
    q = query.transpose(1, 2).reshape(tokens, heads, 1, -1)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, key.transpose(1, 2), value.transpose(1, 2), attn_mask=valid[:, None, None, :], scale=scaling
    )
    return out.reshape(batch, num_tokens, heads, v_dim)


def positioned_attention(module: nn.Module, query: torch.Tensor, rows: torch.Tensor, attention: torch.Tensor,
                         indices: torch.Tensor, attention_mask: Any, scaling: float, latent_width: int) -> torch.Tensor:
    """The model's own attention over the rows hisparse resolved, each at its position.

    ``rows`` [B*S, k, W] are the rows ``attention`` (the indices swap_in
    returned for the top-k ``indices`` [B, S, k]) names. They go to their
    positions of an otherwise zero latent sequence of the mask's length
    (one per request: its S query tokens' rows of a position are one row),
    which the layer expands (``expand_kv``) and attends with the original
    implementation, the mask admitting exactly the positions that resolved:
    the model's computation on the same inputs, so its result bit for bit
    (the zero rows are masked, and masked positions weigh exactly 0).
    """
    batch, _, num_tokens, _ = query.shape
    length = attention_mask.shape[-1]
    resolved = (attention >= 0).view(batch, num_tokens, -1)
    positions = indices.reshape(batch, num_tokens, -1).long()
    rows = rows.view(batch, num_tokens, -1, rows.shape[-1])
    latent = rows.new_zeros((batch, length, rows.shape[-1]))
    b, t, k = resolved.nonzero(as_tuple=True)
    # The token rows of one request resolve a position to the same row, so they share one latent sequence.
    latent[b, positions[b, t, k]] = rows[b, t, k]
    # Contiguous, as the model's own cache hands them over, so that the expansion runs the same GEMM.
    k_pass = latent[..., :latent_width].unsqueeze(1).contiguous()
    k_rot = latent[..., latent_width:].unsqueeze(1).contiguous()
    key, value = module.expand_kv(k_pass, k_rot)
    selected = torch.zeros((batch, 1, num_tokens, length), dtype=torch.bool, device=query.device)
    selected[b, 0, t, positions[b, t, k]] = True
    if attention_mask.dtype == torch.bool:
        mask = attention_mask & selected
    else:
        mask = attention_mask.masked_fill(~selected, torch.finfo(query.dtype).min)
    out, _ = _original_attention(module, query, key, value, mask, None, scaling=scaling, dropout=0.0)
    return out


def _original_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: Any, indices: torch.Tensor, **kwargs: Any) -> tuple:
    """What the model computes with its original implementation: the indexer's top-k folded into the mask."""
    original = _ORIGINAL.get(module.config._attn_implementation, "sdpa")
    batch, _, num_tokens, _ = query.shape
    if indices is not None:
        index_mask = (
            indices.new_ones((batch, num_tokens, key.shape[2]), dtype=torch.bool)
            .scatter(-1, indices.long(), False)
            .unsqueeze(1)
        )
        if attention_mask.dtype == torch.bool:
            attention_mask = attention_mask & ~index_mask
        else:
            attention_mask = attention_mask.masked_fill(index_mask, torch.finfo(query.dtype).min)
    if original == "eager":
        forward = sys.modules[type(module).__module__].eager_attention_forward
    else:
        forward = ALL_ATTENTION_FUNCTIONS["sdpa"]
    return forward(module, query, key, value, attention_mask, **kwargs)


def hisparse_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: Any, scaling: float = None, dropout: float = 0.0, indices: Any = None,
                       **kwargs: Any) -> tuple:
    """The attention of a prepared model (transformers' AttentionInterface signature).

    A decode step of a layer whose cache is a HiSparseCache reads only the
    rows hisparse resolved; anything else (a prompt, another cache) runs the
    model's original attention with the indexer's mask.
    """
    step = getattr(_pending, "step", None)
    if step is not None and step.layer == module.layer_idx:
        _pending.step = None
    else:
        step = None
    if step is None or step.past == 0 or indices is None:
        return _original_attention(module, query, key, value, attention_mask, indices, scaling=scaling,
                                   dropout=dropout, **kwargs)
    out = step.cache.sparse_attention(module, step, query, attention_mask, indices, scaling)
    return out, None
