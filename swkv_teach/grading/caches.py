"""Checks for the cache exercises: 01 sliding window, 03 ring buffer, 05 attention sinks.

Each feeds labelled tokens (see :mod:`._tokens`) one at a time to the
learner's cache and to the library's own cache of the same kind (the oracle),
and compares what ``update`` returns, exactly, step by step: windows
3, 5, 1, 2, 8 (3 first: it is the problem statement's example, and a window
hard-coded to 3 then shows up at 5 as such), runs of ``2W + 3`` tokens (so
``W - 1``, ``W``, ``W + 1`` and long after are all crossed), float32 and
float64, on :func:`swkv_teach.device`. It also checks that the caller's
tensors are never written to and that two instances share no state.
"""

from __future__ import annotations

import torch

from swkv_teach.caches import RingBufferKVCache, SinkKVCache, SlidingWindowKVCache
from swkv_teach.device import device as pick_device
from swkv_teach.grading._report import call, fail, passed, learner_name as _name
from swkv_teach.grading._tokens import (
    Inputs,
    as_positions,
    check_kind,
    describe,
    labels,
    read_positions,
    token,
    unpack_kv,
)

WINDOWS = (3, 5, 1, 2, 8)


# ---------------------------------------------------------------- diagnosis
def _window_hint(got: list, exp: list, seen: int, W: int, more: list) -> str:
    """Why a sliding-window cache returned the tokens ``got`` instead of ``exp`` after ``seen`` tokens.

    ``more``: how many tokens the learner's cache returned on the next updates (to tell "never evicts" from "W + 1").
    """
    n = len(got)
    history = list(range(seen))
    if any(isinstance(g, str) and g.startswith("v") for g in got):
        return "the keys you returned hold values: are k and v swapped somewhere (store, cat or return)?"
    if "0" in got:
        return "zeros came back where keys should be: only return slots that were written."
    if seen - 1 not in got and got == history[:n] and more and more[0] == got:
        return "you kept the oldest tokens and dropped the newest: evict from the front (keep [-W:], not [:W])."
    if got == list(range(max(0, seen - 1 - W), seen - 1)) and seen - 1 not in got:
        return ("you returned the cache as it was before this update: add the new token first, then return "
                "the updated tensors.")
    if sorted(got, key=str) == sorted(exp, key=str) and got != exp:
        if got and got[0] == seen - 1:
            return "newest first: you are prepending. Append at the end, torch.cat([self.k, k_new], dim=2)."
        return "the right tokens in the wrong order: keep them chronological, oldest first."
    if n > len(exp) and got == history[-n:]:
        if (more and all(len(m) > n for m in more)) or (not more and n == seen):
            return ("nothing is evicted: after appending, keep only the last window_size tokens (slice [-W:] on dim 2). "
                    "Count tokens with k.shape[2]: len(k) is the batch and shape[-1] the head_dim; and with W = 1, "
                    "[-(W - 1):] is [-0:], the whole tensor.")
        if n == W + 1:
            return (f"off by one: you keep W + 1 = {n} tokens; the window holds exactly W = {W} "
                    "(evict when shape[2] > window_size, then keep [-window_size:]).")
        return f"your cache keeps {n} tokens but window_size is {W}: is the window hard-coded? Use self.window_size."
    if n < len(exp) and (n == 0 or got == history[-n:]):
        if n == W - 1:
            return (f"off by one: you keep W - 1 = {n} tokens; the window holds exactly W = {W}, the new token "
                    "included (i - W < j <= i).")
        return f"your cache keeps {n} tokens but window_size is {W}: is the window hard-coded? Use self.window_size."
    if seen - 1 not in got and got == history[:n]:
        return "you kept the oldest tokens and dropped the newest: evict from the front (keep [-W:], not [:W])."
    if seen - 1 not in got:
        return "the token you just added is missing: the new token is always part of the window."
    return "compare the two lists above: which tokens should be evicted, and which kept?"


