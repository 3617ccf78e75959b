"""``hf_cache``'s batch check, which runs before every forward: what its shortcut relies on.

``WindowCache.check_call`` asks layer 0 for the tokens seen instead of ``Cache.get_seq_length`` (whose
abstract-class test costs about a microsecond a step). That is the same answer as long as every layer
of a ``WindowCache`` is a ``CacheLayerMixin`` (our ``WindowLayer`` or transformers' ``DynamicLayer``),
whichever kind layer 0 is. Expectations come from the forward calls themselves: a refused call changes
nothing, an accepted one stores its tokens.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason='transformers not installed: pip install -e ".[hf]"')

from transformers.cache_utils import CacheLayerMixin, DynamicLayer  # noqa: E402

from swkv_teach.hf import hf_cache  # noqa: E402
from swkv_teach.hf_cache import WindowLayer, cache_kwarg  # noqa: E402

pytestmark = pytest.mark.hf

DIMS = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, max_position_embeddings=256, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def build(first: str):
    """A tiny Gemma 2 whose layer 0 is ``first`` ("sliding_attention" or "full_attention"), the other kind next."""
    other = "full_attention" if first == "sliding_attention" else "sliding_attention"
    torch.manual_seed(0)
    config = transformers.Gemma2Config(**DIMS, num_hidden_layers=2, sliding_window=4, layer_types=[first, other],
                                       attn_implementation="eager")
    return transformers.Gemma2ForCausalLM(config).eval()


def run(model, cache, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=True, **{cache_kwarg(model): cache}).logits


@pytest.mark.parametrize("first", ["sliding_attention", "full_attention"])
def test_a_new_batch_is_refused_while_tokens_are_held_whichever_kind_layer_0_is(first):
    model = build(first)
    cache = hf_cache(model)
    assert type(cache.layers[0]) is (WindowLayer if first == "sliding_attention" else DynamicLayer)
    assert all(isinstance(layer, CacheLayerMixin) for layer in cache.layers), "layer 0 answers for the cache"
    ids = torch.randint(0, DIMS["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(3))
    run(model, cache, ids[:1, :6])
    for step in range(6, 9):
        with pytest.raises(ValueError, match="input batch is 2 but this cache holds batch 1"):
            run(model, cache, ids[:, step: step + 1])
        assert [layer.get_seq_length() for layer in cache.layers] == [step] * 2, "the refused call changed nothing"
        run(model, cache, ids[:1, step: step + 1])
        assert cache.get_seq_length() == step + 1 == cache.layers[0].get_seq_length()


def test_emptied_layers_take_a_new_batch():
    """Layers emptied one by one (not through ``WindowCache.reset``) hold no tokens, so any batch goes; then
    the new batch is held to. Every layer slides here: transformers 5.15's ``DynamicLayer.reset`` zeroes its
    tensors and keeps them, batch included, so full layers reset one by one could not take a new batch."""
    torch.manual_seed(0)
    config = transformers.MistralConfig(**DIMS, num_hidden_layers=2, sliding_window=4)
    model = transformers.MistralForCausalLM(config).eval()
    cache = hf_cache(model)
    ids = torch.randint(0, DIMS["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(4))
    run(model, cache, ids[:1, :6])
    for layer in cache.layers:
        layer.reset()
    run(model, cache, ids[:, :3])
    assert [layer.get_seq_length() for layer in cache.layers] == [3, 3]
    with pytest.raises(ValueError, match="input batch is 1 but this cache holds batch 2"):
        run(model, cache, ids[:1, 3:4])
    cache.reset()
    run(model, cache, ids[:1, :2])
    assert cache.get_seq_length() == 2


@pytest.mark.parametrize("first", ["sliding_attention", "full_attention"])
def test_a_reset_cache_serves_a_new_sequence_as_a_fresh_one_does(first):
    """Regression (transformers 5.15): ``WindowCache.reset`` called ``DynamicLayer.reset``, which there zeroes
    the full layers' keys in place and keeps them, so a reset cache still counted the old tokens (12 after
    6 + 6) and attended over zero keys (logits off by ~2e-2). Now: the same logits as a fresh cache, any batch."""
    model = build(first)
    ids = torch.randint(0, DIMS["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(5))
    cache = hf_cache(model)
    run(model, cache, ids[:1, :6])
    cache.reset()
    got = run(model, cache, ids)
    want = run(model, hf_cache(model), ids)
    assert [layer.get_seq_length() for layer in cache.layers] == [7, 7]
    assert torch.equal(got, want)
