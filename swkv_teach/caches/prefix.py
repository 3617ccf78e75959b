"""Prefix caching: full blocks named by a hash chain, kept after use in an LRU free queue.

Where LRU really lives in a serving engine: not over tokens (a window evicts by age, lesson 5),
but over whole *blocks* that no request holds any more. vLLM's automatic prefix caching
(vllm-project/vllm, ``vllm/v1/core/kv_cache_utils.py`` and ``vllm/v1/core/block_pool.py`` at
commit 002f3491) works like this, and so does this module:

1. **Name a block by everything before it.** A full block of ``block_size`` token ids gets
   ``hash_block_tokens(parent_hash, token_ids)``, its parent being the previous block's hash
   (vLLM's ``hash_block_tokens``: a hash of ``(parent_block_hash, token_ids, extra_keys)``).
   Two requests share a block's hash only if they share every token up to its end, which is
   exactly when the block's keys are the same (keys depend on the tokens and their positions).
   Here the hash is SHA-256 over the parent's 32 bytes and the ids as 8-byte integers, with a
   fixed root for the first block: stable across processes and machines (a store shared by two
   servers needs that; Python's ``hash()`` is salted per process, and vLLM's first parent
   ``NONE_HASH`` is random unless ``PYTHONHASHSEED`` is set).
2. **Keep freed blocks, least recently freed first out.** A block whose reference count falls
   to zero keeps its keys and its hash, and joins the tail of the free queue (vLLM's
   ``FreeKVCacheBlockQueue``, a doubly linked list; an ``OrderedDict`` here, the build guide's
   LRU reborn). A new request whose prompt hits a cached block takes it back out of the
   queue ("touch": vLLM's ``BlockPool.touch``), from wherever it is, in O(1). A new block is
   taken from the blocks that hold nothing first, then from the head of the queue: the least
   recently freed cached block is evicted and its hash forgotten (vLLM's
   ``_maybe_evict_cached_block``). A block in use is never in the queue, so never evicted.
3. **Free a request's blocks tail first.** vLLM frees a finished request's blocks in reverse
   ("Free blocks in reverse order so that the tail blocks are freed first",
   ``SingleTypeKVCacheManager.free`` in ``vllm/v1/core/single_type_kv_cache_manager.py``):
   the tail of a prompt is the part least likely to be shared, so it should be evicted
   first, and the LRU queue does that when it is appended first. :meth:`PrefixCache.release`
   does the same.

One difference from vLLM: vLLM keeps every free block, cached or not, in one queue, so a
freed partial block (no hash) waits behind cached ones; here blocks that hold no cached
content are always handed out before any cached block is evicted.

:func:`find_longest_cache_hit` is the lookup, with vLLM's rule for a sliding window.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence

from swkv_teach._validate import check_positive_int
from swkv_teach.caches.pool import PoolExhausted

__all__ = ["FreeBlockQueue", "PrefixCache", "ROOT_HASH", "block_hashes", "find_longest_cache_hit",
           "hash_block_tokens"]

ROOT_HASH = hashlib.sha256(b"swkv-teach prefix cache root").digest()  # the first block's parent


def hash_block_tokens(parent_hash: bytes | None, token_ids: Sequence[int]) -> bytes:
    """The 32-byte hash of a full block: SHA-256 of its parent's hash and its token ids.

    Args:
        parent_hash: the previous block's hash, or None for a sequence's first block (then a
            fixed root stands in, as vLLM's ``NONE_HASH``).
        token_ids: the block's token ids (non-negative ints), in order.
    Returns:
        32 bytes, the same in every process (no salted ``hash()``).
    """
    if parent_hash is None:
        parent_hash = ROOT_HASH
    if not isinstance(parent_hash, bytes) or len(parent_hash) != 32:
        got = f"{len(parent_hash)} bytes" if isinstance(parent_hash, bytes) else type(parent_hash).__name__
        raise TypeError(f"parent_hash must be None or a 32-byte hash from hash_block_tokens; got {got}")
    ids = list(token_ids)
    if not ids:
        raise ValueError("token_ids must hold a full block's token ids; got none")
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
        bad = next(t for t in ids if isinstance(t, bool) or not isinstance(t, int) or t < 0)
        raise TypeError(f"token_ids must be non-negative ints; got {bad!r}")
    return hashlib.sha256(parent_hash + struct.pack(f"<{len(ids)}q", *ids)).digest()


def block_hashes(tokens: Sequence[int], block_size: int) -> list[bytes]:
    """One chained hash per FULL block of ``tokens`` (a partial last block has none).

    ``block_hashes(t, 4)[i] == hash_block_tokens(block_hashes(t, 4)[i - 1], t[4 * i : 4 * i + 4])``.
    """
    check_positive_int("block_size", block_size)
    tokens = list(tokens)
    out: list[bytes] = []
    parent = None
    for s in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, tokens[s : s + block_size])
        out.append(parent)
    return out


class FreeBlockQueue:
    """The LRU free queue: blocks no request holds, least recently freed first.

    ``append`` (a block freed: to the tail), ``remove`` (a cached block hit again: out of the
    middle, "touch"), ``popleft`` (evict: the head, the least recently freed); each O(1),
    as vLLM's ``FreeKVCacheBlockQueue`` (a doubly linked list there, an ``OrderedDict`` here).
    Iteration goes oldest first.
    """

    def __init__(self, blocks: Sequence[int] = ()):
        self._q: OrderedDict[int, None] = OrderedDict()
        for b in blocks:
            self.append(b)

    def append(self, block: int) -> None:
        if block in self._q:
            raise ValueError(f"block {block!r} is already in the free queue (freed twice?)")
        self._q[block] = None

    def remove(self, block: int) -> None:
        if block not in self._q:
            raise ValueError(f"block {block!r} is not in the free queue; it holds {list(self._q)}")
        del self._q[block]

    def popleft(self) -> int:
        if not self._q:
            raise IndexError("popleft from an empty free queue")
        return self._q.popitem(last=False)[0]

    def __len__(self) -> int:
        return len(self._q)

    def __contains__(self, block) -> bool:
        return block in self._q

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._q))

    def __repr__(self) -> str:
        return f"FreeBlockQueue({list(self._q)})"


class PrefixCache:
    """Block bookkeeping with prefix caching over ``num_blocks`` blocks (numbers ``0 .. num_blocks - 1``).

    Every block is in exactly one state:

    * **held**: reference count >= 1 (one per request using it); cached (has a hash) or not;
    * **cached, free**: count 0, keeps its keys and hash, waits in :attr:`free_queue` (LRU);
    * **empty**: count 0 and no hash (never used, or freed without a full block's hash).

    ``allocate`` takes an empty block first (oldest first), else evicts the head of the free
    queue; ``lookup``/``acquire`` find and take cached blocks; ``cache`` names a held full block;
    ``release`` drops a request's references, tail first. Evicted ``(hash, block)`` pairs are
    kept in :attr:`evicted` until :meth:`pop_evicted` (the scheduler writes them to a store
    before the block is overwritten).
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = check_positive_int("num_blocks", num_blocks)
        self.free_queue = FreeBlockQueue()
        self._empty: deque[int] = deque(range(num_blocks))
        self._ref = [0] * num_blocks
        self._hash_to_block: dict[bytes, int] = {}
        self._block_hash: dict[int, bytes] = {}
        self.evicted: list[tuple[bytes, int]] = []
        self.evictions = 0

    # ---------------------------------------------------------------- queries
    @property
    def free_blocks(self) -> int:
        """Blocks ``allocate`` may hand out: empty ones and cached ones no request holds."""
        return len(self._empty) + len(self.free_queue)

    @property
    def used_blocks(self) -> int:
        """Blocks some request holds."""
        return self.num_blocks - self.free_blocks

    @property
    def cached_blocks(self) -> int:
        """Blocks with a hash (held or in the free queue)."""
        return len(self._hash_to_block)

    def ref_count(self, block: int) -> int:
        return self._ref[self._check_block(block)]

    def hash_of(self, block: int) -> bytes | None:
        return self._block_hash.get(self._check_block(block))

    def get(self, block_hash: bytes) -> int | None:
        """The block holding ``block_hash``'s keys, or None."""
        return self._hash_to_block.get(block_hash)

    def lookup(self, hashes: Sequence[bytes]) -> list[int]:
        """The blocks of the longest run of ``hashes``, from the first, that are cached (held or free).

        A chain breaks at its first miss: block ``i``'s hash covers every token before it, so
        block ``i + 1`` cannot be cached without ``i`` having been computed (vLLM's
        ``FullAttentionManager.find_longest_cache_hit``). Changes nothing: :meth:`acquire` takes them.
        """
        out = []
        for h in hashes:
            block = self._hash_to_block.get(h)
            if block is None:
                break
            out.append(block)
        return out

    # ---------------------------------------------------------------- changes
    def acquire(self, blocks: Sequence[int]) -> None:
        """Add one reference to each of ``blocks`` (cached blocks a request hit): a free one leaves the queue."""
        blocks = [self._check_block(b) for b in blocks]
        for b in blocks:
            if self._ref[b] == 0 and b not in self.free_queue:
                raise ValueError(f"block {b} holds no cached keys (it is empty); allocate() it instead")
        for b in blocks:
            if self._ref[b] == 0:
                self.free_queue.remove(b)  # touch: no longer a candidate for eviction
            self._ref[b] += 1

    def allocate(self) -> int:
        """A block for new keys, with reference count 1: an empty one if any, else the LRU cached one (evicted).

        Raises :class:`~swkv_teach.caches.pool.PoolExhausted` when every block is held.
        """
        if self._empty:
            block = self._empty.popleft()
        elif self.free_queue:
            block = self.free_queue.popleft()
            h = self._block_hash.pop(block)
            del self._hash_to_block[h]
            self.evicted.append((h, block))
            self.evictions += 1
        else:
            raise PoolExhausted(f"all {self.num_blocks} blocks are held by requests; none is free or cached-free")
        self._ref[block] = 1
        return block

    def cache(self, block: int, block_hash: bytes) -> bool:
        """Name held ``block`` by ``block_hash`` (its keys are a full block's); False if another block has it.

        A second copy of the same keys (two requests computed the block at once) stays uncached
        and is recycled as an empty block when freed.
        """
        block = self._check_block(block)
        if self._ref[block] == 0:
            raise ValueError(f"block {block} is not held; only a block a request holds (and filled) can be cached")
        if self._block_hash.get(block) == block_hash:
            return True
        if block in self._block_hash:
            raise ValueError(f"block {block} is already cached under another hash")
        if block_hash in self._hash_to_block:
            return False
        self._hash_to_block[block_hash] = block
        self._block_hash[block] = block_hash
        return True

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each of ``blocks``, given in a request's order, freeing the LAST first.

        A block whose count reaches zero joins the free queue's tail if it is cached (so a
        request's tail block is evicted before its head), or the empty blocks if not.
        """
        blocks = [self._check_block(b) for b in blocks]
        for b in blocks:
            if self._ref[b] == 0:
                raise ValueError(f"block {b} is not held; releasing it would free it twice")
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                if b in self._block_hash:
                    self.free_queue.append(b)
                else:
                    self._empty.append(b)

    def pop_evicted(self) -> list[tuple[bytes, int]]:
        """The ``(hash, block)`` pairs evicted since the last call (their keys are still in the block)."""
        out, self.evicted = self.evicted, []
        return out

    def _check_block(self, block) -> int:
        if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise ValueError(f"block must be a block number 0..{self.num_blocks - 1}; got {block!r}")
        return block

    def __repr__(self) -> str:
        return (f"PrefixCache(num_blocks={self.num_blocks}, used={self.used_blocks}, cached={self.cached_blocks}, "
                f"free_queue={len(self.free_queue)}, empty={len(self._empty)})")


def find_longest_cache_hit(cache: PrefixCache, hashes: Sequence[bytes], block_size: int,
                           window_size: int | None = None, max_tokens: int | None = None) -> list[int | None]:
    """The cached blocks a request may skip computing: one entry per skipped block, None where not needed.

    Args:
        cache: where the blocks are looked up (nothing is changed).
        hashes: the request's full-block hashes (:func:`block_hashes`).
        block_size: tokens per block.
        window_size: ``W`` (query ``i`` sees ``i - W < j <= i``); None: full attention.
        max_tokens: hit at most this many tokens (a scheduler passes ``len(tokens) - 1``: the last
            token is always computed, so its logits exist; vLLM's ``max_cache_hit_length``).
    Returns:
        ``k`` entries: the request skips tokens ``0 .. k * block_size - 1`` and starts computing
        at ``k * block_size``. Entry ``i`` is the cached block to hold for logical block ``i``,
        or None where no query will ever read it.

    **Full attention**: the longest run of cached blocks from the first (:meth:`PrefixCache.lookup`).

    **Sliding window** (vLLM's ``SlidingWindowManager.find_longest_cache_hit``,
    ``vllm/v1/core/single_type_kv_cache_manager.py`` at commit 002f3491): starting to compute
    at position ``n = k * block_size``, the first query sees keys ``n - W + 1 .. n``, so only the
    ``W - 1`` positions before ``n`` must be cached: they fill the last
    ``c = ceil((W - 1) / block_size)`` blocks before ``n``. Blocks further back are never read,
    so it does not matter whether they are cached (vLLM puts its ``null_block`` there; None
    here). The search runs from the right: the first run of ``c`` consecutive cached blocks,
    ending at block ``k - 1``, gives the hit ``k``. If no run is long enough, the run that
    starts at block 0 is still a hit (there is nothing before position 0 to see).
    Worked example, ``block_size = 4``, ``W = 6`` (``c = 2``), cached ``[Y, Y, -, Y, Y, -, Y]``:
    from the right, block 6 alone is too short, blocks 3-4 are a run of 2, so ``k = 5``:
    ``[None, None, None, b3, b4]``, 20 tokens skipped, only blocks 3 and 4 held. With full
    attention the same cache gives ``k = 2`` (the run from block 0).
    """
    check_positive_int("block_size", block_size)
    n_blocks = len(hashes) if max_tokens is None else min(len(hashes), max(0, max_tokens) // block_size)
    if window_size is None:
        return list(cache.lookup(hashes[:n_blocks]))
    check_positive_int("window_size", window_size)
    need = -(-(window_size - 1) // block_size)
    hit: list[int | None] = [None] * n_blocks
    run = 0
    for i in range(n_blocks - 1, -1, -1):
        block = cache.get(hashes[i])
        if block is None:
            run = 0
            continue
        hit[i] = block
        run += 1
        if run >= need:
            return hit[: i + run]
    return hit[:run]  # no run long enough: the run from block 0 (its length when the loop ended at i = 0)
