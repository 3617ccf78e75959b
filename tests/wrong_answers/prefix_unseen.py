"""More wrong answers to exercise 13, written from the statement alone (issue 37), never from the check.

Ids squeezed into a fixed width before hashing (8, 16 or 32 bits), a full pool raising the wrong exception, a
block cached twice, a tuple of ids, a salt the second Python cannot rebuild, and slips in the free queue and the
two maps. Functions stay at module level: the check rebuilds the hash in a second Python process.
"""

import hashlib
import os
import struct

from tests.wrong_answers import wrong
from tests.wrong_answers.prefix import GoodCache, answer, good_chain, good_hash

CHECK = "check_prefix_cache_lru"
ROOT = hashlib.sha256(b"root of the chain").digest()


# ------------------------------------------------------------------ the hash: fixed-width ids
def ids_as_uint16(parent_hash, token_ids):
    """Ids packed as 16-bit unsigned ('H', wrapped mod 65536): ids 150000 and 84464 give the same bytes."""
    ids = [t & 0xFFFF for t in token_ids]
    return hashlib.sha256((parent_hash or ROOT) + struct.pack(f"<{len(ids)}H", *ids)).digest()


def ids_as_int32(parent_hash, token_ids):
    """Ids packed as 32-bit ('I', wrapped mod 2**32), as a numpy int32 array would: ids 5 and 2**32 + 5 collide."""
    ids = [t % (1 << 32) for t in token_ids]
    return hashlib.sha256((parent_hash or ROOT) + struct.pack(f"<{len(ids)}I", *ids)).digest()


def ids_as_bytes_mod_256(parent_hash, token_ids):
    """Each id kept as one byte (id % 256): a full SHA-256 digest of a lossy encoding, ids 1 and 257 collide."""
    return hashlib.sha256((parent_hash or ROOT) + bytes(t % 256 for t in token_ids)).digest()


def repr_of_container(parent_hash, token_ids):
    """Hashes repr(token_ids): a tuple '(1, 2)' and a list '[1, 2]' of the same ids hash differently."""
    return hashlib.sha256((parent_hash or ROOT) + repr(token_ids).encode()).digest()


_SALTS = {"salt": os.urandom(16)}


def salt_in_a_dict(parent_hash, token_ids):
    """A random salt drawn once per process (kept in a dict): every Python draws its own, so two servers never
    agree on a block."""
    ids = list(token_ids)
    return hashlib.sha256(_SALTS["salt"] + (parent_hash or ROOT) + struct.pack(f"<{len(ids)}q", *ids)).digest()


def _notebook_style(salts):
    def salt_the_check_cannot_carry(parent_hash, token_ids):
        """Defined where the check must rebuild it from source (a notebook cell), its salt read from a dict the
        second Python never gets: the cross-process check cannot run it, and must say so, not pass."""
        ids = list(token_ids)
        return hashlib.sha256(_SALTS["salt"] + (parent_hash or ROOT) + struct.pack(f"<{len(ids)}q", *ids)).digest()

    return salt_the_check_cannot_carry


salt_the_check_cannot_carry = _notebook_style(_SALTS)


def chain_lists_only(token_ids, block_size):
    """block_hashes copies the ids with token_ids.copy(): a tuple has no .copy()."""
    ids = token_ids.copy()
    return good_chain(ids, block_size)


for fn, words in ((ids_as_uint16, ("2**16", "16 bits")),
                  (ids_as_int32, ("2**32", "32 bits")),
                  (ids_as_bytes_mod_256, ("2**8", "8 bits")),
                  (repr_of_container, ("tuple",)),
                  (salt_in_a_dict, ("another python process",)),
                  (salt_the_check_cannot_carry, ("could not run your hash", "cannot pass unchecked"))):
    globals()[fn.__name__.title().replace("_", "")] = wrong(CHECK, *words)(answer(fn, hash_fn=fn))
ChainListsOnly = wrong(CHECK, "tuple", "list(token_ids)")(answer(chain_lists_only, chain=chain_lists_only))


