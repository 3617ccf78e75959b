"""Recording what a real cache holds, step by step, so plots and widgets draw facts, not a re-derivation.

:func:`record` feeds a cache from :mod:`swkv_teach.caches` one token per step,
each token's key and value set to its own absolute position (shape
``(1, 1, 1, 1)``), and after every step reads the stored keys back. What a
figure marks as cached is therefore what the cache's tensors hold, and a bug
in a cache shows up in its pictures.

Step ``t`` means: token ``t`` has just been written (``t + 1`` tokens seen)
and, for LRU, the ids its query read have been promoted. Worked example,
``policy="sliding"``, ``window_size=3``::

    step   cached       evicted this step
      0    [0]          []
      2    [0, 1, 2]    []
      3    [1, 2, 3]    [0]          query 3 sees keys 1, 2, 3: the window rule

which is the rule of :mod:`swkv_teach.masks` (query ``i`` sees ``i - W < j <= i``).

:func:`record_attention` does the same for the caches that evict by attention
(H2O, TOVA): it drives a real model through them one token of a real text per
step and snapshots one layer's cache, with each stored token's score, the
tokens H2O protects, and the one the next token would evict.

:func:`memory_over_steps` gives the bytes an unbounded and a windowed cache
hold for a model's shape; its tests check it against real caches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from swkv_teach._validate import check_nonnegative_int, check_positive_int
from swkv_teach.caches import KVCache, LRUKVCache, RingBufferKVCache, ScoredKVCache, SlidingWindowKVCache, make_cache
from swkv_teach.caches.scored import eviction_order

__all__ = [
    "ATTENTION_POLICIES",
    "POLICIES",
    "Snapshot",
    "check_policy",
    "Trace",
    "memory_over_steps",
    "parse_access_pattern",
    "record",
    "record_attention",
    "stored_positions",
]

POLICIES = ("sliding", "ring", "sinks", "lru")
ATTENTION_POLICIES = ("h2o", "tova")  # need a model's attention: record_attention


def check_policy(policy) -> str:
    """Return ``policy`` if it is one of :data:`POLICIES`, else a ValueError naming the choices."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}; got {policy!r}")
    return policy


@dataclass(frozen=True)
class Snapshot:
    """What the cache holds right after step ``step`` (token ``step`` written, its reads done).

    Attributes:
        step: the token that just arrived; ``step + 1`` tokens seen.
        held: stored positions in the cache's own order (chronological for
            ``sliding``, slot order for ``ring``/``sinks``, least recently used
            first for ``lru``).
        cached: the same positions, sorted.
        sinks: the stored positions that are pinned sinks (``sinks`` policy only).
        evicted: positions that left the cache during this step.
        slots: for ``ring``/``sinks``, the position in each slot (None = empty);
            else None.
        write_slot: slot token ``step`` was written into (ring/sinks), else None.
        next_slot: the write pointer, the slot token ``step + 1`` will go into.
        hits: ids read (and promoted) at this step (lru); misses: ids read but gone.
        nbytes: ``cache.nbytes`` at this step (keys and values of shape (1, 1, ., 1), float32).
        scores: for ``h2o``/``tova``, each slot's score (aligned with ``slots``, None = empty).
        protected: for ``h2o``, the stored positions the next token may not evict (its recent window).
        next_out: for ``h2o``/``tova`` with every slot full, the position the next token evicts.
    """

    step: int
    held: tuple[int, ...]
    cached: tuple[int, ...]
    sinks: tuple[int, ...] = ()
    evicted: tuple[int, ...] = ()
    slots: tuple[int | None, ...] | None = None
    write_slot: int | None = None
    next_slot: int | None = None
    hits: tuple[int, ...] = ()
    misses: tuple[int, ...] = ()
    nbytes: int = 0
    scores: tuple[float | None, ...] | None = None
    protected: tuple[int, ...] = ()
    next_out: int | None = None

    def state_of(self, position: int) -> str:
        """``"sink"``, ``"cached"``, ``"evicted"`` or ``"unseen"`` for one token position."""
        if position > self.step:
            return "unseen"
        if position in self.sinks:
            return "sink"
        if position in self.cached:
            return "cached"
        return "evicted"


