"""Check for exercise 04: the second seed's LRU cache, ``put(token_id, key, value)`` / ``get(token_id)``.

Every operation is mirrored on the library's :class:`~swkv_teach.caches.LRUKVCache`
(the oracle). Every ``get`` must return what the oracle's returns, and after
every operation the learner's whole state is compared with the oracle's: a
fresh deep copy of the learner's cache is asked for each id ever put, one id per
copy, so the reads change nothing. Short scripted scenarios come first, then long random sequences
(sizes 1, 2, 3, 5, 8: gets before the cache is full, misses, re-puts with new
and with identical values), then ``ValueError`` for ``max_size <= 0``.

When something differs, targeted probes on fresh instances name the bug, the most
specific first: ``get`` returning ``(value, key)``, a re-put whose ``popitem()``
drops the most recent entry, eviction before insert on a re-put, an identical
re-put that does not promote, a capacity that shrinks after gets; otherwise the
scenario's own hint, or plainly which id differs. A plain ``dict``
(insertion-ordered), an ``OrderedDict``, a dict subclass or a linked list are
all welcome.
"""

from __future__ import annotations

import copy
import random

from swkv_teach.caches import LRUKVCache
from swkv_teach.grading._own import library_inside, refuse_library
from swkv_teach.grading._report import ExerciseFailed, call, fail, passed, rehint, show
from swkv_teach.grading._report import learner_name as _name

MISS = "None (a miss)"


class _Script:
    """The learner's cache and the oracle, driven together; remembers the operations for the message."""

    def __init__(self, cls, max_size: int, title: str, state: bool = True):
        self.title = f"{title}: {_name(cls)}(max_size={max_size})"
        self.ops = [f"cache = {_name(cls)}({max_size})"]
        self.mine = call(self.title, f"{_name(cls)}({max_size})", cls, max_size)
        for m in ("put", "get"):
            if not callable(getattr(self.mine, m, None)):
                raise fail(self.title,
                           f"{_name(cls)}({max_size}) gave a {type(self.mine).__name__} with no {m}() method.",
                           hint="pass the class itself to the check, with put(token_id, key, value) and get(token_id).")
        inside = library_inside(self.mine)
        if inside:
            raise fail(self.title, f"{inside}: the check compares with that very class, so it shows nothing.",
                       hint="write the LRU logic yourself (an OrderedDict, or a dict and a list).")
        self.oracle = LRUKVCache(max_size)
        self.cls, self.max_size, self.log = cls, max_size, []  # log: the calls so far, to rebuild a twin
        self.version: dict = {}
        self.objects: dict = {}  # id -> the key and value objects last put
        self.reputs = 0
        self.state = state  # compare the whole state after every operation

    def _case(self) -> str:
        ops = self.ops if len(self.ops) <= 14 else self.ops[:1] + ["..."] + self.ops[-12:]
        return self.title + "\n   " + "; ".join(ops)

    def put(self, token_id, fresh: bool = False) -> None:
        n = self.version.get(token_id, 0) + (1 if fresh else 0)
        self.version[token_id] = n
        key, value = f"k{token_id}" + "'" * n, f"v{token_id}" + "'" * n
        if not fresh and self.objects.get(token_id, (None, None))[0] == key:
            self.reputs += 1
            if self.reputs % 2:  # every other identical re-put hands in the very same objects (`is`, not only ==)
                key, value = self.objects[token_id]
        self.objects[token_id] = (key, value)
        self.ops.append(f"put({token_id}, {key!r}, {value!r})")
        call(self._case(), f"put({token_id}, ...)", self.mine.put, token_id, key, value)
        self.log.append(("put", token_id, key, value))
        self.oracle.put(token_id, key, value)
        self.compare_state()

    def get(self, token_id, hint_hit: str | None = None, hint_miss: str | None = None, hint: str | None = None):
        self.ops.append(f"get({token_id})")
        case = self._case()
        got = call(case, f"get({token_id})", self.mine.get, token_id)
        self.log.append(("get", token_id))
        exp = self.oracle.get(token_id)
        if _norm(got) != exp:
            raise fail(case, f"the last call, get({token_id}):", expected=exp if exp is not None else MISS,
                       got=got if got is not None else MISS, **_get_hint(self, token_id, got, exp, hint_hit,
                                                                         hint_miss, hint))
        if isinstance(got, list):
            raise fail(case, f"the last call, get({token_id}), returned a list; the statement asks for the tuple "
                       "(key, value).", expected=exp, got=got,
                       hint="store and return tuples: `self.cache[token_id] = (key, value)`, or `return "
                       "tuple(pair)`. A list handed out is the cache's own entry, which the caller could change.")
        self.compare_state()

    def _twin(self):
        """A copy of the learner's cache: a deep copy, or (for objects deepcopy cannot make, such as a dict
        subclass whose __init__ takes max_size) a fresh instance with every call so far replayed."""
        try:
            return copy.deepcopy(self.mine)
        except Exception:
            twin = self.cls(self.max_size)
            for op in self.log:
                getattr(twin, op[0])(*op[1:])
            return twin

    def compare_state(self) -> None:
        """Ask the learner's cache, through deep copies, for every id ever put: each answer as the oracle's.

        One copy per id, so one read's side effects (a get promotes) cannot change the next.
        """
        if not self.state:
            return
        stored = self.oracle.ids()
        gone = [i for i in self.version if i not in stored]
        for token_id in gone + stored:
            exp = self.oracle.peek(token_id)
            try:
                got = self._twin().get(token_id)
            except Exception:
                return  # an object that can be neither copied nor rebuilt is judged by its gets alone
            if _norm(got) != exp:
                what = (f"id {token_id} should have been evicted by now, yet get({token_id}) returns {show(got)}"
                        if exp is None else
                        f"id {token_id} should be stored as {exp}, but get({token_id}) returns "
                        f"{MISS if got is None else show(got)}")
                raise fail(self._case(), "after the last operation your cache's contents differ from a right LRU's "
                           f"(asked of a copy of your cache): {what}.",
                           f"a right LRU now holds, least recent first: {stored}", hint=_state_hint(exp, got),
                           generic=True)


