"""``hf_cache``: the course's sliding-window caches as a ``transformers`` Cache, inside ``model.generate``.

Hugging Face's cache is a list of per-layer objects (``cache_utils.Cache``), each a
``CacheLayerMixin``: ``update(k, v) -> (k, v)`` returns what the new queries attend over,
``get_seq_length()`` counts tokens *seen* (the model derives the new tokens' positions from
it), and ``get_mask_sizes(q) -> (kv_length, kv_offset)`` tells ``masking_utils`` which
absolute positions those keys hold: ``kv_offset, kv_offset + 1, ..., kv_offset + kv_length - 1``.
The mask is then built from positions alone, with the course's rule ``kv > q - W`` (see
:mod:`swkv_teach.masks`). Lesson 09 (inside Transformers) reads these from the source.

:class:`WindowLayer` wraps one of our caches (``make_cache(kind, W)``) as such a layer.
With ``n`` tokens seen before an update of ``q`` tokens it reports what Hugging Face's own
``DynamicSlidingWindowLayer`` reports::

    kv_offset = max(n - W + 1, 0)          the oldest key the first new query may see
    kv_length = min(n, W - 1) + q          those stored keys, then the q new ones

and our caches return exactly those keys (``KVCache.positions``). Worked example, ``W = 3``:

* ``n = 7``, one token (position 7): the ring returns its 3 slots ``[6, 7, 5]`` in *slot*
  order; HF expects positions ``[5, 6, 7]`` (offset 5, length 3). Every one of them is in
  query 7's window, so the mask row is all True and the order cannot matter (softmax over
  keys is a sum). That is the one-token invariant: no roll, no copy.
* ``n = 7``, a chunk of 2 (positions 7, 8): HF expects ``[5, 6, 7, 8]`` (offset 5, length 4)
  and masks key 5 for query 8. Here order matters, so the ring's chunk path returns the
  stored keys chronologically, then the chunk (``RingBufferKVCache._update_chunk``).

Full-attention layers (Gemma 2 and 3 alternate them with sliding ones) get transformers'
own ``DynamicLayer``. Out of scope, refused with an error that says so: padded batches (a
2-D ``attention_mask`` with zeros), beam search and other batch reordering, cropping a cache
other than the ring (assisted decoding), offloading, ``torch.compile`` (``is_compileable`` stays False).

Assisted generation (``assistant_model=``, ``prompt_lookup_num_tokens=k``) runs on
``hf_cache(model, lookahead=L)``: the ring keeps ``W + L`` slots, and transformers' ``crop(-r)``
after each verify is the ring's O(1) ``rollback(r)`` (:meth:`WindowLayer.crop`, which cites what
5.15 and 5.25 call and when). Greedy and seeded sampled tokens equal those of HF's default cache on
Mistral, Gemma 2 and Gemma 3 under both versions, with two limits in 5.15 that are not the ring's, both
inside HF's own assistant cache (HF's default cache fails the same way): an *assistant* whose own layers
slide (its recording ``DynamicSlidingWindowLayer.update`` returns every state since the last crop,
``cache_utils.py`` lines 252-261 there, while the mask covers ``W - 1 + q``; 5.25 slices, lines 250-259),
so under 5.15 the assistant must attend to everything; and ``assistant_early_exit`` on Gemma
(``DynamicLayer.crop`` slices the keys of a layer the early exit never filled, lines 186-188 there).

For transformers' compiled ``generate``, :func:`hf_compileable_cache` gives Mistral-style models
(every layer sliding) a :class:`CompileableRingLayer`: transformers' own static sliding layer with the
per-token roll replaced by a one-slot write. transformers' compile path takes such a custom layer: it
asks only ``cache.is_compileable`` (every layer's flag, ``cache_utils.py`` lines 1979-1984 in 5.25) and
that the cache is not a ``DynamicCache`` (``generation/utils.py`` line 2458), and builds the 4-D mask
outside the compiled forward (``prepare_inputs_for_generation``, ``generation/utils.py`` lines 735-745).
On a CPU it compiles only with a ``CompileConfig`` whose ``_compile_all_devices`` is set (line 2451).
Measured (bench shape, one thread, busy 2-core CPU, ``CompileConfig(fullgraph=True, mode="default")``):
the same greedy tokens as ``cache_implementation="static"``, and a median step within noise of it
(static / ring step time 0.88 at W = 64, 0.98 at W = 1024): compiled, the roll is one fused copy of
the window, small beside the rest of transformers' step on this model.
"""

