"""Wrong answers to exercise 08, PagedWindow(pool, window_size): block bookkeeping of a sliding window.

Each is the solution with one realistic slip. ``_Base`` is a right answer, written plainly, that the
slips override; ``Right`` in tests/test_grading_serving.py checks that the base itself passes.
"""

import torch

from swkv_teach import PagedKVCache
from tests.wrong_answers import wrong


class PagedBase:
    """Right: free the blocks wholly before the last W tokens, then take a block when a token opens one."""

    def __init__(self, pool, window_size):
        self.pool, self.window_size = pool, window_size
        self.table, self.seen, self.first = [], 0, 0  # pool blocks oldest first, tokens seen, logical block of table[0]

    @property
    def block_table(self):
        return list(self.table)

    def first_needed(self):
        """Logical block of the oldest token in the window."""
        return max(0, self.seen - self.window_size) // self.pool.block_size

    def free_old(self):
        while self.table and self.first < self.first_needed():
            self.pool.give(self.table.pop(0))
            self.first += 1

    def opens_block(self, p):
        return p % self.pool.block_size == 0

    def append(self):
        p = self.seen
        self.seen += 1
        self.free_old()
        if self.opens_block(p):
            self.table.append(self.pool.take())
        return self.table[-1], p % self.pool.block_size

    @property
    def positions(self):
        return list(range(max(0, self.seen - self.window_size), self.seen))

    def reset(self):
        for b in self.table:
            self.pool.give(b)
        self.table, self.seen, self.first = [], 0, 0


@wrong("check_paged_window", "one token too early")
class FreedOneTokenEarly(PagedBase):
    """Frees against the next query's W - 1 predecessors (vLLM's rule), so the window's oldest token loses its block."""

    def first_needed(self):
        return max(0, self.seen - self.window_size + 1) // self.pool.block_size


@wrong("check_paged_window", "one token too late")
class FreedOneTokenLate(PagedBase):
    """Keeps W + 1 tokens' blocks: `seen - W - 1` where `seen - W` belongs."""

    def first_needed(self):
        return max(0, self.seen - self.window_size - 1) // self.pool.block_size


@wrong("check_paged_window", "never return")
class NeverFrees(PagedBase):
    """Takes blocks as tokens arrive, never gives one back: the paged cache grows like a full cache."""

    def free_old(self):
        pass


@wrong("check_paged_window", "reset", "leaked")
class ResetLeaks(PagedBase):
    """reset() clears the table without giving its blocks back to the pool."""

    def reset(self):
        self.table, self.seen, self.first = [], 0, 0


@wrong("check_paged_window", "gave the newest block back to the pool instead of the oldest")
class FreesNewest(PagedBase):
    """pop() instead of pop(0): returns the block just taken and keeps the stale one."""

    def free_old(self):
        while self.table and self.first < self.first_needed():
            self.pool.give(self.table.pop())
            self.first += 1


@wrong("check_paged_window", "newest first")
class NewestFirst(PagedBase):
    """insert(0, ...) for new blocks: the table reads newest first."""

    def free_old(self):
        while self.table and self.first < self.first_needed():
            self.pool.give(self.table.pop())  # the oldest is now at the end
            self.first += 1

    def append(self):
        p = self.seen
        self.seen += 1
        self.free_old()
        if self.opens_block(p):
            self.table.insert(0, self.pool.take())
        return self.table[0], p % self.pool.block_size


@wrong("check_paged_window", "offset uses window_size")
class OffsetModWindow(PagedBase):
    """The slot inside a block computed as p % window_size (the ring's slot) instead of p % block_size."""

    def append(self):
        block, _ = super().append()
        return block, (self.seen - 1) % self.window_size


