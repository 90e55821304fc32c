"""hisparse's decode-path ops as torch custom ops, so that compiled models
(``torch.compile``, CUDA graphs through it) call them without a graph break.

Importing this module registers, in the ``hisparse`` namespace of
``torch.ops`` (each with a schema that marks the tensors it mutates, and a
fake implementation for tracing):

- ``read_rows(cache, indices) -> rows``: :func:`hisparse.ops.read_rows`;
- ``write_rows(rows, req_id_per_token, positions, request_state_indices,
  host_cache?, source_block_table?, block_size, resident_cache?,
  resident_block_table?, hot_cache?, hot_block_table?,
  device_global_indices?) -> ()``: :func:`hisparse.ops.write_rows`,
  mutating the host, resident and hot caches;
- the steps of a :class:`hisparse.KVCache` forward, on the cache named by
  :func:`cache_id`: ``kv_begin_forward(cache, seq_lens, state)``,
  ``kv_write(cache, layer, rows, req_id_per_token, positions, slab)``,
  ``kv_swap_in(cache, layer, topk?, req_id_per_token?, num_tokens, width,
  prefetch, slab, device_global_indices) -> attention indices`` and
  ``kv_read(cache, layer, indices, slab) -> rows``. The cache's tensors
  these change are arguments (``state`` = ``cache.table("seq_lens")``,
  ``slab`` = ``cache.slab``, the group's ``device_global_indices``), so a
  compiled graph keeps the ops and their order; the kernels change the
  cache's own memory, and an op handed a copy of it (functionalization
  without reinplacing) leaves the new state in the copy too.

``import hisparse`` never imports this module (hisparse needs no torch);
import it, or call :func:`register`, where torch is present. Registration
happens once per process.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Optional

import torch

from . import _args, ops
from .kv_cache import KVCache

__all__ = ["cache_id", "register"]

_caches: "weakref.WeakValueDictionary[int, KVCache]" = weakref.WeakValueDictionary()
_ids: dict = {}
_next_id = itertools.count(1)
_registered = False


def cache_id(cache: KVCache) -> int:
    """The integer that names ``cache`` in the ``kv_*`` ops (stable for the cache's lifetime)."""
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache: expected a hisparse.KVCache, got {type(cache).__name__}")
    key = id(cache)
    known = _ids.get(key)
    if known is not None and _caches.get(known) is cache:
        return known
    handle = next(_next_id)
    _caches[handle] = cache
    _ids[key] = handle
    return handle


def _cache(handle: int) -> KVCache:
    cache = _caches.get(handle)
    if cache is None:
        raise ValueError(f"cache: {handle} names no live hisparse.KVCache (hisparse.torch_ops.cache_id makes one)")
    return cache


def _reflect(argument: torch.Tensor, state: torch.Tensor) -> None:
    """Make a mutated argument hold the cache's state. The kernels change the
    cache's own memory; a tracer that hands the op a copy of that memory
    (functionalization without reinplacing) copies the argument back over the
    memory afterwards, so the copy must carry the new state."""
    if argument.data_ptr() != state.data_ptr():
        argument.copy_(state)


def register() -> None:
    """Register the ops (idempotent; importing this module does it)."""
    global _registered
    if _registered:
        return
    _registered = True

    @torch.library.custom_op("hisparse::read_rows", mutates_args=())
    def read_rows(cache: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        if cache.dim() < 2:
            raise ValueError(f"cache: expected a paged view [blocks, block_size, W] or rows [N, W], got shape "
                             f"{tuple(cache.shape)}")
        out = torch.empty((*_args.index_rows("indices", indices), cache.shape[-1]), dtype=cache.dtype,
                          device=cache.device)
        ops.read_rows(cache, indices, out)
        return out

    @read_rows.register_fake
    def _(cache: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return cache.new_empty((*indices.shape, cache.shape[-1]))

    @torch.library.custom_op(
        "hisparse::write_rows", mutates_args=("host_cache", "resident_cache", "hot_cache")
    )
    def write_rows(
        rows: torch.Tensor,
        req_id_per_token: torch.Tensor,
        positions: torch.Tensor,
        request_state_indices: torch.Tensor,
        host_cache: Optional[torch.Tensor],
        source_block_table: Optional[torch.Tensor],
        block_size: int,
        resident_cache: Optional[torch.Tensor],
        resident_block_table: Optional[torch.Tensor],
        hot_cache: Optional[torch.Tensor],
        hot_block_table: Optional[torch.Tensor],
        device_global_indices: Optional[torch.Tensor],
    ) -> None:
        ops.write_rows(rows, req_id_per_token, positions, request_state_indices, host_cache=host_cache,
                       source_block_table=source_block_table, block_size=block_size, resident_cache=resident_cache,
                       resident_block_table=resident_block_table, hot_cache=hot_cache,
                       hot_block_table=hot_block_table, device_global_indices=device_global_indices)

    @write_rows.register_fake
    def _(rows, req_id_per_token, positions, request_state_indices, host_cache, source_block_table, block_size,
          resident_cache, resident_block_table, hot_cache, hot_block_table, device_global_indices) -> None:
        return None

    @torch.library.custom_op("hisparse::kv_begin_forward", mutates_args=("state",))
    def kv_begin_forward(cache: int, seq_lens: torch.Tensor, state: torch.Tensor) -> None:
        kv = _cache(cache)
        kv.begin_forward(seq_lens)
        _reflect(state, kv.table("seq_lens"))

    @kv_begin_forward.register_fake
    def _(cache: int, seq_lens: torch.Tensor, state: torch.Tensor) -> None:
        return None

    @torch.library.custom_op("hisparse::kv_write", mutates_args=("slab",))
    def kv_write(cache: int, layer: int, rows: torch.Tensor, req_id_per_token: torch.Tensor, positions: torch.Tensor,
                 slab: torch.Tensor) -> None:
        kv = _cache(cache)
        kv.write(layer, rows, req_id_per_token, positions)
        _reflect(slab, kv.slab)

    @kv_write.register_fake
    def _(cache, layer, rows, req_id_per_token, positions, slab) -> None:
        return None

    @torch.library.custom_op("hisparse::kv_swap_in", mutates_args=("slab", "device_global_indices"))
    def kv_swap_in(cache: int, layer: int, topk_indices: Optional[torch.Tensor],
                   req_id_per_token: Optional[torch.Tensor], num_tokens: int, width: int, prefetch: bool,
                   slab: torch.Tensor, device_global_indices: torch.Tensor) -> torch.Tensor:
        kv = _cache(cache)
        if topk_indices is not None:
            attention = kv.swap_in(layer, topk_indices, req_id_per_token, prefetch=prefetch)
        else:
            attention = kv.swap_in(layer, num_tokens=num_tokens)[:, :width]
        _reflect(slab, kv.slab)
        _reflect(device_global_indices, kv.group_tensor(layer, "device_global_indices"))
        return attention.clone()

    @kv_swap_in.register_fake
    def _(cache, layer, topk_indices, req_id_per_token, num_tokens, width, prefetch, slab, device_global_indices):
        rows = topk_indices.shape[0] if topk_indices is not None else num_tokens
        return slab.new_empty((rows, width), dtype=torch.int32)

    @torch.library.custom_op("hisparse::kv_read", mutates_args=())
    def kv_read(cache: int, layer: int, indices: torch.Tensor, slab: torch.Tensor) -> torch.Tensor:
        return _cache(cache).read(layer, indices)

    @kv_read.register_fake
    def _(cache, layer, indices, slab):
        return slab.new_empty((*indices.shape, slab.shape[-1]))


def kv_step_args(cache: KVCache, layer: int) -> dict:
    """The tensors of ``cache`` the ``kv_*`` ops of ``layer`` take as arguments."""
    return {"slab": cache.slab, "device_global_indices": cache.group_tensor(layer, "device_global_indices")}


register()
