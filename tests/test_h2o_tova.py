"""Specification of the attention-evicting caches, H2OKVCache and TOVAKVCache.

What they keep is checked against a plain-Python statement of each policy
(lists and sorted(), no tensors), fed the same attention; what they return is
checked against the stream they were fed. The decoder driving them:
tests/test_h2o_tova_decoder.py.
"""

from __future__ import annotations

import pytest
import torch

from swkv_teach import H2OKVCache, KVCache, RingBufferKVCache, TOVAKVCache
from swkv_teach.caches.h2o import h2o_keep
from swkv_teach.caches.tova import tova_keep

B, H, D = 2, 2, 4


def stream(T, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, H, T, D, generator=g).to(device=device, dtype=dtype)
    v = torch.randn(B, H, T, D, generator=g).to(device=device, dtype=dtype)
    return k, v


def random_weights(q_heads, queries, positions, q_positions, g):
    """Causal attention probabilities (B, q_heads, queries, keys): query i gives 0 to keys after it."""
    logits = torch.randn(B, q_heads, queries, len(positions), generator=g, dtype=torch.float64) * 3
    allowed = positions[None, :] <= q_positions[:, None]
    return torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1).float()


# ------------------------------------------------------------------ the policies in plain Python
def reference_run(policy, budget, recent, chunks, weights_for):
    """The policy as a list of (position, score) pairs; yields the stored positions after each observe.

    Evict before writing (lowest score, oldest first among ties, H2O's `recent` newest protected);
    a chunk longer than the budget is kept whole until its attention chooses.
    """
    stored, seen = [], 0  # [position, score]
    for c in chunks:
        new = list(range(seen, seen + c))
        seen += c
        need = len(stored) + c - budget
        if c <= budget and need > 0:
            evictable = [e for e in stored if policy == "tova" or e[0] < seen - recent]
            for e in sorted(evictable, key=lambda e: (e[1], e[0]))[:need]:
                stored.remove(e)
        stored += [[p, 0.0] for p in new]
        keys = [e[0] for e in stored]
        w = weights_for(keys, new)  # (queries, keys) averaged over batch and heads, as Python lists
        for j, e in enumerate(stored):
            e[1] = w[-1][j] if policy == "tova" else e[1] + sum(row[j] for row in w)
        if len(stored) > budget:
            evictable = [e for e in stored if policy == "tova" or e[0] < seen - recent]
            for e in sorted(evictable, key=lambda e: (e[1], e[0]))[: len(stored) - budget]:
                stored.remove(e)
        yield sorted(e[0] for e in stored)


def make(policy, budget, recent):
    return TOVAKVCache(budget) if policy == "tova" else H2OKVCache(budget, recent)


CASES = [  # policy, budget, recent, chunks
    ("tova", 4, 0, [1] * 30),
    ("tova", 5, 0, [3, 1, 2, 1, 1, 4, 1, 5, 1, 1, 2]),
    ("tova", 3, 0, [7, 1, 1, 1, 6, 1, 1]),  # chunks longer than the budget
    ("tova", 1, 0, [1] * 10 + [3]),
    ("h2o", 6, 2, [1] * 30),
    ("h2o", 6, 3, [4, 1, 2, 1, 1, 3, 1, 1, 6, 1]),
    ("h2o", 4, 1, [9, 1, 1, 2, 1, 5, 1]),
    ("h2o", 5, 0, [1] * 20),  # heavy hitters only
    ("h2o", 4, 4, [1] * 12 + [3, 2]),  # all recent: a sliding window
]


