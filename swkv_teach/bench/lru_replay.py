"""Exact LRU against Redis's sampled LRU, on one trace of block accesses, at the same capacity.

A *trace* is the sequence of block keys a cache tier sees (e.g. every full block of every prompt of the chat
workload, in the order requests arrive: :func:`prompt_block_trace`). Each access is a lookup; a miss inserts the
block (as a store does after computing it). Two caches replay it:

* **exact LRU** (:func:`exact_lru_hits`): an ``OrderedDict`` of ``capacity`` blocks, the least recently used out
  first (the build guide's LRU);
* **Redis** (:func:`redis_lru_hits`): a real ``redis-server`` with ``maxmemory-policy allkeys-lru`` and a small
  ``maxmemory``, each block a value of ``value_bytes``. Redis does not keep a recency list: when over
  ``maxmemory`` it samples ``maxmemory-samples`` random keys, merges them into a 16-entry pool of the idlest keys
  seen so far and evicts the idlest of the pool (``evictionPoolPopulate`` and ``performEvictions``, redis
  ``src/evict.c``). The capacity it reaches (keys held once full) is measured, and the exact LRU gets the same.

Redis's clock: an object's idle time comes from a 24-bit LRU clock in **seconds**
(``LRU_CLOCK_RESOLUTION 1000`` ms, ``src/server.h``), so accesses within one second look equally old and a
replay that takes a second leaves Redis nothing to rank by. ``clock="virtual"`` gives access ``t`` of ``n`` its
own second: a hit is checked with ``EXISTS`` (which does not touch the key, ``LOOKUP_NOTOUCH`` in ``existsCommand``,
``src/db.c``) and every access is written with ``RESTORE ... IDLETIME n - t`` (``src/cluster.c``), so recency is
exactly the trace's order and only the sampling differs from the exact LRU. ``clock="wall"`` replays with plain
``GET``/``SET`` as fast as it can, as a client would: what Redis then evicts is close to random.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

__all__ = ["compare_lru", "exact_lru_hits", "prompt_block_trace", "redis_lru_hits"]


def exact_lru_hits(trace: Sequence[Hashable], capacity: int) -> int:
    """Hits of an exact LRU of ``capacity`` entries replaying ``trace`` (a miss inserts, evicting the LRU)."""
    lru: OrderedDict = OrderedDict()
    hits = 0
    for key in trace:
        if key in lru:
            hits += 1
            lru.move_to_end(key)
            continue
        lru[key] = None
        if len(lru) > capacity:
            lru.popitem(last=False)
    return hits


def prompt_block_trace(prompts: Sequence[Sequence[int]], block_size: int) -> list[bytes]:
    """Every full block's chained hash of every prompt, in order: what a block store is asked for."""
    from swkv_teach.caches.prefix import block_hashes

    return [h for p in prompts for h in block_hashes(p, block_size)]


def _key(block) -> str:
    return "lru:" + (block.hex() if isinstance(block, (bytes, bytearray)) else str(block))


def _capacity(client, value: bytes, limit: int) -> int:
    """Keys a full server holds: insert distinct keys until the count stops growing (``limit`` at most)."""
    best, flat = 0, 0
    for i in range(limit):
        client.set(f"fill:{i}", value)
        if i % 8 == 7:
            n = client.dbsize()
            flat = flat + 1 if n <= best else 0
            best = max(best, n)
            if flat >= 8:  # 64 inserts without growth: Redis is evicting as fast as we add
                break
    client.flushall()
    return best


def redis_lru_hits(trace: Sequence[Hashable], url: str, samples: int, value_bytes: int,
                   clock: str = "virtual") -> dict:
    """Replay ``trace`` on the (empty, ``allkeys-lru``, small ``maxmemory``) Redis at ``url`` with
    ``maxmemory-samples`` = ``samples``; ``{"hits", "capacity", "held_at_end"}`` (capacity: keys a full server
    holds, measured by filling it first; held_at_end: keys held after the replay).

    The server is flushed before and after. ``clock``: ``"virtual"`` (one second per access, see the module
    docstring) or ``"wall"`` (plain GET/SET).
    """
    import redis

    if clock not in ("virtual", "wall"):
        raise ValueError(f"clock must be 'virtual' or 'wall'; got {clock!r}")
    client = redis.Redis.from_url(url)
    client.flushall()
    if client.config_get("maxmemory-policy")["maxmemory-policy"] != "allkeys-lru":
        raise ValueError(f"the Redis at {url} must run with maxmemory-policy allkeys-lru (and a small maxmemory)")
    client.config_set("maxmemory-samples", samples)
    value = bytes(value_bytes)
    capacity = _capacity(client, value, limit=len(set(trace)) * 4 + 1000)
    client.set("template", value)
    payload = client.dump("template")
    client.delete("template")
    hits, n = 0, len(trace)
    for t, block in enumerate(trace):
        key = _key(block)
        if clock == "wall":
            if client.get(key) is not None:
                hits += 1
            else:
                client.set(key, value)
            continue
        hit = client.exists(key)
        hits += hit
        client.restore(key, 0, payload, replace=True, idletime=n - t)
    held = client.dbsize()
    client.flushall()
    client.close()
    return {"hits": hits, "capacity": capacity, "held_at_end": held}


def compare_lru(trace: Sequence[Hashable], value_bytes: int, maxmemory: str = "2mb",
                samples: Sequence[int] = (1, 5, 10), clocks: Sequence[str] = ("virtual",)) -> list[dict]:
    """Hit rates of Redis's sampled LRU (one fresh server per row) and of an exact LRU of the capacity Redis reached.

    Returns one dict per (clock, samples): ``clock``, ``samples``, ``capacity`` (blocks Redis held when full),
    ``held_at_end``,
    ``accesses``, ``distinct``, ``redis_hits``, ``exact_hits``, ``redis_hit_rate``, ``exact_hit_rate``.
    Needs ``redis-server`` and the ``redis`` client (:class:`swkv_teach.store.RedisServer` starts the servers).
    """
    from swkv_teach.store import RedisServer

    rows = []
    for clock in clocks:
        for s in samples:
            config = {"maxmemory": maxmemory, "maxmemory-policy": "allkeys-lru", "maxmemory-samples": s}
            with RedisServer(config=config) as server:
                got = redis_lru_hits(trace, server.url, s, value_bytes, clock=clock)
            exact = exact_lru_hits(trace, got["capacity"])
            rows.append({"clock": clock, "samples": s, "capacity": got["capacity"],
                         "held_at_end": got["held_at_end"], "accesses": len(trace),
                         "distinct": len(set(trace)), "redis_hits": got["hits"], "exact_hits": exact,
                         "redis_hit_rate": got["hits"] / max(1, len(trace)),
                         "exact_hit_rate": exact / max(1, len(trace))})
    return rows
