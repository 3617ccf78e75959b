"""Wrong answers that only one probe of a check catches (issue 24: "a probe skipped in a check").

Each entry is right everywhere except on one probe, so a check that stopped making
that probe would let it through. Its docstring names the probe it needs.
"""

from collections import OrderedDict

from tests.wrong_answers import wrong


class _LRU:
    """The seed's OrderedDict LRU, correct except for __init__'s guard (set by each subclass)."""

    def __init__(self, max_size):
        self.guard(max_size)
        self.max_size = max_size
        self.cache = OrderedDict()

    def guard(self, max_size):
        raise NotImplementedError

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


@wrong("check_lru_cache", "max_size=-1", "did not raise")
class RefusesOnlyZero(_LRU):
    """Needs the max_size=-1 probe: `if max_size == 0: raise ValueError` lets a negative size through."""

    def guard(self, max_size):
        if max_size == 0:
            raise ValueError(f"max_size must be positive; got {max_size}")


@wrong("check_lru_cache", "max_size=0", "did not raise")
class RefusesOnlyNegative(_LRU):
    """Needs the max_size=0 probe: `if max_size < 0: raise ValueError` accepts a cache that can hold nothing."""

    def guard(self, max_size):
        if max_size < 0:
            raise ValueError(f"max_size must be positive; got {max_size}")
