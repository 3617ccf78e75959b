"""Wrong answers to exercise 06, LRUCache(max_size) with put/get."""

from collections import OrderedDict

from tests.wrong_answers import wrong


class _LRU:
    """The seed's OrderedDict LRU, correct; each bug overrides one method."""

    def __init__(self, max_size):
        if max_size <= 0:
            raise ValueError(f"max_size must be positive; got {max_size}")
        self.max_size = max_size
        self.cache = OrderedDict()

    def put(self, token_id, key, value):
        if token_id in self.cache:
            self.cache.move_to_end(token_id)
        self.cache[token_id] = (key, value)
        while len(self.cache) > self.max_size:
            self.cache.popitem(last=False)

    def get(self, token_id):
        if token_id not in self.cache:
            return None
        self.cache.move_to_end(token_id)
        return self.cache[token_id]


@wrong("check_lru_cache", "get must promote")
class GetDoesNotPromote(_LRU):
    """get() reads without moving the entry to the end: FIFO, not LRU."""

    def get(self, token_id):
        return self.cache.get(token_id)


@wrong("check_lru_cache", "re-put must promote")
class RePutDoesNotPromote(_LRU):
    """put() on an existing id assigns in place, which keeps its old (least recent) place."""

    def put(self, token_id, key, value):
        self.cache[token_id] = (key, value)
        while len(self.cache) > self.max_size:
            self.cache.popitem(last=False)


@wrong("check_lru_cache", "valueerror", "did not raise")
class NoValueError(_LRU):
    """Accepts max_size <= 0."""

    def __init__(self, max_size):
        self.max_size = max_size
        self.cache = OrderedDict()


@wrong("check_lru_cache", "nothing was evicted")
class NoEviction(_LRU):
    """Never evicts."""

    def put(self, token_id, key, value):
        self.cache[token_id] = (key, value)
        self.cache.move_to_end(token_id)


@wrong("check_lru_cache", "wrong entry was evicted", "newest")
class EvictsNewest(_LRU):
    """popitem(last=True): evicts the entry just put."""

    def put(self, token_id, key, value):
        if token_id in self.cache:
            self.cache.move_to_end(token_id)
        self.cache[token_id] = (key, value)
        while len(self.cache) > self.max_size:
            self.cache.popitem(last=True)


@wrong("check_lru_cache", "shared between instances")
class SharedDict(_LRU):
    """The dict is a class attribute, shared by every cache."""

    cache = OrderedDict()

    def __init__(self, max_size):
        if max_size <= 0:
            raise ValueError("max_size must be positive")
        self.max_size = max_size


@wrong("check_lru_cache", "new key and value")
class RePutKeepsOldValue(_LRU):
    """A re-put promotes the id but keeps the old key and value."""

    def put(self, token_id, key, value):
        if token_id in self.cache:
            self.cache.move_to_end(token_id)
            return
        super().put(token_id, key, value)


@wrong("check_lru_cache", "valueerror", "typeerror")
class WrongErrorType(_LRU):
    """Raises TypeError for max_size <= 0."""

    def __init__(self, max_size):
        if max_size <= 0:
            raise TypeError("bad size")
        super().__init__(max_size)


@wrong("check_lru_cache", "miss must return none", "-1")
class MissReturnsMinusOne:
    """LeetCode's LRU convention: get() returns -1 on a miss instead of None."""

    def __init__(self, max_size):
        if max_size <= 0:
            raise ValueError("max_size must be positive")
        self.max_size, self.d = max_size, {}

    def put(self, token_id, key, value):
        self.d.pop(token_id, None)
        self.d[token_id] = (key, value)
        if len(self.d) > self.max_size:
            self.d.pop(next(iter(self.d)))

    def get(self, token_id):
        if token_id not in self.d:
            return -1
        self.d[token_id] = self.d.pop(token_id)
        return self.d[token_id]


# ---------------------------------------------------------------- issue 10: blind spots and misdiagnoses
@wrong("check_lru_cache", "(value, key)", "swapped")
class GetReturnsValueKey(_LRU):
    """get() returns the pair as (value, key)."""

    def get(self, token_id):
        pair = super().get(token_id)
        return None if pair is None else (pair[1], pair[0])


