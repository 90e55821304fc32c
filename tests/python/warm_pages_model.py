"""What ops.warm_host_pages reads, written from its contract alone (data_movement.h): the words, their count
and their XOR, so that every backend is checked against this and not only against the other."""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np
import torch


def warmed_offsets(host_cache: Any, block_table: Any, block_size: int, page_bytes: int,
                   seq_lens: Optional[Any] = None) -> List[int]:
    """Byte offsets from host_cache's first byte of every word read, in entry order (contiguous host_cache)."""
    base = host_cache.data_ptr()
    row_bytes = host_cache.shape[-1] * host_cache.element_size()
    rows = host_cache.numel() * host_cache.element_size() // row_bytes if row_bytes else 0
    extent = rows * row_bytes
    table = block_table.cpu().numpy()
    blocks = -(-rows // block_size) if rows else 0
    block_bytes = block_size * row_bytes
    offsets = []
    for b in range(table.shape[0]):
        used = table.shape[1]
        if seq_lens is not None:
            length = int(seq_lens[b])
            used = 0 if length <= 0 else min(-(-length // block_size), used)
        for i in range(used):
            block = int(table[b, i])
            if block < 0 or block >= blocks:
                continue
            start, end = block * block_bytes, min((block + 1) * block_bytes, extent)
            below = i > 0 and int(table[b, i - 1]) == block - 1
            boundaries = list(range(start + (-(base + start)) % page_bytes, end, page_bytes))
            if (base + start) % page_bytes != 0 and not below:
                offsets.append(start)
            offsets.extend(boundaries)
    return offsets


def warm_totals(host_cache: Any, block_table: Any, block_size: int, page_bytes: int,
                seq_lens: Optional[Any] = None) -> Tuple[int, int]:
    """(words read, their XOR) as ops.warm_host_pages writes them into ``out``."""
    offsets = warmed_offsets(host_cache, block_table, block_size, page_bytes, seq_lens)
    raw = host_cache.contiguous().view(-1).view(torch.uint8).numpy()
    folded = 0
    for offset in offsets:
        folded ^= int(np.frombuffer(raw[offset:offset + 4].tobytes(), dtype=np.uint32)[0])
    return len(offsets), folded
