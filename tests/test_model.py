"""The decoder's specification: every cached path equals the no-cache oracle.

``forward`` is the oracle (whole sequence, sliding-window mask). ``score``
feeds the same tokens through per-layer caches in chunks and must give the
same logits; ``generate`` must give the tokens that recomputing ``forward``
over everything so far would give. Window convention: swkv_teach.masks.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from swkv_teach.caches import RingBufferKVCache
from swkv_teach.model import Decoder, DecoderConfig, LayerCaches

W = 8
ATOL = 1e-5


def make_model(device="cpu", dtype=torch.float32, **overrides) -> Decoder:
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(window_size=W, **overrides))
    with torch.no_grad():  # a wider init than training's 0.02, so logits spread and mistakes show
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    return model.to(device=device, dtype=dtype).eval()


def random_ids(T: int, B: int = 2, device="cpu", vocab: int = 128, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, T), generator=g).to(device)


# ------------------------------------------------------------------ cached == uncached


@pytest.mark.parametrize("kind", ["ring", "naive"])
@pytest.mark.parametrize("chunk_size", [1, 2, 3, W, 2 * W + 3])
def test_score_equals_forward(device, kind, chunk_size):
    model = make_model(device)
    ids = random_ids(4 * W + 5, device=device)  # several windows, not a multiple of any chunk size
    oracle = model(ids)
    cached = model.score(ids, cache=kind, chunk_size=chunk_size)
    assert cached.shape == oracle.shape == (2, 4 * W + 5, 128)
    assert (cached - oracle).abs().max().item() < ATOL


def test_prompt_longer_than_window_then_steps(device):
    """A prompt of 2W + 3 tokens in one chunk, then single tokens: still the oracle's logits."""
    model = make_model(device)
    ids = random_ids(4 * W, device=device)
    caches = model.new_caches("ring")
    with torch.no_grad():
        first = model.step(ids[:, : 2 * W + 3], caches)
        rest = [model.step(ids[:, t : t + 1], caches) for t in range(2 * W + 3, 4 * W)]
    assert (torch.cat([first, *rest], dim=1) - model(ids)).abs().max() < ATOL


def test_oracle_is_not_trivially_matched(device):
    """The checks above would be empty if the window changed nothing: it does, past W tokens."""
    model = make_model(device)
    ids = random_ids(3 * W, device=device)
    full_causal = model(ids, window_size=3 * W)
    diff = (model(ids) - full_causal).abs().amax(dim=(0, 2))  # per position
    assert diff[:W].max() < ATOL and diff[W:].min() > 1e-3


def test_sinks_cache_equals_oracle_with_sinks(device):
    S = 3
    model = make_model(device)
    ids = random_ids(4 * W, device=device)
    oracle = model(ids, num_sinks=S)
    assert (oracle - model(ids)).abs().max() > 1e-2, "sinks must matter past W + S tokens"
    for chunk_size in (1, 3, 2 * W + 3):
        cached = model.score(ids, cache="sinks", num_sinks=S, chunk_size=chunk_size)
        assert (cached - oracle).abs().max() < ATOL


def test_forward_with_sinks_matches_manual_mask():
    """forward(num_sinks=S) really masks ``j < S or i - W < j``: recompute layer 0 by hand with window_mask."""
    from swkv_teach.attention import attention
    from swkv_teach.masks import window_mask

    S, T = 2, 3 * W
    model = make_model()
    ids = random_ids(T)
    pos = torch.arange(T)
    block = model.layers[0]
    x = model.embed(ids)
    q, k, v = block.attn.qkv(block.attn_norm(x), pos)
    group = q.shape[1] // k.shape[1]
    y = attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), window_mask(pos, pos, W, S))
    manual = x + block.attn.o_proj(y.transpose(1, 2).reshape(2, T, -1))
    manual = manual + block.mlp(block.mlp_norm(manual))
    assert (block(x, pos, None, num_sinks=S) - manual).abs().max() < ATOL


