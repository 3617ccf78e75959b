"""Attention with a sliding window: the full-sequence oracle, and decode over a cache.

Both follow the convention of :mod:`swkv_teach.masks` (query ``i`` sees keys
``i - W < j <= i``, plus the first ``num_sinks``). The oracle spells softmax
out by hand; the decode path uses PyTorch's fused
``scaled_dot_product_attention``. Tests check one against the other, so
neither is trusted alone.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from swkv_teach.masks import window_mask

__all__ = ["attention", "attention_with_cache", "cached_attention", "sliding_window_attention"]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention written out: ``softmax(q kᵀ / √d, masked) v``.

    Args:
        q: ``(..., q_len, head_dim)``; k, v: ``(..., k_len, head_dim)``.
        mask: bool ``(q_len, k_len)`` (or broadcastable), True where attention is allowed.
    Returns:
        ``(..., q_len, head_dim)``.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., q_len, k_len)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def sliding_window_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_size: int, num_sinks: int = 0
) -> torch.Tensor:
    """The oracle: every query of a whole sequence at once, no cache.

    Args:
        q, k, v: ``(batch, heads, seq_len, head_dim)``, position ``t`` at index ``t``.
    Returns:
        ``(batch, heads, seq_len, head_dim)``.
    """
    pos = torch.arange(q.shape[-2], device=q.device)
    return attention(q, k, v, window_mask(pos, pos, window_size, num_sinks))


def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    window_size: int,
    num_sinks: int = 0,
) -> torch.Tensor:
    """New queries over the keys/values a cache's ``update`` returned.

    Args:
        q: ``(batch, heads, tokens, head_dim)``, the new queries.
        k, v: ``(batch, kv_heads, n, head_dim)``, any order (a ring buffer's slot order is fine).
            ``kv_heads`` may divide ``heads`` (grouped-query attention): key/value head ``h``
            then serves query heads ``h * g .. h * g + g - 1`` with ``g = heads // kv_heads``,
            as Hugging Face's ``repeat_kv`` lays them out, without copying the keys ``g`` times.
        q_positions: ``(tokens,)`` absolute positions of the queries.
        k_positions: ``(n,)`` absolute positions of the keys, as the cache's ``positions``.
    Returns:
        ``(batch, heads, tokens, head_dim)``, via ``F.scaled_dot_product_attention``.
    """
    for name, pos, t in (("q_positions", q_positions, q), ("k_positions", k_positions, k)):
        if len(pos) != t.shape[-2]:
            which = "q" if name == "q_positions" else "k"
            raise ValueError(
                f"{name} must give one position per token of {which} ({t.shape[-2]}, shape {tuple(t.shape)}); "
                f"got {len(pos)} positions"
            )
    mask = window_mask(q_positions, k_positions, window_size, num_sinks).to(q.device)
    if k.shape[-3] != q.shape[-3]:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def attention_with_cache(query: torch.Tensor, cache) -> torch.Tensor:
    """The second seed's ``attention_with_cache`` demo, corrected: one query over an LRU cache.

    The seed's version had five bugs: it called ``np.softmax`` (NumPy has
    none), so it could not run; it transposed keys with a permutation of all
    axes instead of swapping the last two; its comment says ``Q @ K^T / sqrt(dk)``
    but the code never divides by ``sqrt(dk)``; it looked up ids
    ``range(max_window)``, i.e. the *oldest* ids, which eviction has removed;
    and its ``get`` calls promoted every key they read, so reading reordered
    what gets evicted (lesson 5 shows each). Here the keys are read with ``peek`` (no promotion), in
    the cache's own order.

    Args:
        query: ``(head_dim,)``.
        cache: an :class:`~swkv_teach.caches.lru.LRUKVCache` whose entries are ``(head_dim,)`` tensors.
    Returns:
        ``(head_dim,)``: zeros if the cache is empty.
    """
    entries = [cache.peek(i) for i in cache.ids()]
    if not entries:
        return torch.zeros_like(query)
    keys = torch.stack([torch.as_tensor(k, dtype=query.dtype, device=query.device) for k, _ in entries])  # (n, hd)
    values = torch.stack([torch.as_tensor(v, dtype=query.dtype, device=query.device) for _, v in entries])
    return attention(query[None, :], keys, values)[0]
