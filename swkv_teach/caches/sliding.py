"""The problem statement's cache: append with ``torch.cat``, evict by slicing off the front.

This is the first seed's ``SlidingWindowKVCache`` with its API unchanged
(``update(k_new, v_new) -> (k, v)``, ``self.k``/``self.v`` None until the first
update), grown in two ways the decoder needs: updates of several tokens at
once (a prompt chunk), and the shared :class:`~swkv_teach.caches.base.KVCache`
interface (``positions``, ``seen``, ``nbytes``, ``reset``, ``len``).

Cost: every step's ``torch.cat`` copies the whole window into a new tensor,
O(W) work and one allocation per token. Lesson 3 measures it and
:class:`~swkv_teach.caches.ring.RingBufferKVCache` removes it.

Window convention: :mod:`swkv_teach.masks`.
"""

from __future__ import annotations

import torch

from swkv_teach._validate import check_kv, check_positive_int
from swkv_teach.caches import _state
from swkv_teach.caches.base import KVCache


class SlidingWindowKVCache(KVCache):
    """Keep the last ``window_size`` tokens' keys and values, in chronological order.

    Example, window 3, ``head_dim`` 1, one token per step, key = its position + 1::

        update(1.) -> [1.]   update(2.) -> [1., 2.]   update(3.) -> [1., 2., 3.]
        update(4.) -> [2., 3., 4.]                     # 1. evicted from the front

    ``update`` returns what the new tokens attend over: for one token, the
    last ``W`` (itself included); for a chunk of ``c`` tokens, the last
    ``W - 1`` stored before it plus the ``c`` new ones, so the chunk's first
    query still sees its ``W - 1`` predecessors (mask with
    :func:`~swkv_teach.masks.window_mask` and :attr:`positions`). Only the last
    ``W`` are kept afterwards.
    """

    one_token_in_window = True  # a one-token update returns the last W tokens, itself included (base.py)

    def __init__(self, window_size: int):
        self.window_size = check_positive_int("window_size", window_size)
        self.k: torch.Tensor | None = None  # (batch, heads, <= W, head_dim)
        self.v: torch.Tensor | None = None
        self._seen = 0
        self._returned = 0  # tokens the last update returned: they end at position seen - 1

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``(batch, heads, tokens, head_dim)`` keys/values; return ``(k, v)`` to attend over."""
        check_kv(k_new, v_new, self.k)
        k_new, v_new = k_new.detach(), v_new.detach()  # values, not autograd history (see base.py)
        tokens = k_new.shape[2]
        if self.k is None:
            # nothing to concatenate onto yet
            k, v = k_new, v_new
        else:
            k = torch.cat([self.k, k_new], dim=2)  # (B, H, stored + tokens, D): copies the window
            v = torch.cat([self.v, v_new], dim=2)

        W = self.window_size
        returned = min(k.shape[2], W - 1 + tokens)
        self._seen += tokens
        self._returned = returned
        if tokens == 1:
            # the seed's path: the last W are both what is kept and what is returned
            if k.shape[2] > W:
                k, v = k[:, :, -W:], v[:, :, -W:]
            self.k, self.v = k, v
            return self.k, self.v
        # a chunk: its early queries need up to W - 1 + tokens keys, the cache keeps W.
        # clone() so a long prompt's storage is not kept alive behind a W-token view.
        self.k, self.v = k[:, :, -W:].clone(), v[:, :, -W:].clone()
        return k[:, :, -returned:], v[:, :, -returned:]

    @property
    def positions(self) -> torch.Tensor:
        """Absolute positions of the last returned keys: chronological, ending at ``seen - 1``."""
        device = self.k.device if self.k is not None else None
        return torch.arange(self._seen - self._returned, self._seen, device=device)

    @property
    def seen(self) -> int:
        return self._seen

    @property
    def nbytes(self) -> int:
        """Bytes of the stored keys and values (``2 * B * H * len * D * itemsize``).

        Logical bytes: after a one-token step ``self.k`` is a W-token *view* of the
        ``W + 1``-token ``cat`` result, so one more token's storage stays alive
        until the next ``cat`` (lesson 6 measures it).
        """
        if self.k is None:
            return 0
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def reset(self) -> None:
        self.k = self.v = None
        self._seen = self._returned = 0

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    # ------------------------------------------------ persistence (caches/_state.py)
    _state_keys = ("seen", "returned", "k", "v")

    def _config(self) -> dict:
        return {"window_size": self.window_size}

    def _state_layout(self) -> list | None:
        return _state.layout(self.k)

    def _state(self) -> dict:
        # copies: self.k may be a W-token view of a W + 1 token tensor, whose whole storage torch.save would write
        return {"seen": self._seen, "returned": self._returned, "k": _state.copy(self.k), "v": _state.copy(self.v)}

    def _check_state(self, sd: dict) -> None:
        name, seen = type(self).__name__, sd["seen"]
        _state.expect_int(name, "returned", sd["returned"], 0, seen)
        if seen == 0:
            if sd["k"] is not None or sd["v"] is not None or sd["layout"] is not None:
                raise ValueError(f"{name}: a state with seen=0 holds no keys, values or layout")
            return
        B, H, D, dt = sd["layout"] or (None,) * 4
        if B is None:
            raise ValueError(f"{name}: state has seen={seen} but no layout")
        shape = (B, H, min(seen, self.window_size), D)
        for key in ("k", "v"):
            _state.expect_tensor(name, key, sd[key], shape, _state.dtype_from_name(dt))

    def _load_state(self, sd: dict) -> None:
        device = self.k.device if self.k is not None else None
        self.k, self.v = _state.copy(sd["k"], device), _state.copy(sd["v"], device)
        self._seen, self._returned = sd["seen"], sd["returned"]