from __future__ import annotations

import inspect

import torch

from swkv_teach._hf_hint import INSTALL_HINT
from swkv_teach.caches import KVCache, RingBufferKVCache, make_cache

try:
    from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer, StaticSlidingWindowLayer
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(INSTALL_HINT) from e

__all__ = ["HF_KINDS", "CompileableRingLayer", "WindowCache", "WindowLayer", "cache_kwarg", "hf_cache",
           "hf_compileable_cache", "layer_types_of", "mask_sizes"]

# kinds whose ``update`` returns the window's keys as ``mask_sizes`` describes them. "sinks" and "lru" keep
# positions outside one contiguous range, which (kv_length, kv_offset) cannot describe; "paged" serves batch 1.
HF_KINDS = ("ring", "naive", "sliding", "int8")


def mask_sizes(seen: int, window: int, query_length: int) -> tuple[int, int]:
    """``(kv_length, kv_offset)`` of the keys a window-``window`` layer returns for ``query_length`` new tokens.

    ``seen`` tokens came before them. The keys hold positions ``kv_offset .. kv_offset + kv_length - 1``:
    the stored ones the first new query may see (``j > seen - window``), then the new ones.
    """
    return min(seen, window - 1) + query_length, max(seen - window + 1, 0)


class WindowLayer(CacheLayerMixin):
    """One sliding-attention layer's keys and values kept in a course cache (``self.cache``).

    ``update`` takes HF's ``(batch, kv_heads, tokens, head_dim)`` keys and values. What the layer
    keeps alive is ``self.cache`` alone (``keys``/``values`` stay None, so no HF helper reaches
    behind the ring's back): at most ``W`` tokens, the ring exactly ``W`` slots.
    """

    is_sliding = True  # per layer: masking_utils sizes the sliding mask from the first layer with it
    is_compileable = False

    def __init__(self, kind: str, sliding_window: int, lookahead: int = 0):
        super().__init__()
        if kind not in HF_KINDS:
            raise ValueError(f"kind must be one of {HF_KINDS} (caches whose keys are one window, in the order "
                             f"the mask expects); got {kind!r}")
        if lookahead != 0 and kind != "ring":
            raise ValueError(f"lookahead is the ring's (kind 'ring', the one cache that can take tokens back); "
                             f"got lookahead={lookahead!r} with kind {kind!r}")
        self.kind = kind
        self.sliding_window = sliding_window
        self.cache: KVCache = (RingBufferKVCache(sliding_window, lookahead) if lookahead
                               else make_cache(kind, sliding_window))
        self.lookahead = lookahead
        self.record_past = False  # as HF's sliding layer: set by activate_past_recording (assisted decoding)
        self.recurrent_states_to_keep = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Store the new keys/values; return the keys/values the new queries attend over (see the module docstring)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.lookahead and key_states.shape[-2] == 1:
            return self._update_one_token_with_lookahead(key_states, value_states)
        return self.cache.update(key_states, value_states)

    def _update_one_token_with_lookahead(self, key_states: torch.Tensor, value_states: torch.Tensor):
        """One token on a ring with ``W + L`` slots: write its slot (O(1)), return the ``min(seen, W)`` in its window.

        The ring's own one-token path returns every filled slot, ``L`` of them (or stale ones after a
        rollback) outside the query's window: the course's decoder masks them by position, but HF's
        mask covers one contiguous run of ``kv_length = min(seen, W - 1) + 1`` positions
        (:func:`mask_sizes`), so only the window's keys go out, gathered in position order.
        """
        ring = self.cache
        ring.update(key_states, value_states)
        n = ring.seen  # the new token is position n - 1; its window is n - W .. n - 1 (clipped at 0)
        slots = torch.arange(max(n - self.sliding_window, 0), n, device=key_states.device) % ring.capacity
        return ring.k_buf.index_select(2, slots), ring.v_buf.index_select(2, slots)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)`` for the next ``update`` of ``query_length`` tokens (called before it)."""
        if isinstance(query_length, torch.Tensor):  # transformers 4.x passes the new tokens' cache_position
            query_length = query_length.shape[0]
        return mask_sizes(self.cache.seen, self.sliding_window, query_length)

    def get_seq_length(self) -> int:
        """Tokens seen, not stored: HF takes the new tokens' positions (and the mask's query offset) from it."""
        return self.cache.seen

    def get_max_length(self) -> int:
        return self.sliding_window

    def get_max_cache_shape(self) -> int:  # its name in transformers 4.x (abstract there; deprecated by 5.15)
        return self.sliding_window

    def reset(self) -> None:
        self.cache.reset()
        self.is_initialized = False

    def _refuse(self, what: str):
        raise NotImplementedError(f"hf_cache layers do not support {what}: a window of {self.kind!r} cache "
                                  "serves greedy or sampled decoding of unpadded batches only")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._refuse("reorder_cache (beam search)")

    # ------------------------------------------------------------------ assisted decoding
    @property
    def is_croppable(self) -> bool:
        """Whether ``crop`` can put this layer back as it was (transformers 5.25 asks, ``generation/utils.py``
        lines 4103-4106, after the first verify): the ring can, within :meth:`rollback_limit`; the others cannot."""
        return self.kind == "ring"

    def rollback_limit(self) -> int:
        """Most tokens ``crop`` can take back now: the ring's ``rollback_limit``, 0 for the other kinds."""
        return self.cache.rollback_limit if self.kind == "ring" else 0

    def activate_past_recording(self, recurrent_states_to_keep: int | None = None, **kwargs) -> None:
        """transformers' signal that ``crop`` will follow each verify: refuse here, before any forward, a layer
        that could not serve it.

        transformers 5.25 calls it from ``_assisted_decoding`` with the drafter's tokens per round,
        ``cache.activate_past_recording(recurrent_states_to_keep=candidate_generator.num_drafting_tokens)``
        (``generation/utils.py`` line 4002; ``num_drafting_tokens`` is ``num_assistant_tokens`` or
        ``prompt_lookup_num_tokens``, ``generation/candidate_generator.py`` lines 344-347 and 1172-1175);
        5.15 calls it with no argument (``generation/utils.py`` line 3632), so there the draft length is
        first known at the crop that needs it (:meth:`crop`). HF's own sliding layer then keeps every
        state until the next crop (``cache_utils.py`` lines 211-216 and 245-259 in 5.25, 218-223 and
        252-261 in 5.15); the ring already keeps ``L`` extra slots, so this only checks and records.

        A verify of ``k`` drafts takes back at most ``k`` tokens (all drafts rejected; its first token,
        the last accepted one, stays), and right after a verify a ring with lookahead ``L`` can take
        back ``L + 1``: so ``L >= k - 1`` serves ``k`` drafts, the same ``W - 1 + k`` tokens HF's
        recording layer peaks at (``hf_cache(model, lookahead=k)`` reads more plainly and spares one).
        """
        if self.kind != "ring":
            self._refuse("assisted decoding (crop after each verify): only kind 'ring', built with "
                         "hf_cache(model, lookahead=k), can take tokens back")
        if recurrent_states_to_keep is not None and recurrent_states_to_keep > self.lookahead + 1:
            raise ValueError(
                f"assisted decoding drafts {recurrent_states_to_keep} tokens a round (num_assistant_tokens or "
                f"prompt_lookup_num_tokens) and may take them all back, but a ring with lookahead={self.lookahead} "
                f"(window {self.sliding_window}) can take back at most {self.lookahead + 1}: pass "
                f"hf_cache(model, lookahead={recurrent_states_to_keep})")
        self.record_past = True
        self.recurrent_states_to_keep = recurrent_states_to_keep or 0

    def check_crop(self, tokens_to_remove) -> int:
        """``r`` for ``crop(-r)``, or an error naming why this layer cannot take ``r`` tokens back (nothing changes)."""
        r = _tokens_to_take_back(tokens_to_remove)
        if r and self.kind != "ring":
            self._refuse("crop (assisted decoding): only kind 'ring' can take tokens back")
        if r > self.rollback_limit():
            raise ValueError(
                f"crop({-r}): this ring (window {self.sliding_window}, lookahead={self.lookahead}, {self.cache.seen} "
                f"tokens seen) can take back at most {self.rollback_limit()} tokens now; older slots were reused. "
                f"For drafts of k tokens (prompt_lookup_num_tokens or num_assistant_tokens, which the 'heuristic' "
                f"schedule grows) build hf_cache(model, lookahead=k)")
        return r

    def crop(self, tokens_to_remove: int) -> None:
        """Take back the last ``-tokens_to_remove`` tokens: the ring's ``rollback``, O(1), no tensor copied.

        transformers' assisted decoding calls ``cache.crop(-(candidate_length - n_matches))`` after each
        verify (``generation/utils.py`` lines 4186-4187 in 5.25, 3802-3803 in 5.15, where the count is a
        0-dim tensor: ``n_matches`` is a ``.sum()``, line 3774), and ``Cache.crop`` calls every layer's
        (``cache_utils.py`` lines 1910-1918 in 5.25, 1602-1610 in 5.15). ``crop(0)`` is a no-op here: HF's
        sliding layer uses it to shrink back to ``W - 1`` states (lines 300-302 in 5.25), the ring never grew.
        HF's own layer slices its keys (lines 304-308 in 5.25); the ring moves its counter.

        A positive count is the legacy "keep the first n tokens" form, deprecated in 5.15 (``cache_utils.py``
        lines 169-174 there) and refused by 5.25's ``DynamicLayer.crop`` (lines 168-173): refused here too.
        """
        r = self.check_crop(tokens_to_remove)
        if r:
            self.cache.rollback(r)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._refuse("batch_repeat_interleave")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._refuse("batch_select_indices")

    def offload(self):
        self._refuse("offloading")

    def prefetch(self):
        self._refuse("offloading")

    def __repr__(self) -> str:
        return f"WindowLayer({self.cache!r})"


