"""The shared host pool's collective side: pool ids, their broadcast over a
torch.distributed group, and whether a deployment should share one pool.

The C ABI follows NCCL's unique-id pattern (hisparse/shared_host_pool.h): one
rank makes an id, the caller broadcasts it, every rank creates its pool from
(id, rank, ranks). ``HostPool.shared`` does the broadcast through the
engine's own process group; ``shared_pool_id`` and ``HostPool.shared(...,
pool_id=, rank=, ranks=)`` serve callers with a channel of their own.
"""

from __future__ import annotations

from typing import Any, Optional

from . import _C, _args
from ._tensors import torch_or_none

__all__ = ["shared_pool_id", "use_shared_host_pool"]


def shared_pool_id() -> bytes:
    """A new shared pool id (``SHARED_POOL_ID_BYTES`` opaque bytes); send them unchanged to every rank."""
    return _C.shared_pool_id()


def broadcast_pool_id(group: Any = None) -> tuple:
    """(id, rank, ranks): rank 0 of ``group`` (None: the world group) makes the id, every rank receives it.

    Works with every torch.distributed backend (gloo, NCCL: the current CUDA
    device carries the bytes). If rank 0 cannot make an id, every rank raises.
    """
    torch = torch_or_none()
    if torch is None or not torch.distributed.is_available():
        raise RuntimeError("HostPool.shared: group needs torch.distributed; pass pool_id, rank and ranks instead")
    dist = torch.distributed
    if not dist.is_initialized():
        raise RuntimeError(
            "HostPool.shared: torch.distributed is not initialised (init_process_group first), "
            "or pass pool_id, rank and ranks"
        )
    rank = dist.get_rank(group)
    ranks = dist.get_world_size(group)
    if rank < 0:
        raise ValueError("group: this process is not a member of the group")
    payload: list = [None]
    if rank == 0:
        try:
            payload = [shared_pool_id()]
        except Exception as error:  # noqa: BLE001 - the other ranks must hear of it, not hang
            payload = [f"{type(error).__name__}: {error}"]
    source = 0 if group is None else dist.get_global_rank(group, 0)
    dist.broadcast_object_list(payload, src=source, group=group)
    pool_id = payload[0]
    if not isinstance(pool_id, bytes):
        raise RuntimeError(f"HostPool.shared: rank 0 of the group could not make the pool id: {pool_id}")
    return pool_id, rank, ranks


def _backend_device_type(device: Any) -> int:
    if device is None:
        cuda = _C.build_info()["cuda_compiled"] and _C.cuda_device_count() > 0
        return _C.DEVICE_CUDA if cuda else _C.DEVICE_CPU
    return _args.device(device)[0]


def use_shared_host_pool(
    parallel_config: Any = None,
    *,
    tensor_parallel_size: Optional[int] = None,
    pipeline_parallel_size: Optional[int] = None,
    prefill_context_parallel_size: Optional[int] = None,
    decode_context_parallel_size: Optional[int] = None,
    world_size: Optional[int] = None,
    distributed_executor_backend: Optional[str] = None,
    nnodes_within_dp: Optional[int] = None,
    device: Any = None,
) -> bool:
    """Whether replicated MLA host KV can share one local mapping (the seed's
    ``use_shared_hisparse_host_pool``).

    True when the backend supports a shared pool and the ranks that share it
    are exactly the tensor-parallel ranks of one host: more than one TP rank,
    no pipeline, prefill-context or decode-context parallelism, a world of
    exactly the TP ranks, the multiprocessing executor ("mp") and one node
    per data-parallel rank. The sizes are read from ``parallel_config`` (an
    object with vLLM's ``ParallelConfig`` attribute names) where given;
    keywords override them. Unset sizes default to 1, ``world_size`` to the
    TP size and the executor to "mp". ``device``: the backend asked (None:
    CUDA when a device is usable, else the CPU backend).
    """

    def setting(name: str, given: Any, default: Any) -> Any:
        if given is None:
            given = getattr(parallel_config, name, None) if parallel_config is not None else None
        if given is None:
            return default
        if name == "distributed_executor_backend":
            if not isinstance(given, str):
                raise TypeError(f"{name}: expected a str, got {type(given).__name__}")
            return given
        return _args.require_int(name, given, 1, bits=32)

    tp = setting("tensor_parallel_size", tensor_parallel_size, 1)
    return bool(
        _C.supports_shared_host_pool(_backend_device_type(device))
        and tp > 1
        and setting("pipeline_parallel_size", pipeline_parallel_size, 1) == 1
        and setting("prefill_context_parallel_size", prefill_context_parallel_size, 1) == 1
        and setting("decode_context_parallel_size", decode_context_parallel_size, 1) == 1
        and setting("world_size", world_size, tp) == tp
        and setting("distributed_executor_backend", distributed_executor_backend, "mp") == "mp"
        and setting("nnodes_within_dp", nnodes_within_dp, 1) == 1
    )
