"""The compiled ring (issue 29): one-token decode steps under ``torch.compile(fullgraph=True)``.

Expectations come from the eager decoder (``Decoder.step`` over ordinary ring caches, itself held to
the no-cache oracle in tests/test_model.py) and from hand-worked slots and masks. The compile test
runs with ``torch._dynamo.config.error_on_recompile = True`` after ``torch._dynamo.reset()``: one
graph must serve the first step, steps before the window fills, 300 steps past it, and a second
``generate`` with another prompt length. Compiling takes tens of seconds on a busy CPU, so the
model is small and compiled once per test file (the inductor cache makes later runs quicker).
"""

from __future__ import annotations

import pytest
import torch

from swkv_teach.caches import RingBufferKVCache
from swkv_teach.caches.ring import ring_slot_and_mask
from swkv_teach.model import Decoder, DecoderConfig

W = 6
ATOL = 1e-5


def make_model(device="cpu", **overrides) -> Decoder:
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(window_size=W, n_layers=3, **overrides))
    with torch.no_grad():  # wide weights, so logits spread and a wrong key shows
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    return model.to(device).eval()


def ids(B: int, T: int, seed: int, device="cpu") -> torch.Tensor:
    return torch.randint(0, 128, (B, T), generator=torch.Generator().manual_seed(seed)).to(device)


# ------------------------------------------------------------------ the pieces, by hand
def test_ring_slot_and_mask_by_hand():
    """W = 3: position p goes to slot p % 3; slot s is visible once s <= p (slots fill 0, 1, 2, then wrap)."""
    expected = {0: (0, [True, False, False]), 1: (1, [True, True, False]), 2: (2, [True, True, True]),
                3: (0, [True, True, True]), 7: (1, [True, True, True]), 10**7: (10**7 % 3, [True] * 3)}
    for p, (slot, visible) in expected.items():
        got_slot, got_visible = ring_slot_and_mask(torch.tensor([p]), 3)
        assert got_slot.tolist() == [slot], f"position {p}: slot {got_slot.tolist()}, expected [{slot}]"
        assert got_visible.tolist() == visible, f"position {p}: visible {got_visible.tolist()}, expected {visible}"


def test_an_adopting_ring_written_by_hand_equals_one_that_updates():
    """``adopt`` + writing slot p % W + ``count_written`` leaves the ring as ``update`` would: buffers, seen,
    positions, ordered keys and state_dict, step by step through two wraps."""
    g = torch.Generator().manual_seed(5)
    ref = RingBufferKVCache(4)
    k_buf, v_buf = torch.zeros(2, 3, 4, 5), torch.zeros(2, 3, 4, 5)
    ours = RingBufferKVCache(4)
    ours.adopt(k_buf, v_buf)
    prompt_k, prompt_v = torch.randn(2, 2, 3, 3, 5, generator=g)
    ref.update(prompt_k, prompt_v)
    ours.update(prompt_k, prompt_v)  # a chunk through the ordinary path, into the adopted buffers
    for p in range(3, 13):
        k, v = torch.randn(2, 2, 3, 1, 5, generator=g)
        ref.update(k, v)
        slot, _ = ring_slot_and_mask(torch.tensor([p]), 4)
        k_buf.index_copy_(2, slot, k)
        v_buf.index_copy_(2, slot, v)
        ours.count_written()
        assert ours.seen == ref.seen == p + 1
        assert torch.equal(ours.k_buf, ref.k_buf) and torch.equal(ours.v_buf, ref.v_buf), f"buffers differ at {p}"
        assert torch.equal(ours.positions, ref.positions), f"positions differ at {p}"
    assert torch.equal(ours.ordered()[0], ref.ordered()[0])
    sd, want = ours.state_dict(), ref.state_dict()
    assert sd["seen"] == want["seen"] and torch.equal(sd["k"], want["k"]) and torch.equal(sd["positions"],
                                                                                          want["positions"])


def test_adopt_refuses_what_it_cannot_hold():
    cache = RingBufferKVCache(4)
    with pytest.raises(ValueError, match="capacity=4"):
        cache.adopt(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8))
    cache.update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8))
    with pytest.raises(ValueError, match="adopt needs an empty cache; this one has seen 1"):
        cache.adopt(torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8))


