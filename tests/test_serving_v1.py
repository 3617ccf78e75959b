"""Specification of the vLLM-v1 modes of ``swkv_teach.serving.Scheduler``: one token budget, preemption, prefix caching.

Every request's tokens must equal ``Decoder.generate`` on it alone (ring cache, batch 1: a second
method sharing none of the paged path), with prefix caching or without, whatever is preempted; each step
is ONE forward; blocks are never leaked; hit counts and held blocks are the ones worked out by hand.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import swkv_teach.serving.scheduler as scheduler_module
from swkv_teach import Decoder, DecoderConfig
from swkv_teach.caches.prefix import block_hashes
from swkv_teach.serving import Scheduler, serve
from swkv_teach.store import LocalStore


def tiny(W=5, seed=0):
    torch.manual_seed(seed)
    return Decoder(DecoderConfig(window_size=W)).eval()


def solo(decoder, r):
    out = decoder.generate(torch.tensor([r["prompt"]]), r["max_new_tokens"], temperature=r.get("temperature", 0.0),
                           top_k=r.get("top_k"), seed=r.get("seed"))
    return out[0].tolist()


def workload(seed, count=12):
    """Prompts of 1..14 tokens, half of them behind a shared 9-token prefix; 0..20 new; some sampled."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(0, 128, (9,), generator=g).tolist()
    requests = []
    for i in range(count):
        tail = torch.randint(0, 128, (int(torch.randint(1, 15, (1,), generator=g)),), generator=g).tolist()
        r = dict(prompt=shared + tail if i % 2 else tail, max_new_tokens=int(torch.randint(0, 21, (1,), generator=g)))
        if i % 3 == 0:
            r.update(temperature=0.9, top_k=40, seed=100 + i)
        requests.append(r)
    return requests


@pytest.mark.parametrize("bs, extra, budget, caching", [
    (b, n, t, c) for (b, n), t, c in itertools.product(((1, 0), (2, 0), (2, 6), (3, 2), (4, 30)), (1, 3, 8, 64),
                                                     (False, True))
])
def test_tokens_equal_generating_alone(bs, extra, budget, caching):
    """Pools of the largest promise (+ extra: 0 preempts in most cases); budgets of 1 token to more than a prompt."""
    decoder = tiny()
    requests = workload(bs + extra + budget)
    sizing = Scheduler(decoder, 1, bs, token_budget=budget)
    num_blocks = max(sizing.blocks_needed(len(r["prompt"]), r["max_new_tokens"]) for r in requests) + extra
    s = Scheduler(decoder, num_blocks, bs, max_running=5, token_budget=budget, prefix_caching=caching)
    for r in requests:
        s.submit(**r)
    outputs = s.run()
    for i, r in enumerate(requests):
        assert outputs[i] == solo(decoder, r), f"request {i} differs from generating it alone"
    assert s.pool.used_blocks == 0, "blocks leaked"
    st = s.stats()
    assert st["prefix_hit_tokens"] + st["prefill_tokens_computed"] == st["prefix_query_tokens"]
    if not caching:
        assert st["prefix_hit_tokens"] == 0


def test_preemption_happens_and_sampled_requests_survive_it():
    """A pool of 5 blocks of 2 for five sampled requests (a budget of 2): preempted again and again, same tokens."""
    decoder = tiny()
    requests = [dict(prompt=list(range(i, i + 6)), max_new_tokens=15, temperature=1.0, seed=i) for i in range(5)]
    outputs, s = serve(decoder, requests, num_blocks=5, block_size=2, max_running=5, token_budget=2)
    assert sum(t["preempted"] for t in s.trace) == s.stats()["preemptions"] > 0
    assert any(s.finished[i].preemptions for i in range(5))
    for i, r in enumerate(requests):
        assert outputs[i] == solo(decoder, r), f"sampled request {i} changed across a preemption"


def test_the_newest_running_request_is_preempted():
    """Two 4-token prompts, W 3, blocks of 2, a pool of 3, budget 3: when request 0 needs a block, 1 goes.

    Step 0 reads request 0's first 3 tokens (blocks 0, 1); step 1 its last token and 2 of request 1's
    (its block 0); step 2 request 0 decodes position 4 (a third block is needed and there is none):
    request 1, the newest, is preempted.
    """
    decoder = tiny(W=3)
    s = Scheduler(decoder, num_blocks=3, block_size=2, max_running=2, token_budget=3)
    s.submit([1, 2, 3, 4], 12)
    s.submit([5, 6, 7, 8], 12)
    for _ in range(3):
        s.step()
    assert [t["preempted"] for t in s.trace] == [0, 0, 1]
    assert s.finished == {} and [r.id for r in s.running] == [0] and s.waiting[0].id == 1
    assert s.waiting[0].preemptions == 1 and s.waiting[0].written == 0 and s.waiting[0].table == []
    s.run()
    assert s.finished[1].output == solo(decoder, dict(prompt=[5, 6, 7, 8], max_new_tokens=12))