def _value_hint(vgot: list, kgot: list, vexp: list) -> str:
    if any(isinstance(g, str) and g.startswith("k") for g in vgot):
        return "the values you returned hold keys: are k and v swapped, or k returned twice?"
    if len(vgot) > len(vexp):
        return "your keys are right but your values are not evicted: slice self.v exactly as self.k."
    if vgot == kgot[::-1] or sorted(vgot, key=str) == sorted(vexp, key=str):
        return "keys and values are in different orders: update them the same way."
    return "your keys are right but your values are not: update and evict values exactly as keys."


def _lookahead(cache, start: int, dtype, dev, n: int = 2) -> list:
    """Token labels the learner's cache returns on ``n`` more updates (a diagnosis aid; failures ignored)."""
    seen = []
    for p in range(start, start + n):
        try:
            k, _ = cache.update(*token(p, dtype, dev))
            seen.append(labels(k))
        except Exception:
            break
    return seen


# ---------------------------------------------------------------- running
def _make(case: str, cls, *args, methods=("update",)):
    obj = call(case, f"{_name(cls)}({', '.join(map(str, args))})", cls, *args)
    for m in methods:
        if not callable(getattr(obj, m, None)):
            raise fail(case, f"{_name(cls)}({', '.join(map(str, args))}) gave {describe(obj)} with no {m}() method.",
                       hint=f"pass the class itself to the check, and give it a {m}(...) method.")
    return obj


