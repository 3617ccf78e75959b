"""The second seed's LRU cache, keyed by token id, done carefully.

``put(token_id, key, value)`` inserts or refreshes an entry and evicts the
least recently used when over ``max_size``; ``get(token_id)`` returns
``(key, value)`` and *promotes* the entry to most recently used.

Promotion is the interesting part. A sliding window evicts by *age*: the
oldest position goes, whatever happened to it. LRU evicts by *use*: an entry
that was read recently survives, even when it is older than the window. So
as soon as anything calls ``get`` on old tokens (a lookup, a debugging print,
the seed's own attention demo), the cache holds keys sliding-window
attention must not see, and attention over it diverges from the oracle.
Lesson 5 shows the divergence; with no ``get`` calls LRU is plain FIFO and
matches the sliding window exactly.

It also implements the shared :class:`~swkv_teach.caches.base.KVCache`
interface: ``update(k_new, v_new)`` puts each new token under its absolute
position as id, so the decoder and widgets can drive it like the others.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable

import torch

from swkv_teach._validate import check_kv, check_positive_int
from swkv_teach.caches.base import KVCache


class LRUKVCache(KVCache):
    """At most ``max_size`` ``(key, value)`` entries, evicting the least recently used.

    Example, ``max_size=3``::

        put(0), put(1), put(2)   ids() == [0, 1, 2]      (least recent first)
        get(0)                   ids() == [1, 2, 0]      0 promoted
        put(3)                   ids() == [2, 0, 3]      1 evicted, not 0
    """

    def __init__(self, max_size: int):
        self.max_size = check_positive_int("max_size", max_size)
        self._entries: OrderedDict[Hashable, tuple[Any, Any]] = OrderedDict()
        self._seen = 0
        self._returned: list = []

    # ------------------------------------------------------ the seed's API
    def put(self, token_id: Hashable, key: Any, value: Any) -> None:
        """Insert or refresh ``token_id`` as most recently used; evict the least recently used if over."""
        if token_id in self._entries:
            self._entries.move_to_end(token_id)
        self._entries[token_id] = (key, value)
        while len(self._entries) > self.max_size:
            self._entries.popitem(last=False)

    def get(self, token_id: Hashable) -> tuple[Any, Any] | None:
        """``(key, value)`` of ``token_id``, promoted to most recently used; None on a miss."""
        if token_id not in self._entries:
            return None
        self._entries.move_to_end(token_id)
        return self._entries[token_id]

    def peek(self, token_id: Hashable) -> tuple[Any, Any] | None:
        """Like :meth:`get` without promoting: reading should not change what is evicted."""
        return self._entries.get(token_id)

    def ids(self) -> list:
        """Stored ids, least recently used first."""
        return list(self._entries)

    def __contains__(self, token_id: Hashable) -> bool:
        return token_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    # ------------------------------------------------ the shared interface
    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Put each of the ``tokens`` new keys/values under its absolute position.

        Returns the ``max_size - 1`` most recently used entries followed by the
        new tokens, ``(batch, heads, n, head_dim)`` each, in recency order; with
        no ``get`` calls in between this is exactly the sliding window.
        """
        like = next((k for k, _ in self._entries.values() if isinstance(k, torch.Tensor)), None)
        check_kv(k_new, v_new, like)
        k_new, v_new = k_new.detach(), v_new.detach()  # values, not autograd history (see base.py)
        old = list(self._entries.items())[-(self.max_size - 1):] if self.max_size > 1 else []
        new_ids = range(self._seen, self._seen + k_new.shape[2])
        for t, token_id in enumerate(new_ids):
            # clone: an entry must not keep the caller's whole chunk alive, or change with it
            self.put(token_id, k_new[:, :, t : t + 1].clone(), v_new[:, :, t : t + 1].clone())
        self._seen += k_new.shape[2]
        self._returned = [i for i, _ in old] + list(new_ids)
        k = torch.cat([kv[0] for _, kv in old] + [k_new], dim=2)
        v = torch.cat([kv[1] for _, kv in old] + [v_new], dim=2)
        return k, v

    @property
    def positions(self) -> torch.Tensor:
        """Ids (absolute positions, when filled by ``update``) of the last returned keys, in that order."""
        like = next((k for k, _ in self._entries.values() if isinstance(k, torch.Tensor)), None)
        return torch.tensor(self._returned, dtype=torch.long, device=None if like is None else like.device)

    @property
    def seen(self) -> int:
        return self._seen

    @property
    def nbytes(self) -> int:
        return sum(getattr(x, "nbytes", 0) for kv in self._entries.values() for x in kv)

    def reset(self) -> None:
        self._entries.clear()
        self._seen = 0
        self._returned = []
