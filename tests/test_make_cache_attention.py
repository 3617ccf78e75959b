"""make_cache("h2o" | "tova"): the attention-evicting caches by name, with H2O's recent window as a parameter."""

from __future__ import annotations

import pytest
import torch

from swkv_teach.caches import ATTENTION_KINDS, CACHE_KINDS, H2OKVCache, TOVAKVCache, make_cache


def drive(cache, attention_on, steps):
    """Feed one token per step; the newest query puts all its attention on position ``attention_on``."""
    for t in range(steps):
        k = torch.randn(1, 1, 1, 2)
        cache.update(k, k)
        w = torch.zeros(1, 2, 1, len(cache.positions))
        w[..., cache.positions == min(attention_on, t)] = 1.0
        cache.observe(w)
    return cache.stored_positions().tolist()


def test_the_kinds_are_named_apart_from_the_decoders_kinds():
    assert ATTENTION_KINDS == ("h2o", "tova")
    assert not set(ATTENTION_KINDS) & set(CACHE_KINDS)  # Decoder.new_caches would mask with the budget


def test_h2o_by_name_is_budget_with_half_recent_by_default():
    cache = make_cache("h2o", 6)
    assert isinstance(cache, H2OKVCache) and (cache.budget, cache.recent) == (6, 3)
    # by hand: budget 6, all attention on token 0, so every other token scores 0 and ties evict the oldest:
    # after 10 tokens token 0 (the heavy hitter) and the five newest, 5..9 (7, 8, 9 being the protected recent)
    assert drive(cache, 0, 10) == [0, 5, 6, 7, 8, 9]


@pytest.mark.parametrize("recent,kept", [(0, [0, 5, 6, 7, 8, 9]), (6, [4, 5, 6, 7, 8, 9]), (2, [0, 5, 6, 7, 8, 9])])
def test_h2o_recent_is_passed_through(recent, kept):
    cache = make_cache("h2o", 6, recent=recent)
    assert cache.recent == recent
    assert drive(cache, 0, 10) == kept  # recent = budget is a window of 6: token 0 goes


def test_tova_by_name_keeps_what_the_newest_query_reads():
    cache = make_cache("tova", 3)
    assert isinstance(cache, TOVAKVCache) and cache.budget == 3
    assert drive(cache, 0, 8) == [0, 6, 7]  # 0 always read; the others tie at 0 and the oldest goes


@pytest.mark.parametrize("kind", ["ring", "sinks", "tova"])
def test_recent_is_refused_for_kinds_without_one(kind):
    with pytest.raises(ValueError, match=r"recent is H2O's recent window, for kind 'h2o' only"):
        make_cache(kind, 4, recent=2)


def test_bad_h2o_parameters_are_named():
    with pytest.raises(ValueError, match="recent must be <= budget"):
        make_cache("h2o", 4, recent=5)
    with pytest.raises(ValueError, match="budget"):
        make_cache("h2o", 0)


def test_unknown_kind_lists_every_kind():
    with pytest.raises(ValueError, match=r"'h2o', 'tova'\); got 'heavy'"):
        make_cache("heavy", 4)