@wrong("check_lru_cache", "popitem", "most recent")
class RePutPopsMostRecent(_LRU):
    """On a re-put, removes 'the old entry' with popitem(), which drops the most recent one instead."""

    def put(self, token_id, key, value):
        if token_id in self.cache:
            self.cache.popitem()
        self.cache[token_id] = (key, value)
        self.cache.move_to_end(token_id)
        while len(self.cache) > self.max_size:
            self.cache.popitem(last=False)


@wrong("check_lru_cache", "re-put", "evicted the least recent")
class EvictsBeforeInsert(_LRU):
    """Evicts when full before inserting, even when the id is already stored (a re-put needs no room)."""

    def put(self, token_id, key, value):
        if len(self.cache) >= self.max_size:
            self.cache.popitem(last=False)
        self.cache[token_id] = (key, value)
        self.cache.move_to_end(token_id)


@wrong("check_lru_cache", "same key and value", "promote")
class IdenticalRePutSkipped(_LRU):
    """Skips a re-put whose key and value are unchanged ('nothing to do'), so it does not promote."""

    def put(self, token_id, key, value):
        if self.cache.get(token_id) == (key, value):
            return
        super().put(token_id, key, value)


@wrong("check_lru_cache", "capacity shrinks after gets")
class SizeCounterCountsGets(_LRU):
    """Counts entries with a counter that get() also increments (it re-inserts through _insert): capacity shrinks."""

    def __init__(self, max_size):
        super().__init__(max_size)
        self.size = 0

    def _insert(self, token_id, pair):
        self.cache[token_id] = pair
        self.size += 1
        while self.size > self.max_size:
            self.cache.popitem(last=False)
            self.size -= 1

    def put(self, token_id, key, value):
        if token_id in self.cache:
            del self.cache[token_id]
            self.size -= 1
        self._insert(token_id, (key, value))

    def get(self, token_id):
        if token_id not in self.cache:
            return None
        self._insert(token_id, self.cache.pop(token_id))
        return self.cache[token_id]


@wrong("check_lru_cache", "a miss", "stores nothing")
class MissStoresAPlaceholder(_LRU):
    """A miss inserts a None placeholder (to 'remember' the lookup), which takes a real entry's place."""

    def get(self, token_id):
        if token_id not in self.cache:
            self.cache[token_id] = None
            while len(self.cache) > self.max_size:
                self.cache.popitem(last=False)
            return None
        return super().get(token_id)


@wrong("check_lru_cache", "fewer than max_size", "not >=")
class HoldsOneTooFew(_LRU):
    """Evicts while len(cache) >= max_size after inserting: holds max_size - 1 entries (at least one)."""

    def put(self, token_id, key, value):
        if token_id in self.cache:
            self.cache.move_to_end(token_id)
        self.cache[token_id] = (key, value)
        while len(self.cache) >= self.max_size and len(self.cache) > 1:
            self.cache.popitem(last=False)


@wrong("check_lru_cache", "id 0 is treated as missing")
class FalsyIdZero(_LRU):
    """get() starts with `if not token_id or token_id not in self.cache: return None`: id 0 always misses."""

    def get(self, token_id):
        if not token_id or token_id not in self.cache:
            return None
        return super().get(token_id)


# ---------------------------------------------------------------- the library's own answer handed in
import swkv_teach  # noqa: E402


@wrong("check_lru_cache", "library's own", "swkv_teach.LRUKVCache")
class LibraryLRU(swkv_teach.LRUKVCache):
    """LRUCache = swkv_teach.LRUKVCache (here a subclass, so the library's class stays clean)."""


@wrong("check_lru_cache", "keeps the library's own lrukvcache", "self.lru")
class WrapsTheLibraryLRU:
    """Holds the library's own LRUKVCache and forwards put/get to it."""

    def __init__(self, max_size):
        self.lru = swkv_teach.LRUKVCache(max_size)

    def put(self, token_id, key, value):
        self.lru.put(token_id, key, value)

    def get(self, token_id):
        return self.lru.get(token_id)


