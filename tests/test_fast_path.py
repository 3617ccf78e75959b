"""The decode step's shortcuts, and the invariants each one relies on (swkv_teach.model).

* No mask for one query over a cache that declares ``one_token_in_window``:
  every such cache is driven here through long random sequences of chunks and
  single tokens, and after every one-token update each key it returned must be
  inside the new token's window (``window_mask`` all True). A cache that broke
  the promise would fail here, not silently in a decode.
* The shortcut is taken only when it is exact: one token, and a cache window
  and sinks no wider than the mask's. Elsewhere the mask is applied, and the
  decoder still equals the oracle.
* The grouped read (a group's query heads as queries of their key head) equals
  the masked, general ``attend``.
* ``attend`` applies SDPA's causal mask instead of building the window's only
  when the keys are the queries' own consecutive positions and at most ``W``
  (a prompt in a fresh cache, the oracle on a short sequence).
* RMSNorm's fused float32 path is the spelled-out formula, bit for bit.
* The fused q/k/v and gate/up projections load state dicts with separate
  ``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj``, ``up_proj`` (Hugging
  Face's names, older checkpoints).

Window convention: swkv_teach.masks (query ``i`` sees keys ``i - W < j <= i``).
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

import swkv_teach  # noqa: F401  (imports every cache, so the subclass scan below sees them all)
from swkv_teach.caches import CACHE_KINDS, KVCache, RingBufferKVCache, SinkKVCache, make_cache
from swkv_teach.masks import window_mask
from swkv_teach.model import Attention, Decoder, DecoderConfig, LayerCaches, RMSNorm, needs_no_mask

W = 5
ATOL = 1e-5


def make_model(**overrides) -> Decoder:
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(window_size=W, **overrides))
    with torch.no_grad():  # wider than the training init, so a wrong mask shows in the logits
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    return model.eval()


def random_ids(T: int, B: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 128, (B, T), generator=torch.Generator().manual_seed(seed))


def _all_subclasses(cls) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _all_subclasses(sub)
    return out


def _flagged_kinds() -> list[str]:
    return [k for k in CACHE_KINDS if getattr(type(make_cache(k, 4, 2)), "one_token_in_window", False)]


# ------------------------------------------------------------------ the invariant: in-window keys only


def test_the_caches_that_promise_in_window_keys():
    """The ring, its sinks variant and the naive cache promise it; LRU must not (promotion keeps old keys)."""
    assert {"ring", "sinks", "naive", "sliding"} <= set(_flagged_kinds())
    assert "lru" not in _flagged_kinds()


def test_every_class_that_promises_it_is_checked_below():
    """A new cache class declaring ``one_token_in_window`` must be reachable by ``make_cache``,
    so the random-sequence check below drives it; otherwise its promise would go unchecked."""
    checked = {type(make_cache(k, 4, 2)) for k in _flagged_kinds()}
    claiming = {c for c in _all_subclasses(KVCache) if getattr(c, "one_token_in_window", False)}
    # test doubles defined in tests/ (subclasses of the library's caches) are not library classes
    claiming = {c for c in claiming if c.__module__.startswith("swkv_teach")}
    assert claiming <= checked, f"unchecked classes claim one_token_in_window: {sorted(map(str, claiming - checked))}"


@pytest.mark.parametrize("kind", _flagged_kinds())
@pytest.mark.parametrize("window", [1, 2, 5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_token_update_returns_only_keys_in_the_window(kind, window, seed):
    """Random chunks and single tokens, at least 6·W of them: after every one-token update,
    every key returned is one the new token may attend to (so the decoder's unmasked read is exact)."""
    rng = random.Random(seed)
    cache = make_cache(kind, window, num_sinks=2)
    S = getattr(cache, "num_sinks", 0)
    B, H, D = 2, 3, 4
    seen, one_token_steps = 0, 0
    while seen < 6 * window + 3 or one_token_steps < 3 * window:
        c = rng.choice([1, 1, 1, 1, 2, 3, window + 2])
        k = torch.randn(B, H, c, D)
        keys, values = cache.update(k, k.clone())
        seen += c
        if c > 1:
            continue
        one_token_steps += 1
        pos = cache.positions
        assert keys.shape[2] == values.shape[2] == len(pos), f"{kind}: {keys.shape[2]} keys, {len(pos)} positions"
        visible = window_mask(torch.tensor([seen - 1]), pos, window, S)[0]
        assert visible.all(), (
            f"{kind} (window {window}, sinks {S}) promises one_token_in_window, but after {seen} tokens its "
            f"one-token update returned positions {pos[~visible].tolist()}, outside query {seen - 1}'s window"
        )


# ------------------------------------------------------------------ the shortcut is taken only when exact


@pytest.fixture
def reads(monkeypatch):
    """Counts of masked (``attend``) and unmasked reads the decoder makes."""
    counts = {"masked": 0, "unmasked": 0}
    for name, key in (("attend", "masked"), ("attend_unmasked", "unmasked")):
        real = getattr(Attention, name)

        def counted(self, *args, _real=real, _key=key, **kwargs):
            counts[_key] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(Attention, name, counted)
    return counts


@pytest.mark.parametrize("kind", ["ring", "naive", "sinks"])
def test_single_tokens_skip_the_mask_and_still_equal_the_oracle(kind, reads):
    model = make_model()
    ids = random_ids(4 * W)
    S = 2 if kind == "sinks" else 0
    caches = model.new_caches(kind, num_sinks=2) if kind == "sinks" else model.new_caches(kind)
    with torch.no_grad():
        out = torch.cat([model.step(ids[:, t : t + 1], caches) for t in range(4 * W)], dim=1)
    assert reads == {"masked": 0, "unmasked": 4 * W * model.config.n_layers}
    assert (out - model(ids, num_sinks=S)).abs().max() < ATOL


def test_chunks_and_lru_are_masked(reads):
    model = make_model()
    ids = random_ids(4 * W)
    model.score(ids, cache="ring", chunk_size=3)
    model.score(ids, cache="lru", chunk_size=1)
    assert reads["unmasked"] == 0 and reads["masked"] > 0


def test_a_cache_wider_than_the_mask_is_masked():
    """Ring caches of 2W under a decoder masking with W: skipping the mask would attend over 2W keys."""
    model = make_model()
    ids = random_ids(4 * W)
    assert not needs_no_mask(RingBufferKVCache(2 * W), 1, W, 0)
    caches = LayerCaches([RingBufferKVCache(2 * W) for _ in model.layers], W)
    with torch.no_grad():
        out = torch.cat([model.step(ids[:, t : t + 1], caches) for t in range(4 * W)], dim=1)
    assert (out - model(ids)).abs().max() < ATOL
    assert (out - model(ids, window_size=2 * W)).abs().max() > 1e-3, "the two windows must differ here"


def test_sinks_the_mask_does_not_keep_are_masked():
    """A sinks cache under a mask without sinks: the sinks it keeps must be masked out, not attended."""
    model = make_model()
    ids = random_ids(4 * W)
    assert not needs_no_mask(SinkKVCache(2, W), 1, W, 0) and needs_no_mask(SinkKVCache(2, W), 1, W, 2)
    caches = LayerCaches([SinkKVCache(2, W) for _ in model.layers], W, num_sinks=0)
    with torch.no_grad():
        out = torch.cat([model.step(ids[:, t : t + 1], caches) for t in range(4 * W)], dim=1)
    assert (out - model(ids)).abs().max() < ATOL
    assert (out - model(ids, num_sinks=2)).abs().max() > 1e-3


def test_a_narrower_cache_needs_no_mask():
    """A cache window narrower than the mask's: every key it returns is inside the wider window too."""
    assert needs_no_mask(RingBufferKVCache(W - 1), 1, W, 0)
    assert not needs_no_mask(RingBufferKVCache(W), 2, W, 0), "a chunk's queries need their own windows"


# ------------------------------------------------------------------ a prompt no longer than the window: causal


def _masked_reference(attn, q, k, v, q_pos, k_pos, window):
    """``attend``'s answer spelled out: keys repeated per query head, ``window_mask``, explicit softmax."""
    from swkv_teach.attention import attention

    group = q.shape[1] // k.shape[1]
    y = attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), window_mask(q_pos, k_pos, window))
    B, nh, T, hd = q.shape
    return attn.o_proj(y.transpose(1, 2).reshape(B, T, nh * hd))


