"""Probes for exercise 13's check: each runs a few operations on a fresh instance of the learner's ``PrefixCache``
and names one bug only when the cache behaves exactly as that bug would (see :func:`diagnose`).
"""

from __future__ import annotations

import hashlib

from swkv_teach.grading._shared import two_fresh

__all__ = ["H", "diagnose"]

H = [hashlib.sha256(f"probe block {i}".encode()).digest() for i in range(8)]  # stand-in hashes for the probes


def _probe(cls, n: int, script):
    try:
        return script(cls(n))
    except Exception:
        return None


def _shared(cls) -> str | None:
    def use(c, i):
        c.cache(c.allocate(), H[i])

    def other_sees():
        a, b = cls(4), cls(4)
        a.cache(a.allocate(), H[0])
        return list(b.lookup([H[0]]))

    try:
        seen = other_sees()
    except Exception:
        return None
    if not seen:
        return None
    found = two_fresh(cls, (4,), use)
    return ("state is shared between instances: a fresh cache found a hash another instance cached. "
            + (found or "Create the dicts and queues in __init__ (self.x = ...), not at class level."))


def _p_full_raises(c):
    c.allocate(), c.allocate()
    try:
        got = c.allocate()
    except Exception:
        return None
    return (f"with every block held, allocate() returned block {got}, which a request is using: raise instead (a block "
            "in use is never evicted).")


def _p_acquire_takes_out(c):
    a, b = c.allocate(), c.allocate()
    c.cache(a, H[0]), c.cache(b, H[1])
    c.release([a]), c.release([b])
    c.acquire([a, b])  # both hit: every block is held again
    try:
        got = c.allocate()
    except Exception:
        return None
    return (f"a hit block was evicted while in use: after acquire([{a}, {b}]) every block is held, yet allocate() "
            f"returned {got}. acquire must take a cached block out of the free queue (vLLM's touch), not move it to "
            "the queue's tail; it goes back to the tail when released.")


def _p_allocate_counts_one(c):
    a = c.allocate()
    c.cache(a, H[0])
    c.release([a])  # its one request is done: cached and free, so the next allocate may evict it
    try:
        c.allocate()
    except Exception:
        return ("a block allocate() handed out, cached and released by its one request was not free again "
                "(allocate() then raised): allocate must set the block's reference count to 1, so that the "
                "request's release brings it to 0.")
    return None


def _p_uncached_comes_back(c):
    a = c.allocate()
    c.release([a])  # freed without a hash: an empty block again
    try:
        c.allocate()
    except Exception:
        return ("a block released without a hash was lost: allocate() then raised although that block held nothing "
                "and no request held it. A block whose count reaches 0 without a hash joins the empty blocks.")
    return None


def _p_cache_records_both_ways(c):
    a, b = c.allocate(), c.allocate()
    c.cache(a, H[0])
    c.release([a])  # cached: it must wait in the free queue, not join the empty blocks
    c.release([b])  # uncached: an empty block, to be handed out first
    got = c.allocate()
    if got == a and list(c.lookup([H[0]])) == [a]:
        return (f"cache({a}, h0) was not remembered on the block's side (block -> hash): when block {a} was "
                "released it seemed to hold nothing, joined the empty blocks and was handed out again while lookup "
                "still finds h0 in it. Record both directions in cache(): hash -> block and block -> hash.")


def _p_lookup_finds_held(c):
    a = c.allocate()
    c.cache(a, H[0])
    if list(c.lookup([H[0]])) != [a]:
        return (f"lookup([h0]) missed block {a} while a request holds it (cached, count 1): lookup finds every cached "
                "block, held or free; record hash -> block in cache(), and drop it on eviction only.")


def _p_evict_forgets_block_hash(c):
    a = c.allocate()
    c.cache(a, H[0])
    c.release([a])
    b = c.allocate()  # evicts a (one block)
    c.release([b])  # freed without a hash this time: an empty block
    try:
        c.allocate()
    except Exception as e:
        return (f"after block {b} was evicted, reused and released without a hash, allocate() raised "
                f"{type(e).__name__}: {e}. The block still carried its old hash: eviction must delete both entries, "
                "hash -> block and block -> hash, or the block goes back to the free queue with a stale hash.")
    return None


def _p_refcount(c):
    a = c.allocate()
    c.cache(a, H[0])
    c.acquire([a])  # a second request shares it
    c.release([a])  # the first leaves: still held by the second
    c.allocate()
    try:
        got = c.allocate()
    except Exception:
        return None
    if got == a:
        return ("a block two requests share was freed when the first released it: count references (acquire +1, "
                "allocate sets 1, release -1) and free a block only at zero.")