def _norm(got):
    return tuple(got) if isinstance(got, (tuple, list)) and len(got) == 2 else got


def _state_hint(exp, got) -> str:
    if exp is not None and _norm(got) == exp[::-1]:
        return "get returns (value, key): return the pair as stored, (key, value)."
    if exp is None:
        return "this id should have been evicted as the least recently used."
    if got is None:
        return "this id should still be cached: something else was least recently used."
    return "a re-put must replace the stored key and value."


def _get_hint(s: _Script, token_id, got, exp, hint_hit, hint_miss, hint) -> dict:
    if exp is not None and _norm(got) == exp[::-1]:
        return {"hint": "get returned (value, key): swapped. Return the stored pair in order, (key, value)."}
    if exp is not None and not (isinstance(got, (tuple, list)) and len(got) == 2) and got is not None:
        return {"hint": f"return the stored (key, value) tuple for a hit, None for a miss; got {show(got)}."}
    if exp is None and not (isinstance(got, (tuple, list)) and len(got) == 2):
        return {"hint": f"a miss must return None, not {show(got)} (no -1 or (None, None) sentinel as in some "
                        "LeetCode versions): callers test `if cache.get(i) is None`."}
    if exp is None and token_id not in s.version:
        return {"hint": "this cache was never given this id, yet it returned a value: state is shared between "
                        "instances. Create the dict in __init__ (self.cache = ...), not at class level."}
    if exp is None:
        return {"hint": hint_hit or hint or "this id should have been evicted as the least recently used.",
                "generic": not (hint_hit or hint)}
    if got is None:
        return {"hint": hint_miss or hint or "this id should still be cached: something else was least recently used.",
                "generic": not (hint_miss or hint)}
    return {"hint": hint or "a re-put must replace the stored key and value.", "generic": not hint}


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
                result = _norm(c.get(op[1]))
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
        return _norm(twin.get(token_id))
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


def diagnose(cls) -> str | None:
    """The most specific bug the probes find in ``cls``, as a hint; None when none fits."""
    got: list = []
    s = _probe(cls, 2, [*_fill(1), ("get", 0, got)])
    if s is not None and got and got[0] == ("v0", "k0"):
        return "get returns (value, key): swapped. Return the stored pair in order, (key, value)."
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


def _with_diagnosis(cls, e: ExerciseFailed) -> ExerciseFailed:
    found = diagnose(cls)
    return rehint(e, found, "(a probe on a fresh cache found the bug below)") if found else e