@pytest.mark.parametrize(
    "q_pos, k_pos, window",
    [
        ([0, 1, 2], [0, 1, 2], 3),  # the shortcut: T == W, the keys are the queries
        ([7, 8, 9, 10], [7, 8, 9, 10], 4),  # not starting at 0
        ([0, 1, 2, 3], [0, 1, 2, 3], 3),  # T == W + 1: query 3 must not see key 0
        ([0, 2, 3], [0, 2, 3], 3),  # same positions, not consecutive: query 3 must not see key 0
        ([1, 0, 2], [1, 0, 2], 3),  # same positions, not in order: the mask is not lower-triangular
        ([2, 3, 4], [1, 2, 3], 3),  # shifted keys
    ],
)
def test_attend_is_causal_only_when_the_keys_are_the_queries_consecutive_within_w(q_pos, k_pos, window):
    torch.manual_seed(len(q_pos) + window)
    attn = Attention(DecoderConfig(dim=16, n_heads=4, n_kv_heads=2, head_dim=4, window_size=window))
    T = len(q_pos)
    q, k, v = torch.randn(2, 4, T, 4), torch.randn(2, 2, T, 4), torch.randn(2, 2, T, 4)
    q_pos, k_pos = torch.tensor(q_pos), torch.tensor(k_pos)
    with torch.no_grad():
        got = attn.attend(q, k, v, q_pos, k_pos)
        expected = _masked_reference(attn, q, k, v, q_pos, k_pos, window)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("prompt", [1, W - 1, W, W + 1, 2 * W + 3])
