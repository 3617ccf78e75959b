# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
# ---

# %% [markdown]
# # Exercise 13: prefix caching, a hash chain and an LRU free queue
#
# A chat server sees the same system prompt, and the same conversation so far, again and again. Prefix caching
# computes each full block of such a prefix once: a block is named by a *hash chain* (its parent's hash and its
# own token ids), and a block no request uses any more keeps its keys in an LRU *free queue* until a new block is
# needed. Exercise 06's `OrderedDict` LRU comes back here, one level up: over whole blocks, evicting the least
# recently *freed*, and never a block in use. Lesson 12 shows it saving most of a chat workload's prefill.
#
# **How this notebook works.** Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError` line), run the cell, then run the check cell below it. `check_prefix_cache_lru` prints one line starting with ✅ when your answer is right; otherwise it stops with an `ExerciseFailed` message naming the first case that went wrong, what was expected, what you returned, and a hint. Run it as often as you like.
#
# Window convention, used everywhere in this course: with window `W`, query `i` attends to keys `i - W < j <= i` (W keys, itself included).

# %%
import hashlib
import struct
from collections import OrderedDict, deque

from swkv_teach.grading import check_prefix_cache_lru

# %% [markdown]
# ## Exercise 13: `hash_block_tokens`, `block_hashes`, `PrefixCache`
#
# **Difficulty:** ★★★ (3/3) · **Time:** about 40 min · **Points:** 3
#
# **The hash chain.**
#
# * `hash_block_tokens(parent_hash, token_ids) -> bytes`: the hash of one full block, from its parent's hash
#   (`None` for a sequence's first block) and its token ids (a list or a tuple of ints, any size: vocabularies have
#   150,000 tokens). Two blocks get the same hash only if their parents and their ids, in order, are the same. It
#   must be **the same in every process**: two servers sharing a block store look blocks up by these bytes.
# * `block_hashes(token_ids, block_size) -> list[bytes]` (`token_ids` a list or a tuple): one hash per **full**
#   block, each chained to the one before (the first to `None`). A partial last block has no hash: its keys are not
#   final yet.
#
# **The cache.** `PrefixCache(num_blocks)` keeps the bookkeeping of blocks `0 .. num_blocks - 1` (no tensors).
# Each block is *held* (a reference count of at least 1, one per request using it), *cached and free* (count 0,
# it keeps its hash and waits in the free queue), or *empty* (count 0, no hash: never used, or freed without one).
#
# * `lookup(hashes) -> list[int]`: the blocks of the longest run of `hashes`, **from the first**, that are cached
#   (held or free). It only reads: nothing changes.
# * `acquire(blocks)`: a request takes these cached blocks (what `lookup` found): one more reference each; a
#   block that was free leaves the free queue (vLLM calls this *touch*).
# * `allocate() -> int`: a block for new keys, its count set to 1: an **empty** block if there is one (any of
#   them), otherwise **evict** the cached free block that was freed the longest ago (the head of the queue) and
#   forget its hash. If every block is held, raise `RuntimeError`: a block in use is never evicted.
# * `cache(block, block_hash)`: a held block now holds the full block `block_hash` names (the check never names two
#   blocks by one hash). Naming a block again by the hash it already holds changes nothing: a scheduler may name
#   every full block of a request, its hits included.
# * `release(blocks)`: a request is done with `blocks`, given in its order: one reference fewer each, **the last
#   block first**. A block whose count reaches 0 joins the tail of the free queue if it has a hash, or the empty
#   blocks if not.
#
# Worked example, 3 blocks, `block_size = 2`. A request for tokens `[1, 2, 3, 4, 5, 6]` finds nothing, allocates
# blocks 0, 1, 2 and caches them as `h0, h1, h2`; when it finishes, `release([0, 1, 2])` frees 2, then 1, then 0:
# the free queue is `[2, 1, 0]` (the tail of a prompt is the part least likely to be shared, so it goes first).
# A request for `[1, 2, 3, 4, 9, 9]` then finds `lookup([h0, h1, h9]) == [0, 1]`, acquires them (queue `[2]`)
# and allocates one block: none is empty, so block 2 is evicted and `h2` forgotten.
#
# The library's `swkv_teach.caches.prefix` is the check's answer key (handing it in, subclassing it or keeping
# one is refused). The check maps your block numbers onto its own, so any empty block will do; it compares the
# whole state after every operation and runs your hash in a second Python process.
#
# <details><summary>Hint 1</summary>
#
# `hashlib.sha256(parent + struct.pack(f"<{len(ids)}q", *ids)).digest()` is a fine hash, with a fixed 32-byte value
# standing in for a `None` parent. `hash()` is not: it returns an int, and Python salts it per process for
# `str` and `bytes` (`PYTHONHASHSEED`; `hash((1, 2, 3))` is the same everywhere, but a parent's bytes are not).
#
# </details>
#
# <details><summary>Hint 2</summary>
#
# The free queue is exercise 06's `OrderedDict`: `q[block] = None` appends to the tail, `del q[block]` takes a hit
# out of the middle, `q.popitem(last=False)` evicts the head. Two dicts (hash → block, block → hash), a list of
# reference counts and a `deque` of empty blocks do the rest.
#
# </details>
#
# <details><summary>Hint 3</summary>
#
# `release`: `for b in reversed(blocks)`. `allocate`: empty blocks first; when you evict, delete both dict entries,
# or `lookup` will hand out keys the block no longer holds.
#
# </details>

