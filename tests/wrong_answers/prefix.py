"""Wrong answers to exercise 13: hash_block_tokens, block_hashes and PrefixCache.

The check takes one object holding the three as attributes; :func:`answer` builds one from a right answer with one
part replaced, named and documented by the wrong part. Functions stay at module level so the check can rebuild them
in a second Python process (it imports this module there).
"""

import functools
import hashlib
import os
import pickle
import struct
from collections import OrderedDict, deque

from tests.wrong_answers import wrong

ROOT = hashlib.sha256(b"first block").digest()
CHECK = "check_prefix_cache_lru"


def good_hash(parent_hash, token_ids):
    ids = list(token_ids)
    return hashlib.sha256((ROOT if parent_hash is None else parent_hash) + struct.pack(f"<{len(ids)}q", *ids)).digest()


def good_chain(token_ids, block_size, hash_fn=None):
    hash_fn = hash_fn or good_hash
    out, parent = [], None
    for s in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_fn(parent, token_ids[s : s + block_size])
        out.append(parent)
    return out


class GoodCache:
    """The solution's PrefixCache; each wrong cache overrides one method."""

    def __init__(self, num_blocks):
        self.ref = [0] * num_blocks
        self.empty = deque(range(num_blocks))
        self.free = OrderedDict()
        self.block_of, self.hash_of = {}, {}

    def lookup(self, hashes):
        out = []
        for h in hashes:
            if h not in self.block_of:
                break
            out.append(self.block_of[h])
        return out

    def acquire(self, blocks):
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1

    def _evict(self):
        b, _ = self.free.popitem(last=False)
        del self.block_of[self.hash_of.pop(b)]
        return b

    def allocate(self):
        if self.empty:
            b = self.empty.popleft()
        elif self.free:
            b = self._evict()
        else:
            raise RuntimeError("every block is held")
        self.ref[b] = 1
        return b

    def cache(self, block, block_hash):
        self.block_of[block_hash] = block
        self.hash_of[block] = block_hash

    def _freed(self, b):
        if b in self.hash_of:
            self.free[b] = None
        else:
            self.empty.append(b)

    def release(self, blocks):
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self._freed(b)


def answer(bad, hash_fn=good_hash, chain=None, cache=GoodCache):
    """An object with .hash_block_tokens, .block_hashes, .PrefixCache, named and documented by ``bad`` (the chain
    built on ``hash_fn`` unless given)."""
    chain = chain or functools.partial(good_chain, hash_fn=hash_fn)
    return type(bad.__name__, (), {"__doc__": bad.__doc__, "hash_block_tokens": staticmethod(hash_fn),
                                    "block_hashes": staticmethod(chain), "PrefixCache": cache})


# ------------------------------------------------------------------ the hash
def unchained_hash(parent_hash, token_ids):
    """The parent is ignored: every block with the same ids gets the same hash, whatever came before it."""
    return hashlib.sha256(struct.pack(f"<{len(token_ids)}q", *token_ids)).digest()


def salted_hash(parent_hash, token_ids):
    """Python's hash() of (parent, ids): salted per process (PYTHONHASHSEED), so another server never matches."""
    return hash((parent_hash, tuple(token_ids))).to_bytes(8, "little", signed=True)


_RANDOM_ROOT = os.urandom(32)


def random_root_hash(parent_hash, token_ids):
    """The first block's parent is os.urandom(32) drawn at import (vLLM's NONE_HASH without PYTHONHASHSEED)."""
    return good_hash(_RANDOM_ROOT if parent_hash is None else parent_hash, token_ids)


def sorted_hash(parent_hash, token_ids):
    """Hashes the ids sorted: a block and its permutation collide."""
    return good_hash(parent_hash, sorted(token_ids))


def glued_digits_hash(parent_hash, token_ids):
    """Hashes the ids' digits glued together: [1, 23] and [12, 3] are the same text."""
    text = "".join(str(t) for t in token_ids)
    return hashlib.sha256((parent_hash or b"") + text.encode()).digest()


def bytes_of_ids_hash(parent_hash, token_ids):
    """bytes(token_ids): fails for any id past 255."""
    return hashlib.sha256((parent_hash or b"") + bytes(token_ids)).digest()


def truncated_hash(parent_hash, token_ids):
    """One byte of SHA-256 kept: 256 values, collisions within a few dozen blocks."""
    return good_hash(parent_hash, token_ids)[:1]


def pickled_hash(parent_hash, token_ids):
    """pickle.dumps of the ids as given: a list and a tuple of the same ids hash differently."""
    return hashlib.sha256((parent_hash or b"") + pickle.dumps(token_ids)).digest()


for fn, words in ((unchained_hash, ("not chained to its parent",)),
                  (salted_hash, ("another python process", "salted")),
                  (random_root_hash, ("another python process", "fixed value for the first block")),
                  (sorted_hash, ("same hash", "reversed")),
                  (glued_digits_hash, ("[12, 3]", "separator")),
                  (bytes_of_ids_hash, ("past 255",)),
                  (truncated_hash, ("same hash", "truncated")),
                  (pickled_hash, ("tuple", "canonical"))):
    globals()[fn.__name__.title().replace("_", "")] = wrong(CHECK, *words)(answer(fn, hash_fn=fn))