# ---------------------------------------------------------------- red team, round 2
@wrong("check_lru_cache", "very same", "every put makes its id the most recently used")
class RePutOfTheSameObjectsSkips(_LRU):
    """Returns early when the id already holds these very objects (old[0] is key): that re-put is not promoted."""

    def put(self, token_id, key, value):
        old = self.cache.get(token_id)
        if old is not None and old[0] is key and old[1] is value:
            return
        super().put(token_id, key, value)


@wrong("check_lru_cache", "returned a list", "tuple (key, value)")
class GetReturnsList(_LRU):
    """Stores and returns [key, value], a list, where the statement asks for the tuple (key, value)."""

    def put(self, token_id, key, value):
        super().put(token_id, key, value)
        self.cache[token_id] = [key, value]


@wrong("check_lru_cache", "grows on every get", "stale duplicates", "self.order")
class OrderListWithStaleDuplicates:
    """An order list that get and put append to without removing the old entry; eviction pops order[0]."""

    def __init__(self, max_size):
        if max_size <= 0:
            raise ValueError(f"max_size must be positive; got {max_size}")
        self.max_size, self.order, self.d = max_size, [], {}

    def put(self, token_id, key, value):
        self.d[token_id] = (key, value)
        self.order.append(token_id)
        while len(self.d) > self.max_size:
            self.d.pop(self.order.pop(0), None)

    def get(self, token_id):
        if token_id not in self.d:
            return None
        self.order.append(token_id)
        return self.d[token_id]


# ---------------------------------------------------------------- issue 18: holes and true diagnoses


@wrong("check_lru_cache", "only when the cache is full", "whatever the fill level")
class PromotesOnlyWhenFull(_LRU):
    """get and re-put promote only once the cache is full ('no need to reorder while there is room')."""

    def put(self, token_id, key, value):
        if token_id in self.cache and len(self.cache) >= self.max_size:
            self.cache.move_to_end(token_id)
        self.cache[token_id] = (key, value)
        while len(self.cache) > self.max_size:
            self.cache.popitem(last=False)

    def get(self, token_id):
        if token_id not in self.cache:
            return None
        if len(self.cache) == self.max_size:
            self.cache.move_to_end(token_id)
        return self.cache[token_id]


@wrong("check_lru_cache", "falsy value is lost", "as a miss", "in self.cache")
class FalsyValueIsAMiss:
    """Keys and values in two dicts; get tests `if not self.values.get(id)`: a stored 0 or '' reads as a miss."""

    def __init__(self, max_size):
        if max_size <= 0:
            raise ValueError("max_size")
        self.max_size, self.keys, self.values = max_size, OrderedDict(), OrderedDict()

    def put(self, token_id, key, value):
        self.keys.pop(token_id, None)
        self.values.pop(token_id, None)
        self.keys[token_id] = key
        self.values[token_id] = value
        while len(self.keys) > self.max_size:
            self.keys.popitem(last=False)
            self.values.popitem(last=False)

    def get(self, token_id):
        if not self.values.get(token_id):
            return None
        self.keys.move_to_end(token_id)
        self.values.move_to_end(token_id)
        return self.keys[token_id], self.values[token_id]


@wrong("check_lru_cache", "shared between instances", "mutable default argument", "self.cache")
class MutableDefaultStore(_LRU):
    """def __init__(self, max_size, cache=OrderedDict()): the default dict is one object for every instance."""

    def __init__(self, max_size, cache=OrderedDict()):
        if max_size <= 0:
            raise ValueError("max_size")
        self.max_size, self.cache = max_size, cache


@wrong("check_lru_cache", "wrong victim", "smallest id")
class EvictsSmallestId(_LRU):
    """Evicts min(self.cache), the smallest token id, as if ids were arrival order."""

    def put(self, token_id, key, value):
        if token_id in self.cache:
            self.cache.move_to_end(token_id)
        self.cache[token_id] = (key, value)
        while len(self.cache) > self.max_size:
            del self.cache[min(self.cache)]