def _tensors_in(obj, depth: int = 0):
    """Every tensor reachable from ``obj``'s attributes, lists, tuples and dicts (a few levels deep)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 3 and isinstance(obj, (list, tuple, set, frozenset)) or hasattr(obj, "popleft"):
        for x in obj:
            yield from _tensors_in(x, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors_in(x, depth + 1)
    elif depth == 0 and hasattr(obj, "__dict__"):
        for x in vars(obj).values():
            yield from _tensors_in(x, depth + 1)


def _check_bounded(case: str, cache, capacity: int, k_new: torch.Tensor) -> None:
    """The point of the exercise: the cache holds at most ``capacity`` tokens of keys and values.

    Counts the bytes of every floating-point storage the cache keeps alive, in units of one
    token's key (B * H * D elements); keys and values together may fill ``2 * capacity`` of them.
    A cache that stores everything and returns only the last W passes every other test.
    """
    per_token = k_new.numel() * k_new.element_size()
    storages = {}  # views of one buffer (per-slot views, slices) share a storage: count it once
    for t in _tensors_in(cache):
        if t.is_floating_point():
            st = t.untyped_storage()
            storages[(t.device, st.data_ptr())] = st.nbytes()
    tokens = sum(storages.values()) / per_token
    # slack of one token each for k and v: the seed's slice is a view of a W + 1 token cat
    if tokens > 2 * capacity + 2:
        raise fail(case, f"the cache's tensors hold {tokens:g} tokens' worth of keys and values; at most "
                   f"{2 * capacity} (keys and values of {capacity} tokens) should be kept.",
                   hint="evict: the memory must stay flat however many tokens arrive. Returning the last W is "
                   "not enough if the cache still stores everything.")


def _steps(title: str, cache, oracle, capacity: int, steps: int, dtype, dev):
    """Feed tokens 0..steps-1 to the learner's cache and to the library's, one per update.

    Yields ``(p, case, k_new, k, v, ek, ev)``: the learner's return and the expected one, already
    unpacked and checked for type, dtype and device. Once the caller has checked a step, confirms
    the caller's tensors were left untouched and the cache holds at most ``capacity`` tokens.
    """
    inputs = Inputs()
    for p in range(steps):
        case = f"{title}, step {p + 1} (tokens 0..{p} fed so far, {str(dtype).replace('torch.', '')})"
        k_new, v_new = token(p, dtype, dev)
        inputs.add(p, k_new, v_new)
        k, v = unpack_kv(case, call(case, "update()", cache.update, k_new, v_new))
        ek, ev = oracle.update(*token(p, dtype, dev))
        check_kind(case, k, v, k_new)
        yield p, case, k_new, k, v, ek, ev
        inputs.check_untouched(case)
        _check_bounded(case, cache, capacity, k_new)


def _run_sliding(cls, W: int, steps: int, dtype, dev) -> None:
    title = f"{_name(cls)}(window_size={W})"
    cache = _make(title, cls, W)
    oracle = SlidingWindowKVCache(W)
    for p, case, k_new, k, v, ek, ev in _steps(title, cache, oracle, W, steps, dtype, dev):
        if not torch.equal(k, ek):
            got, exp = labels(k), labels(ek)
            more = _lookahead(cache, p + 1, dtype, dev) if got != exp else []
            hint = _window_hint(got, exp, p + 1, W, more) if got != exp else (
                "the right tokens, but their numbers changed: store k_new as given (no arithmetic, no re-ordering "
                "of heads or dims).")
            raise fail(case, "update() returned the keys of positions (left) vs expected (right):",
                       expected=exp, got=got, hint=hint)
        if not torch.equal(v, ev):
            vgot, vexp = labels(v, values=True), labels(ev, values=True)
            raise fail(case, "the keys are right, the values are not. Value positions:", expected=vexp, got=vgot,
                       hint=_value_hint(vgot, labels(k), vexp))


def _independent(cls, make, kind: str, dev) -> None:
    """Two instances must not share state (e.g. a class attribute list)."""
    case = f"two {_name(cls)} instances used side by side"
    a = make(case)
    for p in range(4):
        call(case, "update()", a.update, *token(p, device=dev))
    b = make(case)
    k50, v50 = token(50, device=dev)
    k, v = unpack_kv(case, call(case, "update() on the second instance", b.update, k50, v50))
    check_kind(case, k, v, k50)
    got = labels(k)
    if got == ["v50"]:
        raise fail(case, "a fresh cache's first update returned, as keys:", expected=[50], got=got,
                   hint="the keys you returned hold values: are k and v swapped somewhere (store, cat or return)?")
    if got != [50]:
        raise fail(case, "after feeding tokens 0..3 to the first cache, the second, fresh cache's first update "
                   "returned:", expected=[50], got=labels(k),
                   hint="state is shared between instances: keep it on self (assigned in __init__), not in class "
                   "attributes such as `k = []` at class level.")


def _first_example(cls, dev) -> None:
    """The problem statement's doctest: window 3, one (1, 2, 1, 4) token in, the same shape out."""
    case = f"the problem's example: {_name(cls)}(window_size=3), first update of a (1, 2, 1, 4) token"
    cache = _make(case, cls, 3)
    k1, v1 = torch.randn(1, 2, 1, 4, device=dev), torch.randn(1, 2, 1, 4, device=dev)
    k, v = unpack_kv(case, call(case, "update()", cache.update, k1, v1))
    if k.shape == v1.shape and torch.equal(k, v1) and torch.equal(v, k1):
        raise fail(case, "update() returned (v, k): the keys came back as values and the values as keys.",
                   hint="k and v are swapped somewhere (store, cat or return): return self.k, self.v.")
    if tuple(k.shape) != (1, 2, 1, 4) or not torch.equal(k, k1) or not torch.equal(v, v1):
        raise fail(case, "the first update should return exactly the token that came in:",
                   expected="shape (1, 2, 1, 4), equal to k1/v1",
                   got=f"shape {tuple(k.shape)}, keys equal: {torch.equal(k, k1) if k.shape == k1.shape else False}",
                   hint="on the first call there is nothing to concatenate onto: self.k, self.v = k_new, v_new.")


def check_sliding_window_cache(cls) -> None:
    """Exercise 01: the problem statement's ``SlidingWindowKVCache(window_size)`` with ``update(k_new, v_new)``."""
    dev = pick_device()
    _independent(cls, lambda case: _make(case, cls, 3), "sliding", dev)
    _first_example(cls, dev)
    for W in WINDOWS:
        _run_sliding(cls, W, 2 * W + 3, torch.float32, dev)
    _run_sliding(cls, 3, 6, torch.float64, dev)
    passed(f"{_name(cls)} keeps exactly the last W tokens, like the library's SlidingWindowKVCache "
           f"(W = 1, 2, 3, 5, 8; {sum(2 * W + 3 for W in WINDOWS)} updates; float32 and float64).")