@pytest.mark.parametrize("kind", ["ring", "naive", "sinks"])
def test_a_prompt_at_the_window_boundary_then_single_tokens_equals_the_oracle(kind, prompt):
    model = make_model()
    ids = random_ids(prompt + 2 * W)
    S = 2 if kind == "sinks" else 0
    caches = model.new_caches(kind, num_sinks=2) if kind == "sinks" else model.new_caches(kind)
    with torch.no_grad():
        out = [model.step(ids[:, :prompt], caches)]
        out += [model.step(ids[:, t : t + 1], caches) for t in range(prompt, prompt + 2 * W)]
    assert (torch.cat(out, dim=1) - model(ids, num_sinks=S)).abs().max() < ATOL


# ------------------------------------------------------------------ the unmasked grouped read


@pytest.mark.parametrize(
    "B, nh, nkv, hd, n",
    [(1, 4, 2, 16, 7), (3, 6, 2, 8, 1), (2, 4, 4, 8, 9), (1, 3, 1, 6, 5), (2, 8, 2, 4, 33)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_grouped_unmasked_read_equals_masked_attend(B, nh, nkv, hd, n, dtype):
    """GQA, no GQA (nh == nkv), MQA (nkv == 1), batch 1 and 3, one key and many."""
    torch.manual_seed(n)
    config = DecoderConfig(dim=12, n_heads=nh, n_kv_heads=nkv, head_dim=hd, window_size=n)
    attn = Attention(config).to(dtype)
    q = torch.randn(B, nh, 1, hd, dtype=dtype)
    # keys as a cache returns them: a view of a bigger buffer, not contiguous
    k = torch.randn(B, nkv, n + 3, hd, dtype=dtype)[:, :, 2 : n + 2]
    v = torch.randn(B, nkv, n + 3, hd, dtype=dtype)[:, :, 1 : n + 1]
    with torch.no_grad():
        fast = attn.attend_unmasked(q, k, v)
        # the spelled-out reference, not attend(): with n == 1 attend takes a shortcut of its own
        ref = _masked_reference(attn, q, k, v, torch.tensor([n - 1]), torch.arange(n), n)
    assert fast.shape == ref.shape == (B, 1, 12)
    torch.testing.assert_close(fast, ref, atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------ RMSNorm, RoPE once, fused projection


@pytest.mark.parametrize("dim", [1, 7, 64, 96, 255])
def test_rmsnorm_float32_fast_path_is_the_formula_bit_for_bit(dim):
    torch.manual_seed(dim)
    norm = RMSNorm(dim, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    for x in (torch.randn(2, 3, dim) * 5, torch.zeros(1, 1, dim), torch.randn(1, dim)):
        spelled = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps))
        assert torch.equal(norm(x), spelled)


def test_rmsnorm_in_bfloat16_normalises_in_float32_then_casts_then_scales():
    """Hugging Face's order for half types: rms in float32, cast to bfloat16, then times the weight."""
    norm = RMSNorm(16).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 3.0, 16))
    x = (torch.randn(2, 3, 16) * 7).to(torch.bfloat16)
    x32 = x.float()
    expected = norm.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)).to(torch.bfloat16)
    assert torch.equal(norm(x), expected)


