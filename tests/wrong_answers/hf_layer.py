"""Wrong answers to exercise 11 (a ring as a transformers cache layer, ``RingLayer`` and ``ring_cache``).

Each is :class:`_Ring` (the statement's layer, written plainly) with one realistic bug. A class carries its
own ``ring_cache`` (a classmethod), so ``check_hf_cache_layer(Bug)`` grades the pair. Needs transformers:
``tests/wrong_answers/__init__.py`` loads this module only where it is installed.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer, DynamicSlidingWindowLayer

from tests.wrong_answers import wrong

CHECK = "check_hf_cache_layer"


def layer_types(model) -> tuple[int, list[str]]:
    config = model.config.get_text_config(decoder=True)
    n = config.num_hidden_layers
    return config.sliding_window, list(getattr(config, "layer_types", None) or ["sliding_attention"] * n)[:n]


class _Ring(CacheLayerMixin):
    """The statement's layer: a (B, H, W, D) ring, slot order for one token, oldest first for a chunk."""

    is_sliding = True
    is_compileable = False

    def __init__(self, sliding_window: int):
        super().__init__()
        self.sliding_window = sliding_window
        self.k_buf = self.v_buf = None
        self.seen = 0

    @classmethod
    def ring_cache(cls, model) -> Cache:
        W, types = layer_types(model)
        return Cache(layers=[cls(W) if t == "sliding_attention" else DynamicLayer() for t in types])

    def lazy_initialization(self, key_states, value_states) -> None:
        B, H, _, D = key_states.shape
        self.k_buf = key_states.new_zeros(B, H, self.sliding_window, D)
        self.v_buf = value_states.new_zeros(B, H, self.sliding_window, D)
        self.is_initialized = True

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        n, W = self.seen, self.sliding_window
        return min(n, W - 1) + query_length, max(n - W + 1, 0)

    def visible_slots(self, n: int) -> torch.Tensor:
        """Slots of the stored positions the first new query sees, oldest first."""
        W = self.sliding_window
        return torch.arange(max(n - W + 1, 0), n, device=self.k_buf.device) % W

    def store(self, key_states, value_states, n: int) -> None:
        """Write the chunk's last W tokens into their slots."""
        W, q = self.sliding_window, key_states.shape[2]
        last = torch.arange(max(q - W, 0), q, device=self.k_buf.device)
        self.k_buf[:, :, (n + last) % W] = key_states[:, :, last]
        self.v_buf[:, :, (n + last) % W] = value_states[:, :, last]

    def count(self, q: int) -> None:
        self.seen += q

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, W, q = self.seen, self.sliding_window, key_states.shape[2]
        if q == 1:
            self.store(key_states, value_states, n)
            self.count(1)
            filled = min(n + 1, W)
            return self.k_buf[:, :, :filled], self.v_buf[:, :, :filled]
        old = self.visible_slots(n)
        k = torch.cat([self.k_buf[:, :, old], key_states], dim=2)
        v = torch.cat([self.v_buf[:, :, old], value_states], dim=2)
        self.store(key_states, value_states, n)
        self.count(q)
        return k, v

    def get_max_length(self) -> int:
        return self.sliding_window


# --------------------------------------------------------------------------------------------- get_mask_sizes
@wrong(CHECK, "kv_length", "W - 1")
class MaskLengthIsTheWindow(_Ring):
    """kv_length = min(n + q, W), "the window holds W keys": right for one token once full, short for a chunk."""

    def get_mask_sizes(self, query_length):
        n, W = self.seen, self.sliding_window
        return min(n + query_length, W), max(n - W + 1, 0)


@wrong(CHECK, "kv_offset", "n - W + 1")
class MaskOffsetOneEarly(_Ring):
    """kv_offset = n - W (Mistral's reference code counts W + 1 keys): every key is labelled one position early."""

    def get_mask_sizes(self, query_length):
        n, W = self.seen, self.sliding_window
        return min(n, W - 1) + query_length, max(n - W, 0)


@wrong(CHECK, "before update", "first new query")
class MaskSizesOfTheWindowAfterTheUpdate(_Ring):
    """Describes what the ring holds after the update (the last W, counted with the q new tokens): right for one
    token, wrong for every chunk."""

    def get_mask_sizes(self, query_length):
        after = self.seen + query_length
        return min(after, self.sliding_window), max(after - self.sliding_window, 0)