@pytest.mark.parametrize("policy, budget, recent, chunks", CASES)
@pytest.mark.parametrize("q_heads", [H, 2 * H])  # grouped-query attention: 2 query heads per kv head
def test_stored_positions_follow_the_policy_at_every_step(policy, budget, recent, chunks, q_heads):
    g = torch.Generator().manual_seed(budget * 31 + recent)
    k, v = stream(sum(chunks))
    cache = make(policy, budget, recent)
    w_of_step = []

    def weights_for(keys, new):  # the step's attention, columns reordered to the reference's keys
        pos, w = w_of_step[-1]
        col = {p: j for j, p in enumerate(pos.tolist())}
        assert sorted(col) == sorted(keys), "the cache returned other keys than the policy holds"
        return w.mean(dim=(0, 1))[:, [col[p] for p in keys]].tolist()

    ref = reference_run(policy, budget, recent, chunks, weights_for)
    start = 0
    for c in chunks:
        prev = len(cache)
        rk, rv = cache.update(k[:, :, start : start + c], v[:, :, start : start + c])
        pos = cache.positions
        # what came back is what was fed at those positions, and the chunk may attend all of it
        assert torch.equal(rk, k[:, :, pos]) and torch.equal(rv, v[:, :, pos])
        assert set(range(start, start + c)) <= set(pos.tolist())
        assert len(pos) == (min(budget, prev + c) if c <= budget else prev + c)
        w = random_weights(q_heads, c, pos, torch.arange(start, start + c), g)
        w_of_step.append((pos, w))
        cache.observe(w)
        start += c
        assert cache.stored_positions().tolist() == next(ref), f"step ending at {start}"
        assert len(cache) <= budget


@pytest.mark.parametrize("policy", ["tova", "h2o"])
def test_an_old_token_that_gets_all_the_attention_outlives_the_window(policy):
    budget, T = 4, 40
    cache, ring = make(policy, budget, 2), RingBufferKVCache(budget)
    k, v = stream(T)
    for t in range(T):
        cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        ring.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        w = torch.zeros(B, H, 1, len(cache.positions))
        w[..., cache.positions == 0] = 1.0  # every query looks at token 0 only
        cache.observe(w)
    assert 0 in cache.stored_positions().tolist()
    assert 0 not in ring.stored_positions().tolist()
    assert T - 1 in cache.stored_positions().tolist()


def test_tova_evicts_the_least_attended_token_averaged_over_heads():
    cache = TOVAKVCache(3)
    k, v = stream(4)
    cache.update(k[:, :, :3], v[:, :, :3])
    w = torch.zeros(B, 4, 3, 3)
    # head 0 loves token 1, the others ignore it: averaged, token 2 is the least attended
    w[:, 0, -1] = torch.tensor([0.0, 1.0, 0.0])
    w[:, 1:, -1] = torch.tensor([0.7, 0.0, 0.3])
    cache.observe(w)
    cache.update(k[:, :, 3:4], v[:, :, 3:4])
    assert cache.stored_positions().tolist() == [0, 1, 3]


def test_h2o_never_evicts_from_the_recent_window():
    cache = H2OKVCache(4, 2)
    k, v = stream(12)
    for t in range(12):
        cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        w = torch.zeros(B, H, 1, len(cache.positions))
        w[..., cache.positions == 0] = 0.9  # token 0 is the heavy hitter; the newest get ~nothing
        w[..., cache.positions == t] += 0.1
        cache.observe(w)
        held = cache.stored_positions().tolist()
        assert {t, t - 1} & set(range(t + 1)) <= set(held), f"step {t}: recent tokens evicted, held {held}"
    assert cache.stored_positions().tolist()[0] == 0


@pytest.mark.parametrize("policy", ["tova", "h2o"])
def test_attention_that_says_nothing_degrades_to_the_sliding_window(policy):
    cache, ring = make(policy, 5, 1), RingBufferKVCache(5)
    k, v = stream(17)
    for t in range(17):
        cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        ring.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        cache.observe(torch.zeros(B, H, 1, len(cache.positions)))  # ties everywhere: oldest goes
        assert cache.stored_positions().tolist() == ring.stored_positions().tolist()


