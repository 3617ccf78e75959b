"""Rotary position embeddings (RoPE): the ``cos``/``sin`` tables and the rotation, for the decoder and its steps.

Below both :mod:`swkv_teach.model` and :mod:`swkv_teach.compiled_ring`, which use the same tables: a compiled step
holds the frequencies as a tensor (:func:`_rotary_with`), the eager model asks :func:`rotary`. Frequencies are in
float32; the halves layout matches Hugging Face: dim ``d`` and ``d + head_dim/2`` rotate together. Positions are
absolute: a cache's ``seen``, never its length (see :mod:`swkv_teach.caches.base`).
"""

from __future__ import annotations

import functools

import torch

__all__ = ["apply_rotary", "rotary"]


@functools.lru_cache(maxsize=16)
def _inv_freq(head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    # float32, and kept out of the module's buffers, so .to(bfloat16) cannot round it;
    # cached because a decode step would otherwise rebuild it in every layer
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=device) / head_dim))


def rotary(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """RoPE's ``cos`` and ``sin`` for absolute ``positions`` ``(T,)``: each ``(T, head_dim)``.

    Frequencies are in float32; the halves layout matches Hugging Face: dim
    ``d`` and ``d + head_dim/2`` rotate together.
    """
    return _rotary_with(positions, _inv_freq(head_dim, float(theta), positions.device), dtype)


def _rotary_with(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """:func:`rotary` from frequencies already made (a compiled step holds them as a tensor, not a cached call)."""
    freqs = torch.outer(positions.float(), inv_freq)  # (T, head_dim/2): position × frequency
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, head_dim)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``(B, H, T, head_dim)`` by the angles in ``cos``/``sin`` ``(T, head_dim)``."""
    return x * cos + _rotate_half(x) * sin
