"""Attention over each cache equals the oracle: the full-sequence sliding-window attention."""

import pytest
import torch

from swkv_teach import (
    LRUKVCache,
    attention,
    attention_with_cache,
    cached_attention,
    make_cache,
    sliding_window_attention,
    sliding_window_mask,
)

B, H, D = 1, 2, 8


def qkv(T, device):
    g = torch.Generator().manual_seed(T)
    return [torch.randn(B, H, T, D, generator=g).to(device) for _ in range(3)]


def test_oracle_row_equals_attention_over_exactly_the_window_keys():
    """Spell the oracle's row t out by hand: softmax over keys t-W+1..t only."""
    T, W = 10, 3
    q, k, v = qkv(T, "cpu")
    out = sliding_window_attention(q, k, v, W)
    for t in range(T):
        lo = max(0, t - W + 1)
        scores = (q[:, :, t : t + 1] @ k[:, :, lo : t + 1].transpose(-1, -2)) / D**0.5
        expected = torch.softmax(scores, -1) @ v[:, :, lo : t + 1]
        torch.testing.assert_close(out[:, :, t : t + 1], expected)


def test_oracle_differs_for_neighbouring_windows():
    """An off-by-one in the window cannot pass unnoticed: W-1, W and W+1 give different outputs."""
    q, k, v = qkv(12, "cpu")
    outs = [sliding_window_attention(q, k, v, w) for w in (3, 4, 5)]
    assert not torch.allclose(outs[0], outs[1]) and not torch.allclose(outs[1], outs[2])


@pytest.mark.parametrize("kind,S", [("naive", 0), ("ring", 0), ("sinks", 2)])
@pytest.mark.parametrize("chunks", [[1] * 13, [5, 1, 1, 6], [13], [2, 3, 4, 4]])
@pytest.mark.parametrize("W", [1, 3, 4])
def test_decode_over_every_cache_equals_the_oracle(kind, S, chunks, W, device):
    T = sum(chunks)
    q, k, v = qkv(T, device)
    oracle = sliding_window_attention(q, k, v, W, num_sinks=S)
    cache = make_cache(kind, W, num_sinks=S)
    start = 0
    for c in chunks:
        sl = slice(start, start + c)
        ck, cv = cache.update(k[:, :, sl], v[:, :, sl])
        qpos = torch.arange(start, start + c, device=device)
        out = cached_attention(q[:, :, sl], ck, cv, qpos, cache.positions, W, num_sinks=S)
        torch.testing.assert_close(out, oracle[:, :, sl], atol=1e-5, rtol=1e-5)
        start += c


def test_sdpa_path_matches_the_explicit_softmax():
    q, k, v = qkv(9, "cpu")
    mask = sliding_window_mask(9, 4)
    pos = torch.arange(9)
    torch.testing.assert_close(cached_attention(q, k, v, pos, pos, 4), attention(q, k, v, mask), atol=1e-6, rtol=1e-5)


def test_attention_with_cache_reads_the_lru_without_promoting():
    c = LRUKVCache(3)
    keys = torch.randn(5, D)
    vals = torch.randn(5, D)
    for i in range(5):
        c.put(i, keys[i], vals[i])
    order_before = c.ids()
    query = torch.randn(D)
    out = attention_with_cache(query, c)
    assert c.ids() == order_before, "reading must not change what gets evicted"
    w = torch.softmax(keys[2:] @ query / D**0.5, dim=0)
    torch.testing.assert_close(out, w @ vals[2:])


def test_attention_with_an_empty_cache_is_zero():
    assert torch.equal(attention_with_cache(torch.ones(D), LRUKVCache(2)), torch.zeros(D))


def test_cached_attention_rejects_positions_that_do_not_match_the_keys():
    """Regression: one query position passed as k_positions broadcast over every key, silently."""
    q, k, v = qkv(6, "cpu")
    with pytest.raises(ValueError, match="k_positions must give one position per token of k .6"):
        cached_attention(q[:, :, -1:], k, v, torch.tensor([5]), torch.tensor([5]), 3)
    with pytest.raises(ValueError, match="q_positions"):
        cached_attention(q, k, v, torch.arange(5), torch.arange(6), 3)
