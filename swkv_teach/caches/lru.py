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
from swkv_teach.caches import _state
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
        self.hits = self.misses = self.evictions = 0  # get() found / did not find; entries pushed out

    # ------------------------------------------------------ the seed's API
    def put(self, token_id: Hashable, key: Any, value: Any) -> None:
        """Insert or refresh ``token_id`` as most recently used; evict the least recently used if over."""
        if token_id in self._entries:
            self._entries.move_to_end(token_id)
        self._entries[token_id] = (key, value)
        while len(self._entries) > self.max_size:
            self._entries.popitem(last=False)
            self.evictions += 1

    def get(self, token_id: Hashable) -> tuple[Any, Any] | None:
        """``(key, value)`` of ``token_id``, promoted to most recently used; None on a miss."""
        if token_id not in self._entries:
            self.misses += 1
            return None
        self.hits += 1
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
        self.hits = self.misses = self.evictions = 0

    # ------------------------------------------------ telemetry and persistence (caches/_state.py)
    def _stats_extra(self) -> dict:
        return {"hits": self.hits, "misses": self.misses}

    def stats(self) -> dict:
        """:meth:`KVCache.stats`, with ``tokens_evicted`` counted as entries are pushed out (``put`` evicts too)."""
        return {**super().stats(), "tokens_evicted": self.evictions}

    # the entries in recency order (least recent first): the order decides what is evicted next
    _state_keys = ("seen", "returned", "ids", "keys", "values", "hits", "misses", "evictions")

    def _config(self) -> dict:
        return {"max_size": self.max_size}

    def _state_layout(self) -> list | None:
        like = next((k for k, _ in self._entries.values() if isinstance(k, torch.Tensor)), None)
        return _state.layout(like)

    def _state(self) -> dict:
        return {"seen": self._seen, "returned": list(self._returned), "ids": list(self._entries),
                "keys": [_state.copy(k) for k, _ in self._entries.values()],
                "values": [_state.copy(v) for _, v in self._entries.values()],
                "hits": self.hits, "misses": self.misses, "evictions": self.evictions}

    def _check_state(self, sd: dict) -> None:
        name = type(self).__name__
        ids, keys, values = sd["ids"], sd["keys"], sd["values"]
        if not all(isinstance(x, list) for x in (ids, keys, values, sd["returned"])):
            raise ValueError(f"{name}: state['ids'], ['keys'], ['values'] and ['returned'] must be lists")
        if not len(ids) == len(keys) == len(values) <= self.max_size or len(set(ids)) != len(ids):
            raise ValueError(f"{name}: the state holds {len(ids)} ids, {len(keys)} keys, {len(values)} values; "
                             f"expected as many of each, distinct ids, at most max_size={self.max_size}")
        for key in ("hits", "misses", "evictions"):
            _state.expect_int(name, key, sd[key])
        odd = [i for i, k, v in zip(ids, keys, values)
               if isinstance(k, torch.Tensor) and (_state.layout(k) != sd["layout"] or k.shape != v.shape)]
        if odd:
            raise ValueError(f"{name}: the keys or values of ids {odd[:5]} do not match the state's layout "
                             f"({_state.describe_layout(sd['layout'])})")

    def _load_state(self, sd: dict) -> None:
        like = next((k for k, _ in self._entries.values() if isinstance(k, torch.Tensor)), None)
        device = like.device if like is not None else None
        self._entries = OrderedDict(
            (i, (_state.copy(k, device), _state.copy(v, device))) for i, k, v in zip(sd["ids"], sd["keys"], sd["values"])
        )
        self._seen, self._returned = sd["seen"], list(sd["returned"])
        self.hits, self.misses, self.evictions = sd["hits"], sd["misses"], sd["evictions"]