class CompileableRingLayer(StaticSlidingWindowLayer):
    """transformers' static sliding layer with the roll taken out: one token writes slot ``p % W``, in place.

    ``StaticSlidingWindowLayer`` keeps its ``W`` keys at one address (so transformers' compiled
    ``generate`` takes it) and in *position order*, because the mask is built from one contiguous run
    of positions (``kv_arange = torch.arange(kv_length) + kv_offset``, ``masking_utils.py`` line 531
    in 5.25): once full, every token rolls the whole window (``cache_utils.py`` lines 575-576 in 5.25,
    553-554 in 5.15.0), an O(W) copy per layer. This layer inherits everything else (allocation,
    ``get_mask_sizes``, ``get_seq_length``, ``reset``) and changes only the layout:

    * one token, window full: write slot ``cumulative_length % W`` (a tensor, as CUDA graphs need)
      and return the buffers in slot order. The mask transformers builds for them (``kv_length = W``,
      ``kv_offset = p - W + 1``) is all True for the one query at ``p``, so the order cannot matter:
      the same one-token invariant as :class:`WindowLayer`;
    * one token, window not full: slot ``p`` holds position ``p`` (slots fill in order), exactly
      the parent's layout, and the unfilled slots are masked as future positions;
    * a chunk (eager in ``generate``: the prompt, a continuation): the stored keys are put back in
      position order (one roll), the chunk follows as the parent returns it, and the last ``W`` are
      stored at ``p % W``.
    """

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        W, seen, q = self.max_cache_len, self.cumulative_length_int, key_states.shape[-2]
        if q == 1 and seen >= W:  # the decode step: no roll, no Python number in the tensor work
            slot = (self.cumulative_length % W).view(1)
            self.keys.index_copy_(2, slot, key_states)
            self.values.index_copy_(2, slot, value_states)
            self.cumulative_length.add_(1)
            self.cumulative_length_int = seen + 1
            return self.keys, self.values
        if seen + q <= W:  # still filling: slot = position, the parent's own path
            return super().update(key_states, value_states, *args, **kwargs)
        # a chunk that fills or passes the window: what the parent returns, then the ring layout
        shift = seen % W if seen >= W else 0
        k_held = self.keys.roll(-shift, dims=-2)[:, :, 1:] if seen >= W else self.keys[:, :, :seen]
        v_held = self.values.roll(-shift, dims=-2)[:, :, 1:] if seen >= W else self.values[:, :, :seen]
        full_k = torch.cat((k_held, key_states), dim=-2)
        full_v = torch.cat((v_held, value_states), dim=-2)
        total = seen + q
        self.keys.copy_(full_k[:, :, -W:].roll(total % W, dims=-2))  # position p into slot p % W
        self.values.copy_(full_v[:, :, -W:].roll(total % W, dims=-2))
        self.cumulative_length.fill_(total)
        self.cumulative_length_int = total
        return full_k, full_v