@pytest.mark.parametrize("call, match", [
    (lambda m, x: m.generate(x, 3, cache="naive", compile=True), "compile needs cache='ring'"),
    (lambda m, x: m.generate(x, 3, compile=1), "compile must be False, True, a torch.compile mode string or 'aot'"),
    (lambda m, x: m.compiled_ring(1, mode=None), r"mode must be a torch.compile mode string or 'aot' .* got None"),
    (lambda m, x: m.generate(x, 3, compile="AOT"), r"mode must be .*'aot'.*'reduce-overhead'.* got 'AOT'"),
    (lambda m, x: m.compiled_ring(0), "batch"),
    (lambda m, x: m.compiled_ring(2).step(x[:, :1], m.new_caches()), "last new_caches"),
    (lambda m, x: m.compiled_ring(2).step(x[:, :1], m.compiled_ring(2).new_caches()), "caches are empty"),
    (lambda m, x: m.compiled_ring(2).step(x[:1, :1], m.compiled_ring(2).new_caches()), r"\(2, 1\) long tensor"),
    (lambda m, x: m.compiled_ring(2).step(x[:, :2], m.compiled_ring(2).new_caches()), r"\(2, 1\) long tensor"),
])
def test_bad_arguments_are_refused_before_anything_compiles(call, match):
    """Checked in Python before the graph runs (so these cost no compilation)."""
    with pytest.raises(ValueError, match=match):
        call(make_model(), ids(2, 4, 0))


def test_earlier_caches_over_the_same_buffers_are_refused():
    """The buffers are shared: a second ``new_caches`` empties them, so the first caches may not step."""
    model = make_model()
    ring = model.compiled_ring(2)
    first = ring.new_caches()
    model.step(ids(2, 3, 1), first)
    ring.new_caches()
    with pytest.raises(ValueError, match="last new_caches"):
        ring.step(ids(2, 1, 2), first)


def steps_equal_eager(model, ring, prompt_len: int, steps: int, seed: int):
    """A prompt (eager, into both), then ``steps`` one-token steps of ``ring`` beside the eager ring, each fed the
    eager greedy token: logits within ``ATOL`` at every step. Returns (ring's caches, eager caches)."""
    prompt = ids(ring.batch, prompt_len, seed)
    eager, ours = model.new_caches("ring"), ring.new_caches()
    want, got = model.step(prompt, eager)[:, -1:], model.step(prompt, ours)[:, -1:]
    for s in range(steps):
        nxt = want.argmax(-1)
        want, got = model.step(nxt, eager), ring.step(nxt, ours)
        torch.testing.assert_close(got, want, rtol=0, atol=ATOL,
                                   msg=f"prompt {prompt_len}, step {s} (position {prompt_len + s})")
    return ours, eager


# ------------------------------------------------------------------ compiled == eager, one graph
@pytest.mark.slow
def test_compiled_decode_equals_eager_and_never_recompiles():
    """Batch 2, W = 6, 3 layers. Prompts of W - 1, W, W + 1 and 2W + 3 tokens (one chunk, eager), then
    steps: the window fills, wraps, and 300 steps run past it. Under ``error_on_recompile`` every step of
    every prompt uses the one graph compiled at the first; logits equal the eager ring's within 1e-5 at
    every step, the greedy tokens equal eager ``generate``'s, and the caches end as the eager ones do."""
    model = make_model()
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        ring = model.compiled_ring(2)
        for n, prompt_len in enumerate([W - 1, W, W + 1, 2 * W + 3]):
            prompt = ids(2, prompt_len, 10 + n)
            eager, ours = model.new_caches("ring"), ring.new_caches()
            want, got = model.step(prompt, eager)[:, -1:], model.step(prompt, ours)[:, -1:]
            steps = 300 + W if n == 0 else 2 * W + 2
            for s in range(steps):
                nxt = want.argmax(-1)  # (2, 1): both sides are fed the eager greedy token
                want, got = model.step(nxt, eager), ring.step(nxt, ours)
                torch.testing.assert_close(got, want, rtol=0, atol=ATOL,
                                           msg=f"prompt {prompt_len}, step {s} (position {prompt_len + s})")
            for a, b in zip(ours, eager):
                assert a.seen == b.seen == prompt_len + steps
                assert torch.equal(a.stored_positions(), b.stored_positions())
                torch.testing.assert_close(a.ordered()[0], b.ordered()[0], rtol=0, atol=ATOL)
            assert a.k_buf is ring.k[-1], "the caches hold the compiled ring's own buffers"
        # generate(compile=True) reuses that graph: the same tokens as eager generate, still no recompilation
        for n, prompt_len in enumerate([W + 1, 3]):
            prompt = ids(2, prompt_len, 20 + n)
            want = model.generate(prompt, 40)
            got = model.generate(prompt, 40, compile=True)
            assert torch.equal(got, want), f"prompt {prompt_len}: compiled tokens differ from eager"
        with torch.inference_mode():  # the caller's inference mode changes nothing either
            assert torch.equal(model.generate(ids(2, 4, 30), 12, compile=True), model.generate(ids(2, 4, 30), 12))


