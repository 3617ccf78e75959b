"""Probes for exercise 06's check: each runs a few operations on a fresh instance of the learner's LRU cache
and names one bug only when the cache behaves exactly as that bug would (see :func:`diagnose`).

Also the comparison of answers (:func:`same`): keys and values may be falsy (0, '', False, a zero tensor), so a
pair is compared item by item, by identity or equal value of the same type, tensors with ``torch.equal``.
"""

from __future__ import annotations

import copy

import torch

__all__ = ["diagnose", "norm", "same", "swapped"]

def norm(got):
    return tuple(got) if isinstance(got, (tuple, list)) and len(got) == 2 else got


def same(a, b) -> bool:
    """``a`` and ``b`` are the same answer: None with None, or pairs whose items are the very objects put or equal
    ones of the same type (so 0 is not False, and a zero one-element tensor is compared with torch.equal)."""
    a, b = norm(a), norm(b)
    if a is None or b is None:
        return a is None and b is None
    if not (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 2):
        return False
    for x, y in zip(a, b):
        if x is y:
            continue
        if type(x) is not type(y):
            return False
        if isinstance(x, torch.Tensor):
            if not (x.shape == y.shape and x.dtype == y.dtype and torch.equal(x.cpu(), y.cpu())):
                return False
        else:
            try:
                if not bool(x == y):
                    return False
            except Exception:
                return False
    return True


def swapped(got, exp) -> bool:
    return exp is not None and isinstance(norm(got), tuple) and same(norm(got)[::-1], exp)


# ------------------------------------------------------------------ probes: one bug each, on fresh instances
def _probe(cls, size: int, ops) -> dict | None:
    """Run ``ops`` on a fresh cache; then {id: get(id)} for ids 0..9, each asked of its own copy (None if the
    ops themselves fail). ``("get", id, out)`` appends that get's result to the list ``out``."""

    def build():
        c = cls(size)
        for op in ops:
            if op[0] == "put":
                c.put(*op[1:])
            else:
                result = norm(c.get(op[1]))
                if len(op) > 2:
                    op[2].append(result)
        return c

    try:
        c = build()
    except Exception:
        return None
    return {i: _read(c, i, lambda: build()) for i in range(10)}


def _read(cache, token_id, rebuild):
    """``get(token_id)`` on a copy of ``cache`` (a deep copy, else a rebuilt twin); an error reads as a miss."""
    try:
        try:
            twin = copy.deepcopy(cache)
        except Exception:
            twin = rebuild()
        return norm(twin.get(token_id))
    except Exception:
        return None


def _held(state: dict) -> set:
    return {i for i, x in state.items() if x is not None}


def _fill(n: int, prime: str = ""):
    return [("put", i, f"k{i}{prime}", f"v{i}{prime}") for i in range(n)]


def _grows_on_gets(cls) -> str | None:
    """Which container of a full cache of 2 grows over 40 gets (None if nothing does, or the probe fails)."""
    from swkv_teach.grading._retained import growth, retained

    try:
        c = cls(2)
        c.put(0, "k0", "v0")
        c.put(1, "k1", "v1")
        c.get(0)
        before = retained(c)
        for i in range(40):
            c.get(i % 2)
        after = retained(c)
    except Exception:
        return None
    return growth(before, after) if after.items - before.items >= 20 else None


def _puts(*ids, prime: str = ""):
    return [("put", i, f"k{i}{prime}", f"v{i}{prime}") for i in ids]


def _victim(cls) -> str | None:
    """Which rule picks the victim, from probes without any get: ids put in an order that is not their
    numeric order, so 'the smallest id' and 'the first put' differ."""
    s = _probe(cls, 3, _puts(5, 2, 7, 9))
    if s is None or _held(s) == {2, 7, 9} or len(_held(s)) != 3 or 5 not in _held(s):
        return None
    gone = sorted({5, 2, 7, 9} - _held(s))
    if gone == [9]:
        return ("the wrong entry was evicted: after put(5), put(2), put(7) into a cache of max_size 3, put(9) evicted "
                "9 itself, the id just put and so the most recently used. Evict the least recently used (the front: "
                "popitem(last=False)), not the newest.")
    why = " (the smallest id: ids are labels, not arrival order)" if gone == [2] else (
        " (the newest before 9)" if gone == [7] else "")
    return (f"the wrong victim, with no get at all: after put(5), put(2), put(7), put(9) into a cache of max_size 3, "
            f"yours evicted {gone[0] if len(gone) == 1 else gone}{why}; a right LRU evicts 5, the least recently "
            "used (put first, not used since). Evict the entry used longest ago: the front of an OrderedDict kept "
            "in use order (popitem(last=False)), not by the value of the id.")


