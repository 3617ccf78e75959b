"""More right answers to exercise 13 (issue 37), in styles the first ones do not use: a plain dict as the free queue
(insertion order), a set of empty blocks taken highest first, a list queue searched by index, text hashes with
separators, and a full pool raising a subclass of RuntimeError."""

import hashlib
import json

from tests.right_answers import right


def json_hash(parent_hash, token_ids):
    parent = "root" if parent_hash is None else parent_hash.hex()
    return hashlib.blake2b(json.dumps([parent, [int(t) for t in token_ids]]).encode(), digest_size=32).digest()


def sliced_chain(token_ids, block_size):
    ids = list(token_ids)
    hashes, parent = [], None
    while len(ids) >= block_size:
        block, ids = ids[:block_size], ids[block_size:]
        parent = json_hash(parent, block)
        hashes.append(parent)
    return hashes


class PoolFull(RuntimeError):
    """Every block is held by a request."""


@right("check_prefix_cache_lru")
class PlainDictQueue:
    """The free queue a plain dict (insertion ordered: the first key is the head), empty blocks a set taken highest
    first, one dict per block of {count, hash}; a full pool raises a RuntimeError subclass."""

    hash_block_tokens = staticmethod(json_hash)
    block_hashes = staticmethod(sliced_chain)

    def __init__(self, num_blocks):
        self.blocks = {b: {"count": 0, "hash": None} for b in range(num_blocks)}
        self.empty = set(range(num_blocks))
        self.free = {}
        self.where = {}

    def lookup(self, hashes):
        found = []
        for h in hashes:
            b = self.where.get(h)
            if b is None:
                return found
            found.append(b)
        return found

    def acquire(self, blocks):
        for b in blocks:
            self.free.pop(b, None)
            self.blocks[b]["count"] += 1

    def allocate(self):
        if self.empty:
            b = max(self.empty)
            self.empty.discard(b)
        elif self.free:
            b = next(iter(self.free))
            del self.free[b]
            del self.where[self.blocks[b]["hash"]]
            self.blocks[b]["hash"] = None
        else:
            raise PoolFull("every block is held")
        self.blocks[b]["count"] = 1
        return b

    def cache(self, block, block_hash):
        self.blocks[block]["hash"] = block_hash
        self.where[block_hash] = block

    def release(self, blocks):
        for b in blocks[::-1]:
            info = self.blocks[b]
            info["count"] -= 1
            if info["count"] == 0:
                if info["hash"] is None:
                    self.empty.add(b)
                else:
                    self.free[b] = True


def text_hash(parent_hash, token_ids):
    text = ("-" if parent_hash is None else parent_hash.hex()) + "|" + ",".join(str(int(t)) for t in token_ids)
    return hashlib.sha256(text.encode()).digest()


def indexed_chain(token_ids, block_size):
    out = []
    for i in range(len(token_ids) // block_size):
        out.append(text_hash(out[-1] if out else None, tuple(token_ids[i * block_size:(i + 1) * block_size])))
    return out


@right("check_prefix_cache_lru")
class ListQueue:
    """The free queue a plain list (append at the tail, list.remove on a hit, pop(0) to evict), counts in a dict,
    empty blocks a list used as a stack."""

    hash_block_tokens = staticmethod(text_hash)
    block_hashes = staticmethod(indexed_chain)

    def __init__(self, num_blocks):
        self.count = dict.fromkeys(range(num_blocks), 0)
        self.unused = list(range(num_blocks))[::-1]
        self.queue = []
        self.by_hash, self.by_block = {}, {}

    def lookup(self, hashes):
        n = 0
        while n < len(hashes) and hashes[n] in self.by_hash:
            n += 1
        return [self.by_hash[h] for h in hashes[:n]]

    def acquire(self, blocks):
        for b in blocks:
            if b in self.queue:
                self.queue.remove(b)
            self.count[b] += 1

    def allocate(self):
        if self.unused:
            b = self.unused.pop()
        elif self.queue:
            b = self.queue.pop(0)
            self.by_hash.pop(self.by_block.pop(b))
        else:
            raise RuntimeError("no block left: every one is held")
        self.count[b] = 1
        return b

    def cache(self, block, block_hash):
        self.by_hash[block_hash] = block
        self.by_block[block] = block_hash

    def release(self, blocks):
        for b in reversed(list(blocks)):
            self.count[b] -= 1
            if not self.count[b]:
                (self.queue if b in self.by_block else self.unused).append(b)


for _cls in (PlainDictQueue, ListQueue):
    _cls.PrefixCache = _cls  # the check takes one object holding the two functions and the class