# ---------------------------------------------------------------- ring
def _ring_hint(got: list, exp: list, seen: int, W: int) -> str:
    if any(isinstance(g, str) and g.startswith("v") for g in got):
        return "the keys you returned hold values: are k and v swapped somewhere?"
    if "0" in got:
        return ("unfilled slots came back (zeros): before the buffer is full, return only the filled slots, "
                "k_buf[:, :, :seen]; zero keys would still take attention weight.")
    if sorted(got, key=str) == sorted(exp, key=str):
        if got == sorted(exp):
            return ("you returned the tokens in chronological order; a ring buffer returns its slots in slot "
                    "order (token p lives in slot p % W) without moving anything: no roll, no cat.")
        return "the right tokens in the wrong slots: token p belongs in slot p % window_size."
    if seen - 1 not in got:
        return "the token you just wrote is missing: write it first, then return the buffer."
    return "token p belongs in slot p % window_size; compare the slot contents above."


def _run_ring(cls, W: int, steps: int, dtype, dev) -> None:
    title = f"{_name(cls)}(window_size={W})"
    cache = _make(title, cls, W)
    oracle = RingBufferKVCache(W)
    ptr = None
    for p, case, k_new, k, v, ek, ev in _steps(title, cache, oracle, W, steps, dtype, dev):
        if not torch.equal(k, ek):
            got, exp = labels(k), labels(ek)
            hint = _ring_hint(got, exp, p + 1, W) if got != exp else "the right tokens, but their numbers changed."
            raise fail(case, "update() returned, slot by slot, the keys of positions:", expected=exp, got=got, hint=hint)
        if not torch.equal(v, ev):
            vgot, vexp = labels(v, values=True), labels(ev, values=True)
            raise fail(case, "the keys are right, the values are not. Value positions, slot by slot:",
                       expected=vexp, got=vgot, hint=_value_hint(vgot, labels(k), vexp))
        got_pos, exp_pos = read_positions(case, cache), oracle.positions.tolist()
        if got_pos != exp_pos:
            hint = "positions[i] must be the absolute position of key i of what update() just returned."
            if got_pos == sorted(exp_pos):
                hint = "positions is chronological but your keys come in slot order: report them in slot order."
            raise fail(case, "positions after this update:", expected=exp_pos, got=got_pos, hint=hint)
        ok, ov = unpack_kv(case, call(case, "ordered()", lambda: cache.ordered()), what="ordered()")
        eok, eov = oracle.ordered()
        check_kind(case, ok, ov, k_new, what="ordered()")
        if not (torch.equal(ok, eok) and torch.equal(ov, eov)):
            got_o = labels(ok)
            hint = "sort the slots by the position each holds (index_select with argsort of positions)."
            if "0" in got_o:
                hint = ("ordered() returned an unwritten (zero) slot: is token p written into slot p % W, and does "
                        "ordered() read the slots that positions describes?")
            raise fail(case, "ordered() should return the stored keys chronologically, oldest first:",
                       expected=labels(eok), got=got_o, hint=hint)
        if p + 1 >= W:
            now = (k.data_ptr(), v.data_ptr())
            if ptr is None:
                ptr = now
            elif now != ptr:
                raise fail(case, "once the buffer is full, update() returned tensors in new memory "
                           "(their data_ptr() changed since the buffer filled up).",
                           hint="a ring buffer allocates once and writes each token in place into slot p % W "
                           "(k_buf[:, :, slot] = k_new[:, :, 0], or copy_); return the buffer itself, not a "
                           "torch.cat, clone or new tensor.")


def check_ring_buffer_cache(cls) -> None:
    """Exercise 03: ``RingBufferKVCache(window_size)``: one-token ``update`` in slot order, ``positions``, ``ordered()``."""
    dev = pick_device()
    _independent(cls, lambda case: _make(case, cls, 3), "ring", dev)
    for W in WINDOWS:
        _run_ring(cls, W, 2 * W + 3, torch.float32, dev)
    _run_ring(cls, 3, 7, torch.float64, dev)
    passed(f"{_name(cls)} matches the library's RingBufferKVCache slot for slot (W = 1, 2, 3, 5, 8; float32 and "
           "float64), with positions, ordered() and no allocation once full.")