@wrong(CHECK, "get_mask_sizes", "only read")
class MaskSizesCountsTheTokens(_Ring):
    """Counts seen in get_mask_sizes ("it is called once, before update"): transformers asks only the first sliding
    layer, so the others never count, and asking twice counts twice."""

    def get_mask_sizes(self, query_length):
        sizes = super().get_mask_sizes(query_length)
        self.seen += query_length
        return sizes

    def update(self, key_states, value_states, *args, **kwargs):
        self.seen -= key_states.shape[2]  # update works from the count before this update...
        k, v = super().update(key_states, value_states)
        return k, v

    def count(self, q):
        pass  # ...and does not count again


@wrong(CHECK, "swapped", "kv_length, kv_offset")
class MaskSizesSwapped(_Ring):
    """Returns (kv_offset, kv_length)."""

    def get_mask_sizes(self, query_length):
        return super().get_mask_sizes(query_length)[::-1]


# --------------------------------------------------------------------------------------------- get_seq_length
@wrong(CHECK, "stored", "seen")
class SeqLengthIsTheTokensStored(_Ring):
    """get_seq_length returns the tokens stored, min(seen, W): transformers then places new tokens at position W."""

    def get_seq_length(self):
        return min(self.seen, self.sliding_window)


# --------------------------------------------------------------------------------------------- update
@wrong(CHECK, "slot order", "chunk")
class SlotOrderForAChunk(_Ring):
    """The visible stored keys for a chunk are picked from the slots by a mask, in slot order, not sorted by
    position (the library's chunk path without its argsort)."""

    def visible_slots(self, n):
        W = self.sliding_window
        slots = torch.arange(min(n, W), device=self.k_buf.device)
        held = slots + W * torch.div(n - 1 - slots, W, rounding_mode="floor")
        return slots[held > n - W]


@wrong(CHECK, "only the new")
class ReturnsOnlyTheNewKeys(_Ring):
    """update returns key_states, value_states: each query sees itself and its chunk only, no stored key."""

    def update(self, key_states, value_states, *args, **kwargs):
        super().update(key_states, value_states)
        return key_states, value_states


@wrong(CHECK, "last", "chunk")
class ChunkKeepsItsFirstTokens(_Ring):
    """A chunk longer than W: its FIRST W tokens are written (loop over range(min(q, W))), not its last W."""

    def store(self, key_states, value_states, n):
        W = self.sliding_window
        for i in range(min(key_states.shape[2], W)):
            self.k_buf[:, :, (n + i) % W] = key_states[:, :, i]
            self.v_buf[:, :, (n + i) % W] = value_states[:, :, i]


@wrong(CHECK, "never written")
class ReturnsTheWholeRingBeforeItIsFull(_Ring):
    """One token: returns all W slots from the start, the unwritten zero slots included."""

    def update(self, key_states, value_states, *args, **kwargs):
        k, v = super().update(key_states, value_states)
        return (self.k_buf, self.v_buf) if key_states.shape[2] == 1 else (k, v)


@wrong(CHECK, "values")
class ReturnsTheKeysTwice(_Ring):
    """return k, k."""

    def update(self, key_states, value_states, *args, **kwargs):
        k, _ = super().update(key_states, value_states)
        return k, k


@wrong(CHECK, "evict", "keeps")
class KeepsEveryToken(_Ring):
    """A growing torch.cat behind the ring (a "history" kept for debugging): the right keys, unbounded memory."""

    def update(self, key_states, value_states, *args, **kwargs):
        self.history = key_states if getattr(self, "history", None) is None else torch.cat(
            [self.history, key_states], dim=2)
        return super().update(key_states, value_states)


@wrong(CHECK, "dtype", "lazy_initialization")
class BuffersInFloat32(_Ring):
    """torch.zeros(B, H, W, D): float32 whatever the model's dtype (the keys come back float32)."""

    def lazy_initialization(self, key_states, value_states):
        B, H, _, D = key_states.shape
        self.k_buf = torch.zeros(B, H, self.sliding_window, D, device=key_states.device)
        self.v_buf = torch.zeros(B, H, self.sliding_window, D, device=key_states.device)
        self.is_initialized = True

    def store(self, key_states, value_states, n):
        super().store(key_states.to(self.k_buf.dtype), value_states.to(self.v_buf.dtype), n)

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return super().update(key_states.to(self.k_buf.dtype), value_states.to(self.v_buf.dtype))