# %% swkv={"exercise": "13", "role": "answer"}
ROOT = hashlib.sha256(b"first block").digest()  # stands in for a None parent: fixed, so every process agrees


def hash_block_tokens(parent_hash, token_ids) -> bytes:
    """SHA-256 of the parent's hash and the block's ids (8 bytes each, in order)."""
    ### BEGIN SOLUTION
    ids = list(token_ids)
    parent = ROOT if parent_hash is None else parent_hash
    return hashlib.sha256(parent + struct.pack(f"<{len(ids)}q", *ids)).digest()
    ### END SOLUTION


def block_hashes(token_ids, block_size) -> list:
    """One chained hash per full block of token_ids."""
    ### BEGIN SOLUTION
    out, parent = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size])
        out.append(parent)
    return out
    ### END SOLUTION


class PrefixCache:
    """Blocks 0 .. num_blocks - 1: held (counted), cached and free (LRU queue), or empty."""

    def __init__(self, num_blocks: int):
        ### BEGIN SOLUTION
        self.ref = [0] * num_blocks
        self.empty = deque(range(num_blocks))
        self.free = OrderedDict()  # cached blocks no request holds, least recently freed first
        self.block_of = {}  # hash -> block
        self.hash_of = {}  # block -> hash
        ### END SOLUTION

    def lookup(self, hashes) -> list:
        ### BEGIN SOLUTION
        out = []
        for h in hashes:
            if h not in self.block_of:
                break
            out.append(self.block_of[h])
        return out
        ### END SOLUTION

    def acquire(self, blocks) -> None:
        ### BEGIN SOLUTION
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]  # touch: a block in use is no candidate for eviction
            self.ref[b] += 1
        ### END SOLUTION

    def allocate(self) -> int:
        ### BEGIN SOLUTION
        if self.empty:
            b = self.empty.popleft()
        elif self.free:
            b, _ = self.free.popitem(last=False)  # the least recently freed
            del self.block_of[self.hash_of.pop(b)]
        else:
            raise RuntimeError("every block is held by a request")
        self.ref[b] = 1
        return b
        ### END SOLUTION

    def cache(self, block, block_hash) -> None:
        ### BEGIN SOLUTION
        self.block_of[block_hash] = block
        self.hash_of[block] = block_hash
        ### END SOLUTION

    def release(self, blocks) -> None:
        ### BEGIN SOLUTION
        for b in reversed(blocks):  # the tail first: it is evicted first
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if b in self.hash_of:
                    self.free[b] = None
                else:
                    self.empty.append(b)
        ### END SOLUTION


# %% swkv={"exercise": "13", "points": 3, "role": "check"}
check_prefix_cache_lru(hash_block_tokens, block_hashes, PrefixCache)

# %%
# The worked example, through the methods the statement specifies only (your block numbers may differ).
cache = PrefixCache(3)
first = block_hashes([1, 2, 3, 4, 5, 6], 2)
table = [cache.allocate() for _ in first]
for block, h in zip(table, first):
    cache.cache(block, h)
cache.release(table)  # the last block first: the free queue is [table[2], table[1], table[0]]
second = block_hashes([1, 2, 3, 4, 9, 9], 2)
hit = cache.lookup(second)
cache.acquire(hit)
new = cache.allocate()
print("the first request's blocks:", table, "| the second hits", hit, "and gets block", new, "for its last one")
print("its first two blocks are shared:", hit == table[:2], "| the evicted block is the first's tail:",
      new == table[2], "| h2 is forgotten:", cache.lookup(first) == table[:2])

# %% [markdown]
# ### Interview follow-up
#
# Your prefix cache serves a chatbot whose system prompt is 2,000 tokens and whose users send 50-token
# messages. The cache is full and evicts least recently freed first. Which blocks survive, which go first, and
# why does vLLM free a finished request's blocks in reverse order? What would an LFU policy change?
#
# <details><summary>One good answer</summary>
#
# The system prompt's blocks are hit by almost every request, so they are nearly always held, or freed and
# touched again within moments: they sit at the tail of the queue or outside it, and survive. What goes first
# are the tails of finished conversations, which nobody shares. Freeing a request's blocks last first puts its
# tail at the head of the queue, ahead of its own prefix, so a chain is eaten from its end: a half-evicted
# chain still gives a hit for its first half, while losing its first block would make every later block
# useless (a hit must start at block 0). LFU would keep the system prompt even through a burst of one-off
# long prompts that push it out of an LRU, but it needs counts that age, or yesterday's popular prefix stays
# forever; vLLM keeps the LRU (its free queue, `FreeKVCacheBlockQueue`) and Redis offers both
# (`allkeys-lru`, `allkeys-lfu`).
#
# </details>