# ---------------------------------------------------------------- sinks
SINK_CASES = ((2, 3), (1, 3), (4, 2), (1, 1), (2, 5))


def _sink_hint(got: list, exp: list, seen: int, S: int, W: int) -> str:
    if any(isinstance(g, str) and g.startswith("v") for g in got):
        return "the keys you returned hold values: are k and v swapped somewhere?"
    if "0" in got:
        return "unfilled slots (zeros) came back: return only slots that hold a token."
    if len(set(map(str, got))) != len(got):
        return "the same token came back twice: each stored token once."
    g, e = set(got), set(exp)
    missing, extra = e - g, g - e
    if missing & set(range(S)):
        if missing == {S - 1} and not extra - {seen - W - 1}:
            return f"off by one: you keep the first {S - 1} tokens as sinks; num_sinks={S} means positions 0..{S - 1}."
        return (f"the sinks were evicted: positions 0..{S - 1} must stay forever, whatever comes later "
                "(evict only from the window part).")
    if extra == {S} or (S in extra and seen - W != S):
        return f"off by one: you keep positions 0..{S} as sinks; num_sinks={S} means p < num_sinks, i.e. 0..{S - 1}."
    if seen - 1 in missing:
        return "the token you just added is missing: add it first, then return."
    if missing and min(missing) == max(0, seen - W) and not extra:
        return f"off by one: your window keeps W - 1 recent tokens; it should keep W = {W} (the new one included)."
    if extra and max(extra) == seen - W - 1:
        return f"off by one: your window keeps W + 1 recent tokens; it should keep W = {W}."
    return f"keep positions 0..{S - 1} (the sinks) and the last {W} positions; nothing else."


def _run_sinks(cls, S: int, W: int, steps: int, dtype, dev) -> None:
    title = f"{_name(cls)}(num_sinks={S}, window_size={W})"
    cache = _make(title, cls, S, W)
    oracle = SinkKVCache(S, W)
    for p, case, k_new, k, v, ek, ev in _steps(title, cache, oracle, S + W, steps, dtype, dev):
        got, exp = labels(k), sorted(oracle.positions.tolist())
        if sorted(got, key=str) != sorted(exp, key=str) or len(got) != len(exp):
            raise fail(case, "update() returned the keys of positions (any order is fine):",
                       expected=exp, got=got, hint=_sink_hint(got, exp, p + 1, S, W))
        pos = read_positions(case, cache)
        if pos != got:
            raise fail(case, "positions must list, in order, the absolute position of each key update() returned:",
                       expected=got, got=pos, hint="keep a position next to each slot, and report them in the "
                       "same order as the keys you return.")
        # exact contents, token by token, whatever order the learner chose
        mine = torch.tensor([got.index(q) for q in exp], device=k.device)
        theirs = torch.argsort(oracle.positions.to(ek.device))
        if not torch.equal(k.index_select(2, mine), ek.index_select(2, theirs)):
            raise fail(case, "the right positions, but the key tensors differ from the tokens fed in.",
                       hint="store k_new as given, without arithmetic or reshaping.")
        if not torch.equal(v.index_select(2, mine), ev.index_select(2, theirs)):
            vgot = labels(v, values=True)
            raise fail(case, "the keys are right, the values are not. Value positions:", expected=got, got=vgot,
                       hint=_value_hint(vgot, got, got))


def check_sink_cache(cls) -> None:
    """Exercise 05: ``SinkCache(num_sinks, window_size)``: the first ``num_sinks`` tokens forever plus the last W."""
    dev = pick_device()
    _independent(cls, lambda case: _make(case, cls, 1, 3), "sinks", dev)
    for S, W in SINK_CASES:
        _run_sinks(cls, S, W, S + 2 * W + 3, torch.float32, dev)
    _run_sinks(cls, 2, 3, 9, torch.float64, dev)
    passed(f"{_name(cls)} keeps the sinks and the last W tokens, like the library's SinkKVCache "
           "(num_sinks, W = " + ", ".join(f"({S}, {W})" for S, W in SINK_CASES) + "; float32 and float64).")


__all__ = ["as_positions", "check_ring_buffer_cache", "check_sink_cache", "check_sliding_window_cache"]