@dataclass(frozen=True)
class Trace:
    """A policy's snapshots over a token stream: ``trace[t]`` is the :class:`Snapshot` after step ``t``."""

    policy: str
    window_size: int
    num_sinks: int
    steps: int
    reads: tuple[tuple[int, ...], ...]
    snapshots: tuple[Snapshot, ...] = field(repr=False)
    tokens: tuple[str, ...] | None = None  # the text's characters (record_attention), for labels
    recent: int | None = None  # H2O's recent window

    def __getitem__(self, step: int) -> Snapshot:
        return self.snapshots[step]

    def __len__(self) -> int:
        return len(self.snapshots)

    @property
    def label(self) -> str:
        """A short name for titles, e.g. ``"sinks (S=2, W=4)"``."""
        if self.policy == "sinks":
            return f"sinks (S={self.num_sinks}, W={self.window_size})"
        if self.policy == "lru":
            return f"lru (max_size={self.window_size})"
        if self.policy == "h2o":
            return f"h2o (B={self.window_size}, recent={self.recent})"
        if self.policy == "tova":
            return f"tova (B={self.window_size})"
        return f"{self.policy} (W={self.window_size})"


def stored_positions(cache: KVCache) -> tuple[int, ...]:
    """Positions a cache fed by :func:`record` stores, read from its key tensors, in its own order.

    ``record`` sets every key to its token's position, so reading the keys is
    reading the cache: sliding -> ``cache.k`` (chronological), ring/sinks ->
    the filled slots of ``cache.k_buf`` (slot order), lru -> ``peek`` of each
    id, least recently used first (peek does not promote).
    """
    if isinstance(cache, LRUKVCache):
        return tuple(int(cache.peek(i)[0].flatten()[0]) for i in cache.ids())
    if isinstance(cache, RingBufferKVCache):
        if cache.k_buf is None:
            return ()
        return tuple(int(x) for x in cache.k_buf[0, 0, : len(cache), 0].tolist())
    if isinstance(cache, SlidingWindowKVCache):
        if cache.k is None:
            return ()
        return tuple(int(x) for x in cache.k[0, 0, :, 0].tolist())
    raise TypeError(f"cache must be one of the swkv_teach caches; got {type(cache).__name__}")


def parse_access_pattern(access_pattern, steps: int) -> tuple[tuple[int, ...], ...]:
    """Turn an LRU access pattern into one tuple of token ids read per step.

    Accepted forms:

    * ``None`` or ``""``: nothing is read (LRU then behaves like the window).
    * a ``str`` of ids such as ``"0"`` or ``"0, 3"``: those ids are read at
      *every* step once they exist (the widget's text box). Reading ``"0"``
      keeps token 0 alive forever, like a sink.
    * a mapping ``{step: id or ids}``, or a sequence whose item ``t`` is an id,
      several ids, or None, for step ``t``. These must only read tokens
      already seen (id <= step).
    """
    check_positive_int("steps", steps)
    if access_pattern is None:
        return ((),) * steps
    if isinstance(access_pattern, str):
        ids = []
        for part in access_pattern.replace(",", " ").split():
            if not part.isdigit():
                raise ValueError(
                    f"access_pattern must list token ids (non-negative ints) separated by commas or spaces, "
                    f"e.g. '0, 3'; got {access_pattern!r} (bad part {part!r})"
                )
            ids.append(int(part))
        return tuple(tuple(i for i in ids if i <= t) for t in range(steps))
    if isinstance(access_pattern, Mapping):
        items = list(access_pattern.items())
    elif isinstance(access_pattern, Sequence):
        if len(access_pattern) > steps:
            raise ValueError(
                f"access_pattern has {len(access_pattern)} entries; expected at most steps={steps} (one per step)"
            )
        items = list(enumerate(access_pattern))
    else:
        raise TypeError(
            "access_pattern must be None, a str of ids, a {step: ids} mapping or a per-step list; "
            f"got {type(access_pattern).__name__}"
        )
    reads: list[tuple[int, ...]] = [()] * steps
    for step, ids in items:
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < steps:
            raise ValueError(f"access_pattern step must be an int in [0, {steps - 1}]; got {step!r}")
        if ids is None:
            continue
        ids = (ids,) if isinstance(ids, int) else tuple(ids) if isinstance(ids, Iterable) else ids
        if not isinstance(ids, tuple) or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            raise TypeError(f"access_pattern[{step}] must be an int id or ints; got {ids!r}")
        for i in ids:
            if not 0 <= i <= step:
                raise ValueError(
                    f"access_pattern[{step}] reads token {i}; expected ids already seen at step {step} (0..{step})"
                )
        reads[step] = ids
    return tuple(reads)