@wrong("check_paged_window", "pool says is free")
class InventedBlockIds(PagedBase):
    """Numbers blocks itself (0, 1, 2, ...) instead of taking them from the pool."""

    def append(self):
        p = self.seen
        self.seen += 1
        while self.table and self.first < self.first_needed():
            self.table.pop(0)
            self.first += 1
        if self.opens_block(p):
            self.table.append(p // self.pool.block_size)
        return self.table[-1], p % self.pool.block_size


@wrong("check_paged_window", "still lists block", "remove it from block_table")
class GivesBackButKeepsListed(PagedBase):
    """pool.give(table[0]) without removing it from the table (and the logical index never moves)."""

    def free_old(self):
        if self.table and self.first < self.first_needed() and self.table[0] in self.pool._owner:
            self.pool.give(self.table[0])


@wrong("check_paged_window", "positions keeps w - 1")
class PositionsWMinus1(PagedBase):
    """Blocks right, but positions lists only W - 1 tokens (the newest and W - 2 before it)."""

    @property
    def positions(self):
        return list(range(max(0, self.seen - self.window_size + 1), self.seen))


@wrong("check_paged_window", "instances share state")
class SharedClassList(PagedBase):
    """block_table as a class attribute: every sequence appends to the same list."""

    shared = []

    def __init__(self, pool, window_size):
        super().__init__(pool, window_size)
        self.table = SharedClassList.shared
        self.table.clear()


@wrong("check_paged_window", "too early")
class CapByCount(PagedBase):
    """Keeps at most ceil(W / block_size) blocks, dropping the oldest past that: one short unless (W - 1) % bs == 0."""

    def free_old(self):
        cap = -(-self.window_size // self.pool.block_size)
        p = self.seen - 1
        need_new = self.opens_block(p)
        while len(self.table) + need_new > cap:
            self.pool.give(self.table.pop(0))
            self.first += 1


@wrong("check_paged_window", "hard-coded to 16", "pool.block_size")
class HardCodedBlockSize(PagedBase):
    """vLLM's default block size 16 written in, not pool.block_size."""

    def first_needed(self):
        return max(0, self.seen - self.window_size) // 16

    def opens_block(self, p):
        return p % 16 == 0

    def append(self):
        block, _ = super().append()
        return block, (self.seen - 1) % 16


@wrong("check_paged_window", "pool.give", "before")
class TakesBeforeFreeing(PagedBase):
    """Takes the new block first, then returns the old one: the pool, sized for the window, runs dry."""

    def append(self):
        p = self.seen
        self.seen += 1
        if self.opens_block(p):
            self.table.append(self.pool.take())
        self.free_old()
        return self.table[-1], p % self.pool.block_size


@wrong("check_paged_window", "after reset()", "fresh instance")
class ResetKeepsFirstBlockCounter(PagedBase):
    """reset() gives the blocks back and zeroes the token count, but leaves self.first (the logical number of
    table[0]) as it was: the next sequence frees its blocks late."""

    def reset(self):
        for b in self.table:
            self.pool.give(b)
        self.table, self.seen = [], 0


@wrong("check_paged_window", "logical block number", "no block 5")
class ReturnsLogicalBlockNumber(PagedBase):
    """Takes blocks from the pool but returns p // block_size, the logical number, instead of the pool's id."""

    def append(self):
        _, offset = super().append()
        return (self.seen - 1) // self.pool.block_size, offset


@wrong("check_paged_window", "your own list", "list(self.table)")
class HandsOutItsOwnTable(PagedBase):
    """block_table returns the internal list itself: a caller's append or clear changes the sequence."""

    @property
    def block_table(self):
        return self.table


@wrong("check_paged_window", "library's own pagedkvcache")
class LibraryPagedCache(PagedKVCache):
    """Subclasses the library's PagedKVCache and adds append(): the check's own oracle doing the work."""

    def append(self):
        p = self.seen
        self.update(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))
        return self.block_table[-1], p % self.pool.block_size

    @property
    def positions(self):
        return self.stored_positions().tolist()


@wrong("check_paged_window", "keeps the library's own pagedkvcache in self.cache")
class KeepsALibraryCache:
    """Wraps the library's PagedKVCache in an attribute and forwards to it: the oracle again."""

    def __init__(self, pool, window_size):
        self.cache = PagedKVCache(pool, window_size)

    def append(self):
        p = self.cache.seen
        self.cache.update(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))
        return self.cache.block_table[-1], p % self.cache.pool.block_size

    block_table = property(lambda self: self.cache.block_table)
    positions = property(lambda self: self.cache.stored_positions().tolist())

    def reset(self):
        self.cache.reset()


# ---------------------------------------------------------------- issue 18: holes and true diagnoses


@wrong("check_paged_window", "taken before a token needed it", "p % block_size == 0")
class OpensBlockOneTokenEarly(PagedBase):
    """Takes the next block when the current one's last slot is written ((p + 1) % bs == 0), one token early."""

    def append(self):
        p = self.seen
        self.seen += 1
        self.free_old()
        if p == 0:
            self.table.append(self.pool.take())
        block = self.table[-1]
        if (p + 1) % self.pool.block_size == 0:
            self.table.append(self.pool.take())
            block = self.table[-2]
        return block, p % self.pool.block_size


