"""Wrong answers that only one probe of a check catches (issue 24: "a probe skipped in a check").

Each entry is right everywhere except on one probe, so a check that stopped making
that probe would let it through. Its docstring names the probe it needs.
"""

from collections import OrderedDict

import torch

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


# ------------------------------------------------------------------ the LRU check's scenarios
# Its random operations (state compared after each) and its diagnosing probes catch almost any LRU bug, so these
# answers are told apart by the case their message names: removing a scenario would still reject them, but under
# another case, with a hint that no longer points at what the scenario shows. Each docstring names its scenario.
class _Right(_LRU):
    def guard(self, max_size):
        if max_size <= 0:
            raise ValueError(f"max_size must be positive; got {max_size}")


@wrong("check_lru_cache", "two instances side by side", "shared between instances")
class StoreSharedButClearedOnInit(_Right):
    """Needs "two instances side by side": the store is a class attribute that __init__ clears, so one instance at
    a time (every other case) behaves; two alive at once read each other's entries."""

    store = OrderedDict()

    def __init__(self, max_size):
        super().__init__(max_size)
        type(self).store.clear()
        self.cache = type(self).store


@wrong("check_lru_cache", "the smallest cache", "size 1 holds one entry")
class SizeOneHoldsTwo(_Right):
    """Needs "the smallest cache": evicts only above max(max_size, 2), so a cache of size 1 holds two entries."""

    def put(self, token_id, key, value):
        if token_id in self.cache:
            self.cache.move_to_end(token_id)
        self.cache[token_id] = (key, value)
        while len(self.cache) > max(self.max_size, 2):
            self.cache.popitem(last=False)


@wrong("check_lru_cache", "get promotes:", "get must promote")
class GetReadsWithoutPromoting(_Right):
    """Needs "get promotes": get() is dict.get, no move_to_end."""

    def get(self, token_id):
        return self.cache.get(token_id)


@wrong("check_lru_cache", "while the cache still has room")
class RePutPromotesOnlyWhenFull(_Right):
    """Needs "gets and re-puts while the cache still has room": a re-put moves its id to the end only when the
    cache is full (the "re-put refreshes" scenario re-puts into a full cache, so it passes there)."""

    def put(self, token_id, key, value):
        if token_id in self.cache and len(self.cache) < self.max_size:
            self.cache[token_id] = (key, value)  # assigned in place: keeps its old place
            return
        super().put(token_id, key, value)


@wrong("check_lru_cache", "a re-put of the very same objects refreshes")
class RePutOfIdenticalObjectsReturnsEarly(_Right):
    """Needs "a re-put of the very same objects refreshes": put() returns early when the key and value are the very
    objects already stored, so the id keeps its old place."""

    def put(self, token_id, key, value):
        old = self.cache.get(token_id)
        if old is not None and old[0] is key and old[1] is value:
            return
        super().put(token_id, key, value)


@wrong("check_lru_cache", "filling", "whatever the fill level")
class GetPromotesOnlyWhenFull(_Right):
    """Needs the random fillings from empty: get() promotes only when the cache is full; the fixed scenarios and
    the random operations happen not to tell (the random ones fill the cache early and keep it full)."""

    def get(self, token_id):
        if token_id not in self.cache:
            return None
        if len(self.cache) == self.max_size:
            self.cache.move_to_end(token_id)
        return self.cache[token_id]


# ------------------------------------------------------------------ the int8 check's cases
# Each is first rejected on the case its docstring names (the cases run in order); without that case a later one
# would still reject it, under another title. "exact ties at scale 1" has no such answer: any rounding within half a
# step passes it, and no plausible slip fails only there (the mutation run lists it as a survivor).
def _int8(quantize):
    from tests.wrong_answers.int8 import pair

    answer = pair(quantize)
    answer.__module__ = __name__  # listed with this module's answers
    return wrong("check_int8_quantize", *quantize.words)(answer)


def _words(*words):
    def mark(fn):
        fn.words = words
        return fn

    return mark