def _frequency(cls) -> str | None:
    """An LFU: the victim is the id with the fewest uses, not the one used longest ago."""
    s = _probe(cls, 3, [*_puts(0, 1, 2), ("get", 0), ("get", 0), ("get", 1), ("get", 2), *_puts(3)])
    if s is not None and 0 in _held(s) and 1 not in _held(s) and 2 in _held(s):
        return ("the least FREQUENTLY used was evicted (LFU): after put(0..2), get(0) twice, get(1), get(2) and "
                "put(3) into a cache of max_size 3, yours evicted 1 (used once) and kept 0 (used twice, but longest "
                "ago). An LRU evicts by recency: 0 is the least recently used. Keep the ids in use order instead "
                "of counting uses.")
    return None


def _promotion(cls) -> str | None:
    """get and re-put promote: on a full cache, then (when that is right) while the cache still has room."""
    full_get = _probe(cls, 3, [*_puts(4, 8, 6), ("get", 4), *_puts(1)])
    if full_get is not None and _held(full_get) == {8, 6, 1}:
        return ("get must promote: after put(4), put(8), put(6), get(4) and put(1) into a cache of max_size 3, yours "
                "evicted 4, which get(4) had just used; a right LRU evicts 8. Move the entry get returns to the most "
                "recent end (move_to_end, or pop and re-insert in a plain dict).")
    room_get = _probe(cls, 3, [*_puts(4, 8), ("get", 4), *_puts(6, 1)])
    room_put = _probe(cls, 3, [*_puts(4, 8), ("put", 4, "k4'", "v4'"), *_puts(6, 1)])
    full_put = _probe(cls, 3, [*_puts(4, 8, 6), ("put", 4, "k4'", "v4'"), *_puts(1)])
    right = {4, 6, 1}
    if full_put is not None and _held(full_put) == {8, 6, 1}:
        return ("a re-put must promote: after put(4), put(8), put(6), put(4) again and put(1) into a cache of "
                "max_size 3, yours evicted 4, which the re-put had just used; a right LRU evicts 8. In a plain dict "
                "or an OrderedDict, assigning an existing key keeps its old place: pop it (or move_to_end) first.")
    if full_get is not None and _held(full_get) == right and room_get is not None and _held(room_get) == {8, 6, 1}:
        return ("get promotes only when the cache is full: after put(4), put(8), get(4) (the cache still had room), "
                "put(6) and put(1) into a cache of max_size 3, yours evicted 4; a right LRU evicts 8, since get(4) "
                "made 4 the most recently used. Promote on every get, whatever the fill level.")
    if full_put is not None and _held(full_put) == right and room_put is not None and _held(room_put) == {8, 6, 1}:
        return ("a re-put promotes only when the cache is full: after put(4), put(8), put(4) again (the cache still "
                "had room), put(6) and put(1) into a cache of max_size 3, yours evicted 4; a right LRU evicts 8. "
                "Every put makes its id the most recently used, whatever the fill level.")
    return None


FALSY = (0, "", False, 0.0, None)


def _falsy(cls) -> str | None:
    """A stored falsy key or value (0, '', False, a zero one-element tensor) read back as a miss."""
    for kv in [("k", x) for x in FALSY] + [(x, "v") for x in FALSY] + [("k", torch.zeros(1))]:
        s = _probe(cls, 3, [("put", 5, *kv)])
        plain = _probe(cls, 3, _puts(5))
        if s is not None and plain is not None and s[5] is None and plain[5] is not None:
            which = "value" if kv[0] == "k" else "key"
            return (f"a falsy {which} is lost: after put(5, {kv[0]!r}, {kv[1]!r}), get(5) returned None (put dropped "
                    "it, or get read it as a miss). A test like `if not key:` in put, or `if not self.cache.get("
                    "token_id)` / `if value:` in get, is False for 0, '', False, None or a zero tensor, which are "
                    "legitimate keys and values. Test presence with `token_id in self.cache`, never by the stored key "
                    "or value (a stored None is present too).")
    return None