# ------------------------------------------------------------------ the cache
class _Cache(GoodCache):
    hash_block_tokens = staticmethod(good_hash)
    block_hashes = staticmethod(good_chain)


@wrong(CHECK, "every block is held", "KeyError", "RuntimeError")
class FullPoolKeyError(_Cache):
    """A full pool lets OrderedDict.popitem raise its KeyError ('dictionary is empty'), not RuntimeError."""

    def allocate(self):
        if self.empty:
            b = self.empty.popleft()
        else:
            b, _ = self.free.popitem(last=False)
            del self.block_of[self.hash_of.pop(b)]
        self.ref[b] = 1
        return b


@wrong(CHECK, "every block is held", "IndexError", "RuntimeError")
class FullPoolIndexError(_Cache):
    """The empty blocks and the free queue as lists, a full pool ends in list.pop(0)'s IndexError."""

    def allocate(self):
        if not self.empty and self.free:
            b, _ = self.free.popitem(last=False)
            del self.block_of[self.hash_of.pop(b)]
        else:
            b = list(self.empty).pop(0)
            self.empty.popleft()
        self.ref[b] = 1
        return b


@wrong(CHECK, "acquire", "not move it to the queue's tail")
class HitMovedToTail(_Cache):
    """acquire moves a free hit to the queue's tail (move_to_end) instead of taking it out: a held block can be
    evicted."""

    def acquire(self, blocks):
        for b in blocks:
            if self.ref[b] == 0:
                self.free.move_to_end(b)
            self.ref[b] += 1

    def release(self, blocks):
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if b in self.hash_of:
                    self.free[b] = None
                    self.free.move_to_end(b)
                else:
                    self.empty.append(b)


@wrong(CHECK, "lookup", "while a request holds it")
class MapKeepsFreeBlocksOnly(_Cache):
    """The hash map holds free blocks only (filled on release, emptied on acquire): a held block is never found."""

    def acquire(self, blocks):
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
                self.block_of.pop(self.hash_of[b], None)
            self.ref[b] += 1

    def cache(self, block, block_hash):
        self.hash_of[block] = block_hash

    def _freed(self, b):
        if b in self.hash_of:
            self.free[b] = None
            self.block_of[self.hash_of[b]] = b
        else:
            self.empty.append(b)


@wrong(CHECK, "block -> hash", "record both directions in cache()")
class CacheRecordsOneWay(_Cache):
    """cache() records hash -> block only: on release the block seems to hold nothing and goes to the empty
    blocks, so it is reused while lookup still finds it."""

    def cache(self, block, block_hash):
        self.block_of[block_hash] = block


@wrong(CHECK, "allocate must set", "reference count to 1")
class AllocateCountZero(_Cache):
    """allocate leaves the reference count at 0 (it only takes the block): the request's own release underflows."""

    def allocate(self):
        b = super().allocate()
        self.ref[b] = 0
        return b


@wrong(CHECK, "stale hash", "block -> hash")
class EvictKeepsBlockToHash(_Cache):
    """Eviction forgets hash -> block but keeps block -> hash: the block, reused and released uncached, joins the free
    queue with the stale hash and the next eviction meets a KeyError."""

    def _evict(self):
        b, _ = self.free.popitem(last=False)
        del self.block_of[self.hash_of[b]]
        return b


@wrong(CHECK, "lowest-numbered", "freed longest ago")
class EvictsLowestNumbered(_Cache):
    """Evicts the free block with the smallest number instead of the one freed longest ago."""

    def _evict(self):
        b = min(self.free)
        del self.free[b]
        del self.block_of[self.hash_of.pop(b)]
        return b


@wrong(CHECK, "cached longest ago", "by release, not by cache()")
class EvictsOldestCached(_Cache):
    """Evicts the free block cached longest ago (the order cache() was called), not the one freed longest ago."""

    def __init__(self, num_blocks):
        super().__init__(num_blocks)
        self.cached_order = []

    def cache(self, block, block_hash):
        super().cache(block, block_hash)
        if block in self.cached_order:
            self.cached_order.remove(block)
        self.cached_order.append(block)

    def _evict(self):
        b = next(x for x in self.cached_order if x in self.free)
        self.cached_order.remove(b)
        del self.free[b]
        del self.block_of[self.hash_of.pop(b)]
        return b