def _scale(x):
    return x.float().abs().amax(dim=-1, keepdim=True) / 127


@_words("a hand-made token")
def truncates_to_int8(x):
    """Needs "a hand-made token (scale 3 / 127)", the first case: (x / scale).to(torch.int8) truncates 0.7 / (3 / 127)
    = 29.6 to 29."""
    scale = _scale(x)
    return (x.float() / torch.where(scale > 0, scale, torch.ones_like(scale))).to(torch.int8), scale


@_words("largest magnitude is negative")
def signed_max(x):
    """Needs "a row whose largest magnitude is negative": scale = x.amax() / 127 takes the largest value, 2 in
    [-4, 1, 2, -0.5], not the largest magnitude."""
    scale = x.float().amax(dim=-1, keepdim=True).clamp_min(0) / 127
    q = torch.round(x.float() / torch.where(scale > 0, scale, torch.ones_like(scale))).clamp(-127, 127)
    return q.to(torch.int8), scale


@_words("all-zero tokens among others")
def zero_rows_divide_by_zero(x):
    """Needs "all-zero tokens among others", the first case with a zero row: x / scale with scale 0 gives NaN."""
    scale = _scale(x)
    return torch.nan_to_num(torch.round(x.float() / scale), nan=-1.0).clamp(-127, 127).to(torch.int8), scale


@_words("tiny magnitudes")
def scale_floor(x):
    """Needs "tiny magnitudes, 1e-8 to 1": scale = max(absmax / 127, 1e-6) flattens tokens quieter than 1.3e-4
    (the random cases' quietest tokens are louder)."""
    scale = _scale(x).clamp_min(1e-6)
    return torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8), scale


@_words("an all-zero tensor")
def zero_rows_divided_by_the_largest_scale(x):
    """Needs "an all-zero tensor": a zero row is divided by the tensor's largest scale, which is 0 when every row
    is zero (0 / 0)."""
    scale = _scale(x)
    safe = torch.where(scale > 0, scale, scale.max())
    return torch.round(x.float() / safe).clamp(-127, 127).to(torch.int8), scale


for _fn in (truncates_to_int8, signed_max, zero_rows_divide_by_zero, scale_floor, zero_rows_divided_by_the_largest_scale):
    _int8(_fn)


# ------------------------------------------------------------------ the H2O check's scripted cases
# Catalogued slips (tests/wrong_answers/h2o.py) that each scripted case is the first to reject, registered again
# with the case's title as the words their message must hold: without the case, a later one rejects them under
# another title. (The cases "old scores [2.0, ...]", "the newest token is attended most", "under budget", the two
# streams and the random cases are the first to reject no catalogued slip: the mutation run lists them.)
def _h2o_first_caught_by(title: str, slip):
    def answer(scores, weights, positions, budget, recent):
        return slip(scores, weights, positions, budget, recent)

    answer.__name__ = answer.__qualname__ = f"{slip.__name__}_first_caught_by_its_case"
    answer.__doc__ = f"Needs the case {title.strip()!r}: {slip.__doc__.strip()}"
    return wrong("check_h2o_keep", title)(answer)


def _register_h2o():
    from tests.wrong_answers import h2o as slips

    for title, slip in [
        ("one query, old scores [0.2, 0.1, 0.05, 0, 0], budget 4, recent 1: which token goes?", slips.evicts_oldest),
        ("4 heads that disagree, batch 2", slips.first_head_only),
        ("batch rows that disagree", slips.first_batch_row),
        ("recent window 3, the newest tokens attended least", slips.evicts_only_one),
        ("keys in slot order: positions [4, 9, 5, 6, 7, 8]", slips.returns_indices),
        ("a chunk of 3 queries, 8 keys, budget 5, recent 1", slips.newest_query_only),
        ("all-zero attention (ties)\n", slips.ties_evict_newest),  # the line ends there: not the wrapped case
        ("all-zero attention (ties), keys in ring slot order after a wrap", slips.ties_by_topk),
    ]:
        _h2o_first_caught_by(title, slip)


_register_h2o()