def diagnose(cls) -> str | None:
    """The most specific bug the probes find in ``cls``, as a hint; None when none fits."""
    got: list = []
    s = _probe(cls, 2, [*_fill(1), ("get", 0, got)])
    if s is not None and got and got[0] == ("v0", "k0"):
        return "get returns (value, key): swapped. Return the stored pair in order, (key, value)."
    found = _falsy(cls) or _victim(cls) or _frequency(cls)
    if found:
        return found
    # many gets on a full cache: nothing the cache keeps may grow (an order list with stale duplicates does)
    grew = _grows_on_gets(cls)
    if grew:
        return (f"what your cache keeps grows on every get: {grew} after 40 gets on a full cache of 2. An order list "
                "that a get (or put) appends to without removing the id's older entry keeps stale duplicates, and "
                "eviction then pops the oldest entry, which may name an id used since (or long gone). Remove the "
                "id's old entry first (order.remove(token_id)), or use an OrderedDict with move_to_end.")
    # three puts into a cache of three: all three stay
    s = _probe(cls, 3, _fill(3))
    shifted = _probe(cls, 3, [("put", i, f"k{i}", f"v{i}") for i in (1, 2, 3)])
    if s is not None and shifted is not None and _held(s) == {1, 2} and _held(shifted) == {1, 2, 3}:
        return ("id 0 is treated as missing: a test like `if token_id and ...` or `if not token_id` is False for "
                "id 0. Test membership with `token_id in self.cache` (and compare with `is None`).")
    if s is not None and _held(s) != {0, 1, 2}:
        return (f"after put(0), put(1), put(2) into a cache of max_size 3, only {sorted(_held(s))} can be found: "
                "the cache holds fewer than max_size entries. Evict only while len(cache) > max_size (not >=).")
    # a miss must change nothing
    s = _probe(cls, 3, [*_fill(3), ("get", 9)])
    if s is not None and _held(s) != {0, 1, 2}:
        return (f"get(9), a miss, changed the cache: afterwards only {sorted(_held(s))} of 0, 1, 2 can be found. "
                "A miss returns None and stores nothing (no placeholder, no eviction).")
    # a placeholder that evicts nothing at once shows at the next put: put(3) must push out 0 alone
    s = _probe(cls, 3, [*_fill(3), ("get", 9), *_puts(3)])
    plain = _probe(cls, 3, [*_fill(3), *_puts(3)])
    if s is not None and plain is not None and _held(plain) == {1, 2, 3} and _held(s) != {1, 2, 3}:
        return (f"get(9), a miss, took a place in the cache: after it, put(3) left only {sorted(_held(s))} of 1, 2, 3 "
                "(without the miss, all three stay). A miss returns None and stores nothing: look the id up with `in` "
                "or dict.get, not a defaultdict's [] or setdefault, which insert it.")
    # re-put of the middle entry of a full cache: nothing may be evicted
    s = _probe(cls, 3, [*_fill(3), ("put", 1, "k1'", "v1'")])
    if s is not None:
        held = _held(s)
        if held == {0, 1} or (2 not in held and 0 in held):
            return ("a re-put dropped the most recent entry: popitem() without last=False removes the newest. To "
                    "refresh an id, remove that id itself (pop(token_id) or move_to_end(token_id)), then insert.")
        if 0 not in held and 2 in held:
            return ("a re-put of an id already stored evicted the least recent entry: the cache does not grow on a "
                    "re-put, so nothing may be evicted. Insert (or replace) first, then evict only while "
                    "len > max_size.")
    found = _promotion(cls)
    if found:
        return found
    # re-put with identical values must promote like any other
    fresh = _probe(cls, 3, [*_fill(3), ("put", 0, "k0'", "v0'"), ("put", 3, "k3", "v3")])
    same = _probe(cls, 3, [*_fill(3), ("put", 0, "k0", "v0"), ("put", 3, "k3", "v3")])
    k0, v0 = _fill(1)[0][2:]
    very = _probe(cls, 3, [("put", 0, k0, v0), *_fill(3)[1:], ("put", 0, k0, v0), ("put", 3, "k3", "v3")])
    if fresh is not None and same is not None and 0 in _held(fresh) and 0 not in _held(same):
        return ("a re-put with the same key and value did not promote the id: every put makes its id the most "
                "recently used, whether or not the value changed.")
    if fresh is not None and very is not None and 0 in _held(fresh) and 0 not in _held(very):
        return ("a re-put of the very same key and value objects did not promote the id (a test like `old[0] is "
                "key` that returns early?): every put makes its id the most recently used, whatever it stores.")
    # capacity after many gets
    s = _probe(cls, 3, [*_fill(3), ("get", 0), ("get", 1), ("get", 2), ("get", 0), ("put", 3, "k3", "v3")])
    if s is not None and len(_held(s)) < 3:
        return (f"after put(0..2), four gets and put(3) on a cache of max_size 3, a copy of yours finds only "
                f"{len(_held(s))} of the 3 ids a right LRU holds (2, 0, 3): its capacity shrinks after gets. Do gets "
                "count as insertions (a size counter a get increments, or a second list that a get appends to)? "
                "Count entries with len(the dict).")
    return None