@wrong("check_paged_window", "before any append()", "holds nothing")
class ReservesInInit(PagedBase):
    """Takes the first block in __init__ (and after reset), 'ready for the first token'."""

    def __init__(self, pool, window_size):
        super().__init__(pool, window_size)
        self.table = [pool.take()]

    def opens_block(self, p):
        return p > 0 and p % self.pool.block_size == 0

    def reset(self):
        super().reset()
        self.table = [self.pool.take()]


@wrong("check_paged_window", "before any append()", "holds nothing")
class ReservesInInitOnly(PagedBase):
    """Takes the first block in __init__; reset() then behaves like the solution (takes on the first append)."""

    def __init__(self, pool, window_size):
        super().__init__(pool, window_size)
        self.table = [pool.take()]
        self.pre = True

    def opens_block(self, p):
        if p == 0 and self.pre:
            self.pre = False
            return False
        return p % self.pool.block_size == 0


# ---------------------------------------------------------------- issue 18: written as a learner would, unseen


@wrong("check_paged_window", "offset", "p % block_size")
class OffsetAfterIncrement(PagedBase):
    """Increments seen first, then returns seen % block_size as the offset (one slot late)."""

    def append(self):
        self.seen += 1
        p = self.seen - 1
        self.free_old()
        if p % self.pool.block_size == 0:
            self.table.append(self.pool.take())
        return self.table[-1], self.seen % self.pool.block_size


@wrong("check_paged_window", "before any append()", "max(0, seen - w)")
class PositionsWithoutMax(PagedBase):
    """positions = range(seen - W, seen) with no max(0, ...): negative positions before the window fills."""

    @property
    def positions(self):
        return list(range(self.seen - self.window_size, self.seen))


@wrong("check_paged_window", "share state", "mutable default argument", "self.table")
class MutableDefaultTable(PagedBase):
    """def __init__(self, pool, window_size, table=[]): every sequence appends to the one default list."""

    def __init__(self, pool, window_size, table=[]):
        super().__init__(pool, window_size)
        self.table = table

    def reset(self):
        for b in self.table:
            self.pool.give(b)
        self.table.clear()
        self.seen, self.first = 0, 0


@wrong("check_paged_window", "both hold tokens of logical block 0", "block id 0", "is none")
class CurrentBlockByTruthiness:
    """Keeps self.current (the block being filled); takes a new one `if not self.current or p % bs == 0`:
    block id 0 is falsy, so while block 0 is current every token takes a new block."""

    def __init__(self, pool, window_size):
        self.pool, self.W, self.table, self.seen, self.current = pool, window_size, [], 0, None

    def append(self):
        bs = self.pool.block_size
        p = self.seen
        self.seen += 1
        first_needed = max(0, self.seen - self.W) // bs
        while self.table and self.table[0][0] < first_needed:
            self.pool.give(self.table.pop(0)[1])
        if not self.current or p % bs == 0:
            self.current = self.pool.take()
            self.table.append((p // bs, self.current))
        return self.current, p % bs

    @property
    def block_table(self):
        return [b for _, b in self.table]

    @property
    def positions(self):
        return list(range(max(0, self.seen - self.W), self.seen))

    def reset(self):
        for _, b in self.table:
            self.pool.give(b)
        self.table, self.seen, self.current = [], 0, None


@wrong("check_paged_window", "sorted by block id", "order the blocks were taken")
class TableSortedByBlockId(PagedBase):
    """`sorted(self.table)`: on a fresh pool ids grow with time, but a block given back comes out again later."""

    @property
    def block_table(self):
        return sorted(self.table)


@wrong("check_paged_window", "blocks held", "whatever the blocks hold")
class PositionsReadOffTheBlocks(PagedBase):
    """Positions are every token the held blocks contain: the oldest block also holds tokens that left the window."""

    @property
    def positions(self):
        bs = self.pool.block_size
        return list(range(self.first * bs, self.seen))


@wrong("check_paged_window", "block_table[0]", "oldest block", "block_table[-1]")
class AppendReturnsTheOldestBlock(PagedBase):
    """append() returns (self.table[0], offset): the window's oldest block, not the one the token went into."""

    def append(self):
        _, offset = super().append()
        return self.table[0], offset


@wrong("check_paged_window", "consecutive", "block_table[-1]")
class AssumesConsecutiveBlockIds(PagedBase):
    """append() computes the block as table[0] + (logical block - first logical block): right while the pool hands
    out 0, 1, 2, ..., wrong once a block given back comes out again."""

    def append(self):
        _, offset = super().append()
        return self.table[0] + ((self.seen - 1) // self.pool.block_size - self.first), offset
