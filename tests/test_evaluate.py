"""swkv_teach.evaluate: segments, bootstrap intervals, policy losses against cached scoring, sink shares."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from swkv_teach.evaluate import (
    Interval,
    attention_maps,
    heldout_segments,
    interval,
    paired_difference,
    position_losses,
    ratio_interval,
    sink_shares,
    streaming_losses,
)
from swkv_teach.masks import window_mask
from swkv_teach.model import Decoder, DecoderConfig
from swkv_teach.pretrained import CharTokenizer


def tiny(window=100, seed=0):
    torch.manual_seed(seed)
    cfg = DecoderConfig(vocab_size=98, dim=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=4, hidden_dim=24,
                        window_size=window)
    model = Decoder(cfg).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.attn.qkv_proj.weight.mul_(8)
    return model


def per_position(logits, ids):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="none").view(ids.shape[0], -1)


# ----------------------------------------------------------------------------- segments
def test_segments_are_consecutive_non_overlapping_pieces_of_the_text():
    tok = CharTokenizer()
    text = "".join(chr(33 + i % 90) for i in range(1000))
    seg = heldout_segments(tok, length=99, text=text)
    assert seg.shape == (10, 100)  # 1000 // 100 rows, the tail dropped
    for r in (0, 3, 9):
        assert tok.decode(seg[r]) == text[100 * r : 100 * (r + 1)]
    assert heldout_segments(tok, 99, text, max_segments=4).shape == (4, 100)


def test_the_default_text_is_the_held_out_files_at_least_20000_characters():
    from swkv_teach.train import HELDOUT_FILES, read_stdlib

    try:
        text, _ = read_stdlib(HELDOUT_FILES)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    seg = heldout_segments(CharTokenizer(), 256)
    assert len(text) >= 20_000 and seg.shape == (len(text) // 257, 257)


def test_too_short_a_text_is_refused():
    with pytest.raises(ValueError, match="at least two segments"):
        heldout_segments(CharTokenizer(), 256, text="x" * 300)


# ----------------------------------------------------------------------------- intervals
def test_constant_values_have_a_zero_width_interval():
    assert interval(torch.full((30,), 1.25)) == Interval(1.25, 1.25, 1.25)


def test_bootstrap_interval_matches_normal_theory_on_many_samples():
    """400 standard normal draws: the 95 % interval of the mean is mean +- 1.96 / sqrt(400) = +- 0.098 (second method)."""
    x = torch.randn(400, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ci = interval(x, n_boot=4000)
    half = 1.96 * x.std().item() / 20
    assert ci.mean == pytest.approx(x.mean().item())
    assert ci.high - ci.mean == pytest.approx(half, rel=0.15) and ci.mean - ci.low == pytest.approx(half, rel=0.15)


def test_paired_difference_sees_a_constant_gain_that_overlapping_intervals_hide():
    g = torch.Generator().manual_seed(1)
    a = 1.5 + 0.3 * torch.randn(50, generator=g, dtype=torch.float64)  # segments differ a lot
    b = a - 0.01  # B beats A by 0.01 on every segment
    ia, ib = interval(a), interval(b)
    assert ib.high > ia.low  # the two intervals overlap ...
    d = paired_difference(a, b)
    assert d.mean == pytest.approx(0.01) and d.excludes_zero and d.low == pytest.approx(0.01)  # ... the pairs do not


def test_paired_difference_of_noise_includes_zero():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(60, generator=g, dtype=torch.float64)
    b = a + 0.5 * torch.randn(60, generator=g, dtype=torch.float64) * torch.tensor([1.0, -1.0]).repeat(30)
    assert paired_difference(a, b).low < 0 < paired_difference(a, b).high


def test_interval_arguments_are_checked():
    with pytest.raises(ValueError, match="at least two segments"):
        interval([1.0])
    with pytest.raises(ValueError, match="level must be in"):
        interval([1.0, 2.0], level=95)
    with pytest.raises(ValueError, match="same segments"):
        paired_difference([1.0, 2.0], [1.0, 2.0, 3.0])
    assert str(Interval(1.0, 0.5, 1.5)) == "1.000 [0.500, 1.500]"


def test_ratio_interval_resamples_units_whole_by_hand():
    """[1, 3] / [2, 2]: a resample of two units holds unit 0 twice (0.5), both (1.0) or unit 1 twice (1.5)."""
    got = ratio_interval([1, 3], [2, 2], n_boot=4000)
    assert got.mean == 1.0
    assert (got.low, got.high) == (0.5, 1.5)


def test_ratio_interval_is_a_ratio_of_sums_not_a_mean_of_ratios():
    """1 of 10 drafts kept in one prompt, 30 of 100 in another: 31 / 110, not (0.1 + 0.3) / 2."""
    got = ratio_interval([1, 30], [10, 100])
    assert got.mean == pytest.approx(31 / 110)
    assert got.low == pytest.approx(0.1) and got.high == pytest.approx(0.3)  # both units alone are the extremes


def test_ratio_interval_narrows_with_more_units_of_the_same_rate():
    g = torch.Generator().manual_seed(0)
    den = torch.randint(20, 40, (200,), generator=g).double()
    num = torch.distributions.Binomial(den, torch.full_like(den, 0.6)).sample()
    few, many = ratio_interval(num[:10], den[:10]), ratio_interval(num, den)
    assert many.low < 0.6 < many.high
    assert many.high - many.low < (few.high - few.low) / 2  # about 1/sqrt(20) as wide


def test_ratio_interval_arguments_are_checked():
    with pytest.raises(ValueError, match="same units"):
        ratio_interval([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="at least two units"):
        ratio_interval([1], [2])
    with pytest.raises(ValueError, match="every denominator must be > 0"):
        ratio_interval([1, 0], [2, 0])
    with pytest.raises(ValueError, match="level must be in"):
        ratio_interval([1, 2], [2, 2], level=95)


# ----------------------------------------------------------------------------- policy losses
@pytest.fixture
def seg():
    return torch.randint(0, 98, (3, 41), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("budget", [5, 8, 40])
def test_window_losses_are_the_ring_caches_cached_scoring(seg, budget):
    model = tiny()
    expected = per_position(model.score(seg, "ring", window_size=budget), seg)
    torch.testing.assert_close(position_losses(model, seg, "window", budget), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("budget,sinks", [(8, 4), (6, 1), (12, 2)])
def test_sinks_losses_are_the_sink_caches_cached_scoring(seg, budget, sinks):
    model = tiny()
    expected = per_position(model.score(seg, "sinks", num_sinks=sinks, window_size=budget - sinks), seg)
    got = position_losses(model, seg, "sinks + window", budget, num_sinks=sinks)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_dense_ignores_the_models_window():
    model = tiny(window=4)
    ids = torch.randint(0, 98, (2, 30), generator=torch.Generator().manual_seed(4))
    wide = tiny(window=1000)  # the same weights (same seed), a window wider than the text
    torch.testing.assert_close(position_losses(model, ids, "dense", 8), per_position(wide(ids), ids)[:, :],
                               atol=1e-5, rtol=1e-5)
    assert set(streaming_losses(model, ids, 8)) == {"dense", "window", "sinks + window", "sinks + window, cache positions"}


def test_bad_policy_and_budget_are_named(seg):
    model = tiny()
    with pytest.raises(ValueError, match="policy must be one of"):
        position_losses(model, seg, "fifo", 8)
    with pytest.raises(ValueError, match="budget must exceed num_sinks=4"):
        position_losses(model, seg, "sinks + window", 4)


# ----------------------------------------------------------------------------- attention and sinks
@pytest.mark.parametrize("window", [100, 5])
def test_attention_maps_are_probabilities_under_the_mask_and_layer_0_is_by_hand(window):
    model = tiny(window)
    ids = torch.randint(0, 98, (2, 12), generator=torch.Generator().manual_seed(6))
    maps = attention_maps(model, ids)
    pos = torch.arange(12)
    allowed = window_mask(pos, pos, window)
    for w in maps:
        assert w.shape == (2, 4, 12, 12)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 12))
        assert (w[..., ~allowed] == 0).all()
    # layer 0 by hand: softmax(q k^T / sqrt(d)) of the first block's projections, masked
    layer = model.layers[0]
    with torch.no_grad():
        q, k, _ = layer.attn.qkv(layer.attn_norm(model.embed(ids)), pos)
        k = k.repeat_interleave(2, dim=1)
        s = (q @ k.transpose(-2, -1) / 2.0).masked_fill(~allowed, float("-inf"))
    torch.testing.assert_close(maps[0], torch.softmax(s, -1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("window,first", [(100, 1), (100, 3), (8, 1), (8, 2)])
def test_uniform_attention_puts_exactly_chance_on_the_first_tokens(window, first):
    """Zero queries and keys: every head spreads attention evenly over what it sees, so its share is chance."""
    model = tiny(window)
    with torch.no_grad():
        model.layers[0].attn.qkv_proj.weight[: (4 + 2) * 4].zero_()  # q and k rows of layer 0
    ids = torch.randint(0, 98, (2, 40), generator=torch.Generator().manual_seed(7))
    shares, chance = sink_shares(model, ids, first=first, queries=slice(4, None))
    # by hand: query i sees the keys i - W < j <= i; chance is the fraction of them with j < first
    by_hand = [sum(1 for j in range(first) if i - window < j <= i) / min(i + 1, window) for i in range(4, 40)]
    assert chance[0].item() == pytest.approx(sum(by_hand) / len(by_hand))
    torch.testing.assert_close(shares[0], torch.full((4,), chance[0].item()), atol=1e-6, rtol=1e-5)
    assert shares.shape == (2, 4)


def test_sink_shares_needs_some_queries():
    with pytest.raises(ValueError, match="queries must select"):
        sink_shares(tiny(), torch.zeros(1, 5, dtype=torch.long), queries=slice(10, None))


# ----------------------------------------------------------------------------- StreamingLLM's cache positions
def streamingllm_by_hand(model, ids, budget, sinks):
    """Query by query: the cache holds the first `sinks` and the last `budget - sinks` tokens, each key rotated by
    its slot in the cache (keys kept before RoPE, as StreamingLLM's pos_shift does), the query by its own slot."""
    from swkv_teach.model import apply_rotary, rotary

    c = model.config
    T = ids.shape[1]
    x = model.embed(ids)
    for layer in model.layers:
        h = layer.attn_norm(x)
        q_raw, k_raw, v = layer.attn.qkv(h, torch.zeros(T, dtype=torch.long))  # rotation by 0: before RoPE
        outs = []
        for i in range(T):
            kept = sorted(set(range(min(sinks, i + 1))) | set(range(max(0, i - (budget - sinks) + 1), i + 1)))
            slots = torch.arange(len(kept))
            cos, sin = rotary(slots, c.head_dim, c.rope_theta, torch.float32)
            k = apply_rotary(k_raw[:, :, kept], cos, sin).repeat_interleave(2, dim=1)
            qc, qs = rotary(torch.tensor([len(kept) - 1]), c.head_dim, c.rope_theta, torch.float32)
            q = apply_rotary(q_raw[:, :, i : i + 1], qc, qs)
            w = torch.softmax(q @ k.transpose(-2, -1) / c.head_dim**0.5, dim=-1)
            outs.append(w @ v[:, :, kept].repeat_interleave(2, dim=1))
        y = torch.cat(outs, dim=2).transpose(1, 2).reshape(ids.shape[0], T, -1)
        x = x + layer.attn.o_proj(y)
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


@pytest.mark.parametrize("budget,sinks", [(6, 2), (8, 4), (5, 1)])
def test_cache_positions_match_streamingllm_done_query_by_query(budget, sinks):
    from swkv_teach.evaluate import sinks_in_cache_positions

    model = tiny()
    ids = torch.randint(0, 98, (2, 23), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        expected = per_position(streamingllm_by_hand(model, ids, budget, sinks), ids)
    torch.testing.assert_close(sinks_in_cache_positions(model, ids, budget, sinks), expected, atol=1e-5, rtol=1e-5)


def test_cache_positions_change_nothing_until_the_cache_is_full_and_then_differ():
    from swkv_teach.evaluate import sinks_in_cache_positions

    model = tiny()
    ids = torch.randint(0, 98, (2, 30), generator=torch.Generator().manual_seed(9))
    true_pos = position_losses(model, ids, "sinks + window", 8, num_sinks=2)
    cache_pos = sinks_in_cache_positions(model, ids, 8, 2)
    torch.testing.assert_close(cache_pos[:, :8], true_pos[:, :8], atol=1e-5, rtol=1e-5)  # positions 0..7: same slots
    assert not torch.allclose(cache_pos[:, 9:], true_pos[:, 9:], atol=1e-4)