def test_one_forward_per_step_decode_rows_first(monkeypatch):
    """Each step is one call; decode rows take their token before a waiting prompt's chunk takes the rest."""
    decoder = tiny(W=4)
    calls, inside = [], []
    real_varlen, real_paged = scheduler_module.step_varlen, decoder.step_paged

    def varlen(dec, ids, cu, start, *args, **kwargs):
        calls.append(("varlen", cu.diff().tolist(), start.tolist()))
        inside.append(1)
        try:
            return real_varlen(dec, ids, cu, start, *args, **kwargs)
        finally:
            inside.pop()

    def paged(ids, start, *args, **kwargs):
        if not inside:  # step_varlen runs an all-decode step as step_paged: that is its one forward
            calls.append(("paged", tuple(ids.shape)))
        return real_paged(ids, start, *args, **kwargs)

    monkeypatch.setattr(scheduler_module, "step_varlen", varlen)
    monkeypatch.setattr(decoder, "step_paged", paged)
    s = Scheduler(decoder, num_blocks=40, block_size=2, max_running=4, token_budget=6)
    s.submit(list(range(5)), 8)  # read in one step (5 <= 6)
    s.submit(list(range(3)), 8)  # gets the budget's last token: 1 of 3
    s.submit(list(range(20, 30)), 4)
    first = s.step()
    assert calls == [("varlen", [5, 1], [0, 0])] and first["prefill_tokens"] == 6 and first["decode_tokens"] == 0
    calls.clear()
    second = s.step()  # request 0 decodes its token first, then 1 reads 2 more, then 2 reads 3 of its 10
    assert calls == [("varlen", [1, 2, 3], [5, 1, 0])]
    assert (second["decode_tokens"], second["prefill_tokens"], second["decoded"], second["prefilled"]) == (1, 5, 1, 2)
    while s.waiting or s.running:
        calls.clear()
        record = s.step()
        assert len(calls) == 1 and record["decode_tokens"] + record["prefill_tokens"] <= 6
    assert s.finished[2].output == solo(decoder, dict(prompt=list(range(20, 30)), max_new_tokens=4))
    assert {"prefill_tokens", "decode_tokens", "preempted", "used_blocks", "running", "waiting"} <= set(record)


def test_reserved_mode_trace_gains_the_token_counts():
    decoder = tiny(W=4)
    _, s = serve(decoder, [dict(prompt=[1, 2, 3], max_new_tokens=4), dict(prompt=[4, 5], max_new_tokens=3)],
                 num_blocks=20, block_size=2)
    assert s.trace[0]["prefill_tokens"] == 5 and s.trace[0]["decode_tokens"] == 0 and s.trace[0]["preempted"] == 0
    assert sum(t["decode_tokens"] for t in s.trace) == 3 + 2


# ------------------------------------------------------------------ prefix caching
@pytest.mark.parametrize("budget", [None, 4, 64])
def test_same_prompt_again_hits_all_but_the_last_token(budget):
    """W 5, blocks of 2, an 11-token prompt twice, one after the other.

    Hashes cover 5 full blocks; the last token is always computed, so at most 10 tokens hit (5 blocks).
    The window needs only the W - 1 = 4 positions before position 10: blocks 3 and 4. The second run
    computes 1 token, holds 2 of the hit blocks, and its tokens are the first run's.
    """
    decoder = tiny()
    prompt = list(range(30, 41))
    s = Scheduler(decoder, num_blocks=20, block_size=2, token_budget=budget, prefix_caching=True)
    s.submit(prompt, 6)
    s.run()
    read = []
    real = s._read_prefix

    def spy(r):
        real(r)
        read.append(list(r.table))

    s._read_prefix = spy
    s.submit(prompt, 6)
    out = s.run()
    assert read == [[-1, -1, -1, read[0][3], read[0][4]]] and min(read[0][3:]) >= 0
    st = s.stats()
    assert (st["prefix_query_tokens"], st["prefix_hit_tokens"], st["prefill_tokens_computed"]) == (22, 10, 12)
    assert out[0] == out[1] == solo(decoder, dict(prompt=prompt, max_new_tokens=6))


@pytest.mark.parametrize("budget", [None, 5])
def test_a_whole_block_is_recomputed_when_the_prompt_fills_its_last_block(budget):
    """A 12-token prompt in blocks of 2, twice: all 6 blocks are cached, but the last token must be computed
    (its logits pick the first new token), and hits are whole blocks: 10 tokens hit, 2 computed
    (vLLM: ``max_cache_hit_length = request.num_tokens - 1``)."""
    decoder = tiny()
    s = Scheduler(decoder, num_blocks=20, block_size=2, token_budget=budget, prefix_caching=True)
    for _ in range(2):
        s.submit(list(range(60, 72)), 3)
        s.run()
    st = s.stats()
    assert (st["prefix_hit_tokens"], st["prefill_tokens_computed"]) == (10, 14)
    assert s.finished[1].output == solo(decoder, dict(prompt=list(range(60, 72)), max_new_tokens=3))


