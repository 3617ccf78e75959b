"""The int8 cache's one-token path: what it relies on, pinned (STYLE.md point 11).

The path quantises a token's key and value together, copies the rounded floats into one slot of a
shared int8 buffer (keys in rows ``:B``, values in ``B:``) and its scales into the scale buffer,
advances both rings without their ``update``, and dequantises the window in one go. It relies on:

* the rings' ``k_buf``/``v_buf`` being views of those shared buffers, so the chunk path, ``ordered``,
  ``positions`` and ``state_dict`` see what the one-token path wrote;
* the copy into int8 converting exactly, the floats being whole numbers already (rounded to
  nearest, never truncated);
* memory: no float copy of the window kept between steps.

Expectations are worked by hand or come from a plain ring fed the hand-made round trip.
"""

from __future__ import annotations

import pytest
import torch

from swkv_teach import Int8RingBufferKVCache, RingBufferKVCache

B, H, D = 2, 3, 6


def round_trip(x: torch.Tensor) -> torch.Tensor:
    """absmax / 127 per row, rounded to nearest (half to even), back: worked by hand, float32."""
    scale = x.abs().amax(-1, keepdim=True) / 127
    q = torch.where(scale > 0, torch.round(x / torch.where(scale > 0, scale, 1.0)), 0.0)
    return q * scale


def tokens(n: int, seed: int, batch: int = B) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, H, n, D, generator=g), torch.randn(batch, H, n, D, generator=g) * 7


@pytest.mark.parametrize("W", [1, 2, 5])
@pytest.mark.parametrize("ones_first", [0, 1, 4, 7])
def test_a_chunk_after_single_tokens_reads_what_the_single_tokens_wrote(W, ones_first):
    """Single tokens (the fast path) then a chunk (the rings' path) then single tokens again:
    every step equals a plain ring fed the round trips. A one-token write that missed the rings'
    buffers (not views of the shared ones) would hand the chunk stale zeros; a ring not advanced
    would give the chunk the wrong positions."""
    cache, ring = Int8RingBufferKVCache(W), RingBufferKVCache(W)
    plan = [1] * ones_first + [3] + [1] * (W + 2) + [W + 1, 1]
    for step, c in enumerate(plan):
        k, v = tokens(c, seed=step)
        got_k, got_v = cache.update(k, v)
        want_k, want_v = ring.update(round_trip(k), round_trip(v))
        assert torch.equal(cache.positions, ring.positions), f"step {step}: positions"
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v), f"step {step} ({c} tokens)"
        assert cache.seen == ring.seen and len(cache) == len(ring)
    qk, qv = cache.ordered()
    rk, rv = ring.ordered()
    assert torch.equal(qk, rk) and torch.equal(qv, rv)


def test_single_tokens_round_to_nearest_in_the_stored_int8():
    """Row [127, 0.6, -0.6, 1.5, -126.4, 0.49] has scale 1: stored as [127, 1, -1, 2, -126, 0] by hand.
    Copying unrounded floats into int8 would truncate: [127, 0, 0, 1, -126, 0]."""
    cache = Int8RingBufferKVCache(3)
    row = torch.tensor([127.0, 0.6, -0.6, 1.5, -126.4, 0.49])
    k = row.expand(1, 1, 1, 6).clone()
    cache.update(k, -k)
    qk, qv, sk, sv = cache.buffers
    assert qk.dtype == torch.int8 and qk[0, 0, 0].tolist() == [127, 1, -1, 2, -126, 0]
    assert qv[0, 0, 0].tolist() == [-127, -1, 1, -2, 126, 0]
    assert sk[0, 0, 0].item() == 1.0 and sv[0, 0, 0].item() == 1.0
    assert qk[0, 0, 1:].abs().sum() == 0, "only slot 0 written"


def test_the_state_of_single_tokens_restores_and_goes_on_alike():
    """state_dict after single tokens holds what they wrote (read through the rings' views); a cache
    restored from it continues exactly as the original."""
    W = 4
    a = Int8RingBufferKVCache(W)
    for step in range(W + 2):
        a.update(*tokens(1, seed=step))
    sd = a.state_dict()
    ref = RingBufferKVCache(W)
    for step in range(W + 2):
        ref.update(*(round_trip(t) for t in tokens(1, seed=step)))
    assert torch.equal(sd["k"].float() * sd["k_scale"], ref.k_buf)
    assert torch.equal(sd["v"].float() * sd["v_scale"], ref.v_buf)
    b = Int8RingBufferKVCache(W)
    b.load_state_dict(sd)
    for step in range(W + 2, 2 * W + 3):
        k, v = tokens(1 if step % 3 else 2, seed=step)
        ga, gb = a.update(k, v), b.update(k, v)
        assert torch.equal(ga[0], gb[0]) and torch.equal(ga[1], gb[1]) and torch.equal(a.positions, b.positions)


@pytest.mark.parametrize("W", [4, 64])
def test_the_storage_held_is_int8_data_and_float32_scales_only(W):
    """Bytes of every storage the cache keeps alive after 3W single tokens: W slots of int8 keys and
    values, a float32 scale each, the one-token layout template and the two rings' slot indices; no
    float copy of the window (which would be 4 * D bytes per slot more)."""
    cache = Int8RingBufferKVCache(W)
    for step in range(3 * W):
        cache.update(*tokens(1, seed=step))
    seen, total, todo = set(), 0, [vars(cache)]
    while todo:
        x = todo.pop()
        if isinstance(x, torch.Tensor):
            s = x.untyped_storage()
            if s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                total += s.nbytes()
        elif isinstance(x, dict):
            todo += list(x.values())
        elif isinstance(x, (list, tuple)):
            todo += list(x)
        elif isinstance(x, RingBufferKVCache):
            todo.append(vars(x))
    data = 2 * B * H * W * (D + 4)  # int8 keys and values, one float32 scale each
    extra = B * H * D * 4 + 2 * W * 8  # the fp32 one-token template; each ring's slot index (int64)
    assert cache.nbytes == data
    assert total == data + extra, f"held {total} bytes; expected {data} + {extra}"
