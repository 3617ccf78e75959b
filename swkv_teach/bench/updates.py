"""What the update benchmark measures: one ``Subject`` per cache, all fed the same one-token keys/values.

========================  =============================================================
name                      one steady-state step (window already full)
========================  =============================================================
``floor``                 two ``copy_`` into slot views made in advance, cycling the
                          slots as a ring does: the least an in-place write can cost
``ring``                  :class:`~swkv_teach.caches.RingBufferKVCache`
``sinks``                 :class:`~swkv_teach.caches.SinkKVCache` (4 sinks)
``naive``                 :class:`~swkv_teach.caches.SlidingWindowKVCache` (cat + slice)
``int8``                  :class:`~swkv_teach.caches.Int8RingBufferKVCache` (int8 + one
                          scale per token and head; returns a dequantised copy)
``paged``                 :class:`~swkv_teach.caches.PagedKVCache`, blocks of 16, its own
                          pool (batch 1 only; returns a gathered copy of its blocks)
``hf_dynamic_sliding``    transformers' ``DynamicCache`` -> ``DynamicSlidingWindowLayer``
``hf_static_sliding``     transformers' ``StaticCache`` -> ``StaticSlidingWindowLayer``
========================  =============================================================

Plus :func:`attention_read`, one decode query over a full window with SDPA,
so each update can be seen as a share of a decode step's attention work.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from swkv_teach.caches import Int8RingBufferKVCache, RingBufferKVCache, SinkKVCache, SlidingWindowKVCache, make_cache

NUM_SINKS = 4


@dataclass
class Subject:
    """One thing to time: ``step()`` makes one steady-state update; ``held()`` lists the tensors it keeps.

    Before measuring, ``fill()`` runs once (a ``W``-token prompt: the window is full
    from the start, as after a prefill) and then ``warmup`` steps.
    """

    name: str
    label: str
    step: Callable[[], object]
    held: Callable[[], tuple]
    fill: Callable[[], object] = lambda: None
    warmup: int = 16
    meta: dict = field(default_factory=dict)


def _floor(W: int, k: torch.Tensor, v: torch.Tensor) -> Subject:
    B, H, _, D = k.shape
    k_buf = torch.zeros(B, H, W, D, dtype=k.dtype, device=k.device)
    v_buf = torch.zeros_like(k_buf)
    slots = itertools.cycle(list(zip(k_buf.split(1, dim=2), v_buf.split(1, dim=2))))

    def step():
        k_slot, v_slot = next(slots)
        k_slot.copy_(k)
        v_slot.copy_(v)

    return Subject("floor", "floor: 2 copy_ into ready slots", step, lambda: (k_buf, v_buf), warmup=W + 16)


def _prompt(W: int, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    B, H, _, D = k.shape
    return tuple(torch.randn(B, H, W, D, dtype=k.dtype, device=k.device) for _ in "kv")


def _ours(name: str, label: str, cache, W: int, k, v, held) -> Subject:
    prompt = _prompt(W, k)
    return Subject(name, label, lambda: cache.update(k, v), lambda: held(cache), lambda: cache.update(*prompt),
                   meta={"class": type(cache).__name__})


def _hf_config(W: int, k: torch.Tensor):
    from transformers import MistralConfig

    _, H, _, D = k.shape
    return MistralConfig(
        vocab_size=128, hidden_size=H * D, intermediate_size=2 * H * D, num_hidden_layers=1,
        num_attention_heads=H, num_key_value_heads=H, head_dim=D, sliding_window=W,
        max_position_embeddings=1 << 20,
    )


def _hf(name: str, label: str, cache, W: int, k, v) -> Subject:
    layer = cache.layers[0]
    prompt = _prompt(W, k)
    return Subject(
        name, label,
        lambda: cache.update(k, v, 0),
        lambda: (layer.keys, layer.values),
        lambda: cache.update(*prompt, 0),
        meta={"class": type(layer).__name__, "via": type(cache).__name__},
    )


def subjects(W: int, k: torch.Tensor, v: torch.Tensor, with_hf: bool) -> list[Subject]:
    """Fresh subjects for window ``W``; ``k``, ``v`` are the one token ``(B, H, 1, D)`` every step writes."""
    found = [
        _floor(W, k, v),
        _ours("ring", "ring buffer (swkv_teach)", RingBufferKVCache(W), W, k, v, lambda c: (c.k_buf, c.v_buf)),
        _ours("sinks", f"sinks S={NUM_SINKS} (swkv_teach)", SinkKVCache(NUM_SINKS, W), W, k, v,
              lambda c: (c.k_buf, c.v_buf)),
        _ours("naive", "naive cat+slice (swkv_teach)", SlidingWindowKVCache(W), W, k, v, lambda c: (c.k, c.v)),
        _ours("int8", "int8 + scales (swkv_teach)", Int8RingBufferKVCache(W), W, k, v, lambda c: c.buffers),
    ]
    if k.shape[0] == 1:  # a paged cache holds one sequence: one batch row
        found.append(_ours("paged", "paged, blocks of 16 (swkv_teach)", make_cache("paged", W), W, k, v,
                           lambda c: (c.pool.k, c.pool.v)))
    if with_hf:
        from transformers import DynamicCache, StaticCache

        config = _hf_config(W, k)
        found.append(_hf("hf_dynamic_sliding", "HF DynamicSlidingWindowLayer", DynamicCache(config=config), W, k, v))
        found.append(_hf("hf_static_sliding", "HF StaticSlidingWindowLayer",
                         StaticCache(config=config, max_cache_len=1 << 20), W, k, v))
    return found


def attention_read(W: int, k: torch.Tensor) -> Subject:
    """One decode query ``(B, H, 1, D)`` over a full window ``(B, H, W, D)``, SDPA, no mask needed."""
    B, H, _, D = k.shape
    q = torch.randn(B, H, 1, D, dtype=k.dtype, device=k.device)
    keys = torch.randn(B, H, W, D, dtype=k.dtype, device=k.device)
    values = torch.randn_like(keys)
    return Subject("attention", "SDPA read, 1 query over W keys",
                   lambda: F.scaled_dot_product_attention(q, keys, values), lambda: ())