def hf_compileable_cache(model) -> "WindowCache":
    """A cache for ``model`` whose sliding layers are :class:`CompileableRingLayer`: ``is_compileable`` is True.

    transformers' ``generate`` compiles the decode forward when ``cache.is_compileable`` and the
    cache is not a ``DynamicCache`` (``_valid_auto_compile_criteria``, ``generation/utils.py`` line
    2458 in 5.25), on CUDA and similar devices, or anywhere with a ``compile_config`` that allows every
    device. Models with full-attention layers (Gemma) would need static full layers sized for the
    whole generation: refused here (one window per layer only; Mistral-style models).
    """
    config = _text_config(model)
    window = _window_of(config)
    types = layer_types_of(config)
    if any(t != "sliding_attention" for t in types):
        raise ValueError(f"hf_compileable_cache serves models whose every layer slides; layer_types is {types}")
    _install_guard(model)
    return WindowCache(layers=[CompileableRingLayer(max_cache_len=window, sliding_window=window) for _ in types])


def _tokens_to_take_back(tokens_to_remove) -> int:
    """``r`` from transformers' ``crop(-r)`` argument: an int or a 0-dim integer tensor (5.15), at most 0."""
    value = tokens_to_remove
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"crop: tokens_to_remove must be an int <= 0 (crop(-r) takes back r tokens); "
                        f"got {type(tokens_to_remove).__name__} {tokens_to_remove!r}")
    if value > 0:
        raise ValueError(
            f"crop({value}): a positive count is the legacy 'keep the first {value} tokens' form (deprecated in "
            f"transformers 5.15, refused by 5.25); pass crop(-r) to take back the last r tokens")
    return -value


