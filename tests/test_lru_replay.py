"""Exact LRU vs Redis's sampled LRU (swkv_teach.bench.lru_replay), on traces whose answers are worked by hand."""

from __future__ import annotations

from swkv_teach.bench.lru_replay import compare_lru, exact_lru_hits
from tests.redis_fixture import require_redis


def test_exact_lru_by_hand():
    # capacity 2: a b a c b -> a miss, b miss, a hit (a most recent), c miss evicts b, b miss
    assert exact_lru_hits("abacb", 2) == 1
    # capacity 3, a loop over 4 keys: LRU always evicts the key needed next, so never a hit
    assert exact_lru_hits("abcd" * 10, 3) == 0
    assert exact_lru_hits("abcd" * 10, 4) == 36


def test_redis_replay_on_a_trace_that_fits_and_on_a_loop_one_larger_than_the_capacity():
    require_redis()
    fits = [i % 5 for i in range(60)]  # 5 distinct blocks, far below the capacity: every re-access hits
    for row in compare_lru(fits, value_bytes=8000, maxmemory="1500kb", samples=(5,), clocks=("virtual", "wall")):
        assert row["capacity"] == 5 and row["redis_hits"] == row["exact_hits"] == 55, row  # never full
    row = compare_lru(list(range(300)), value_bytes=8000, maxmemory="1500kb", samples=(5,))[0]
    assert 8 < row["capacity"] < 200 and row["redis_hits"] == 0, row  # ~40 blocks of 8 kB over an empty ~1 MB
    assert row["held_max"] - row["held_min"] <= 6, row  # evictions overshoot maxmemory by a few blocks
    loop = [i % (row["capacity"] + 1) for i in range(6 * (row["capacity"] + 1))]
    assert exact_lru_hits(loop, row["capacity"]) == 0  # exact LRU's worst case: a loop one block longer than it
    got = compare_lru(loop, value_bytes=8000, maxmemory="1500kb", samples=(1,))[0]
    assert got["redis_hits"] > 0, got  # sampling evicts at random among the oldest, so some blocks survive a lap
