"""What every cache's ``state_dict`` / ``load_state_dict`` / ``stats`` share, written once.

A cache's state follows PyTorch's convention: a plain dict of tensors and Python
values (ints, strings, lists, None), so ``torch.save`` writes it and
``torch.load(path, weights_only=True)`` reads it back. Every state has three
kinds of entries::

    {"kind": "RingBufferKVCache",                 # the class; a state loads only into the same class
     "window_size": 64, "num_sinks": 0,           # the constructor's settings: must match exactly
     "layout": [1, 2, 24, "float32"],             # (batch, heads, head_dim, dtype), None while empty
     "seen": 70, "k": tensor, "v": tensor, ...}   # the rest: what decides the cache's future outputs

An entry a cache lists in ``_optional`` (a setting or a state entry added later, such as the
ring's ``lookahead``) is left out of the state while it has its default, and a state without it
reads as that default: a state saved before the entry existed loads unchanged, and a cache that
does not use the feature saves what it always saved.

Loading checks everything before it changes anything (:func:`check_many`):
the kind, the settings, the keys, the tensors' shapes, the layout against
the one the cache already holds (a fresh or reset cache takes the state's),
and for paged caches that their pools have room. A refused state raises
``ValueError`` naming what differs (``PoolExhausted`` when a pool is short
of blocks) and leaves every cache as it was.
"""

from __future__ import annotations

import torch

HEADER = ("kind", "layout")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``"float16"``: a plain string survives ``weights_only`` loading everywhere."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"state has dtype {name!r}, not the name of a torch dtype (e.g. 'float32')")
    return dtype


def layout(k: torch.Tensor | None, dtype: torch.dtype | None = None) -> list | None:
    """``[batch, heads, head_dim, dtype name]`` of keys ``(batch, heads, tokens, head_dim)``; None for None."""
    if k is None:
        return None
    B, H, _, D = k.shape
    return [B, H, D, dtype_name(k.dtype if dtype is None else dtype)]


def describe_layout(lay) -> str:
    if lay is None:
        return "nothing (empty)"
    B, H, D, dt = lay
    return f"batch={B}, heads={H}, head_dim={D}, dtype {dt}"


def copy(t, device=None):
    """A detached copy of ``t`` (on ``device`` when given): a state must not change as the cache goes on."""
    if not isinstance(t, torch.Tensor):
        return t
    return t.detach().to(device, copy=True) if device is not None else t.detach().clone()


def expect_tensor(owner: str, name: str, t, shape: tuple, dtype: torch.dtype | None = None) -> None:
    """Raise ``ValueError`` unless ``t`` is a tensor of ``shape`` (and ``dtype``)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{owner}: state[{name!r}] must be a tensor of shape {shape}; got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{owner}: state[{name!r}] has shape {tuple(t.shape)}; expected {tuple(shape)}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{owner}: state[{name!r}] has dtype {t.dtype}; expected {dtype}")


def expect_int(owner: str, name: str, value, lo: int = 0, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        span = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{owner}: state[{name!r}] must be an int {span}; got {value!r}")
    return value


def check_one(cache, state_dict) -> None:
    """Every check of :meth:`KVCache.load_state_dict` except the pool's room; changes nothing.

    ``cache``: any :class:`~swkv_teach.caches.base.KVCache` (not imported: base.py sits above this module).
    """
    owner = type(cache).__name__
    if not isinstance(state_dict, dict):
        raise ValueError(f"{owner}: a state must be a dict (from state_dict()); got {type(state_dict).__name__}")
    if state_dict.get("kind") != owner:
        raise ValueError(f"kind differs: the state is of a {state_dict.get('kind')!r}, this cache is a {owner!r}")
    config, optional = cache._config(), cache._optional
    given = {**{k: v for k, v in optional.items() if k in config}, **state_dict}  # a left-out setting is its default
    differs = [f"{k} is {given[k]!r} in the state but {v!r} in this cache"
               for k, v in config.items() if k in given and given[k] != v]
    if differs:
        raise ValueError(f"{owner}: settings differ: " + "; ".join(differs))
    want = set(HEADER) | set(config) | set(cache._state_keys)
    missing = sorted(want - set(state_dict) - set(optional))
    extra = sorted(set(state_dict) - want - set(optional))
    if missing or extra:
        raise ValueError(f"{owner}: the state lacks keys {missing} and has unexpected keys {extra}")
    expect_int(owner, "seen", state_dict["seen"])
    lay = state_dict["layout"]
    if lay is not None:
        if not (isinstance(lay, list) and len(lay) == 4 and all(isinstance(x, int) and x > 0 for x in lay[:3])):
            raise ValueError(f"{owner}: state['layout'] must be [batch, heads, head_dim, dtype name] or None; got {lay!r}")
        dtype_from_name(lay[3])
    held = cache._state_layout()
    if held is not None and lay is not None and held != lay:
        raise ValueError(
            f"{owner}: layout differs: the state holds {describe_layout(lay)}, this cache holds "
            f"{describe_layout(held)}; reset() the cache first to load a state of another layout"
        )
    cache._check_state(state_dict)


def check_room(pairs) -> None:
    """Raise ``PoolExhausted`` when caches sharing a pool would need more blocks than it can give.

    ``pairs``: ``(cache, state)``; each cache's claim (:meth:`KVCache._blocks_claim`) is
    ``(pool, blocks the state needs, blocks the cache holds now and would return)``.
    """
    need: dict[int, list] = {}
    for cache, sd in pairs:
        claim = cache._blocks_claim(sd)
        if claim is not None:
            pool, wanted, held = claim
            entry = need.setdefault(id(pool), [pool, 0, 0])
            entry[1] += wanted
            entry[2] += held
    for pool, wanted, held in need.values():
        if wanted > pool.free_blocks + held:
            from swkv_teach.caches.pool import PoolExhausted

            raise PoolExhausted(
                f"{pool!r} cannot take this state: it needs {wanted} block{'s' * (wanted != 1)}, the pool has "
                f"{pool.free_blocks} free and the caches loading it hold {held}. Nothing was changed: "
                "reset() finished sequences or build a larger pool."
            )


def check_many(caches, states) -> None:
    """Check every ``(cache, state)`` pair, then the pools' room, before any cache is changed."""
    caches, states = list(caches), list(states)
    if len(caches) != len(states):
        raise ValueError(f"layer count differs: the state has {len(states)} layers, there are {len(caches)} caches")
    for i, (cache, sd) in enumerate(zip(caches, states)):
        try:
            check_one(cache, sd)
        except ValueError as err:
            raise ValueError(f"layer {i}: {err}") from None
    check_room(zip(caches, states))


def load_many(caches, states, check=None) -> None:
    """Load ``states`` into ``caches`` all or nothing: :func:`check_many` (then ``check()``, the
    caller's own checks) first, then each load."""
    caches, states = list(caches), list(states)
    check_many(caches, states)
    if check is not None:
        check()
    for cache, sd in zip(caches, states):
        cache._load_state(sd)


def sum_stats(per_layer: list[dict]) -> dict:
    """Integer counts summed over caches, each cache's own dict kept under ``"layers"``.

    Keys every cache reports are summed; a paged pool shared by several caches is
    counted once per cache in ``pool_*`` sums (they are per-cache views of one pool).
    """
    common = set.intersection(*(set(s) for s in per_layer)) if per_layer else set()
    keys = [k for k in (per_layer[0] if per_layer else {}) if k in common]
    total = {k: sum(s[k] for s in per_layer) for k in keys
             if all(isinstance(s[k], int) and not isinstance(s[k], bool) for s in per_layer)}
    total["layers"] = per_layer
    return total