def _raises_for(cls, bad: int) -> None:
    case = f"{_name(cls)}(max_size={bad})"
    try:
        cls(bad)
    except ValueError:
        return
    except NotImplementedError:
        raise fail(case, "__init__ is not implemented yet (it raised NotImplementedError).") from None
    except Exception as e:
        raise fail(case, f"raised {type(e).__name__}: {e}; expected ValueError.",
                   hint="a size that is not positive is a bad value: raise ValueError (and say what you got).") from None
    raise fail(case, "did not raise; a cache that can hold nothing (or less) is a mistake worth reporting.",
               hint="in __init__: if max_size <= 0: raise ValueError(f'max_size must be positive; got {max_size}')")


def _scenarios(cls) -> None:
    a = _Script(cls, 2, "two instances side by side")
    b = _Script(cls, 2, "two instances side by side (the second)")
    a.put(0)
    a.put(1)
    b.get(0)
    b.put(5)
    a.get(0)

    s = _Script(cls, 3, "eviction", state=False)
    for i in range(4):
        s.put(i)
    s.get(3, hint_miss="the wrong entry was evicted: the id just put is the most recently used; evict the least "
          "recently used (the front: popitem(last=False)), not the newest.")
    s.get(0, hint_hit="nothing was evicted: after a put makes the cache hold more than max_size, remove the least "
          "recently used entry (the first in insertion order: popitem(last=False) or next(iter(d))).")
    for i in (1, 2):
        s.get(i, hint_miss="the wrong entry was evicted: evict the least recently used (the front), not the newest.")

    s = _Script(cls, 1, "the smallest cache", state=False)
    s.put(0)
    s.put(1)
    s.get(0, hint_hit="a cache of size 1 holds one entry: evict once len > max_size.")
    s.get(1, hint_miss="the entry just put was evicted: evict the least recently used, not the newest.")

    s = _Script(cls, 3, "get promotes", state=False)
    for i in range(3):
        s.put(i)
    s.get(0)
    s.put(3)
    s.get(1, hint_hit="get(0) made 0 the most recently used, so put(3) must evict 1: get must promote the entry "
          "it returns (move_to_end, or pop and re-insert in a plain dict).")
    s.get(0, hint_miss="get(0) made 0 the most recently used, so it must survive put(3): promote on get.")

    s = _Script(cls, 3, "re-put refreshes", state=False)
    for i in range(3):
        s.put(i)
    s.put(0, fresh=True)
    s.put(3)
    s.get(1, hint_hit="put(0) again made 0 the most recently used, so put(3) must evict 1: a re-put must promote "
          "too (in a plain dict, assigning an existing key keeps its old place: pop it first).")
    s.get(0, hint_miss="put(0) again made 0 the most recently used, so it must survive put(3).",
          hint="a re-put must store the new key and value.")

    s = _Script(cls, 3, "a re-put of the very same objects refreshes", state=False)
    for i in range(3):
        s.put(i)
    s.put(0)  # the same key and value objects as the first put(0)
    s.put(3)
    s.get(1, hint_hit="put(0) with the very same key and value objects made 0 the most recently used, so put(3) "
          "must evict 1: every put promotes, even one that changes nothing stored (no early return when "
          "old[0] is key).")
    s.get(0, hint_miss="put(0) again (the very same objects) made 0 the most recently used, so it must survive "
          "put(3): every put promotes, even one that changes nothing stored.")


SIZES = (1, 2, 3, 5, 8)
OPS = 80


def _random(cls) -> None:
    rng = random.Random(0)
    for size in SIZES:
        s = _Script(cls, size, f"random operations #{size}")
        for _ in range(OPS):
            i = rng.randrange(size + 4)  # ids beyond the size: misses and evictions
            r = rng.random()
            if r < 0.45:
                s.put(i, fresh=i in s.version and rng.random() < 0.5)  # re-puts with new or identical values
            else:
                s.get(i)


def check_lru_cache(cls) -> None:
    """Exercise 04: ``cls(max_size)`` with ``put``/``get``, ``get`` promoting, ``ValueError`` for ``max_size <= 0``."""
    refuse_library("check_lru_cache", cls, LRUKVCache, "LRUCache")
    try:
        _scenarios(cls)
        _random(cls)
    except ExerciseFailed as e:
        if "shared between instances" in str(e) or "sentinel" in str(e):
            raise
        raise _with_diagnosis(cls, e) from None
    _raises_for(cls, 0)
    _raises_for(cls, -1)
    passed(f"{_name(cls)} evicts the least recently used and promotes on get and put, like the library's "
           f"LRUKVCache (sizes {', '.join(map(str, SIZES))}; 6 scenarios and {len(SIZES) * OPS} random operations, "
           "the whole state compared after each; ValueError for max_size <= 0).")


__all__ = ["check_lru_cache", "diagnose"]