def record(policy: str, window_size: int, steps: int, num_sinks: int = 2, access_pattern=None) -> Trace:
    """Feed a fresh ``policy`` cache ``steps`` tokens, one per step, and snapshot it after each.

    Args:
        policy: one of :data:`POLICIES` (``"sliding"`` is the seed's cat-and-slice cache).
        window_size: ``W``; for ``lru`` its ``max_size``.
        steps: tokens in the stream, positions ``0 .. steps - 1``.
        num_sinks: pinned first tokens, used by ``"sinks"`` only.
        access_pattern: ids read (``get``, which promotes) after each step's
            write; ``lru`` only (see :func:`parse_access_pattern`).

    Returns:
        a :class:`Trace` of ``steps`` snapshots.
    """
    check_policy(policy)
    check_positive_int("window_size", window_size)
    check_positive_int("steps", steps)
    check_nonnegative_int("num_sinks", num_sinks)
    if policy == "sinks" and num_sinks < 1:
        raise ValueError(f"num_sinks must be >= 1 for policy 'sinks'; got {num_sinks}")
    reads = parse_access_pattern(access_pattern, steps)
    if policy != "lru" and any(reads):
        raise ValueError(f"access_pattern only changes policy 'lru' (reads promote); got policy {policy!r}")

    cache = make_cache(policy, window_size, num_sinks=num_sinks)
    sinks_of_cache = num_sinks if policy == "sinks" else 0
    snapshots, before = [], ()
    for t in range(steps):
        kv = torch.full((1, 1, 1, 1), float(t))  # the key *is* the position: exact in float32 below 2**24
        cache.update(kv, kv)
        hits = tuple(i for i in reads[t] if cache.get(i) is not None) if policy == "lru" else ()
        held = stored_positions(cache)
        slots = write_slot = next_slot = None
        if isinstance(cache, RingBufferKVCache):
            slots = held + (None,) * (cache.capacity - len(held))
            write_slot = held.index(t)
            # the write pointer, read off the slots: the first empty one, else the oldest non-sink
            window = range(sinks_of_cache, cache.capacity)
            empty = [s for s in range(cache.capacity) if slots[s] is None]
            next_slot = empty[0] if empty else min(window, key=lambda s: slots[s])
        snapshots.append(
            Snapshot(
                step=t,
                held=held,
                cached=tuple(sorted(held)),
                sinks=tuple(p for p in held if p < sinks_of_cache),
                evicted=tuple(sorted(set(before) - set(held))),
                slots=slots,
                write_slot=write_slot,
                next_slot=next_slot,
                hits=hits,
                misses=tuple(i for i in reads[t] if i not in hits) if policy == "lru" else (),
                nbytes=cache.nbytes,
            )
        )
        before = held
    return Trace(policy, window_size, sinks_of_cache, steps, reads, tuple(snapshots))


def memory_over_steps(
    steps: int,
    window_size: int,
    num_layers: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    dtype: torch.dtype = torch.float16,
    batch: int = 1,
) -> dict:
    """KV memory after each of ``steps`` tokens: an unbounded cache vs a window of ``window_size``.

    Defaults are a 7B-class shape (Mistral 7B: 32 layers, 8 kv heads, head_dim
    128, float16), i.e. ``2 * 32 * 8 * 128 * 2`` bytes = 128 KiB per token.

    Returns a dict of lists indexed by step: ``"tokens_seen"`` (1 .. steps),
    ``"unbounded_tokens"``, ``"window_tokens"`` (``min(seen, W)``),
    ``"unbounded_bytes"``, ``"window_bytes"``, and ``"bytes_per_token"`` (int).
    """
    for name, value in (("steps", steps), ("window_size", window_size), ("num_layers", num_layers),
                        ("num_kv_heads", num_kv_heads), ("head_dim", head_dim), ("batch", batch)):
        check_positive_int(name, value)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float16; got {type(dtype).__name__} {dtype!r}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_token = 2 * num_layers * batch * num_kv_heads * head_dim * itemsize  # keys and values
    seen = list(range(1, steps + 1))
    window = [min(n, window_size) for n in seen]
    return {
        "tokens_seen": seen,
        "unbounded_tokens": seen,
        "window_tokens": window,
        "unbounded_bytes": [n * per_token for n in seen],
        "window_bytes": [n * per_token for n in window],
        "bytes_per_token": per_token,
    }


