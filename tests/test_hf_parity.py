"""Our decoder against Hugging Face's Mistral: same weights, same logits, same greedy tokens.

A tiny random ``MistralConfig`` (2 layers, hidden 64, 4 heads, 2 kv heads,
sliding window 8) is built locally; nothing is downloaded. Hugging Face's
full forward is the reference for ``forward`` and for ``score`` through
every cache kind that should equal it; its ``generate`` (with its own
sliding-window cache) is the reference for ours.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers", reason='transformers not installed: pip install -e ".[hf]"')

from swkv_teach.hf import config_from_hf, from_hf  # noqa: E402
from swkv_teach.model import Decoder  # noqa: E402

pytestmark = pytest.mark.hf

W = 8
TOL = 1e-4


def make_hf(window: int = W, attn: str = "eager", tie: bool = False):
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=window,
        max_position_embeddings=512,
        rope_theta=10000.0,
        initializer_range=0.1,  # larger than the default 0.02, so logits spread and the window's edge shows
        tie_word_embeddings=tie,
        attn_implementation=attn,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return transformers.MistralForCausalLM(config).eval()


@pytest.fixture(scope="module")
def hf_model():
    return make_hf()


@pytest.fixture(scope="module")
def ids():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 100, (2, 4 * W + 5), generator=g)  # > 4 windows


@pytest.fixture(scope="module")
def hf_logits(hf_model, ids):
    with torch.no_grad():
        return hf_model(ids).logits


def test_config_mapping(hf_model):
    c = config_from_hf(hf_model.config)
    assert (c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim) == (64, 2, 4, 2, 16)
    assert (c.hidden_dim, c.window_size, c.vocab_size, c.rope_theta) == (128, W, 100, 10000.0)
    assert c.norm_eps == hf_model.config.rms_norm_eps and c.tie_embeddings is False


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_forward_matches_hf(attn, ids):
    hf = make_hf(attn=attn)
    with torch.no_grad():
        ref = hf(ids).logits
    ours = from_hf(hf)(ids)
    err = (ours - ref).abs().max().item()
    print(f"forward vs HF ({attn}): max abs logits error {err:.2e} (logits up to {ref.abs().max():.2f})")
    assert err < TOL


@pytest.mark.parametrize("kind", ["ring", "naive"])
@pytest.mark.parametrize("chunk_size", [1, 3, 2 * W + 3])
def test_score_matches_hf(hf_model, ids, hf_logits, kind, chunk_size):
    ours = from_hf(hf_model).score(ids, cache=kind, chunk_size=chunk_size)
    err = (ours - hf_logits).abs().max().item()
    print(f"score({kind}, chunk_size={chunk_size}) vs HF: max abs logits error {err:.2e}")
    assert err < TOL


def test_tied_embeddings_match_hf(ids):
    hf = make_hf(tie=True)
    ours = from_hf(hf)
    assert ours.config.tie_embeddings and ours.lm_head.weight.data_ptr() == ours.embed.weight.data_ptr()
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max() < TOL


@pytest.mark.parametrize("other", [W - 1, W + 1])
def test_window_boundary_is_exact(hf_model, ids, hf_logits, other):
    """An off-by-one in the window cannot pass: W - 1 and W + 1 give visibly different logits, on both sides."""
    ours = from_hf(hf_model)
    shifted = Decoder(dataclasses.replace(ours.config, window_size=other))
    shifted.load_state_dict(ours.state_dict())
    assert (shifted(ids) - hf_logits).abs().max() > 100 * TOL
    assert (shifted.score(ids, cache="ring", chunk_size=3) - hf_logits).abs().max() > 100 * TOL
    hf_other = make_hf(window=other)  # same seed: same weights, other window
    with torch.no_grad():
        assert (hf_other(ids).logits - ours(ids)).abs().max() > 100 * TOL
        assert (hf_other(ids).logits - shifted(ids)).abs().max() < TOL


def test_greedy_generation_matches_hf(hf_model):
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 100, (1, 2 * W + 3), generator=g)  # longer than the window
    new = 3 * W + 2
    with torch.no_grad():
        ref = hf_model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    ours = from_hf(hf_model)
    for kind in ("ring", "naive"):
        out = ours.generate(prompt, new, cache=kind)
        assert out.shape == ref.shape == (1, prompt.shape[1] + new)
        assert torch.equal(out, ref), f"{kind}: first difference at token {(out != ref).nonzero()[0, 1].item()}"
    assert len(set(ref[0, prompt.shape[1]:].tolist())) > 3, "a degenerate continuation would make this check weak"


def test_config_reads_rope_theta_from_either_layout(hf_model):
    """transformers 5.x keeps the RoPE base in ``rope_parameters``; 4.x in ``rope_theta``. Both map."""
    from types import SimpleNamespace

    fields = {k: getattr(hf_model.config, k) for k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "intermediate_size", "rms_norm_eps", "max_position_embeddings")}  # fmt: skip
    v4 = SimpleNamespace(**fields, rope_theta=1e6, sliding_window=None, hidden_act="silu")
    v5 = SimpleNamespace(**fields, rope_parameters={"rope_type": "default", "rope_theta": 5e5}, sliding_window=4)
    assert config_from_hf(v4).rope_theta == 1e6 and config_from_hf(v5).rope_theta == 5e5
    assert config_from_hf(v4).window_size == 512  # no window: causal over every position the model accepts
    scaled = SimpleNamespace(**fields, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}, sliding_window=4)
    with pytest.raises(NotImplementedError, match="rope_type"):
        config_from_hf(scaled)
