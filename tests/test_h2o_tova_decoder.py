"""The decoder driving H2OKVCache and TOVAKVCache: equal to a full-sequence oracle that masks exactly the keys
they evicted; each layer's cache shown its own attention; TOVA(B) deciding as the released TOVACache(B - 1)."""

from __future__ import annotations

import pytest
import torch

from swkv_teach import Decoder, DecoderConfig, H2OKVCache, KVCache, TOVAKVCache
from swkv_teach.attention import attention
from swkv_teach.masks import window_mask
from swkv_teach.model import LayerCaches
from tests.test_h2o_tova import make


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