def test_full_attention_window_holds_every_hit_block():
    """W 64 over a 11-token prompt (the window covers it all): the same hit holds all 5 blocks."""
    decoder = tiny(W=64)
    s = Scheduler(decoder, num_blocks=20, block_size=2, prefix_caching=True)
    s.submit(list(range(11)), 3)
    s.run()
    s.submit(list(range(11)), 3)
    s.step()
    assert sum(b >= 0 for b in s.running[0].table) == 6  # 5 hit + the one of position 10


def test_sliding_window_hits_where_full_attention_cannot():
    """Evict blocks 1 and 2 of a prompt: a sliding window still hits all 10 tokens (it needs only blocks 3, 4),
    full attention only block 0's 2 tokens (its chain breaks at block 1)."""
    def run(W):
        decoder = tiny(W=W)
        s = Scheduler(decoder, num_blocks=8, block_size=2, prefix_caching=True)
        prompt = list(range(50, 61))  # 5 full blocks
        s.submit(prompt, 1)
        s.run()
        # hold blocks 0, 3, 4 (a hit "touches" them out of the free queue), then take every free block:
        # the cached ones left in the queue, 1 and 2, are evicted; then give everything back
        hashes = block_hashes(prompt, 2)
        keep = [s.pool.get(hashes[i]) for i in (0, 3, 4)]
        s.pool.acquire(keep)
        taken = [s.pool.allocate() for _ in range(s.pool.free_blocks)]
        s.pool.release(taken + keep)
        assert [s.pool.get(h) is not None for h in hashes] == [True, False, False, True, True]
        s.submit(prompt, 4)
        out = s.run()
        return s.stats()["prefix_hit_tokens"], out[1] == solo(decoder, dict(prompt=prompt, max_new_tokens=4))

    assert run(5) == (10, True)
    assert run(64) == (2, True)


def test_a_chat_turn_reuses_the_previous_turn():
    """The next turn = prompt + reply + a new line: it hits every full block the first turn wrote."""
    decoder = tiny(W=8)
    s = Scheduler(decoder, num_blocks=30, block_size=4, prefix_caching=True, token_budget=32)
    s.submit(list(range(10)), 9)
    first = s.run()[0]  # 19 tokens; keys written for 18 of them: 4 full blocks
    s.submit(first + [7, 7, 7], 2)
    s.run()
    assert s.stats()["prefix_hit_tokens"] == 16
    assert s.finished[1].output == solo(decoder, dict(prompt=first + [7, 7, 7], max_new_tokens=2))


# ------------------------------------------------------------------ a store behind the cache
class FakeStore:
    """A dict of copies: what swkv_teach.store's stores promise, in five lines."""

    def __init__(self, broken=False):
        self.blocks, self.broken, self.gets, self.puts = {}, broken, 0, 0

    def put_block(self, block_hash, layout, keys, values):
        self.puts += 1
        self.blocks[block_hash] = (keys.clone(), values.clone())

    def get_block(self, block_hash, layout):
        self.gets += 1
        got = self.blocks.get(block_hash)
        if got is not None and self.broken:
            return got[0][:, :1], got[1][:, :1]  # the wrong shape: must be a miss
        return got

    def stats(self):
        return {"bytes_held": sum(k.numel() * 2 * k.element_size() for k, _ in self.blocks.values()),
                "store_rejected": 0, "store_errors": 0}


@pytest.mark.parametrize("budget", [None, 8])
@pytest.mark.parametrize("kind", ["fake", "broken", "local"])
def test_evicted_blocks_go_to_the_store_and_come_back(budget, kind):
    """A tiny pool evicts; a second scheduler (fresh pool, same store) gets the prompt's blocks from the store."""
    decoder = tiny(W=6)
    store = LocalStore(10**7) if kind == "local" else FakeStore(broken=kind == "broken")
    broken = kind == "broken"
    prompts = [list(range(i, i + 13)) for i in (0, 30, 60, 90)]
    first = Scheduler(decoder, num_blocks=10, block_size=2, token_budget=budget, prefix_caching=True, store=store)
    for p in prompts:  # one after another: each writes 8 full blocks, so prompt 0's are all evicted (LRU)
        first.submit(p, 5)
        first.run()
    assert all(first.pool.get(h) is None for h in block_hashes(prompts[0], 2))
    assert first.stats()["cached_blocks_evicted"] == first.stats()["store_put_blocks"] > 0
    second = Scheduler(decoder, num_blocks=10, block_size=2, token_budget=budget, prefix_caching=True, store=store)
    second.submit(prompts[0], 5)
    out = second.run()
    st = second.stats()
    assert out[0] == solo(decoder, dict(prompt=prompts[0], max_new_tokens=5))
    if broken:
        assert st["store_hit_blocks"] == 0 and st["prefix_hit_tokens"] == 0
    else:
        assert st["store_hit_blocks"] == 6 and st["prefix_hit_tokens"] == 12  # 6 full blocks, last token computed
    assert "bytes_held" in st and second.pool.used_blocks == 0