@wrong(CHECK, "empty block")
class EvictsBeforeUsingEmpty(_Cache):
    """allocate evicts a cached free block even while an empty one is left (the free queue is tried first)."""

    def allocate(self):
        if self.free:
            b = self._evict()
        elif self.empty:
            b = self.empty.popleft()
        else:
            raise RuntimeError("every block is held")
        self.ref[b] = 1
        return b


@wrong(CHECK, "already holds that very hash", "change nothing")
class RecacheRaises(_Cache):
    """cache() refuses a block that already holds a hash, even the same one: a scheduler that names every full block
    of a request after a prefix hit (the hit blocks again, by the hashes they hold) gets an error."""

    def cache(self, block, block_hash):
        if block in self.hash_of:
            raise ValueError(f"block {block} is cached already")
        super().cache(block, block_hash)


@wrong(CHECK, "release", "held")
class SharedBlockFreedEarly(_Cache):
    """release puts a block in the free queue at every release, not only when its count reaches 0: a block another
    request still holds can be evicted."""

    def release(self, blocks):
        for b in reversed(blocks):
            self.ref[b] -= 1
            if b in self.hash_of:
                self.free[b] = None
            elif self.ref[b] == 0:
                self.empty.append(b)

    def acquire(self, blocks):
        for b in blocks:
            self.free.pop(b, None)
            self.ref[b] += 1


@wrong(CHECK, "released without a hash was lost", "empty blocks")
class UncachedBlockLost(_Cache):
    """A block freed without a hash is dropped instead of joining the empty blocks: the pool shrinks."""

    def _freed(self, b):
        if b in self.hash_of:
            self.free[b] = None


@wrong(CHECK, "lookup", "free")
class LookupHeldOnly(_Cache):
    """lookup finds held blocks only: a cached block whose request finished (in the free queue) is a miss."""

    def lookup(self, hashes):
        out = []
        for h in hashes:
            if h not in self.block_of or self.ref[self.block_of[h]] == 0:
                break
            out.append(self.block_of[h])
        return out


@wrong(CHECK, "most recently freed", "join the tail")
class ReleaseAppendsToHead(_Cache):
    """A freed block joins the head of the free queue (move_to_end(last=False)): the newest free block is evicted
    first."""

    def _freed(self, b):
        if b in self.hash_of:
            self.free[b] = None
            self.free.move_to_end(b, last=False)
        else:
            self.empty.append(b)


@wrong(CHECK, "acquire", "count")
class AcquireOncePerBlock(_Cache):
    """acquire sets the count to 1 instead of adding 1: two requests sharing a block, one finishes, and the block is
    freed while the other still uses it."""

    def acquire(self, blocks):
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] = 1


class _ListQueueCache(_Cache):
    def __init__(self, num_blocks):
        super().__init__(num_blocks)
        self.queue = []


@wrong(CHECK, "free queue")
class ListQueueForgetsTouch(_ListQueueCache):
    """The free queue as a list; acquire bumps the count but never removes the block from the list, and eviction
    takes the list's head even if it is held again."""

    def acquire(self, blocks):
        for b in blocks:
            self.ref[b] += 1

    def allocate(self):
        if self.empty:
            b = self.empty.popleft()
        elif self.queue:
            b = self.queue.pop(0)
            del self.block_of[self.hash_of.pop(b)]
        else:
            raise RuntimeError("every block is held")
        self.ref[b] = 1
        return b

    def _freed(self, b):
        if b in self.hash_of:
            self.queue.append(b)
        else:
            self.empty.append(b)




for _cls in [c for c in list(globals().values()) if isinstance(c, type) and issubclass(c, _Cache)]:
    _cls.PrefixCache = _cls  # the check takes one object holding the two functions and the class