@wrong("check_lru_cache", "least frequently used", "recency")
class EvictsLeastFrequentlyUsed(_LRU):
    """LFU: evicts the id with the fewest gets (a count per id), not the least recently used."""

    def __init__(self, max_size):
        super().__init__(max_size)
        self.count = {}

    def put(self, token_id, key, value):
        self.count.setdefault(token_id, 0)
        self.cache[token_id] = (key, value)
        while len(self.cache) > self.max_size:
            victim = min((i for i in self.cache if i != token_id), key=lambda i: self.count.get(i, 0))
            del self.cache[victim]
            self.count.pop(victim, None)

    def get(self, token_id):
        if token_id not in self.cache:
            return None
        self.count[token_id] = self.count.get(token_id, 0) + 1
        return self.cache[token_id]


# ---------------------------------------------------------------- issue 18: written as a learner would, unseen


@wrong("check_lru_cache", "re-put must promote")
class KeyInsteadOfId:
    """put tests `if key in self.cache` (the key, not token_id) to spot a re-put, so a re-put never promotes."""

    def __init__(self, max_size):
        if max_size <= 0:
            raise ValueError("max_size must be positive")
        self.max_size, self.cache = max_size, {}

    def put(self, token_id, key, value):
        if key in self.cache:
            del self.cache[key]
        self.cache[token_id] = (key, value)
        if len(self.cache) > self.max_size:
            del self.cache[next(iter(self.cache))]

    def get(self, token_id):
        if token_id not in self.cache:
            return None
        self.cache[token_id] = self.cache.pop(token_id)
        return self.cache[token_id]


@wrong("check_lru_cache", "re-put promotes only when the cache is full")
class ListOrderPromotesOnPutOnlyWhenFull:
    """dict + order list; get removes/appends always, but a re-put only reorders when the cache is full."""

    def __init__(self, max_size):
        if max_size <= 0:
            raise ValueError("max_size")
        self.max_size, self.d, self.order = max_size, {}, []

    def put(self, token_id, key, value):
        if token_id in self.d:
            if len(self.d) == self.max_size:
                self.order.remove(token_id)
                self.order.append(token_id)
        else:
            self.order.append(token_id)
        self.d[token_id] = (key, value)
        if len(self.d) > self.max_size:
            del self.d[self.order.pop(0)]

    def get(self, token_id):
        if token_id not in self.d:
            return None
        self.order.remove(token_id)
        self.order.append(token_id)
        return self.d[token_id]


@wrong("check_lru_cache", "falsy key is lost", "if not key:")
class KeyTruthiness:
    """put returns early `if not key:` ('nothing to store'): a 0, '' or False key is dropped."""

    def __init__(self, max_size):
        if max_size <= 0:
            raise ValueError("max_size")
        self.max_size, self.d = max_size, OrderedDict()

    def put(self, token_id, key, value):
        if not key:
            return
        self.d.pop(token_id, None)
        self.d[token_id] = (key, value)
        while len(self.d) > self.max_size:
            self.d.popitem(last=False)

    def get(self, token_id):
        if token_id not in self.d:
            return None
        self.d.move_to_end(token_id)
        return self.d[token_id]


@wrong("check_lru_cache", "falsy key is lost", "none", "in self.cache")
class NoneKeyReadsAsAMiss(FalsyValueIsAMiss):
    """The same two dicts; get tests `self.keys.get(id) is None` (not truthiness, as told), so a stored key None is
    still a miss."""

    def get(self, token_id):
        if self.keys.get(token_id) is None:
            return None
        self.keys.move_to_end(token_id)
        self.values.move_to_end(token_id)
        return self.keys[token_id], self.values[token_id]


@wrong("check_lru_cache", "a miss, took a place", "setdefault")
class MissInsertsAPlaceholder(_LRU):
    """`self.cache.setdefault(token_id, None)` in get: a miss inserts a placeholder that takes a stored entry's place
    at the next put."""

    def get(self, token_id):
        entry = self.cache.setdefault(token_id, None)
        if entry is None:
            return None
        self.cache.move_to_end(token_id)
        return entry


@wrong("check_lru_cache", "a miss must return none itself", "(none, none)")
class MissReturnsAPairOfNones(_LRU):
    """get() answers a miss with (None, None), the shape of a hit: `cache.get(i) is None` never holds."""

    def get(self, token_id):
        if token_id not in self.cache:
            return None, None
        self.cache.move_to_end(token_id)
        return self.cache[token_id]