def test_store_needs_prefix_caching():
    with pytest.raises(ValueError, match="store needs prefix_caching=True"):
        Scheduler(tiny(), 8, 2, store=FakeStore())


# ------------------------------------------------------------------ the promise (issue 30)
@pytest.mark.parametrize("W, bs, prompt, new, chunk, expected, why", [
    (5, 1, 1, 1, None, 1, "one position written (the last new token is never fed back), not 2"),
    (5, 2, 1, 1, None, 1, "a 1-token request fills one block"),
    (8, 4, 3, 2, None, 1, "4 positions fill 1 block; the window bound alone would say 2"),
    (5, 2, 4, 9, None, 5, "12 positions written, but a window of 5 + a 4-token prompt spans 8: 5 blocks"),
    (5, 3, 12, 6, 4, 4, "17 written; chunks of 4 under W 5 span 8 positions: ceil(7 / 3) + 1 = 4 blocks"),
    (5, 4, 5, 1, None, 2, "5 positions written: 2 blocks of 4, never 3"),
    (5, 4, 4, 1, None, 1, "4 positions written fill exactly 1 block"),
    (64, 16, 200, 40, None, 15, "239 written, 263-position span: min(15, 18) = 15"),
    (3, 2, 2, 0, None, 0, "no new token: nothing held"),
])
def test_blocks_needed_pins_the_exact_promise(W, bs, prompt, new, chunk, expected, why):
    """Hand-worked counts: over-promising (last token counted, short requests ignored) or under-promising fails."""
    s = Scheduler(tiny(W=W), num_blocks=64, block_size=bs, prefill_chunk=chunk)
    assert s.blocks_needed(prompt, new) == expected, why


def test_blocks_needed_with_a_token_budget_covers_a_recompute():
    """With a budget, a preempted request reads prompt + new tokens again in chunks of the budget."""
    s = Scheduler(tiny(W=5), num_blocks=64, block_size=2, token_budget=4)
    # 3 + 10 - 1 = 12 written; chunks of 4 under W 5 span 8 positions: ceil(7 / 2) + 1 = 5 blocks
    assert s.blocks_needed(3, 10) == 5
    assert Scheduler(tiny(W=5), num_blocks=64, block_size=2, token_budget=1).blocks_needed(3, 10) == 3


@pytest.mark.parametrize("budget", [None, 4])
def test_a_long_chain_from_the_store_fits_the_promise(budget):
    """W 3, blocks of 2, a 30-token prompt read in chunks of 4: the promise is 4 blocks, the pool exactly that.

    Its 14 cached blocks come back from the store one by one; the window needs only the last one held
    at a time, so all 14 (28 tokens) are hits in a pool of 4, none refused for want of room.
    """
    decoder = tiny(W=3)
    store = LocalStore(10**7)
    prompt = list(range(30, 60))
    first = Scheduler(decoder, 6, 2, prefill_chunk=4, token_budget=budget, prefix_caching=True, store=store)
    for p in (prompt, list(range(60, 90)), list(range(90, 120))):  # the later prompts evict the first one's blocks
        first.submit(p, 3)
        first.run()
    assert all(first.pool.get(h) is None for h in block_hashes(prompt, 2))
    pool = first.blocks_needed(30, 3)
    assert pool == 4
    second = Scheduler(decoder, pool, 2, prefill_chunk=4, token_budget=budget, prefix_caching=True, store=store)
    second.submit(prompt, 3)
    assert second.run()[0] == solo(decoder, dict(prompt=prompt, max_new_tokens=3))
    assert second.stats()["store_hit_blocks"] == 14 and second.stats()["prefix_hit_tokens"] == 28


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(token_budget=0), ValueError, "token_budget must be a positive int"),
    (dict(token_budget=2.5), TypeError, "token_budget must be a positive int"),
    (dict(prefix_caching="yes"), TypeError, "prefix_caching must be True or False"),
    (dict(prefix_caching=True, store=FakeStore(), window_size=3), ValueError, "store needs the decoder's own window"),
])
def test_bad_scheduler_arguments_are_named(kwargs, error, words):
    with pytest.raises(error, match=words):
        Scheduler(tiny(), 8, 2, **kwargs)