# ------------------------------------------------------------------ the chain
def chain_with_partial_block(token_ids, block_size):
    """Hashes the partial last block too (range(0, len, block_size))."""
    out, parent = [], None
    for s in range(0, len(token_ids), block_size):
        parent = good_hash(parent, token_ids[s : s + block_size])
        out.append(parent)
    return out


def chain_unlinked(token_ids, block_size):
    """Every block hashed with parent None: the chain is not linked."""
    return [good_hash(None, token_ids[s : s + block_size]) for s in range(0, len(token_ids) - block_size + 1,
                                                                          block_size)]


ChainWithPartialBlock = wrong(CHECK, "partial last block")(answer(chain_with_partial_block,
                                                                  chain=chain_with_partial_block))
ChainUnlinked = wrong(CHECK, "chain them")(answer(chain_unlinked, chain=chain_unlinked))


# ------------------------------------------------------------------ the cache
@wrong(CHECK, "most recently freed")
class EvictsMostRecent(GoodCache):
    """popitem() (last=True): evicts the block freed last."""

    def _evict(self):
        b, _ = self.free.popitem()
        del self.block_of[self.hash_of.pop(b)]
        return b


@wrong(CHECK, "while in use", "free queue")
class AcquireKeepsItQueued(GoodCache):
    """acquire counts the reference but leaves the block in the free queue, where allocate evicts it in use."""

    def acquire(self, blocks):
        for b in blocks:
            self.ref[b] += 1

    def _freed(self, b):
        if b in self.hash_of:
            self.free[b] = None  # already there if it was hit: keeps its old place
        else:
            self.empty.append(b)

    def allocate(self):
        if self.empty:
            b = self.empty.popleft()
        elif self.free:
            b = self._evict()
        else:
            raise RuntimeError("every block is held")
        self.ref[b] = 1
        return b


@wrong(CHECK, "every block is held", "raise instead")
class EvictsHeldWhenFull(GoodCache):
    """When every block is held, takes block 0 anyway instead of raising."""

    def allocate(self):
        if not self.empty and not self.free:
            self.ref[0] += 1
            return 0
        return super().allocate()


@wrong(CHECK, "not dropped on eviction")
class HashNotDropped(GoodCache):
    """Eviction forgets block -> hash but keeps hash -> block: lookup hands out a reused block."""

    def _evict(self):
        b, _ = self.free.popitem(last=False)
        self.hash_of.pop(b)
        return b


@wrong(CHECK, "head first", "reversed")
class ReleasesHeadFirst(GoodCache):
    """release frees a request's blocks in order, so its first block (the shared prefix) is evicted first."""

    def release(self, blocks):
        for b in blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self._freed(b)


@wrong(CHECK, "count references")
class NoReferenceCount(GoodCache):
    """A set of held blocks instead of counts: the first request to leave frees a block another still uses."""

    def acquire(self, blocks):
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] = 1

    def release(self, blocks):
        for b in reversed(blocks):
            if self.ref[b]:
                self.ref[b] = 0
                self._freed(b)


@wrong(CHECK, "kept its old place", "tail")
class TouchKeepsFirstFreeTime(GoodCache):
    """The free order is the time a block was FIRST freed (setdefault): a hit freed again keeps its old place."""

    def __init__(self, num_blocks):
        super().__init__(num_blocks)
        self.first_freed, self.clock = {}, 0

    def _freed(self, b):
        if b in self.hash_of:
            self.clock += 1
            self.first_freed.setdefault(b, self.clock)
            self.free[b] = None
        else:
            self.empty.append(b)

    def _evict(self):
        b = min(self.free, key=lambda x: self.first_freed[x])
        del self.free[b]
        self.first_freed.pop(b)
        del self.block_of[self.hash_of.pop(b)]
        return b


@wrong(CHECK, "holding nothing was free")
class UncachedIntoTheQueue(GoodCache):
    """One queue for every freed block: an uncached block waits behind cached ones, which are evicted first."""

    def _freed(self, b):
        self.free[b] = None

    def _evict(self):
        b, _ = self.free.popitem(last=False)
        if b in self.hash_of:
            del self.block_of[self.hash_of.pop(b)]
        return b


@wrong(CHECK, "past a miss")
class LookupSkipsMisses(GoodCache):
    """lookup skips a missing hash (continue, not break) and returns blocks past the gap."""

    def lookup(self, hashes):
        return [self.block_of[h] for h in hashes if h in self.block_of]


@wrong(CHECK, "lookup changed")
class LookupTouches(GoodCache):
    """lookup moves the free blocks it finds to the tail of the queue: a mere look reorders evictions."""

    def lookup(self, hashes):
        out = super().lookup(hashes)
        for b in out:
            if b in self.free:
                self.free.move_to_end(b)
        return out


@wrong(CHECK, "shared between instances")
class SharedTables(GoodCache):
    """The hash -> block dict is a class attribute: every instance sees every other's blocks."""

    block_of_all: dict = {}

    def __init__(self, num_blocks):
        super().__init__(num_blocks)
        self.block_of = SharedTables.block_of_all


for cls in (EvictsMostRecent, AcquireKeepsItQueued, EvictsHeldWhenFull, HashNotDropped, ReleasesHeadFirst,
            NoReferenceCount, TouchKeepsFirstFreeTime, UncachedIntoTheQueue, LookupSkipsMisses, LookupTouches,
            SharedTables):
    cls.hash_block_tokens = staticmethod(good_hash)
    cls.block_hashes = staticmethod(good_chain)
    cls.PrefixCache = cls
