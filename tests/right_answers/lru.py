"""Right answers to exercise 06, LRUCache(max_size) with put/get."""

from collections import OrderedDict

from tests.right_answers import right

# swkv_teach.LRUKVCache itself is refused by the check (it is the oracle).


@right("check_lru_cache")
class PlainDictLRU:
    """A plain dict (insertion-ordered): pop and re-insert to promote; pairs stored as lists, returned as tuples."""

    def __init__(self, max_size):
        if max_size <= 0:
            raise ValueError("max_size must be positive")
        self.max_size, self.d = max_size, {}

    def put(self, token_id, key, value):
        self.d.pop(token_id, None)
        self.d[token_id] = [key, value]
        if len(self.d) > self.max_size:
            del self.d[next(iter(self.d))]

    def get(self, token_id):
        if token_id not in self.d:
            return None
        self.d[token_id] = self.d.pop(token_id)
        return tuple(self.d[token_id])


@right("check_lru_cache")
class SeedLRU:
    """The blog's OrderedDict LRU, verbatim API."""

    def __init__(self, max_size):
        if max_size <= 0:
            raise ValueError("max_size must be a positive integer")
        self.max_size, self.cache = max_size, OrderedDict()

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


@right("check_lru_cache")
class DictSubclassLRU(OrderedDict):
    """The cache *is* an OrderedDict (a dict subclass with put/get on top)."""

    def __init__(self, max_size):
        if max_size <= 0:
            raise ValueError(f"max_size must be positive; got {max_size}")
        super().__init__()
        self.max_size = max_size

    def put(self, token_id, key, value):
        self.pop(token_id, None)
        self[token_id] = (key, value)
        if len(self) > self.max_size:
            self.popitem(last=False)

    def get(self, token_id):
        if token_id not in self:
            return None
        self.move_to_end(token_id)
        return self[token_id]


class _Node:
    __slots__ = ("id", "pair", "prev", "next")

    def __init__(self, token_id=None, pair=None):
        self.id, self.pair, self.prev, self.next = token_id, pair, None, None


@right("check_lru_cache")
class LinkedListLRU:
    """The textbook O(1) LRU: a dict of nodes in a doubly linked list with sentinels, most recent at the tail."""

    def __init__(self, max_size):
        if max_size <= 0:
            raise ValueError(f"max_size must be positive; got {max_size}")
        self.max_size, self.nodes = max_size, {}
        self.head, self.tail = _Node(), _Node()
        self.head.next, self.tail.prev = self.tail, self.head

    def _unlink(self, node):
        node.prev.next, node.next.prev = node.next, node.prev

    def _append(self, node):
        node.prev, node.next = self.tail.prev, self.tail
        self.tail.prev.next = node
        self.tail.prev = node

    def put(self, token_id, key, value):
        node = self.nodes.get(token_id)
        if node is not None:
            self._unlink(node)
            node.pair = (key, value)
        else:
            node = self.nodes[token_id] = _Node(token_id, (key, value))
        self._append(node)
        if len(self.nodes) > self.max_size:
            oldest = self.head.next
            self._unlink(oldest)
            del self.nodes[oldest.id]

    def get(self, token_id):
        node = self.nodes.get(token_id)
        if node is None:
            return None
        self._unlink(node)
        self._append(node)
        return node.pair