def test_h2o_with_recent_equal_to_budget_is_the_sliding_window():
    g = torch.Generator().manual_seed(3)
    cache, ring = H2OKVCache(4, 4), RingBufferKVCache(4)
    k, v = stream(20)
    for t in range(20):
        cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        ring.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        cache.observe(random_weights(H, 1, cache.positions, torch.tensor([t]), g))
        assert cache.stored_positions().tolist() == ring.stored_positions().tolist()


def test_the_oracle_functions_agree_with_the_caches():
    g = torch.Generator().manual_seed(5)
    k, v = stream(12)
    tova, h2o = TOVAKVCache(4), H2OKVCache(4, 1)
    tova.update(k[:, :, :9], v[:, :, :9])
    h2o.update(k[:, :, :9], v[:, :, :9])
    w = random_weights(H, 9, torch.arange(9), torch.arange(9), g)
    tova.observe(w)
    h2o.observe(w)
    assert tova.stored_positions().tolist() == tova_keep(w, torch.arange(9), 4).tolist()
    kept, scores = h2o_keep(torch.zeros(9), w, torch.arange(9), 4, 1)
    assert h2o.stored_positions().tolist() == kept.tolist()
    torch.testing.assert_close(h2o.scores(), scores)


# ------------------------------------------------------------------ ties, worked by hand (issue 24)
# The test above compares two functions that share eviction_order, and random weights never tie: it passed with
# ties broken the wrong way. These pin the rule "lowest score first, the OLDEST position first among ties".
def one_query(*weights):
    return torch.tensor(weights, dtype=torch.float32).view(1, 1, 1, -1)


def test_tova_keep_breaks_a_three_way_tie_by_evicting_the_oldest():
    """Keys in slot order [4, 1, 3, 0, 2], newest query's weights [0.2, 0.1, 0.1, 0.1, 0.5], budget 3:
    two must go, all from the tie at 0.1 among positions 1, 3, 0; the oldest two are 0 and 1, so 2, 3, 4 stay."""
    kept = tova_keep(one_query(0.2, 0.1, 0.1, 0.1, 0.5), torch.tensor([4, 1, 3, 0, 2]), 3)
    assert kept.tolist() == [2, 3, 4]


def test_h2o_keep_breaks_ties_oldest_first_outside_the_protected_window():
    """Positions [2, 0, 4, 1, 3] (slot order) with old scores 0, this step's weights tie 0, 1, 2 at 1/3 and give
    3 and 4 nothing; recent = 2 protects 3 and 4 (> 4 - 2). Budget 3: drop the oldest two of the tie, 0 and 1.
    Budget 2: drop all three, however low 3 and 4 score."""
    positions = torch.tensor([2, 0, 4, 1, 3])
    w = one_query(1 / 3, 1 / 3, 0.0, 1 / 3, 0.0)
    kept, scores = h2o_keep(torch.zeros(5), w, positions, 3, 2)
    assert kept.tolist() == [2, 3, 4]
    torch.testing.assert_close(scores, torch.tensor([1 / 3, 0.0, 0.0]))
    assert h2o_keep(torch.zeros(5), w, positions, 2, 2)[0].tolist() == [3, 4]


def test_h2o_keep_adds_every_query_and_the_old_scores_before_ranking():
    """Old scores [0.5, 0, 0.2] at positions [0, 1, 2]; two queries give [0.1, 0.6, 0.3] and [0.2, 0.3, 0.5]:
    totals 0.8, 0.9, 1.0 -> budget 2, recent 0 evicts 0 (0.8), though it was ahead before this step."""
    w = torch.tensor([[0.1, 0.6, 0.3], [0.2, 0.3, 0.5]]).view(1, 1, 2, 3)
    kept, scores = h2o_keep(torch.tensor([0.5, 0.0, 0.2]), w, torch.tensor([0, 1, 2]), 2, 0)
    assert kept.tolist() == [1, 2]
    torch.testing.assert_close(scores, torch.tensor([0.9, 1.0]))