@wrong(CHECK, "float64", "float32", "key_states' dtype")
class Float32BuffersCastBack(BuffersInFloat32):
    """The ring is always float32 ("attention runs in float32 anyway"), returned cast back to the keys' dtype: the
    dtype is right, the last bits of a float64 key are not."""

    def update(self, key_states, value_states, *args, **kwargs):
        k, v = super().update(key_states, value_states)
        return k.to(key_states.dtype), v.to(value_states.dtype)


@wrong(CHECK, "device", "lazy_initialization", needs_accelerator=True)
class BuffersOnTheCpu(_Ring):
    """torch.zeros(..., dtype=key_states.dtype): the right dtype, but on the CPU while the model is on the GPU."""

    def lazy_initialization(self, key_states, value_states):
        B, H, _, D = key_states.shape
        self.k_buf = torch.zeros(B, H, self.sliding_window, D, dtype=key_states.dtype)
        self.v_buf = torch.zeros(B, H, self.sliding_window, D, dtype=value_states.dtype)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return super().update(key_states.cpu(), value_states.cpu())


@wrong(CHECK, "shared", "mutable default argument")
class BuffersInAMutableDefault(_Ring):
    """def __init__(self, sliding_window, buffers={}): every layer of the model writes into one dict."""

    def __init__(self, sliding_window, buffers={}):  # noqa: B006 - the bug
        self.buffers = buffers
        super().__init__(sliding_window)

    k_buf = property(lambda self: self.buffers.get("k"), lambda self, x: self.buffers.__setitem__("k", x))
    v_buf = property(lambda self: self.buffers.get("v"), lambda self, x: self.buffers.__setitem__("v", x))


@wrong(CHECK, "is_sliding")
class NotMarkedSliding(_Ring):
    """is_sliding left False: Gemma's full mask would be sized from the ring."""

    is_sliding = False


# --------------------------------------------------------------------------------------------- ring_cache
@wrong(CHECK, "full", "layer_types", "DynamicLayer")
class FullLayersWindowed(_Ring):
    """ring_cache gives every layer a ring: Gemma's full-attention layers lose all but the last W tokens."""

    @classmethod
    def ring_cache(cls, model):
        W, types = layer_types(model)
        return Cache(layers=[cls(W) for _ in types])


@wrong(CHECK, "mistral", "layer_types")
class ReadsLayerTypesUnguarded(_Ring):
    """for t in config.layer_types: Mistral's config has none."""

    @classmethod
    def ring_cache(cls, model):
        config = model.config.get_text_config(decoder=True)
        return Cache(layers=[cls(config.sliding_window) if t == "sliding_attention" else DynamicLayer()
                             for t in config.layer_types])


@wrong(CHECK, "logits", "sliding_window")
class RingOneTokenTooWide(_Ring):
    """ring_cache builds RingLayer(W + 1) (Mistral's reference code lets a query see W + 1 keys): the layer itself
    is right, the model sees one key too many."""

    @classmethod
    def ring_cache(cls, model):
        W, types = layer_types(model)
        return Cache(layers=[cls(W + 1) if t == "sliding_attention" else DynamicLayer() for t in types])


@wrong(CHECK, "not your")
class UsesTheLibrarysLayer(_Ring):
    """ring_cache builds the library's WindowLayer, not the learner's class."""

    @classmethod
    def ring_cache(cls, model):
        from swkv_teach.hf_cache import WindowLayer

        W, types = layer_types(model)
        return Cache(layers=[WindowLayer("ring", W) if t == "sliding_attention" else DynamicLayer() for t in types])


@wrong(CHECK, "*args, **kwargs")
class UpdateWithoutExtraArguments(_Ring):
    """def update(self, key_states, value_states): transformers 5.24 also passes kwargs=... to every layer."""

    def update(self, key_states, value_states):
        return super().update(key_states, value_states)


@wrong(CHECK, "before writing the chunk")
class ChunkAsOneTokenUpdates(_Ring):
    """A chunk is written token by token, then the ring's filled slots are returned (as after one token): the
    chunk's first queries lose the keys it evicted."""

    def update(self, key_states, value_states, *args, **kwargs):
        for i in range(key_states.shape[2]):
            k, v = super().update(key_states[:, :, i: i + 1], value_states[:, :, i: i + 1])
        return k, v


@wrong(CHECK, "is_initialized")
class NeverMarkedInitialized(_Ring):
    """lazy_initialization never sets is_initialized, so every update allocates the ring anew (all zeros)."""

    def lazy_initialization(self, key_states, value_states):
        super().lazy_initialization(key_states, value_states)
        self.is_initialized = False


