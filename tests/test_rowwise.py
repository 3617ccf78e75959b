"""rowwise_losses: each row evicts as the library's own cache would, driven one token at a time through Decoder.step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from swkv_teach.caches import H2OKVCache, LRUKVCache, TOVAKVCache
from swkv_teach.model import Decoder, DecoderConfig, LayerCaches
from swkv_teach.rowwise import rowwise_losses


class AttentionReadLRU(LRUKVCache):
    """Lesson 8's LRU: each step the key the newest query attends to most (head average) is read, which promotes it."""

    wants_attention = True

    def observe(self, weights):
        newest = weights.float().mean(dim=(0, 1))[-1]
        self.get(int(self.positions[int(newest.argmax())]))


def reference_losses(model, ids, make, window):
    """Per-position losses of each row alone, through the real caches and Decoder.step (the second method)."""
    out = []
    for row in ids:
        caches = LayerCaches([make() for _ in model.layers], window, 0)
        x, y = row[None, :-1], row[None, 1:]
        logits = torch.cat([model.step(x[:, t : t + 1], caches) for t in range(x.shape[1])], dim=1)
        out.append(F.cross_entropy(logits[0], y[0], reduction="none"))
    return torch.stack(out)


def tiny(window, seed=0, n_kv_heads=2):
    torch.manual_seed(seed)
    cfg = DecoderConfig(vocab_size=11, dim=16, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, head_dim=4,
                        hidden_dim=24, window_size=window)
    model = Decoder(cfg).eval()
    with torch.no_grad():  # sharper attention than the init's near-uniform one, so evictions differ
        for layer in model.layers:
            layer.attn.qkv_proj.weight.mul_(8)
    return model


CASES = [  # (kind, budget, recent, model window): budget 1 and the boundary, recent 0 and = budget, a mask at W < T
    ("h2o", 5, 2, 100), ("h2o", 5, 0, 100), ("h2o", 4, 4, 100), ("h2o", 6, 3, 7), ("h2o", 1, 0, 100),
    ("tova", 5, None, 100), ("tova", 1, None, 100), ("tova", 6, None, 7),
    ("lru", 5, None, 100), ("lru", 6, None, 7), ("lru", 2, None, 100),
]


@pytest.mark.parametrize("kind,budget,recent,window", CASES)
def test_each_row_evicts_as_the_library_cache_does_alone(kind, budget, recent, window):
    model = tiny(window, seed=budget)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 11, (3, 19), generator=g)
    make = {"h2o": lambda: H2OKVCache(budget, budget // 2 if recent is None else recent),
            "tova": lambda: TOVAKVCache(budget), "lru": lambda: AttentionReadLRU(budget)}[kind]
    expected = reference_losses(model, ids, make, window)
    got = rowwise_losses(model, ids, kind, budget, recent)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_h2o_with_every_slot_recent_is_the_window_forward():
    """recent = budget keeps the newest budget tokens: the oracle with window = budget (a different method)."""
    model = tiny(100, n_kv_heads=1)
    ids = torch.randint(0, 11, (4, 25), generator=torch.Generator().manual_seed(1))
    logits = model(ids[:, :-1], window_size=6)
    expected = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none").view(4, 24)
    torch.testing.assert_close(rowwise_losses(model, ids, "h2o", 6, recent=6), expected, atol=1e-5, rtol=1e-5)


def test_a_budget_past_the_text_evicts_nothing_and_equals_the_forward():
    model = tiny(100)
    ids = torch.randint(0, 11, (2, 10), generator=torch.Generator().manual_seed(2))
    logits = model(ids[:, :-1])
    expected = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none").view(2, 9)
    for kind in ("h2o", "tova", "lru"):
        torch.testing.assert_close(rowwise_losses(model, ids, kind, 9), expected, atol=1e-5, rtol=1e-5)


def test_rows_decide_independently():
    """A row's losses do not depend on the other rows in the batch (the library caches would share one decision)."""
    model = tiny(100)
    ids = torch.randint(0, 11, (4, 20), generator=torch.Generator().manual_seed(3))
    together = rowwise_losses(model, ids, "tova", 4)
    alone = torch.cat([rowwise_losses(model, ids[r : r + 1], "tova", 4) for r in range(4)])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(kind="ring", budget=4), "kind must be one of"),
    (dict(kind="h2o", budget=0), "budget"),
    (dict(kind="h2o", budget=4, recent=5), "recent must be <= budget"),
    (dict(kind="h2o", budget=4, recent=-1), "recent"),
])
def test_bad_arguments_are_named(kwargs, match):
    model = tiny(100)
    with pytest.raises(ValueError, match=match):
        rowwise_losses(model, torch.zeros(1, 5, dtype=torch.long), **kwargs)


def test_ids_must_be_rows_of_at_least_two_tokens():
    with pytest.raises(ValueError, match=r"ids must be a 2-D long tensor"):
        rowwise_losses(tiny(100), torch.zeros(1, 1, dtype=torch.long), "tova", 2)


@pytest.mark.parametrize("budget", [1, 3, 5])
def test_ties_evict_the_oldest_position(budget):
    """Guards "ties to the oldest position": with the query and key projections zeroed every score ties (uniform
    attention), so TOVA evicting the oldest keeps the newest ``budget`` tokens, which is the window forward
    with ``window_size = budget`` (a second method). Ties broken towards the newest keep other tokens."""
    model = tiny(100)
    c = model.config
    with torch.no_grad():
        for layer in model.layers:
            layer.attn.qkv_proj.weight[: (c.n_heads + c.n_kv_heads) * c.head_dim] = 0.0
    ids = torch.randint(0, 11, (3, 16), generator=torch.Generator().manual_seed(5))
    logits = model(ids[:, :-1], window_size=budget)
    expected = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none").view(3, 15)
    torch.testing.assert_close(rowwise_losses(model, ids, "tova", budget), expected, atol=1e-5, rtol=1e-5)
