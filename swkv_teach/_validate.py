"""Argument checks whose errors teach: each names the argument, what was expected and what came.

Kept in one place so every cache, mask and helper words its errors the same way.
"""

from __future__ import annotations

import torch

KV_LAYOUT = "(batch, heads, tokens, head_dim)"


def check_positive_int(name: str, value) -> int:
    """Return ``value`` if it is an int >= 1 (bool is refused: ``True`` is not a size)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int; got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive int (>= 1); got {value}")
    return value


def check_nonnegative_int(name: str, value) -> int:
    """Return ``value`` if it is an int >= 0 (bool refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a non-negative int; got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative int (>= 0); got {value}")
    return value


def check_kv(k_new, v_new, like: torch.Tensor | None = None) -> None:
    """Check one update's keys and values, and that they match what a cache already holds.

    Args:
        k_new, v_new: tensors shaped ``(batch, heads, tokens, head_dim)``, ``tokens >= 1``.
        like: a tensor the cache already stores (None when empty): the new tokens
            must agree with it in batch, heads, head_dim, dtype and device.

    Raises TypeError for non-tensors and dtype/device mismatches, ValueError for shapes.
    """
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor shaped {KV_LAYOUT}; got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} has {t.dim()} dims, shape {tuple(t.shape)}; expected 4: {KV_LAYOUT}")
        if t.shape[2] < 1:
            raise ValueError(f"{name} holds no tokens (shape {tuple(t.shape)}); expected at least 1 along dim 2")
    if k_new.shape != v_new.shape:
        raise ValueError(f"k_new and v_new must have the same shape; got {tuple(k_new.shape)} and {tuple(v_new.shape)}")
    if k_new.dtype != v_new.dtype:
        raise TypeError(f"k_new and v_new must have the same dtype; got {k_new.dtype} and {v_new.dtype}")
    if k_new.device != v_new.device:
        raise TypeError(f"k_new and v_new must be on the same device; got {k_new.device} and {v_new.device}")
    if like is None:
        return
    for axis, what in ((0, "batch"), (1, "heads"), (3, "head_dim")):
        if k_new.shape[axis] != like.shape[axis]:
            raise ValueError(
                f"k_new has {what}={k_new.shape[axis]} (shape {tuple(k_new.shape)}) but the cache holds "
                f"{what}={like.shape[axis]} (shape {tuple(like.shape)}); call reset() to start a new sequence"
            )
    if k_new.dtype != like.dtype:
        raise TypeError(f"k_new has dtype {k_new.dtype} but the cache holds {like.dtype}")
    if k_new.device != like.device:
        raise TypeError(f"k_new is on device {k_new.device} but the cache is on {like.device}")
