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

from swkv_teach.hf import config_from_hf, from_hf, to_hf  # noqa: E402
from swkv_teach.model import Decoder  # noqa: E402

pytestmark = pytest.mark.hf

W = 8
TOL = 1e-4


def make_hf(window: int = W, attn: str = "eager", tie: bool = False, head_dim: int = 16, eps: float = 1e-6,
            random_norms: bool = False, **extra):
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        rms_norm_eps=eps,
        sliding_window=window,
        max_position_embeddings=512,
        rope_theta=10000.0,
        initializer_range=0.1,  # larger than the default 0.02, so logits spread and the window's edge shows
        tie_word_embeddings=tie,
        attn_implementation=attn,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **extra,
    )
    model = transformers.MistralForCausalLM(config).eval()
    if random_norms:  # HF initialises every RMSNorm weight to 1: then which norm goes where cannot show
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(torch.empty(p.shape).uniform_(0.2, 2.0, generator=g))
    return model


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


def test_parity_sees_norms_eps_and_head_dim(ids):
    """Guards the fields a default random model cannot show: each RMSNorm's own weight (the attention norm
    loaded into the MLP norm, or the final norm left at 1, change the logits only when the weights differ
    from 1), ``rms_norm_eps`` (only a large eps on small activations moves them) and an explicit
    ``head_dim`` that is not ``hidden_size / num_attention_heads`` (Gemma's; 24 here, not 64/4 = 16)."""
    hf = make_hf(head_dim=24, eps=0.05, random_norms=True)
    c = config_from_hf(hf.config)
    assert (c.head_dim, c.norm_eps) == (24, 0.05)
    ours = from_hf(hf)
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max() < TOL
    assert (ours.score(ids, cache="ring", chunk_size=3) - ref).abs().max() < TOL
    # the test can fail: swapping two layers' norms or using the default eps moves the logits well past TOL
    swapped = from_hf(hf)
    with torch.no_grad():
        a, m = swapped.layers[0].attn_norm.weight, swapped.layers[0].mlp_norm.weight
        a_copy = a.clone()
        a.copy_(m)
        m.copy_(a_copy)
        assert (swapped(ids) - ref).abs().max() > 100 * TOL
    default_eps = Decoder(dataclasses.replace(c, norm_eps=1e-6))
    default_eps.load_state_dict(ours.state_dict())
    assert (default_eps(ids) - ref).abs().max() > 100 * TOL


def _v4_config(**changes):
    """A transformers 4.x config as a plain namespace: ``rope_theta`` and ``rope_scaling`` as fields."""
    from types import SimpleNamespace

    fields = dict(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, intermediate_size=128, rms_norm_eps=1e-6, max_position_embeddings=512,
                  rope_theta=1e4, rope_scaling=None, sliding_window=W, hidden_act="silu")
    return SimpleNamespace(**{**fields, **changes})


@pytest.mark.parametrize("scaling", [{"type": "linear", "factor": 2.0}, {"rope_type": "yarn", "factor": 4.0},
                                     {"type": "dynamic", "factor": 2.0}])
def test_rope_scaling_is_refused(scaling):
    """Guards the refusal of scaled RoPE, which the decoder does not implement (it would run plain RoPE and
    give other logits). The old layout (4.x: ``rope_scaling`` beside ``rope_theta``) and the new (5.x:
    ``rope_parameters``, which transformers fills from a ``rope_scaling`` argument) are both named."""
    with pytest.raises(NotImplementedError, match=r"rope_scaling must be None.*plain RoPE"):
        config_from_hf(_v4_config(rope_scaling=scaling))
    with pytest.raises(NotImplementedError, match=r"rope_(scaling|parameters).*plain RoPE"):
        config_from_hf(make_hf(rope_scaling=scaling).config)
    old_key = {k: v for k, v in scaling.items()}
    with pytest.raises(NotImplementedError, match="rope_type"):  # a 5.x dict that kept 4.x's "type"
        config_from_hf(_v4_config(rope_scaling=None, rope_parameters={**old_key, "rope_theta": 1e4}))
    assert config_from_hf(_v4_config(rope_scaling={})).rope_theta == 1e4  # empty: plain RoPE


def test_llama_without_a_window_converts():
    """Llama's config has no ``sliding_window`` field at all: full causal attention, same logits as HF."""
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.1, attn_implementation="eager",
        bos_token_id=None, eos_token_id=None, pad_token_id=None)).eval()
    ours = from_hf(hf)
    assert ours.config.window_size == 64
    ids = torch.randint(0, 100, (1, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max() < TOL


def _qwen2(**changes):
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=W, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        **changes)).eval()


def test_qwen2_layouts_are_refused_or_unwindowed():
    """Guards three silent wrong answers on Qwen2-like models: its q/k/v biases would be dropped by a loader
    that picks the weights it knows (refused, the first bias named); ``use_sliding_window=False`` keeps a
    ``sliding_window`` it does not use (its ``layer_types`` say full attention: no window); a mix of
    sliding and full layers has no single window (refused)."""
    with pytest.raises(NotImplementedError, match=r"no place for .*self_attn\.\w_proj\.bias"):
        from_hf(_qwen2(use_sliding_window=True))
    unused = _qwen2(use_sliding_window=False).config
    unused.sliding_window = W  # older transformers kept the number even when unused
    assert config_from_hf(unused).window_size == unused.max_position_embeddings
    mixed = _qwen2(use_sliding_window=True, max_window_layers=2).config
    with pytest.raises(NotImplementedError, match="layer_types mixes"):
        config_from_hf(mixed)


@pytest.mark.parametrize("tie", [False, True])
def test_to_hf_gives_back_the_model_from_hf_took(ids, tie):
    """``to_hf(from_hf(m))``: Hugging Face's own forward on the weights we split back (q/k/v, gate/up) gives the
    original model's logits, and the decoder's, past the window."""
    original = make_hf(tie=tie, random_norms=True)
    decoder = from_hf(original)
    back = to_hf(decoder, "eager")
    assert back.config.sliding_window == W and back.config.tie_word_embeddings is tie
    with torch.no_grad():
        want, got = original(ids).logits, back(ids).logits
    assert torch.equal(got, want)
    assert (decoder(ids) - got).abs().max().item() < TOL


def test_to_hf_without_a_window_is_full_attention(ids):
    decoder = from_hf(make_hf())
    full = to_hf(decoder, sliding_window=False)
    assert full.config.sliding_window is None
    short = ids[:, :W]  # within the window the two models agree; past it they must not
    with torch.no_grad():
        assert (full(short).logits - decoder(short)).abs().max().item() < TOL
        assert (full(ids).logits - decoder(ids)).abs().max().item() > 100 * TOL
