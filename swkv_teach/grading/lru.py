"""Check for exercise 06: the second seed's LRU cache, ``put(token_id, key, value)`` / ``get(token_id)``.

Every operation is mirrored on the library's :class:`~swkv_teach.caches.LRUKVCache`
(the oracle). Every ``get`` must return what the oracle's returns, and after
every operation the learner's whole state is compared with the oracle's: a
fresh deep copy of the learner's cache is asked for each id ever put, one id per
copy, so the reads change nothing. Short scripted scenarios come first, then long random sequences
(sizes 1, 2, 3, 5, 8: gets before the cache is full, misses, re-puts with new
and with identical values), then ``ValueError`` for ``max_size <= 0``.

Scenarios and random fillings from empty also use the cache while it still has room (gets
and re-puts whose order decides the evictions later), and store falsy keys and values
(0, '', False, 0.0, a zero tensor), so an answer that promotes only once full, or that
tests presence by truthiness, is caught.

When something differs, targeted probes on fresh instances (:mod:`._lru_probes`) name the
bug, the most specific first: ``get`` returning ``(value, key)``, a falsy value read as a
miss, the wrong victim (the smallest id, an LFU), a re-put whose ``popitem()`` drops the
most recent entry, eviction before insert on a re-put, get or re-put not promoting (at
all, or only once full), an identical re-put that does not promote, a capacity that
shrinks after gets; otherwise the scenario's expectation, or plainly which id differs.
Shared state is named from two fresh instances (:mod:`._shared`). A plain ``dict``
(insertion-ordered), an ``OrderedDict``, a dict subclass or a linked list are
all welcome.
"""

from __future__ import annotations

import copy
import random

import torch

from swkv_teach.caches import LRUKVCache
from swkv_teach.grading._own import library_inside, refuse_library
from swkv_teach.grading._lru_probes import diagnose, norm, same, swapped
from swkv_teach.grading._shared import two_fresh
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

    def put(self, token_id, fresh: bool = False, kv: tuple | None = None) -> None:
        """``kv``: the key and value objects to put (falsy ones, say); else labels like 'k3' and 'v3'."""
        n = self.version.get(token_id, 0) + (1 if fresh or kv else 0)
        self.version[token_id] = n
        key, value = kv if kv else (f"k{token_id}" + "'" * n, f"v{token_id}" + "'" * n)
        if not kv and not fresh and self.objects.get(token_id, (None, None))[0] == key:
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
        if not same(got, exp):
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
            if not same(got, exp):
                what = (f"id {token_id} should have been evicted by now, yet get({token_id}) returns {show(got)}"
                        if exp is None else
                        f"id {token_id} should be stored as {exp}, but get({token_id}) returns "
                        f"{MISS if got is None else show(got)}")
                raise fail(self._case(), "after the last operation your cache's contents differ from a right LRU's "
                           f"(asked of a copy of your cache): {what}.",
                           f"a right LRU now holds, least recent first: {stored}", hint=_state_hint(exp, got),
                           generic=True)


def _pair_of_nones(got) -> bool:
    """``(None, None)``: a miss written as an empty pair (nothing stored holds that pair in these checks)."""
    return isinstance(got, (tuple, list)) and len(got) == 2 and got[0] is None and got[1] is None


def _state_hint(exp, got) -> str:
    if swapped(got, exp):
        return "get returns (value, key): return the pair as stored, (key, value)."
    if exp is None and _pair_of_nones(got):
        return "a miss must return None itself, not (None, None): callers test `if cache.get(i) is None`."
    if exp is None:
        return "this id should have been evicted as the least recently used."
    if got is None:
        return "this id should still be cached: something else was least recently used."
    return "a re-put must replace the stored key and value."