@wrong(CHECK, "transformers' own DynamicSlidingWindowLayer")
class TransformersOwnLayer(DynamicSlidingWindowLayer):
    """Hands in transformers' own sliding layer (a subclass that only renames it)."""

    ring_cache = _Ring.__dict__["ring_cache"]


@wrong(CHECK, "image-text", "get_text_config")
class ReadsTheTopConfig(_Ring):
    """ring_cache reads model.config itself: an image-text Gemma 3 keeps its layers' settings in text_config."""

    @classmethod
    def ring_cache(cls, model) -> Cache:
        config = model.config
        n = config.num_hidden_layers
        types = list(getattr(config, "layer_types", None) or ["sliding_attention"] * n)[:n]
        return Cache(layers=[cls(config.sliding_window) if t == "sliding_attention" else DynamicLayer() for t in types])


@wrong(CHECK, "one and the same", "per model layer")
class OneLayerObjectForEveryLayer(_Ring):
    """ring_cache builds one RingLayer and one DynamicLayer and hands the same objects to every layer."""

    @classmethod
    def ring_cache(cls, model) -> Cache:
        W, types = layer_types(model)
        ring, full = cls(W), DynamicLayer()
        return Cache(layers=[ring if t == "sliding_attention" else full for t in types])


@wrong(CHECK, "the cache has 2 layers; the model has 1", "hard-coded", "num_hidden_layers")
class TwoLayersWithoutLayerTypes(_Ring):
    """ring_cache falls back to ["sliding_attention"] * 2 when layer_types is missing: right for every two-layer
    Mistral, one layer too many or too few for any other."""

    @classmethod
    def ring_cache(cls, model) -> Cache:
        config = model.config.get_text_config(decoder=True)
        types = getattr(config, "layer_types", None) or ["sliding_attention"] * 2
        return Cache(layers=[cls(config.sliding_window) if t == "sliding_attention" else DynamicLayer()
                             for t in types])


@wrong(CHECK, "chunk alone", "q >= w")
class LongChunkWithoutStoredKeys(_Ring):
    """A chunk of q >= W tokens is returned alone (its mask sizes say so too): 'the chunk fills the window
    anyway', but its first queries still see the stored keys before it."""

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if query_length >= self.sliding_window:
            return query_length, self.seen
        return super().get_mask_sizes(query_length)

    def update(self, key_states, value_states, *args, **kwargs):
        n, q = self.seen, key_states.shape[2]
        if q < self.sliding_window:
            return super().update(key_states, value_states)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.store(key_states, value_states, n)
        self.count(q)
        return key_states, value_states


@wrong(CHECK, "no get_mask_sizes call before it", "first sliding layer only", "read-only")
class UpdateReadsTheRecordedOffset(_Ring):
    """get_mask_sizes records kv_offset and update gathers the stored keys from it: transformers asks only the
    first sliding layer, so the other layers read a stale offset (0 here) and return keys out of the window."""

    def __init__(self, sliding_window: int):
        super().__init__(sliding_window)
        self.offset = 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        length, self.offset = super().get_mask_sizes(query_length)
        return length, self.offset

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, W = self.seen, self.sliding_window
        old = torch.arange(self.offset, n, device=self.k_buf.device) % W
        k = torch.cat([self.k_buf[:, :, old], key_states], dim=2)
        v = torch.cat([self.v_buf[:, :, old], value_states], dim=2)
        self.store(key_states, value_states, n)
        self.count(key_states.shape[2])
        return k, v


@wrong(CHECK, "not contiguous", "transposed as a model makes it", ".reshape()")
class ChunkWrittenThroughAFlatView(_Ring):
    """Writes a chunk's last W tokens through key_states.view(B * H, q, D): a model's key_states are
    proj(h).view(B, q, H, D).transpose(1, 2), not contiguous, and view raises."""

    def store(self, key_states, value_states, n: int) -> None:
        B, H, q, D = key_states.shape
        W = self.sliding_window
        flat_k, flat_v = key_states.view(B * H, q, D), value_states.view(B * H, q, D)
        for i in range(max(q - W, 0), q):
            self.k_buf.view(B * H, W, D)[:, (n + i) % W] = flat_k[:, i]
            self.v_buf.view(B * H, W, D)[:, (n + i) % W] = flat_v[:, i]
