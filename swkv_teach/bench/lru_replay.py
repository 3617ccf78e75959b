"""Exact LRU against Redis's sampled LRU, on one trace of block accesses, at the same capacity.

A *trace* is the sequence of block keys a cache tier sees (e.g. every full block of every prompt of the chat
workload, in the order requests arrive: :func:`prompt_block_trace`). Each access is a lookup; a miss inserts the
block (as a store does after computing it). Two caches replay it:

* **exact LRU** (:func:`exact_lru_hits`): an ``OrderedDict`` of ``capacity`` blocks, the least recently used out
  first (the build guide's LRU);
* **Redis** (:func:`redis_lru_hits`): a real ``redis-server`` with ``maxmemory-policy allkeys-lru`` and a small
  ``maxmemory``, each block a value of ``value_bytes``. Redis keeps no recency list: when over ``maxmemory`` it
  samples ``maxmemory-samples`` random keys (``evictionPoolPopulate``, redis 7.0.15 ``src/evict.c:146-150``),
  merges them into a pool of the 16 idlest keys seen so far (``EVPOOL_SIZE``, ``src/evict.c:54``) and evicts the
  idlest of the pool (``performEvictions``, ``src/evict.c:540``, "Go backward from best to worst", line 610).
  The number of blocks it holds once full is measured during the replay (``DBSIZE`` after each access; it varies
  by a block or two as Redis evicts just past ``maxmemory``), and the exact LRU gets its median.

Redis's clock: an object's idle time is its 24-bit LRU clock subtracted from the server's
(``estimateObjectIdleTime``, ``src/evict.c:92``), and that clock ticks in **seconds** (``LRU_CLOCK_RESOLUTION
1000`` ms, ``src/server.h:849``), so accesses within one second look equally old and a replay that takes a second
leaves Redis nothing to rank by. ``clock="virtual"`` gives access ``t`` of ``n`` its own second: a hit is checked
with ``EXISTS``, which does not touch the key (``LOOKUP_NOTOUCH``, ``src/db.c:704``), and every access is written
with ``RESTORE key 0 value REPLACE IDLETIME n - t`` (``src/cluster.c:6021``, set by ``objectSetLRUOrLFU``,
``src/object.c:1384``), so recency is exactly the trace's order and only the sampling differs from the exact LRU.
``clock="wall"`` replays with plain ``GET``/``SET`` as fast as it can, as a client would: what Redis then evicts
is close to random. (Line numbers: redis 7.0.15, commit f35f36a2, the version Debian 12 ships.)
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


def redis_lru_hits(trace: Sequence[Hashable], url: str, samples: int, value_bytes: int,
                   clock: str = "virtual") -> dict:
    """Replay ``trace`` on the (empty, ``allkeys-lru``, small ``maxmemory``) Redis at ``url`` with
    ``maxmemory-samples`` = ``samples``; ``{"hits", "capacity", "held_min", "held_max"}``: the median, least and
    most keys Redis held after an access, from its first eviction on (all distinct keys if it never evicted).

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
    client.set("template", bytes(value_bytes))
    payload = client.dump("template")
    client.delete("template")
    hits, n, held, inserted, full_at = 0, len(trace), [], set(), None
    for t, block in enumerate(trace):
        key = _key(block)
        if clock == "wall":
            hit = client.get(key) is not None
            if not hit:
                client.set(key, bytes(value_bytes))
        else:
            hit = bool(client.exists(key))
            client.restore(key, 0, payload, replace=True, idletime=n - t)
        hits += hit
        inserted.add(key)
        held.append(client.dbsize())
        if full_at is None and held[-1] < len(inserted):
            full_at = t  # the first eviction: from here on Redis holds what maxmemory allows
    steady = sorted(held[full_at:]) if full_at is not None else [len(inserted)]
    client.flushall()
    client.close()
    return {"hits": hits, "capacity": steady[len(steady) // 2], "held_min": steady[0], "held_max": steady[-1]}


def compare_lru(trace: Sequence[Hashable], value_bytes: int, maxmemory: str = "2mb",
                samples: Sequence[int] = (1, 5, 10), clocks: Sequence[str] = ("virtual",)) -> list[dict]:
    """Hit rates of Redis's sampled LRU (one server, flushed between rows) and of an exact LRU of the capacity
    Redis reached.

    Returns one dict per (clock, samples): ``clock``, ``samples``, ``capacity`` (the median number of blocks Redis
    held once full, which the exact LRU is given), ``held_min``, ``held_max``,
    ``accesses``, ``distinct``, ``redis_hits``, ``exact_hits``, ``redis_hit_rate``, ``exact_hit_rate``.
    Needs ``redis-server`` and the ``redis`` client (:class:`swkv_teach.store.RedisServer` starts the server).
    """
    from swkv_teach.store import RedisServer

    rows = []
    with RedisServer(config={"maxmemory": maxmemory, "maxmemory-policy": "allkeys-lru"}) as server:
        for clock, s in [(c, n) for c in clocks for n in samples]:
            got = redis_lru_hits(trace, server.url, s, value_bytes, clock=clock)  # flushed before and after
            exact = exact_lru_hits(trace, got["capacity"])
            rows.append({"clock": clock, "samples": s, "capacity": got["capacity"], "held_min": got["held_min"],
                         "held_max": got["held_max"], "accesses": len(trace), "distinct": len(set(trace)),
                         "redis_hits": got["hits"], "exact_hits": exact,
                         "redis_hit_rate": got["hits"] / max(1, len(trace)),
                         "exact_hit_rate": exact / max(1, len(trace))})
    return rows
