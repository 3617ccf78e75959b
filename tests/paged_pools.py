"""The poisoned pool both ``paged_attention`` specifications read (tests/test_paged_attention*.py).

Each row's keys and values sit in shuffled blocks of a pool where its queries read them; every slot holding no key
of any query's window is NaN, and every block-table entry no query needs is -1 or far outside the pool, so a read
the function must not make shows in its output. The dense keys and values, in position order, feed the oracles.
"""

from __future__ import annotations

import torch


def poisoned_pool(seqlens, counts, W, bs, Hk, D, dtype, seed, junk):
    """Row ``b`` holds ``seqlens[b]`` keys and is read by its last ``counts[b]`` queries, window ``W`` (None: all).

    Returns ``k_cache``, ``v_cache`` ``(num_blocks, bs, Hk, D)``, the block table ``(batch, max_blocks)`` int32,
    and per row the dense keys and values ``(seqlens[b], Hk, D)``. ``junk``: ``"minus1"`` or ``"huge"`` entries.
    """
    g = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-n // bs) for n in seqlens) + 1
    firsts = [0 if W is None else max(0, n - c - W + 1) for n, c in zip(seqlens, counts)]
    needed = [list(range(f // bs, (n - 1) // bs + 1)) if c else [] for f, n, c in zip(firsts, seqlens, counts)]
    num_blocks = sum(map(len, needed)) + 2
    perm = torch.randperm(num_blocks, generator=g).tolist()
    k_cache = torch.full((num_blocks, bs, Hk, D), float("nan"))
    v_cache = torch.full((num_blocks, bs, Hk, D), float("nan"))
    table = torch.empty(len(seqlens), max_blocks, dtype=torch.int32)
    dense_k, dense_v = [], []
    for b, n in enumerate(seqlens):
        k = torch.randn(n, Hk, D, generator=g).to(dtype)
        v = torch.randn(n, Hk, D, generator=g).to(dtype)
        dense_k.append(k)
        dense_v.append(v)
        for i in range(max_blocks):
            if i in needed[b]:
                table[b, i] = block = perm.pop()
                for j in range(max(i * bs, firsts[b]), min(n, (i + 1) * bs)):
                    k_cache[block, j % bs], v_cache[block, j % bs] = k[j].float(), v[j].float()
            else:
                table[b, i] = -1 if junk == "minus1" else 10**6 + i
    return k_cache.to(dtype), v_cache.to(dtype), table, dense_k, dense_v
