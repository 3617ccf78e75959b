"""Specification of the attention-evicting caches, H2OKVCache and TOVAKVCache.

What they keep is checked against a plain-Python statement of each policy
(lists and sorted(), no tensors), fed the same attention; what they return is
checked against the stream they were fed; the decoder driving them is checked
against a full-sequence forward that masks exactly the keys they had evicted.
"""

from __future__ import annotations

import pytest
import torch

from swkv_teach import Decoder, DecoderConfig, H2OKVCache, KVCache, RingBufferKVCache, TOVAKVCache
from swkv_teach.attention import attention
from swkv_teach.caches.h2o import h2o_keep
from swkv_teach.caches.tova import tova_keep
from swkv_teach.masks import window_mask
from swkv_teach.model import LayerCaches, apply_rotary, rotary

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


# ------------------------------------------------------------------ the decoder with these caches
def tiny_decoder(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=32, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, hidden_dim=48, window_size=6)
    return Decoder(DecoderConfig(**{**cfg, **kw})).eval()


def oracle_with_kept_keys(model, ids, kept, window_size):
    """Full-sequence forward where query i of layer l sees only kept[l][i] (and j <= i, inside the window).

    Written from the decoder's own modules, attention spelled out with a mask per query, no cache.
    """
    B, T = ids.shape
    pos = torch.arange(T)
    x = model.embed(ids)
    probs = []
    for layer, allowed_sets in zip(model.layers, kept):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), pos)
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        mask = torch.zeros(T, T, dtype=torch.bool)
        for i, allowed in enumerate(allowed_sets):
            mask[i, allowed] = True
        mask &= window_mask(pos, pos, window_size)
        y = attention(q, k, v, mask)  # (B, nh, T, hd)
        scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~mask, float("-inf"))
        probs.append(torch.softmax(scores, dim=-1))  # (B, nh, T, T)
        x = x + layer.attn.o_proj(y.transpose(1, 2).reshape(B, T, -1))
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x)), probs


@pytest.mark.parametrize("policy, budget, recent", [("tova", 4, 0), ("h2o", 5, 2), ("h2o", 3, 0), ("tova", 1, 0)])
@pytest.mark.parametrize("chunks", [[1] * 24, [7, 1, 1, 3, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1]])
@pytest.mark.parametrize("window", [6, 10_000])  # the model's window as the mask, or none
def test_decoder_with_these_caches_equals_the_oracle_masking_what_they_evicted(policy, budget, recent, chunks, window):
    model = tiny_decoder()
    T = sum(chunks)
    ids = torch.randint(0, 32, (2, T), generator=torch.Generator().manual_seed(1))
    caches = LayerCaches([make(policy, budget, recent) for _ in model.layers], window)
    kept = [[None] * T for _ in model.layers]  # per layer, per query position: the keys it was given
    logits, start = [], 0
    for c in chunks:
        logits.append(model.step(ids[:, start : start + c], caches))
        for layer_kept, cache in zip(kept, caches):
            for i in range(start, start + c):
                layer_kept[i] = cache.positions.tolist()
            assert len(cache) <= budget
        start += c
    cached = torch.cat(logits, dim=1)
    with torch.no_grad():
        expected, probs = oracle_with_kept_keys(model, ids, kept, window)
    torch.testing.assert_close(cached, expected, atol=2e-5, rtol=1e-4)
    # each layer's cache was shown its own layer's attention: TOVA's scores are the last query's row
    if policy == "tova":
        for cache, p in zip(caches, probs):
            stored = cache.stored_positions()
            torch.testing.assert_close(cache.scores(), p[:, :, T - 1, stored].mean(dim=(0, 1)), atol=1e-5, rtol=1e-4)
    # and the caches did evict: some query of the last layer missed a key its window would have shown it
    last_query = kept[-1][T - 1]
    assert len(last_query) <= max(budget, 1) < min(window, T)


def test_a_budget_larger_than_the_sequence_evicts_nothing_and_equals_forward():
    model = tiny_decoder(window_size=8)
    ids = torch.randint(0, 32, (1, 20), generator=torch.Generator().manual_seed(2))
    for cache_of in (lambda: TOVAKVCache(20), lambda: H2OKVCache(20, 3)):
        caches = LayerCaches([cache_of() for _ in model.layers], 8)
        got = torch.cat([model.step(ids[:, t : t + 1], caches) for t in range(20)], dim=1)
        with torch.no_grad():
            torch.testing.assert_close(got, model(ids), atol=2e-5, rtol=1e-4)


def test_every_layer_observes_its_own_attention():
    model = tiny_decoder()
    caches = LayerCaches([TOVAKVCache(3) for _ in model.layers], 6)
    ids = torch.randint(0, 32, (1, 12), generator=torch.Generator().manual_seed(3))
    for t in range(12):
        model.step(ids[:, t : t + 1], caches)
    a, b = (c.scores() for c in caches)
    torch.testing.assert_close(a.sum(), torch.tensor(1.0))  # the newest query's row over the 3 keys it saw
    assert not torch.equal(a, b), "both layers scored the same: one layer's weights went to both caches"


class PublishedTOVA(KVCache):
    """The released TOVACache's order (schwartz-lab-NLP/TOVA src/tova_cache.py): attend over the stored keys
    plus the new ones, then keep the top ``cache_size`` of the newest query's head-averaged row (batch 1)."""

    wants_attention = True

    def __init__(self, cache_size):
        self.cache_size, self.k, self.v, self.pos, self._seen = cache_size, None, None, [], 0

    def update(self, k_new, v_new):
        c = k_new.shape[2]
        self.k = k_new if self.k is None else torch.cat([self.k, k_new], dim=2)
        self.v = v_new if self.v is None else torch.cat([self.v, v_new], dim=2)
        self.pos += list(range(self._seen, self._seen + c))
        self._seen += c
        return self.k, self.v

    def observe(self, weights):
        if len(self.pos) <= self.cache_size:
            return
        mean = weights[:, :, -1, :].float().mean(dim=1)[0]  # tova_cache.py line 44
        ind = torch.sort(torch.topk(mean, self.cache_size).indices).values  # lines 45-46
        self.k, self.v = self.k[:, :, ind], self.v[:, :, ind]
        self.pos = [self.pos[i] for i in ind.tolist()]

    positions = property(lambda self: torch.tensor(self.pos))
    seen = property(lambda self: self._seen)
    nbytes = property(lambda self: 0)
    reset = __len__ = None


@pytest.mark.parametrize("budget", [2, 4, 7])
@pytest.mark.parametrize("prompt", [1, 5, 11])
def test_tova_with_budget_b_decides_as_the_released_cache_with_b_minus_1(budget, prompt):
    """Both attend over B keys per decode step: ours evicts before writing, the released code after attending."""
    model = tiny_decoder(seed=budget)
    ids = torch.randint(0, 32, (1, prompt + 20), generator=torch.Generator().manual_seed(prompt))
    ours = LayerCaches([TOVAKVCache(budget) for _ in model.layers], 10_000)
    theirs = LayerCaches([PublishedTOVA(budget - 1) for _ in model.layers], 10_000)
    logits = [(model.step(ids[:, :prompt], ours), model.step(ids[:, :prompt], theirs))]
    for t in range(prompt, ids.shape[1]):
        logits.append((model.step(ids[:, t : t + 1], ours), model.step(ids[:, t : t + 1], theirs)))
        for a, b in zip(ours, theirs):  # theirs has evicted already what ours evicts at the next step
            assert set(b.pos) <= set(a.stored_positions().tolist()) and len(a) - len(b.pos) <= 1, f"step {t}"
    for a, b in logits:
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
