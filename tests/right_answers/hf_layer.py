"""Right answers to exercise 11 (``RingLayer`` and ``ring_cache``), each written in a style the statement allows.

Each class carries its ``ring_cache`` (a classmethod or staticmethod), so ``check_hf_cache_layer(Answer)`` grades
the pair. Needs transformers: ``tests/right_answers/__init__.py`` loads this module only where it is installed.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

from tests.right_answers import right

CHECK = "check_hf_cache_layer"


@right(CHECK)
class AlwaysOldestFirst(CacheLayerMixin):
    """No slot-order shortcut: a positions tensor per slot (-1 = empty), every update sorted by position, the chunk
    written token by token in a Python loop."""

    is_sliding = True

    def __init__(self, sliding_window):
        super().__init__()
        self.W, self.n = sliding_window, 0

    @classmethod
    def ring_cache(cls, model):
        cfg = model.config.get_text_config(decoder=True)
        kinds = cfg.layer_types if getattr(cfg, "layer_types", None) is not None else None
        layers = []
        for i in range(cfg.num_hidden_layers):
            full = kinds is not None and kinds[i] == "full_attention"
            layers.append(DynamicLayer() if full else cls(cfg.sliding_window))
        return Cache(layers=layers)

    def lazy_initialization(self, key_states, value_states):
        B, H, _, D = key_states.shape
        self.k = torch.zeros(B, H, self.W, D, dtype=key_states.dtype, device=key_states.device)
        self.v = torch.zeros_like(self.k)
        self.pos = torch.full((self.W,), -1, dtype=torch.long)
        self.is_initialized = True

    def get_seq_length(self):
        return self.n

    def get_mask_sizes(self, query_length):
        if self.n < self.W:
            return self.n + query_length, 0
        return self.W - 1 + query_length, self.n - self.W + 1

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        first = self.n - self.W + 1  # the oldest position the first new query sees
        order = [s for s in torch.argsort(self.pos).tolist() if self.pos[s] >= max(first, 0)]
        idx = torch.tensor(order, dtype=torch.long, device=self.k.device)
        k = torch.cat([self.k.index_select(2, idx), key_states], dim=2)
        v = torch.cat([self.v.index_select(2, idx), value_states], dim=2)
        for i in range(key_states.shape[2]):
            slot = self.n % self.W
            self.k[:, :, slot], self.v[:, :, slot] = key_states[:, :, i], value_states[:, :, i]
            self.pos[slot] = self.n
            self.n += 1
        return k, v

    def get_max_length(self):
        return self.W


@right(CHECK)
class ShiftLeftWindow(CacheLayerMixin):
    """Not a ring: the last W - 1 tokens kept oldest first in one tensor, rebuilt with cat and a slice each update
    (transformers' own DynamicSlidingWindowLayer, written out)."""

    is_sliding = True

    def __init__(self, sliding_window):
        super().__init__()
        self.sliding_window = sliding_window
        self.total = 0

    @staticmethod
    def ring_cache(model):
        config = model.config.get_text_config(decoder=True)
        types = getattr(config, "layer_types", None) or ["sliding_attention"] * config.num_hidden_layers
        return Cache(layers=[ShiftLeftWindow(config.sliding_window) if t == "sliding_attention" else DynamicLayer()
                             for t in types])

    def lazy_initialization(self, key_states, value_states):
        self.keys, self.values = key_states[:, :, :0], value_states[:, :, :0]
        self.is_initialized = True

    def get_seq_length(self):
        return self.total

    def get_mask_sizes(self, query_length):
        kept = self.keys.shape[2] if self.keys is not None else 0
        return kept + query_length, self.total - kept

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        k = torch.cat([self.keys, key_states], dim=2)
        v = torch.cat([self.values, value_states], dim=2)
        keep = self.sliding_window - 1  # the next first query sees W - 1 stored keys
        start = k.shape[2] - min(keep, k.shape[2])  # not k[:, :, -keep:]: with W = 1, -0 would keep everything
        self.keys, self.values = k[:, :, start:], v[:, :, start:]
        self.total += key_states.shape[2]
        return k, v

    def get_max_length(self):
        return self.sliding_window


@right(CHECK)
class TimeMajorRing(CacheLayerMixin):
    """A time-major ring (W, B, H, D) in one stacked tensor for keys and values (2, W, B, H, D), returned as
    permuted views; the chunk's old keys are the two halves of the ring around the next slot."""

    is_sliding = True

    def __init__(self, sliding_window):
        super().__init__()
        self.W = sliding_window
        self.buf = None
        self.count = 0

    @classmethod
    def ring_cache(cls, model):
        cfg = model.config.get_text_config(decoder=True)
        return Cache(layers=[DynamicLayer() if kind == "full_attention" else cls(cfg.sliding_window)
                             for kind in (getattr(cfg, "layer_types", None) or ["sliding"] * cfg.num_hidden_layers)])

    def lazy_initialization(self, key_states, value_states):
        B, H, _, D = key_states.shape
        self.buf = key_states.new_zeros(2, self.W, B, H, D)
        self.is_initialized = True

    def get_seq_length(self):
        return self.count

    def get_mask_sizes(self, query_length):
        visible = min(self.count, self.W - 1)
        return [visible + query_length, self.count - visible]  # a list unpacks like a tuple

    @torch.no_grad()
    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = torch.stack([key_states, value_states]).permute(0, 3, 1, 2, 4)  # (2, q, B, H, D)
        q, W, n = new.shape[1], self.W, self.count
        if q == 1:
            self.buf[:, n % W] = new[:, 0]
            self.count += 1
            kv = self.buf[:, : min(n + 1, W)].permute(0, 2, 3, 1, 4)
            return kv[0], kv[1]
        if n >= W:
            s = n % W  # the oldest stored token's slot: the ring from s onward, then from 0
            old = torch.cat([self.buf[:, s:], self.buf[:, :s]], dim=1)[:, 1:]
        else:
            old = self.buf[:, :n][:, max(n - W + 1, 0):]
        kv = torch.cat([old, new], dim=1).permute(0, 2, 3, 1, 4)
        for i in range(max(q - W, 0), q):
            self.buf[:, (n + i) % W] = new[:, i]
        self.count += q
        return kv[0], kv[1]

    def get_max_length(self):
        return self.W


class _Store(dict):
    """Buffers by name, a dict subclass (a learner's taste)."""


@right(CHECK)
class DictStoreRing(CacheLayerMixin):
    """Buffers in a per-instance dict subclass left uninitialised (torch.empty), ``...`` indexing, index_copy_ for
    the chunk, update reading its own get_mask_sizes, and ring_cache indexing layer_types by layer number."""

    is_sliding = True
    is_compileable = False

    def __init__(self, sliding_window):
        super().__init__()
        self.window = sliding_window
        self.store = _Store()
        self.tokens_seen = 0

    @classmethod
    def ring_cache(cls, model):
        config = model.config.get_text_config(decoder=True)
        types = getattr(config, "layer_types", None)
        return Cache(layers=[
            cls(config.sliding_window) if types is None or types[i] != "full_attention" else DynamicLayer()
            for i, _ in enumerate(range(config.num_hidden_layers))])

    def lazy_initialization(self, key_states, value_states):
        shape = (*key_states.shape[:2], self.window, key_states.shape[3])
        self.store["k"] = torch.empty(shape, dtype=key_states.dtype, device=key_states.device)
        self.store["v"] = torch.empty(shape, dtype=value_states.dtype, device=value_states.device)
        self.is_initialized = True

    def get_seq_length(self):
        return self.tokens_seen

    def get_mask_sizes(self, query_length):
        W, n = self.window, self.tokens_seen
        offset = n - W + 1 if n >= W else 0
        return n - offset + query_length, offset

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        k_buf, v_buf, W, n = self.store["k"], self.store["v"], self.window, self.tokens_seen
        q = key_states.shape[-2]
        length, offset = self.get_mask_sizes(q)
        if q == 1:
            k_buf[..., n % W, :] = key_states[..., 0, :]
            v_buf[..., n % W, :] = value_states[..., 0, :]
            self.tokens_seen += 1
            return k_buf[..., : min(n + 1, W), :], v_buf[..., : min(n + 1, W), :]
        slots = torch.arange(offset, n, device=k_buf.device).remainder(W)
        out = (torch.cat([k_buf.index_select(-2, slots), key_states], -2),
               torch.cat([v_buf.index_select(-2, slots), value_states], -2))
        tail = torch.arange(n + q - min(q, W), n + q, device=k_buf.device)
        k_buf.index_copy_(-2, tail.remainder(W), key_states[..., tail - n, :])
        v_buf.index_copy_(-2, tail.remainder(W), value_states[..., tail - n, :])
        self.tokens_seen += q
        return out

    def get_max_length(self):
        return self.window