class WindowCache(Cache):
    """A ``transformers.Cache`` of :class:`WindowLayer` (sliding layers) and ``DynamicLayer`` (full layers)."""

    def crop(self, tokens_to_remove: int) -> None:
        """Every layer takes back ``-tokens_to_remove`` tokens, or none does: each sliding layer is asked first
        (:meth:`WindowLayer.check_crop`), so a refusal leaves the full layers uncut too."""
        r = _tokens_to_take_back(tokens_to_remove)
        for layer in self.layers:
            if isinstance(layer, WindowLayer):
                layer.check_crop(-r)
        super().crop(-r)

    def __init__(self, layers: list):
        super().__init__(layers=layers)
        self.batch: int | None = None  # set by the first forward after construction or reset

    def reset(self):
        """Forget every token: the cache serves a new sequence (any batch) as if just made.

        Full layers are replaced by fresh ``DynamicLayer`` objects rather than reset: transformers 5.15's
        ``CacheLayerMixin.reset`` zeroes the keys in place and keeps them (cache_utils.py:87-91 there), so a
        reset full layer would still count its old tokens and attend over zero keys.
        """
        self.layers = [DynamicLayer() if isinstance(layer, DynamicLayer) else layer for layer in self.layers]
        super().reset()
        self.batch = None

    def check_call(self, batch: int, attention_mask: torch.Tensor | None) -> None:
        """Refuse a forward this cache cannot serve, before any layer changes (called by the model's hook)."""
        # min, not all(): one reduction is the cheapest test (~4 µs), and this runs every step
        mask = attention_mask
        if mask is not None and mask.dim() == 2 and mask.numel() and not mask.min():
            raise ValueError(
                "attention_mask has zeros (a padded batch): hf_cache serves unpadded batches only, since a ring "
                "returns one-token keys in slot order and HF's padding mask is in position order. Pass sequences "
                "of equal length (attention_mask all ones, or None)")
        # layer 0 directly: every layer here is a CacheLayerMixin, and Cache.get_seq_length first tests that (an ABC
        # isinstance, ~0.3 µs a step)
        if self.batch is None or self.layers[0].get_seq_length() == 0:
            self.batch = batch
        elif batch != self.batch:
            raise ValueError(f"input batch is {batch} but this cache holds batch {self.batch}: start a new "
                             "hf_cache(model) for a new batch")


