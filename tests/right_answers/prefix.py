"""Right answers to exercise 13, each holding hash_block_tokens, block_hashes and PrefixCache, in other styles."""

import hashlib
import heapq
import struct
from collections import OrderedDict, deque

from tests.right_answers import right


# ------------------------------------------------------------------ the solution's style: OrderedDict, deque
def sha_hash(parent_hash, token_ids):
    ids = list(token_ids)
    parent = hashlib.sha256(b"root").digest() if parent_hash is None else parent_hash
    return hashlib.sha256(parent + struct.pack(f"<{len(ids)}q", *ids)).digest()


def sha_chain(token_ids, block_size):
    out, parent = [], None
    for i in range(len(token_ids) // block_size):
        parent = sha_hash(parent, token_ids[i * block_size : (i + 1) * block_size])
        out.append(parent)
    return out


@right("check_prefix_cache_lru")
class OrderedDictCache:
    """The solution's style: an OrderedDict free queue, a deque of empty blocks, two dicts, a list of counts."""

    hash_block_tokens = staticmethod(sha_hash)
    block_hashes = staticmethod(sha_chain)

    def __init__(self, num_blocks):
        self.ref, self.empty, self.free = [0] * num_blocks, deque(range(num_blocks)), OrderedDict()
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

    def allocate(self):
        if self.empty:
            b = self.empty.popleft()
        elif self.free:
            b, _ = self.free.popitem(last=False)
            del self.block_of[self.hash_of.pop(b)]
        else:
            raise RuntimeError("all blocks held")
        self.ref[b] = 1
        return b

    def cache(self, block, block_hash):
        self.block_of[block_hash], self.hash_of[block] = block, block_hash

    def release(self, blocks):
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (self.free.__setitem__(b, None) if b in self.hash_of else self.empty.append(b))


OrderedDictCache.PrefixCache = OrderedDictCache


# ------------------------------------------------------------------ vLLM's style: a doubly linked list
def blake_hash(parent_hash, token_ids):
    return hashlib.blake2b(repr((parent_hash, tuple(int(t) for t in token_ids))).encode(), digest_size=32).digest()


def blake_chain(token_ids, block_size):
    hashes, parent = [], None
    n_full = len(token_ids) - len(token_ids) % block_size
    for start in range(0, n_full, block_size):
        parent = blake_hash(parent, tuple(token_ids[start : start + block_size]))
        hashes.append(parent)
    return hashes


class _Node:
    __slots__ = ("block", "prev", "next", "ref", "hash")

    def __init__(self, block):
        self.block, self.prev, self.next, self.ref, self.hash = block, None, None, 0, None


@right("check_prefix_cache_lru")
class LinkedListCache:
    """vLLM's FreeKVCacheBlockQueue: a doubly linked list with sentinels, O(1) remove from the middle; the empty
    blocks handed out newest first (a stack), which the check allows."""

    hash_block_tokens = staticmethod(blake_hash)
    block_hashes = staticmethod(blake_chain)

    def __init__(self, num_blocks):
        self.nodes = [_Node(b) for b in range(num_blocks)]
        self.head, self.tail = _Node(-1), _Node(-1)
        self.head.next, self.tail.prev = self.tail, self.head
        self.stack = list(range(num_blocks))[::-1]
        self.table = {}

    def _unlink(self, n):
        n.prev.next, n.next.prev = n.next, n.prev
        n.prev = n.next = None

    def _push(self, n):
        n.prev, n.next = self.tail.prev, self.tail
        self.tail.prev.next = n
        self.tail.prev = n

    def lookup(self, hashes):
        found = []
        for h in hashes:
            n = self.table.get(h)
            if n is None:
                return found
            found.append(n.block)
        return found

    def acquire(self, blocks):
        for b in blocks:
            n = self.nodes[b]
            if n.ref == 0:
                self._unlink(n)
            n.ref += 1

    def allocate(self):
        if self.stack:
            n = self.nodes[self.stack.pop()]
        elif self.head.next is not self.tail:
            n = self.head.next
            self._unlink(n)
            del self.table[n.hash]
            n.hash = None
        else:
            raise RuntimeError("no block free")
        n.ref = 1
        return n.block

    def cache(self, block, block_hash):
        self.nodes[block].hash = block_hash
        self.table[block_hash] = self.nodes[block]

    def release(self, blocks):
        for b in blocks[::-1]:
            n = self.nodes[b]
            n.ref -= 1
            if n.ref == 0:
                if n.hash is None:
                    self.stack.append(b)
                else:
                    self._push(n)


LinkedListCache.PrefixCache = LinkedListCache


# ------------------------------------------------------------------ timestamps and a heap
def repr_hash(parent_hash, token_ids):
    return hashlib.sha256((parent_hash or b"\0") + b"|" + ",".join(map(str, token_ids)).encode()).digest()


def repr_chain(token_ids, block_size):
    full = len(token_ids) // block_size
    chain = []
    for i in range(full):
        chain.append(repr_hash(chain[-1] if chain else None, token_ids[i * block_size : (i + 1) * block_size]))
    return chain


@right("check_prefix_cache_lru")
class TimestampCache:
    """A freed-at clock per cached free block, the minimum evicted (O(n), still right); empty blocks from a heap,
    lowest number first; ids joined with commas (a separator, so [1, 23] is not [12, 3])."""

    hash_block_tokens = staticmethod(repr_hash)
    block_hashes = staticmethod(repr_chain)

    def __init__(self, num_blocks):
        self.count = {}
        self.freed_at = {}
        self.empty = list(range(num_blocks))
        heapq.heapify(self.empty)
        self.by_hash, self.hash = {}, {}
        self.clock = 0

    def lookup(self, hashes):
        out = []
        for h in hashes:
            if h in self.by_hash:
                out.append(self.by_hash[h])
            else:
                break
        return out

    def acquire(self, blocks):
        for b in blocks:
            self.freed_at.pop(b, None)
            self.count[b] = self.count.get(b, 0) + 1

    def allocate(self):
        if self.empty:
            b = heapq.heappop(self.empty)
        elif self.freed_at:
            b = min(self.freed_at, key=self.freed_at.get)
            del self.freed_at[b]
            del self.by_hash[self.hash.pop(b)]
        else:
            raise RuntimeError("full")
        self.count[b] = 1
        return b

    def cache(self, block, block_hash):
        self.by_hash[block_hash] = block
        self.hash[block] = block_hash

    def release(self, blocks):
        for b in reversed(list(blocks)):
            self.count[b] -= 1
            if self.count[b] == 0:
                if b in self.hash:
                    self.clock += 1
                    self.freed_at[b] = self.clock
                else:
                    heapq.heappush(self.empty, b)


TimestampCache.PrefixCache = TimestampCache
