"""Specification of continuous batching (``swkv_teach.serving``).

Every request's tokens must equal ``Decoder.generate`` run on it alone (ring cache, batch 1: a
second method sharing none of the paged path), whatever else runs beside it; each step runs one
decode forward over every running request; blocks are never shared, never leaked, and a request
the pool can never hold is refused when submitted.
"""

from __future__ import annotations

import pytest
import torch

import swkv_teach as sw
from swkv_teach import Decoder, DecoderConfig
from swkv_teach.caches import PagedKVCache
from swkv_teach.serving import Scheduler, serve


@pytest.fixture(scope="module")
def shipped():
    return sw.load_pretrained()


def solo(decoder, r):
    out = decoder.generate(torch.tensor([r["prompt"]]), r["max_new_tokens"], temperature=r.get("temperature", 0.0),
                           top_k=r.get("top_k"), seed=r.get("seed"))
    return out[0].tolist()


def test_shipped_decoder_text_equals_generating_alone(shipped):
    """Prompts shorter and longer than the window (64), new tokens 0, 1 and many, greedy and sampled."""
    decoder, tok = shipped
    texts = ["def f(x):\n    return", "import os\n", "class A:\n    def __init__(self):\n        self.x = 1\n" * 2,
             "x", "    # a comment\n" * 6, "while True:", "for i in range(3):\n"]
    new = [25, 40, 12, 1, 30, 35, 0]
    requests = [dict(prompt=tok.encode(t), max_new_tokens=n) for t, n in zip(texts, new)]
    requests[5].update(temperature=0.9, top_k=20, seed=7)
    requests.append(dict(prompt=tok.encode("if x:"), max_new_tokens=30, temperature=1.3, seed=11))
    outputs, scheduler = serve(decoder, requests, num_blocks=20, block_size=16, max_running=4)
    for i, r in enumerate(requests):
        assert outputs[i] == solo(decoder, r), f"request {i} ({texts[i][:12]!r}...) differs from generating it alone"
    assert scheduler.pool.free_blocks == scheduler.pool.num_blocks, "blocks leaked"


def tiny(W=5, seed=0):
    torch.manual_seed(seed)
    return Decoder(DecoderConfig(window_size=W)).eval()


@pytest.mark.parametrize("block_size, extra, max_running, chunk", [
    (1, 0, 3, None), (2, 1, 8, None), (3, 12, 2, 2), (4, 0, 16, 3), (16, 2, 5, None),
])
def test_tiny_decoder_many_requests_small_pool(block_size, extra, max_running, chunk):
    """W = 5, prompts 1..14 tokens, 0..20 new: blocks recycle every few steps, requests wait for room."""
    decoder = tiny()
    g = torch.Generator().manual_seed(block_size)
    requests = []
    for i in range(10):
        n = int(torch.randint(1, 15, (1,), generator=g))
        requests.append(dict(prompt=torch.randint(0, 128, (n,), generator=g).tolist(),
                             max_new_tokens=int(torch.randint(0, 21, (1,), generator=g))))
    sizing = Scheduler(decoder, 1, block_size, prefill_chunk=chunk)
    num_blocks = max(sizing.blocks_needed(len(r["prompt"]), r["max_new_tokens"]) for r in requests) + extra
    scheduler = Scheduler(decoder, num_blocks, block_size, max_running, prefill_chunk=chunk)
    for r in requests:
        scheduler.submit(**r)
    held_max = PagedKVCache.max_blocks(5, block_size)
    while scheduler.waiting or scheduler.running:
        scheduler.step()
        owners = {}
        for r in scheduler.running:
            blocks = [b for b in r.table if b >= 0]
            assert len(blocks) <= r.reserved, f"request {r.id} holds {len(blocks)} > its promise {r.reserved}"
            if r.written > 0:  # decoding or prefilled: only the next query's window is held
                assert len(blocks) <= held_max
            for b in blocks:
                assert b not in owners, f"block {b} held by requests {owners[b]} and {r.id}"
                owners[b] = r.id
        assert scheduler.pool.used_blocks == len(owners) <= num_blocks
    outputs = {i: r.output for i, r in scheduler.finished.items()}
    for i, r in enumerate(requests):
        assert outputs[i] == solo(decoder, r), f"request {i} differs from generating it alone"
    assert scheduler.pool.free_blocks == num_blocks
    if extra == 0 and max_running > 2:
        assert any(t["waiting"] for t in scheduler.trace), "a small pool should make some request wait"