def feed_one_by_one(cache, weights_per_step):
    k, v = stream(len(weights_per_step))
    for t, w in enumerate(weights_per_step):
        cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        if w is not None:
            cache.observe(torch.tensor(w).view(1, 1, 1, -1).expand(B, H, 1, -1))
    return cache


def test_the_tova_cache_evicts_the_oldest_of_a_tie():
    """Budget 3. After token 2: newest weights [0.2, 0.4, 0.4] -> token 3 evicts 0 (slots now hold 3, 1, 2).
    Weights over [3, 1, 2] = [0.4, 0.3, 0.3]: 1 and 2 tie, so token 4 evicts 1, the older: 2, 3, 4 stay."""
    cache = feed_one_by_one(TOVAKVCache(3), [[1.0], [0.5, 0.5], [0.2, 0.4, 0.4], [0.4, 0.3, 0.3], None])
    assert cache.stored_positions().tolist() == [2, 3, 4]


def test_the_h2o_cache_evicts_the_oldest_of_a_tie_and_keeps_its_recent_window():
    """Budget 3, recent 1. Scores after three steps: token 0 gets 1 + 0 + 0, token 1 gets 1 + 0, token 2 gets 1:
    a three-way tie at 1.0, so token 3 evicts 0, the oldest. With recent 1 nothing stored is protected then
    (the window is token 3 itself)."""
    cache = feed_one_by_one(H2OKVCache(3, 1), [[1.0], [0.0, 1.0], [0.0, 0.0, 1.0], None])
    assert cache.stored_positions().tolist() == [1, 2, 3]
    torch.testing.assert_close(cache.scores(), torch.tensor([1.0, 1.0, 0.0]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_any_float_dtype_and_weights_in_another_dtype(dtype, device):
    cache = H2OKVCache(3, 1)
    k, v = stream(8, dtype=dtype, device=device)
    for t in range(8):
        rk, _ = cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        assert rk.dtype == dtype and rk.device.type == torch.device(device).type
        cache.observe(torch.full((B, H, 1, len(cache.positions)), 1.0 / len(cache.positions), dtype=torch.float16, device=device))
        assert cache.positions.device.type == torch.device(device).type
    assert len(cache) == 3


@pytest.mark.parametrize("policy", ["tova", "h2o"])
def test_memory_is_flat_and_the_buffer_is_never_reallocated(policy):
    cache = make(policy, 6, 2)
    k, v = stream(200)
    g = torch.Generator().manual_seed(1)
    sizes, ptrs = set(), set()
    for t in range(200):
        cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        cache.observe(random_weights(H, 1, cache.positions, torch.tensor([t]), g))
        sizes.add(cache.nbytes)
        ptrs.add(cache.k_buf.data_ptr())
    assert sizes == {2 * B * H * 6 * D * 4} and len(ptrs) == 1


def test_instances_interleaved_do_not_share_state():
    a, b = TOVAKVCache(3), TOVAKVCache(3)
    k, v = stream(10)
    for t in range(10):
        a.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        b.update(v[:, :, t : t + 1], k[:, :, t : t + 1])
        wa = torch.zeros(B, H, 1, len(a.positions))
        wa[..., a.positions == 0] = 1
        a.observe(wa)
        b.observe(torch.zeros(B, H, 1, len(b.positions)))
    assert a.stored_positions().tolist() == [0, 8, 9]
    assert b.stored_positions().tolist() == [7, 8, 9]


def test_reset_starts_a_new_sequence_with_another_shape():
    cache = H2OKVCache(3, 1)
    cache.update(*stream(5))
    cache.observe(torch.ones(B, H, 5, 5) / 5)
    cache.reset()
    assert len(cache) == 0 and cache.seen == 0 and cache.nbytes == 0
    k = torch.randn(1, 1, 2, 8)
    rk, _ = cache.update(k, k)
    assert rk.shape == (1, 1, 2, 8) and cache.positions.tolist() == [0, 1]


def test_a_cache_that_does_not_want_attention_ignores_observe():
    ring = RingBufferKVCache(3)
    assert KVCache.wants_attention is False and ring.wants_attention is False
    assert ring.observe(torch.ones(1)) is None
    assert TOVAKVCache.wants_attention and H2OKVCache.wants_attention


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "build, err, words",
    [
        (lambda: TOVAKVCache(0), ValueError, "budget"),
        (lambda: TOVAKVCache(2.0), TypeError, "budget"),
        (lambda: TOVAKVCache(True), TypeError, "budget"),
        (lambda: H2OKVCache(4, 5), ValueError, "recent=5, budget=4"),
        (lambda: H2OKVCache(4, -1), ValueError, "recent"),
        (lambda: H2OKVCache(4, None), TypeError, "recent"),
    ],
)
def test_bad_sizes_name_the_argument(build, err, words):
    with pytest.raises(err, match=words):
        build()


@pytest.mark.parametrize(
    "weights, err, words",
    [
        (lambda n: torch.ones(B, H, 1, n + 1), ValueError, "keys="),
        (lambda n: torch.ones(B, H, 2, n), ValueError, "queries=1"),
        (lambda n: torch.ones(B + 1, H, 1, n), ValueError, f"batch={B}"),
        (lambda n: torch.ones(B, H + 1, 1, n), ValueError, f"multiple of {H}"),
        (lambda n: torch.ones(B, 0, 1, n), ValueError, f"multiple of {H}"),
        (lambda n: torch.ones(H, 1, n), ValueError, "got shape"),
        (lambda n: torch.ones(B, H, 1, n, dtype=torch.long), TypeError, "floating"),
        (lambda n: [[0.5]], TypeError, "floating"),
    ],
)
def test_bad_weights_name_the_shape_expected_and_change_nothing(weights, err, words):
    cache = TOVAKVCache(3)
    k, v = stream(5)
    for t in range(4):
        cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        cache.observe(torch.zeros(B, H, 1, len(cache.positions)))
    cache.update(k[:, :, 4:5], v[:, :, 4:5])
    before = (cache.stored_positions().tolist(), cache.scores().tolist())
    with pytest.raises(err, match=words):
        cache.observe(weights(len(cache.positions)))
    assert (cache.stored_positions().tolist(), cache.scores().tolist()) == before
    cache.observe(torch.zeros(B, H, 1, 3))  # still usable


def test_observe_needs_an_update_first_and_only_once():
    cache = H2OKVCache(3, 1)
    with pytest.raises(RuntimeError, match="call update"):
        cache.observe(torch.ones(B, H, 1, 1))
    cache.update(*stream(1))
    cache.observe(torch.ones(B, H, 1, 1))
    with pytest.raises(RuntimeError, match="once"):
        cache.observe(torch.ones(B, H, 1, 1))  # would count the same attention twice


def test_an_over_budget_chunk_must_be_observed_before_the_next_update():
    cache = TOVAKVCache(2)
    k, v = stream(6)
    rk, _ = cache.update(k[:, :, :5], v[:, :, :5])
    assert rk.shape[2] == 5 and len(cache) == 5
    with pytest.raises(RuntimeError, match="observe"):
        cache.update(k[:, :, 5:6], v[:, :, 5:6])
    cache.observe(torch.ones(B, H, 5, 5) / 5)
    assert len(cache) == 2
    cache.update(k[:, :, 5:6], v[:, :, 5:6])
    assert cache.seen == 6


def test_a_rejected_update_leaves_the_cache_as_it_was():
    cache = TOVAKVCache(3)
    cache.update(*stream(2))
    cache.observe(torch.ones(B, H, 2, 2) / 2)
    with pytest.raises(ValueError, match="heads"):
        cache.update(torch.ones(B, H + 1, 1, D), torch.ones(B, H + 1, 1, D))
    assert cache.seen == 2 and cache.stored_positions().tolist() == [0, 1]