def test_qkv_with_angles_made_once_equals_qkv_computing_them():
    from swkv_teach.model import rotary

    model = make_model()
    attn = model.layers[1].attn
    x = torch.randn(2, 4, model.config.dim)
    pos = torch.arange(10, 14)
    rope = rotary(pos, model.config.head_dim, model.config.rope_theta, x.dtype)
    for a, b in zip(attn.qkv(x, pos), attn.qkv(x, pos, rope)):
        assert torch.equal(a, b)


def test_separate_projections_load_into_the_fused_ones():
    """Hugging Face's names (q_proj, k_proj, v_proj; gate_proj, up_proj), as in checkpoints saved before
    the fusion, load: same weights, same logits. A missing part is refused, naming the fused weight."""
    model = make_model(n_heads=4, n_kv_heads=1, head_dim=8, hidden_dim=40)
    c = model.config
    split = {}
    for name, t in model.state_dict().items():
        if name.endswith("qkv_proj.weight"):
            base = name[: -len("qkv_proj.weight")]
            parts = zip(("q_proj", "k_proj", "v_proj"), t.split([c.n_heads * c.head_dim, c.head_dim, c.head_dim]))
        elif name.endswith("gate_up_proj.weight"):
            base = name[: -len("gate_up_proj.weight")]
            parts = zip(("gate_proj", "up_proj"), t.split([c.hidden_dim, c.hidden_dim]))
        else:
            split[name] = t
            continue
        split.update({f"{base}{part}.weight": w.clone() for part, w in parts})
    assert "layers.1.attn.k_proj.weight" in split and "layers.0.mlp.up_proj.weight" in split
    fresh = Decoder(c)
    fresh.load_state_dict(split)
    ids = random_ids(3 * W)
    assert torch.equal(fresh(ids), model(ids))
    for missing, fused in (("layers.0.attn.v_proj.weight", "qkv_proj.weight"), ("layers.1.mlp.gate_proj.weight",
                                                                                  "gate_up_proj.weight")):
        incomplete = {n: t for n, t in split.items() if n != missing}
        with pytest.raises(RuntimeError, match=fused):
            Decoder(c).load_state_dict(incomplete)


def test_unmasked_read_matches_sdpa_with_repeated_keys():
    """The grouped read against Hugging Face's layout: keys repeated per query head (repeat_kv), plain SDPA."""
    q = torch.randn(2, 6, 1, 8)
    k, v = torch.randn(2, 3, 11, 8), torch.randn(2, 3, 11, 8)
    attn = Attention(DecoderConfig(dim=48, n_heads=6, n_kv_heads=3, head_dim=8))
    with torch.no_grad():
        y = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
        expected = attn.o_proj(y.transpose(1, 2).reshape(2, 1, 48))
        torch.testing.assert_close(attn.attend_unmasked(q, k, v), expected, atol=1e-6, rtol=1e-5)