def _get_hint(s: _Script, token_id, got, exp, hint_hit, hint_miss, hint) -> dict:
    if swapped(got, exp):
        return {"hint": "get returned (value, key): swapped. Return the stored pair in order, (key, value)."}
    if exp is not None and not (isinstance(got, (tuple, list)) and len(got) == 2) and got is not None:
        return {"hint": f"return the stored (key, value) tuple for a hit, None for a miss; got {show(got)}."}
    if exp is None and not (isinstance(got, (tuple, list)) and len(got) == 2):
        return {"hint": f"a miss must return None, not {show(got)} (no -1 or (None, None) sentinel as in some "
                        "LeetCode versions): callers test `if cache.get(i) is None`."}
    if exp is None and _pair_of_nones(got):
        return {"hint": f"a miss must return None itself, not {show(got)}: a pair of Nones is a (key, value) like "
                        "any other to the caller, whose `if cache.get(i) is None` then reads a hit. Return None "
                        "(`return self.cache.get(token_id)` does, or `return None` when the id is absent)."}
    if exp is None and token_id not in s.version:
        found = two_fresh(s.cls, (2,), lambda c, i: c.put(i, f"k{i}", f"v{i}"))
        return {"hint": "this cache was never given this id, yet it returned a value: state is shared between "
                        "instances. " + (found or "Create the dict in __init__ (self.cache = ...), not at class "
                                         "level or in a module-level variable.")}
    if exp is None:
        return {"hint": hint_hit or hint or "this id should have been evicted as the least recently used.",
                "generic": not (hint_hit or hint)}
    if got is None:
        return {"hint": hint_miss or hint or "this id should still be cached: something else was least recently used.",
                "generic": not (hint_miss or hint)}
    return {"hint": hint or "a re-put must replace the stored key and value.", "generic": not hint}


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
    s.get(1, hint_hit="get(0) made 0 the most recently used, so put(3) must evict 1, the least recently used.")
    s.get(0, hint_miss="get(0) made 0 the most recently used, so it must survive put(3).")

    s = _Script(cls, 3, "re-put refreshes", state=False)
    for i in range(3):
        s.put(i)
    s.put(0, fresh=True)
    s.put(3)
    s.get(1, hint_hit="put(0) again made 0 the most recently used, so put(3) must evict 1, the least recently "
          "used.")
    s.get(0, hint_miss="put(0) again made 0 the most recently used, so it must survive put(3).",
          hint="a re-put must store the new key and value.")

    s = _Script(cls, 4, "gets and re-puts while the cache still has room")
    s.put(0)
    s.put(1)
    s.get(0)
    s.put(2)
    s.put(1, fresh=True)
    s.put(3)  # full now: least recent first 0, 2, 1, 3
    s.put(4)
    s.put(5)
    s.get(0)
    s.get(2)
    s.get(1)

    s = _Script(cls, 3, "falsy keys and values (0, '', False, 0.0, None, a zero tensor)")
    s.put(0, kv=(0, ""))
    s.put(1, kv=("", 0))
    s.put(2, kv=(False, torch.zeros(1)))
    s.get(0)
    s.get(2)
    s.put(3, kv=(0.0, False))
    s.get(1)
    s.get(0)
    s.put(1, kv=(0, 0))
    s.get(1)
    s.put(2, kv=(None, ""))  # None is a key or value like any other: get returns (None, ''), not a miss
    s.get(2)
    s.put(0, kv=("", None))
    s.get(0)
    s.get(2)

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


FILLS = 3  # random episodes per size that begin empty


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
        for episode in range(FILLS if size > 1 else 0):
            _filling(_Script(cls, size, f"random operations #{size}, filling {episode + 1}"), size, rng)


def _filling(s: _Script, size: int, rng: random.Random) -> None:
    """From empty: gets, re-puts and misses while the cache still has room, then enough new ids to evict every
    entry, so the order the early gets and re-puts set decides every eviction (compared after each operation)."""
    ids = rng.sample(range(20), 2 * size + 2)
    new = iter(ids)
    held: list = []
    while len(held) < size:
        r = rng.random()
        if held and r < 0.35:
            s.get(rng.choice(held))
        elif held and r < 0.55:
            s.put(rng.choice(held), fresh=rng.random() < 0.5)
        elif r < 0.6:
            s.get(ids[-1])  # a miss
        else:
            i = next(new)
            s.put(i)
            held.append(i)
    for _ in range(size + 1):
        if rng.random() < 0.5:
            s.get(rng.choice(held))
        i = next(new)
        s.put(i)
        held.append(i)


def check_lru_cache(cls) -> None:
    """Exercise 06: ``cls(max_size)`` with ``put``/``get``, ``get`` promoting, ``ValueError`` for ``max_size <= 0``."""
    refuse_library("check_lru_cache", cls, LRUKVCache, "LRUCache")
    try:
        _scenarios(cls)
        _random(cls)
    except ExerciseFailed as e:
        if "shared between instances" in str(e) or "sentinel" in str(e) or "pair of Nones" in str(e):
            raise
        raise _with_diagnosis(cls, e) from None
    _raises_for(cls, 0)
    _raises_for(cls, -1)
    passed(f"{_name(cls)} evicts the least recently used and promotes on get and put, like the library's "
           f"LRUKVCache (sizes {', '.join(map(str, SIZES))}; 8 scenarios, falsy keys and values among them, "
           f"{len(SIZES) * OPS} random operations and {FILLS * (len(SIZES) - 1)} random fillings from empty, the "
           "whole state compared after each; ValueError for max_size <= 0).")


__all__ = ["check_lru_cache", "diagnose"]