def test_window_at_least_sequence_is_plain_causal_attention():
    """With W >= T the decoder is an ordinary causal transformer (checked against is_causal SDPA)."""
    T = 20
    model = make_model()
    ids = random_ids(T)
    pos = torch.arange(T)
    x = model.embed(ids)
    for block in model.layers:
        q, k, v = block.attn.qkv(block.attn_norm(x), pos)
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + block.attn.o_proj(y.transpose(1, 2).reshape(2, T, -1))
        x = x + block.mlp(block.mlp_norm(x))
    causal = model.lm_head(model.norm(x))
    for window in (T, T + 1, 10 * T):
        wide = Decoder(dataclasses.replace(model.config, window_size=window))
        wide.load_state_dict(model.state_dict())
        assert (wide(ids) - causal).abs().max() < ATOL
        assert (wide.score(ids, cache="ring", chunk_size=3) - causal).abs().max() < ATOL
    narrow = Decoder(dataclasses.replace(model.config, window_size=T - 1))
    narrow.load_state_dict(model.state_dict())
    assert (narrow(ids) - causal).abs().max() > 1e-3


# ------------------------------------------------------------------ positions come from seen


class LenLiesRing(RingBufferKVCache):
    """A ring cache whose ``len`` always says 0: a decoder that used it for positions would break."""

    def __len__(self):
        return 0


class SeenIsLenRing(RingBufferKVCache):
    """A ring cache whose ``seen`` says how many tokens it *stores*: the decoder must follow it.

    (A lie that shifted every position by the same amount would not show: RoPE
    scores depend only on distances.)
    """

    @property
    def seen(self):
        return len(self)


def test_rope_positions_come_from_seen_not_len():
    """Regression for rotary positions taken from tokens *stored* (``len``) instead of *seen*.

    Past W tokens a ring holds W, but the next token's position is ``seen``.
    A cache lying about ``len`` changes nothing; one whose ``seen`` is ``len``
    breaks the output from token ``W + 1`` on (``len`` stops at ``W``), and only then.
    """
    model = make_model()
    ids = random_ids(3 * W)
    oracle = model(ids)
    caches = LayerCaches([LenLiesRing(W) for _ in model.layers], W)
    with torch.no_grad():
        out = torch.cat([model.step(ids[:, t : t + 1], caches) for t in range(3 * W)], dim=1)
    assert caches[0].seen == 3 * W and len(caches[0]) == 0  # stored W, says 0
    assert (out - oracle).abs().max() < ATOL
    stuck = LayerCaches([SeenIsLenRing(W) for _ in model.layers], W)
    with torch.no_grad():
        out = torch.cat([model.step(ids[:, t : t + 1], stuck) for t in range(3 * W)], dim=1)
    diff = (out - oracle).abs().amax(dim=(0, 2))  # per position
    assert diff[: W + 1].max() < ATOL and diff[W + 1 :].min() > 1e-3  # len == seen up to token W


def test_any_cache_kind_works_unchanged():
    """LRU with no reads is FIFO, i.e. the sliding window: the decoder drives it like the others."""
    model = make_model()
    ids = random_ids(3 * W)
    assert (model.score(ids, cache="lru", chunk_size=1) - model(ids)).abs().max() < ATOL


# ------------------------------------------------------------------ generation