def cache_kwarg(model) -> str:
    """The keyword ``model`` takes its cache by: ``"cache"`` (transformers >= 5.2x) or ``"past_key_values"`` (5.15)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _guard(module, args, kwargs):
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if isinstance(cache, WindowCache):
        x = kwargs.get("input_ids", args[0] if args else None)
        if x is None:
            x = kwargs.get("inputs_embeds")
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        cache.check_call(x.shape[0], mask)


def _text_config(model):
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"model must be a transformers model with a .config; got {type(model).__name__}")
    return config.get_text_config(decoder=True)  # a multimodal Gemma 3 keeps its layers in text_config


def layer_types_of(config) -> list[str]:
    """``"sliding_attention"`` / ``"full_attention"`` per layer: ``config.layer_types``, or all sliding (Mistral)."""
    n = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    if types is None:  # Mistral: one window for every layer
        return ["sliding_attention"] * n
    types = list(types)[:n]
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown:
        raise ValueError(f"config.layer_types may hold only 'sliding_attention' and 'full_attention'; got {unknown}")
    return types


def hf_cache(model, kind: str = "ring", lookahead: int = 0) -> WindowCache:
    """A ``transformers.Cache`` for ``model`` whose sliding layers keep their keys/values in ``make_cache(kind, W)``.

    Args:
        model: a Hugging Face causal LM (Mistral, Gemma 2, Gemma 3, ...) whose (text) config has
            ``sliding_window`` = W keys per query, its own included (HF's rule since 4.56, ours).
        kind: ``"ring"`` (default), ``"naive"`` (``"sliding"``) or ``"int8"``.
        lookahead: ``L`` extra ring slots (kind ``"ring"``): ``RingBufferKVCache(W, lookahead=L)``, so
            assisted generation (``assistant_model=``, ``prompt_lookup_num_tokens=k``) can take back a
            rejected draft in O(1); ``L = k`` serves drafts of ``k`` tokens (see :meth:`WindowLayer.crop`).

    Returns:
        a fresh cache for one batch of equal-length sequences; pass it as ``past_key_values`` to
        ``model.generate`` or to ``model(...)`` calls of any number of tokens each. A forward hook
        installed once on ``model`` refuses padded batches and a change of batch before any layer changes.
    """
    if kind not in HF_KINDS:
        raise ValueError(f"kind must be one of {HF_KINDS}; got {kind!r} (sinks and lru keep positions that "
                         "HF's (kv_length, kv_offset) mask sizes cannot describe)")
    config = _text_config(model)
    window = _window_of(config)
    layers = [WindowLayer(kind, window, lookahead) if t == "sliding_attention" else DynamicLayer()
              for t in layer_types_of(config)]
    _install_guard(model)
    return WindowCache(layers=layers)


def _install_guard(model) -> None:
    """The pre-forward check (padding, batch), once per model however many caches it is served."""
    if isinstance(model, torch.nn.Module) and not getattr(model, "_swkv_guard", False):
        model.register_forward_pre_hook(_guard, with_kwargs=True)
        model._swkv_guard = True


def _window_of(config) -> int:
    """``config.sliding_window`` as an int, refusing configs whose layers do not slide."""
    window = getattr(config, "sliding_window", None)
    if window is None:
        raise ValueError(f"config.sliding_window is {window!r}: this model attends to every past token, "
                         "so there is no window for hf_cache to keep (use transformers' DynamicCache)")
    if getattr(config, "use_sliding_window", True) is False:  # Qwen2's switch: a window written but unused
        raise ValueError(f"config.use_sliding_window is False (with sliding_window={window!r}): this model attends "
                         "to every past token, so a window cache would drop keys it reads (use DynamicCache)")
    if getattr(config, "use_bidirectional_attention", False):
        raise ValueError("config.use_bidirectional_attention is True: hf_cache serves causal decoders only")
    return int(window)