def record_attention(policy: str, budget: int, model, token_ids, recent: int | None = None, layer: int = 0,
                     tokens: Sequence[str] | None = None) -> Trace:
    """Feed ``model`` the tokens ``token_ids`` one per step through fresh ``policy`` caches; snapshot layer ``layer``.

    The caches are the library's (``make_cache(policy, budget, recent=...)``, one per layer),
    driven by ``model.step`` with a plain list of caches, so the model's own mask window
    applies, and fed by the model's real attention (``observe``). After each step the
    snapshot holds what layer ``layer``'s cache stores, slot by slot, with each slot's
    score, H2O's protected recent tokens, and the token the next step would evict
    (the cache's own rule: lowest score outside the protected ones, ties to the oldest).

    Args:
        policy: one of :data:`ATTENTION_POLICIES`.
        budget: stored tokens per layer.
        model: a :class:`~swkv_teach.model.Decoder` (anything with ``step`` and ``layers``).
        token_ids: the stream, a 1-D sequence of ints (or a 1-D long tensor), at least 2.
        recent: H2O's recent window (default ``budget // 2``); ``tova`` takes none.
        layer: which layer's cache to snapshot.
        tokens: optional text of each token (e.g. its character), kept for labels.
    """
    if policy not in ATTENTION_POLICIES:
        raise ValueError(f"policy must be one of {ATTENTION_POLICIES}; got {policy!r}")
    check_positive_int("budget", budget)
    if policy == "h2o":
        recent = budget // 2 if recent is None else check_nonnegative_int("recent", recent)
    elif recent is not None:
        raise ValueError(f"recent is H2O's recent window; policy {policy!r} takes none, got recent={recent!r}")
    ids = token_ids.tolist() if isinstance(token_ids, torch.Tensor) else list(token_ids)
    if len(ids) < 2 or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise ValueError(f"token_ids must be a 1-D sequence of at least 2 int ids; got {token_ids!r:.80}")
    n_layers = len(model.layers)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n_layers:
        raise ValueError(f"layer must be an int in [0, {n_layers - 1}]; got {layer!r}")
    if tokens is not None and len(tokens) != len(ids):
        raise ValueError(f"tokens must label each of the {len(ids)} token ids; got {len(tokens)}")

    caches = [make_cache(policy, budget, recent=recent) for _ in range(n_layers)]
    device = next(model.parameters()).device
    snapshots, before = [], ()
    for t, token in enumerate(ids):
        model.step(torch.tensor([[token]], device=device), caches)
        cache: ScoredKVCache = caches[layer]
        n = len(cache)
        held = tuple(int(p) for p in cache.pos_buf[:n].tolist())  # slot order
        scores = tuple(float(s) for s in cache.score_buf[:n].tolist())
        pos = cache.pos_buf[:n]
        guard = cache._protected(pos, cache.seen + 1)  # the rule the next token's eviction applies
        protected = tuple(sorted(int(p) for p in pos[guard].tolist())) if guard is not None else ()
        next_out = None
        if n == budget:
            order = eviction_order(cache.score_buf[:n], pos, guard)
            next_out = int(pos[order[0]]) if len(order) else None
        snapshots.append(
            Snapshot(
                step=t,
                held=held,
                cached=tuple(sorted(held)),
                evicted=tuple(sorted(set(before) - set(held))),
                slots=held + (None,) * (budget - n),
                write_slot=held.index(t),
                nbytes=cache.nbytes,
                scores=scores + (None,) * (budget - n),
                protected=protected,
                next_out=next_out,
            )
        )
        before = held
    labels = tuple(tokens) if tokens is not None else None
    return Trace(policy, budget, 0, len(ids), ((),) * len(ids), tuple(snapshots), labels, recent)