def _p_dropped(c):
    a = c.allocate()
    c.cache(a, H[0])
    c.release([a])
    c.allocate()  # evicts it (one block)
    if list(c.lookup([H[0]])):
        return ("a hash was not dropped on eviction: lookup still finds h0 in a block that was handed out again "
                "(its keys are being overwritten). Delete the hash -> block entry when you evict.")


def _p_most_recent(c):
    x = [c.allocate() for _ in range(3)]
    for i, b in enumerate(x):
        c.cache(b, H[i])
    for b in x:
        c.release([b])
    got = c.allocate()
    if got == x[2]:
        return ("allocate evicted the most recently freed block (popitem() or pop() take the newest, or release put "
                "the block at the queue's head): freed blocks join the tail, and allocate evicts the head, the least "
                "recently freed (popitem(last=False)).")


def _p_eviction_order(c):
    """Four blocks cached in one order and freed in another: which one goes names the rule the answer follows."""
    x = [c.allocate() for _ in range(4)]
    for i, b in enumerate((x[1], x[2], x[3], x[0])):  # cached first: x[1]
        c.cache(b, H[i])
    for b in (x[3], x[1], x[0], x[2]):  # freed first: x[3]; last: x[2]
        c.release([b])
    got = c.allocate()
    if got == x[1]:
        return (f"allocate evicted block {got}, the one cached longest ago, not block {x[3]}, the one freed longest "
                "ago: order the free queue by release, not by cache() (a block enters the queue's tail when its "
                "count reaches 0).")
    if got == min(x) and got not in (x[3], x[2]):
        return (f"allocate evicted block {got}, the lowest-numbered free block, not block {x[3]}, the one freed "
                "longest ago: keep the free queue in release order (an OrderedDict: q[b] = None on release, "
                "popitem(last=False) to evict).")
    return None


def _p_empty_first(c):
    a, b = c.allocate(), c.allocate()
    c.cache(b, H[1])
    c.release([b]), c.release([a])  # a holds nothing: an empty block again
    if c.allocate() == b:
        return ("allocate evicted a cached block while a block holding nothing was free (did the uncached block go "
                "into the free queue?): hand out empty blocks first, evict only when none is left.")


def _p_tail_first(c):
    x = [c.allocate() for _ in range(3)]
    for i, b in enumerate(x):
        c.cache(b, H[i])
    c.release(x)
    got = c.allocate()
    if got == x[0]:
        return ("release freed a request's blocks head first: free them last first (reversed), so the tail of a "
                "prompt, the part least likely shared, is evicted first (as vLLM does).")


def _p_touch(c):
    x = [c.allocate() for _ in range(3)]
    for i, b in enumerate(x):
        c.cache(b, H[i])
    for b in x:
        c.release([b])
    c.acquire([x[0]])
    c.release([x[0]])  # a hit used and freed again: now the most recently freed
    if c.allocate() == x[0]:
        return ("a block hit and freed again kept its old place in the free queue: when it is released it must go to "
                "the tail (the most recent). With an OrderedDict, assigning an existing key keeps its place: take it "
                "out on acquire (or move_to_end on release).")


def _p_lookup_stops(c):
    a, _, b = c.allocate(), c.allocate(), c.allocate()
    c.cache(a, H[0]), c.cache(b, H[2])
    if len(list(c.lookup([H[0], H[1], H[2]]))) > 1:
        return ("lookup went past a miss: the hit is the longest run from the first block; block i + 1 is of no use "
                "without block i (its keys assume every token before it).")


def _p_lookup_pure(c):
    x = [c.allocate() for _ in range(3)]
    for i, b in enumerate(x):
        c.cache(b, H[i])
    for b in x:
        c.release([b])
    c.lookup([H[0]])
    if c.allocate() == x[1]:
        return "lookup changed the free queue's order (it touched h0): lookup only reads; acquire takes the hits."


PROBES = ((2, _p_full_raises), (2, _p_acquire_takes_out), (1, _p_allocate_counts_one), (1, _p_uncached_comes_back),
          (2, _p_refcount), (2, _p_lookup_finds_held), (2, _p_cache_records_both_ways),
          (1, _p_evict_forgets_block_hash), (1, _p_dropped), (3, _p_most_recent), (4, _p_eviction_order),
          (2, _p_empty_first), (3, _p_tail_first), (3, _p_touch), (3, _p_lookup_stops), (3, _p_lookup_pure))


def diagnose(cls) -> str | None:
    """The first bug a probe on fresh instances shows, most specific first; None when none fits."""
    found = _shared(cls)
    if found:
        return found
    for n, probe in PROBES:
        found = _probe(cls, n, probe)
        if found:
            return found
    return None