def recompute_greedy(model: Decoder, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """The no-cache reference: forward over everything so far, argmax of the last position, n times."""
    ids = prompt
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@pytest.mark.parametrize("kind", ["ring", "naive"])
def test_greedy_generate_equals_full_recompute(device, kind):
    model = make_model(device)
    prompt = random_ids(2 * W + 3, device=device)
    out = model.generate(prompt, 3 * W, cache=kind)
    ref = recompute_greedy(model, prompt, 3 * W)
    assert out.shape == (2, 5 * W + 3)
    assert torch.equal(out[:, : prompt.shape[1]], prompt)
    assert torch.equal(out, ref)
    assert len(set(out[:, prompt.shape[1]:].flatten().tolist())) > 3, "degenerate continuation: weak check"


def test_sampling_is_seeded_and_respects_top_k(device):
    model = make_model(device)
    prompt = random_ids(5, device=device)
    a = model.generate(prompt, 30, temperature=1.0, top_k=5, seed=123)
    b = model.generate(prompt, 30, temperature=1.0, top_k=5, seed=123)
    c = model.generate(prompt, 30, temperature=1.0, top_k=5, seed=124)
    assert torch.equal(a, b) and not torch.equal(a, c)
    # top_k=1 is greedy, whatever the temperature
    assert torch.equal(model.generate(prompt, 20, temperature=2.0, top_k=1, seed=0), model.generate(prompt, 20))
    # every sampled token was among the top 5 at its step
    logits = model(a[:, :-1])[:, prompt.shape[1] - 1 :]  # (B, 30, vocab)
    top5 = logits.topk(5, dim=-1).indices
    assert (top5 == a[:, prompt.shape[1] :, None]).any(-1).all()


def test_memory_is_flat_while_generating():
    """Past W tokens the caches' total bytes stop growing: a step overwrites, it does not append."""
    model = make_model()
    caches = model.new_caches("ring")
    ids = random_ids(1, B=1)
    sizes = []
    with torch.no_grad():
        for t in range(4 * W):
            logits = model.step(ids, caches)
            ids = logits[:, -1].argmax(-1, keepdim=True)
            sizes.append(sum(c.nbytes for c in caches))
    assert len(set(sizes[W:])) == 1 and all(len(c) == W for c in caches)
    per_layer = 2 * 1 * model.config.n_kv_heads * W * model.config.head_dim * 4  # k and v, float32
    assert sizes[-1] == model.config.n_layers * per_layer


def test_generate_zero_new_tokens_returns_prompt():
    model = make_model()
    prompt = random_ids(4)
    assert torch.equal(model.generate(prompt, 0), prompt)


# ------------------------------------------------------------------ dtypes, tying, errors


def test_bfloat16_follows_parameters(device):
    model32 = make_model(device)
    model16 = make_model(device, dtype=torch.bfloat16)
    ids = random_ids(3 * W, device=device)
    out = model16.score(ids, cache="ring", chunk_size=3)
    assert out.dtype == torch.bfloat16 and model16(ids).dtype == torch.bfloat16
    ref = model32(ids)
    assert (out.float() - ref).abs().max() < 0.05 * ref.abs().max()
    assert (out.float() - model16(ids).float()).abs().max() < 0.05 * ref.abs().max()
    assert model16.generate(ids[:, :5], 10).shape == (2, 15)


def test_tied_embeddings_share_one_matrix():
    model = make_model(tie_embeddings=True)
    assert model.lm_head.weight is model.embed.weight
    untied = make_model()
    n_tied = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in untied.parameters()) - n_tied == 128 * 64


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda m, ids: m.score(ids, cache="fifo"), "cache must be one of"),
        (lambda m, ids: m.score(ids, chunk_size=0), "chunk_size"),
        (lambda m, ids: m.score(ids, chunk_size=1.5), "chunk_size"),
        (lambda m, ids: m.generate(ids, -1), "max_new_tokens"),
        (lambda m, ids: m.generate(ids, 2, cache="ringbuffer"), "cache must be one of"),
        (lambda m, ids: m.generate(ids, 2, temperature=-1.0), "temperature"),
        (lambda m, ids: m.generate(ids, 2, temperature=1.0, top_k=0), "top_k"),
        (lambda m, ids: m.generate(ids[0], 2), "prompt_ids must be a 2-D long tensor"),
        (lambda m, ids: m.score(ids.float()), "input_ids must be a 2-D long tensor"),
        (lambda m, ids: m.score(ids + 1000), r"token ids in \[0, 128\)"),
        (lambda m, ids: m.step(ids, m.new_caches()[:1]), "one cache per layer"),
        (lambda m, ids: m.new_caches("sinks", num_sinks=0), "num_sinks"),
    ],
)
def test_bad_arguments_name_what_was_wrong(call, match):
    model = make_model()
    with pytest.raises((ValueError, TypeError), match=match):
        call(model, random_ids(5))


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="n_heads must be a multiple of n_kv_heads"):
        DecoderConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="window_size"):
        DecoderConfig(window_size=0)


def test_step_outside_no_grad_is_fine_and_builds_no_graph():
    """Regression: Decoder.step with the default ring cache crashed in grad mode."""
    from swkv_teach.model import Decoder, DecoderConfig

    model = Decoder(DecoderConfig(window_size=4))
    caches = model.new_caches("ring")
    ids = torch.randint(0, model.config.vocab_size, (1, 9))
    logits = torch.cat([model.step(ids[:, t : t + 1], caches) for t in range(9)], dim=1)
    assert not logits.requires_grad
    torch.testing.assert_close(logits, model(ids).detach(), atol=1e-5, rtol=1e-5)