def test_one_decode_forward_per_step_over_every_running_request(monkeypatch):
    """Each step: one step_paged per newcomer's prefill, and ONE for all decoding rows, at their own positions."""
    decoder = tiny(W=4)
    calls = []
    original = decoder.step_paged

    def spy(input_ids, start, *args, **kwargs):
        calls.append((tuple(input_ids.shape), torch.as_tensor(start).tolist()))
        return original(input_ids, start, *args, **kwargs)

    monkeypatch.setattr(decoder, "step_paged", spy)
    scheduler = Scheduler(decoder, num_blocks=30, block_size=2, max_running=3)
    for n, new in ((3, 6), (7, 4), (1, 5), (2, 3)):
        scheduler.submit(list(range(n)), new)
    first = scheduler.step()  # admits three, prefills each with its own forward; nothing to decode yet
    assert [c[0] for c in calls] == [(1, 3), (1, 7), (1, 1)] and first["decoded"] == 0
    calls.clear()
    second = scheduler.step()  # one forward, three rows, each at its own position
    assert calls == [((3, 1), [3, 7, 1])] and second["decoded"] == 3
    scheduler.run()
    assert scheduler.finished[3].output == solo(decoder, dict(prompt=[0, 1], max_new_tokens=3))


def test_a_request_that_can_never_fit_is_refused_at_submit():
    decoder = tiny(W=8)
    scheduler = Scheduler(decoder, num_blocks=3, block_size=2)
    with pytest.raises(ValueError, match=r"can never fit the pool.*hold up to \d+ blocks of 2 tokens.*has 3"):
        scheduler.submit(list(range(20)), 5)
    assert not scheduler.waiting
    chunked = Scheduler(decoder, num_blocks=6, block_size=2, prefill_chunk=2)  # chunks make the same prompt fit
    chunked.submit(list(range(20)), 5)
    assert chunked.run()[0] == solo(decoder, dict(prompt=list(range(20)), max_new_tokens=5))


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(prompt=[0, 500], max_new_tokens=3), ValueError, "token ids in [0, 128)"),
    (dict(prompt=[], max_new_tokens=3), ValueError, "at least one token"),
    (dict(prompt=[1], max_new_tokens=-1), ValueError, "max_new_tokens"),
    (dict(prompt=[1], max_new_tokens=2, temperature=-1.0), ValueError, "temperature"),
    (dict(prompt=[1], max_new_tokens=2, top_k=0), ValueError, "top_k"),
])
def test_bad_requests_are_named(kwargs, error, words):
    scheduler = Scheduler(tiny(), num_blocks=8, block_size=2)
    with pytest.raises(error, match=None) as info:
        scheduler.submit(**kwargs)
    assert words in str(info.value)
    assert not scheduler.waiting


def test_blocks_needed_is_the_peak_a_request_reaches():
    """The promise, checked against the most blocks a lone request actually held at any step."""
    decoder = tiny(W=5)
    for bs in (1, 2, 3, 7):
        for prompt_len, new, chunk in ((1, 1, None), (4, 9, None), (12, 3, None), (12, 6, 4), (3, 30, 2)):
            scheduler = Scheduler(decoder, num_blocks=64, block_size=bs, prefill_chunk=chunk)
            scheduler.submit(list(range(prompt_len)), new)
            peak = 0
            request = scheduler.waiting[0]
            real_hold = scheduler._hold

            def hold(r, lo, hi, real_hold=real_hold):
                nonlocal peak
                real_hold(r, lo, hi)
                peak = max(peak, sum(b >= 0 for b in r.table))

            scheduler._hold = hold
            scheduler.run()
            assert peak <= scheduler.blocks_needed(prompt_len, new), (bs, prompt_len, new, chunk)
            assert request.reserved == scheduler.blocks_needed(prompt_len, new)


def test_step_paged_refuses_a_missing_block():
    decoder = tiny(W=4)
    kv = [(torch.zeros(4, 2, 2, 16), torch.zeros(4, 2, 2, 16)) for _ in decoder.layers]
    with pytest.raises(ValueError, match="block for every new token"):
        decoder.step_paged(torch.tensor([[1]]), torch.tensor([2]), kv, torch.tensor([[0, -1]]))