@pytest.mark.slow
def test_at_batch_one_inductor_generates_the_linears_and_the_step_still_equals_eager():
    """Batch 1, the decode the bench and lesson 9 time: on a CPU ``CompiledRing`` has inductor's
    ``decompose_mm_pass`` generate every one-row linear itself (a fused multiply-and-sum, no BLAS call).
    With every compile cache off (so the graph is really lowered), the pass fires once per linear at
    least (3 layers x 4 linears + the head), and the step still equals the eager ring within 1e-5 through
    a prompt of W - 1 and 3W + 10 steps, one graph throughout."""
    from torch._dynamo.utils import counters

    model = make_model()
    torch._dynamo.reset()
    counters.clear()
    with torch._inductor.config.patch(force_disable_caches=True), \
            torch._dynamo.config.patch(error_on_recompile=True):
        steps_equal_eager(model, model.compiled_ring(1), W - 1, 3 * W + 10, seed=40)
    linears = 4 * model.config.n_layers + 1
    assert counters["inductor"]["decompose_mm"] >= linears, (
        f"decompose_mm fired {counters['inductor']['decompose_mm']} times, expected one per linear ({linears}): "
        "the compiled step calls BLAS for its one-row linears again")


# ------------------------------------------------------------------ compiled ahead of time
@pytest.mark.slow
def test_the_step_compiled_ahead_of_time_equals_eager_and_is_compiled_once():
    """``mode="aot"``: the same step exported and compiled by AOTInductor (no dynamo per call). Batch 1 (inductor
    generates the linears). A prompt of W - 1, then 3W + 10 steps: logits within 1e-5 of the eager ring at every
    step, the caches end as the eager ones do (the library wrote the ring's own buffers); ``generate(...,
    compile="aot")`` gives eager's tokens for two prompts with one library; a parameter replaced between
    sequences (not changed in place) gets the step compiled again, and its tokens follow the new weights."""
    model = make_model()
    ring = model.compiled_ring(1, "aot")
    ours, eager = steps_equal_eager(model, ring, W - 1, 3 * W + 10, seed=50)
    for a, b in zip(ours, eager):
        assert a.seen == b.seen and torch.equal(a.stored_positions(), b.stored_positions())
        torch.testing.assert_close(a.ordered()[0], b.ordered()[0], rtol=0, atol=ATOL)
    library = ring._step._runner
    for n, prompt_len in enumerate([W + 1, 3]):
        prompt = ids(1, prompt_len, 60 + n)
        assert torch.equal(model.generate(prompt, 30, compile="aot"), model.generate(prompt, 30)), prompt_len
    assert model.compiled_ring(1, "aot") is ring and ring._step._runner is library, "compiled again"
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().flip(0))
    prompt = ids(1, W, 70)
    assert torch.equal(model.generate(prompt, 30, compile="aot"), model.generate(prompt, 30)), "stale weights"
    assert ring._step._runner is not library, "the replaced parameter did not get the step compiled again"


@pytest.mark.slow
def test_ahead_of_time_with_tied_embeddings_and_after_a_dtype_round_trip():
    """A model whose head shares the embedding (one tensor under two names), then ``.double()`` and ``.float()``
    (the same Parameter objects, new memory): the next sequence compiles again and decodes eager's tokens."""
    model = make_model(tie_embeddings=True)
    prompt = ids(1, W + 2, 80)
    assert torch.equal(model.generate(prompt, 20, compile="aot"), model.generate(prompt, 20))
    library = model.compiled_ring(1, "aot")._step._runner
    model.double()
    model.float()
    assert torch.equal(model.generate(prompt, 20, compile="aot"), model.generate(prompt, 20)), "stale memory read"
    assert model.compiled_ring(1, "aot")._step._runner is not library


# ------------------------------------------------------------------ CUDA graphs
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs (mode='reduce-overhead') need a CUDA GPU")
def test_cuda_graphs_decode_equals_eager_and_never_recompiles():
    """``mode="reduce-overhead"``: the step is captured as a CUDA graph (fixed buffer addresses, position and
    token as static inputs) and replayed; tokens and logits equal eager's, 300 steps past the window."""
    model = make_model("cuda")
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        ring = model.compiled_ring(2, mode="reduce-overhead")
        prompt = ids(2, W + 1, 3, "cuda")
        eager, ours = model.new_caches("ring"), ring.new_caches()
        want, got = model.step(prompt, eager)[:, -1:], model.step(prompt, ours)[:, -1:]
        for s in range(300 + W):
            nxt = want.argmax(-1)
            want, got = model.step(nxt, eager), ring.step(nxt, ours)
            torch.testing.assert_close(got, want, rtol=0, atol=ATOL, msg=f"step {s}")
        prompt = ids(2, 5, 4, "cuda")
        assert torch.equal(model.generate(prompt, 50, compile="reduce-overhead"), model.generate(prompt, 50))


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiling ahead of time for a GPU needs a CUDA GPU")
def test_ahead_of_time_on_cuda_decodes_eagers_tokens():
    """``compile="aot"`` on CUDA: AOTInductor builds the step for the GPU; greedy tokens equal eager's, past the
    window, for two prompts with one library."""
    model = make_model("cuda")
    for n, prompt_len in enumerate([W + 1, 3]):
        prompt = ids(2, prompt_len, 90 + n, "cuda")
        assert torch.equal(model.generate(prompt, 40, compile="aot"), model.generate(prompt, 40)), prompt_len
