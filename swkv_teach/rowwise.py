"""Eviction with one decision per batch row: many independent texts through H2O, TOVA or LRU at once.

The library's caches keep one set of positions per layer, shared by every batch
row (:mod:`swkv_teach.caches.scored`), so a batch of unrelated texts would evict
the same positions from all of them. A fair measurement needs each text to
evict by its own attention, and feeding texts one at a time through
``Decoder.step`` is thousands of Python steps per number. This module runs the
same policies with a *held* mask per row instead of gathered slots:

* every layer's keys/values for all positions are kept (that is the simulator's
  bookkeeping, not the policy's memory), and a bool ``held`` ``(rows, T)`` says
  which of them the policy stores; attention is masked to ``held`` and to the
  model's window rule (:mod:`swkv_teach.masks`), so a query attends over at most
  ``budget`` keys, as with the real cache;
* the decisions are the library caches' own, per row: evict *before* writing the
  new token (equal memory with a ring buffer of ``budget``), score by the attention
  of the new query averaged over query heads, ties to the oldest position.

  ``"h2o"``   :class:`~swkv_teach.caches.H2OKVCache` ``(budget, recent)``: scores accumulate;
              the ``recent`` newest (the new token included) are never evicted.
  ``"tova"``  :class:`~swkv_teach.caches.TOVAKVCache` ``(budget)``: the newest query's weight.
  ``"lru"``   :class:`~swkv_teach.caches.LRUKVCache` ``(budget)`` read by attention: after each
              step the key the new query attends to most is read (``get``), which promotes it;
              the least recently written-or-read goes.

With one row each kind makes exactly the choices of the library's cache driven
through ``Decoder.step`` (tests/test_rowwise.py checks it against the real caches).
Window and sinks need no simulator: their cached scoring equals
``Decoder.forward(ids, num_sinks, window_size)``, one batched pass.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from swkv_teach._validate import check_nonnegative_int, check_positive_int
from swkv_teach.model import Decoder, rotary

__all__ = ["ROWWISE_KINDS", "rowwise_losses"]

ROWWISE_KINDS = ("h2o", "tova", "lru")


@torch.no_grad()
def rowwise_losses(
    model: Decoder,
    ids: torch.Tensor,
    kind: str,
    budget: int,
    recent: int | None = None,
    window_size: int | None = None,
) -> torch.Tensor:
    """Next-token losses ``(rows, T)`` of ``ids`` ``(rows, T + 1)``, one token per step, each row evicting on its own.

    Args:
        model: the decoder.
        ids: ``(rows, T + 1)`` token ids; row ``r`` predicts ``ids[r, 1:]`` from ``ids[r, :-1]``.
        kind: one of :data:`ROWWISE_KINDS`.
        budget: keys stored per layer (and per row).
        recent: H2O's recent window, ``0 <= recent <= budget`` (default ``budget // 2``); others ignore it.
        window_size: the mask's window (default the model's own, as ``Decoder.step`` uses): a held
            key older than it is masked, as in training.
    """
    if kind not in ROWWISE_KINDS:
        raise ValueError(f"kind must be one of {ROWWISE_KINDS}; got {kind!r}")
    check_positive_int("budget", budget)
    recent = budget // 2 if recent is None else check_nonnegative_int("recent", recent)
    if recent > budget:
        raise ValueError(f"recent must be <= budget; got recent={recent}, budget={budget}")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] < 2 or ids.dtype != torch.long:
        got = f"shape {tuple(ids.shape)} dtype {ids.dtype}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"ids must be a 2-D long tensor (rows, T + 1) with T >= 1; got {got}")
    c = model.config
    W = c.window_size if window_size is None else check_positive_int("window_size", window_size)
    x_ids, targets = ids[:, :-1], ids[:, 1:]
    R, T = x_ids.shape
    dev, dtype = ids.device, model.embed.weight.dtype
    group, hd = c.n_heads // c.n_kv_heads, c.head_dim
    rows, pos = torch.arange(R, device=dev), torch.arange(T, device=dev)
    cos, sin = rotary(pos, hd, c.rope_theta, dtype)
    L = len(model.layers)
    keys = torch.zeros(L, R, c.n_kv_heads, T, hd, device=dev, dtype=dtype)
    values = torch.zeros_like(keys)
    held = torch.zeros(L, R, T, dtype=torch.bool, device=dev)
    score = torch.zeros(L, R, T, device=dev)  # float32: the caches' scores
    logits = []
    for t in range(T):
        x = model.embed(x_ids[:, t : t + 1])  # (R, 1, dim)
        rope = (cos[t : t + 1], sin[t : t + 1])
        for l, layer in enumerate(model.layers):
            q, k, v = layer.attn.qkv(layer.attn_norm(x), pos[t : t + 1], rope)  # q (R, nh, 1, hd)
            if t >= budget:  # full: evict one per row before writing (ties: argmin takes the oldest)
                candidates = held[l].clone()
                if kind == "h2o":
                    candidates[:, max(0, t + 1 - recent) :] = False  # the recent window is protected
                victim = score[l].masked_fill(~candidates, math.inf).argmin(dim=1)
                held[l, rows, victim] = False
            held[l, :, t] = True
            score[l, :, t] = 2.0 * t if kind == "lru" else 0.0  # LRU: the write is a use at time 2t
            keys[l, :, :, t], values[l, :, :, t] = k[:, :, 0], v[:, :, 0]
            visible = held[l, :, : t + 1] & (pos[: t + 1] > t - W)  # (R, t + 1)
            # GQA without copying keys: query head h*group + g is row g of key head h (HF's repeat_kv order)
            qg = q.view(R, c.n_kv_heads, group, hd)
            s = (qg @ keys[l, :, :, : t + 1].transpose(-2, -1)) / math.sqrt(hd)  # (R, nkv, group, t + 1)
            w = torch.softmax(s.masked_fill(~visible[:, None, None, :], -math.inf).float(), dim=-1).to(dtype)
            y = (w @ values[l, :, :, : t + 1]).reshape(R, 1, c.n_heads * hd)  # heads in order h*group + g
            x = x + layer.attn.o_proj(y)
            x = x + layer.mlp(layer.mlp_norm(x))
            heads = w.float().mean(dim=(1, 2))  # (R, t + 1): one score for all query heads, per row
            if kind == "h2o":
                score[l, :, : t + 1] += heads
            elif kind == "tova":
                score[l, :, : t + 1] = heads
            else:  # the most-attended key is read (promoted) after the write
                score[l, rows, heads.argmax(dim=1)] = 2.0 * t + 1
        logits.append(model.lm_head(model.norm(x)))
    logits = torch.cat(logits, dim=1)  # (R, T, vocab)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none").view(R, T)
