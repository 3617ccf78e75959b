"""Specification of speculative rows in ``swkv_teach.serving.Scheduler`` (issue 39).

``submit(..., speculative=PromptLookup(k))`` makes a request verify up to ``k`` drafts a step, as one row of
``m + 1`` tokens in the same forward as the plain rows. Greedy, its tokens equal ``Decoder.generate`` without
drafts (ring cache, batch 1: a second method sharing none of the paged path), in both modes, with prefix caching
or without, preempted or not, across the window and block boundaries, for k = 1, 2, 4. Sampled, they equal
``speculative_generate``'s (the ring's loop) with the same seed where nothing cuts a draft, and follow the
target's distribution where the budget and preemption do.

Blocks: the keys of a verify are written before acceptance is known; after every step no request holds a block
whose positions are all at or past ``written`` (rejected drafts' or never written), reference counts are exactly
the holds, every prefix-cached block is a full block of accepted tokens whose keys equal a recomputation, and
the pool is whole again when all finish.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import swkv_teach.serving.scheduler as scheduler_module
from swkv_teach import Decoder, DecoderConfig
from swkv_teach.caches.prefix import block_hashes
from swkv_teach.serving import Scheduler
from swkv_teach.speculative import PromptLookup, early_exit, speculative_generate
from swkv_teach.store import LocalStore

_MODELS: dict[tuple, Decoder] = {}


def tiny(vocab=10, window=4, layers=2, seed=0, sharpen=30.0) -> Decoder:
    """A random decoder in float64 with its head scaled up (as tests/test_speculative.py's): greedy choices far
    from ties (top-2 logit gaps of 7e-5 and more over 3,000 random positions for each vocabulary 3..10 and window
    2..6), while the paged path's float32 attention moves keys by about 2e-8, so the paged path and the ring agree
    on every argmax. A small vocabulary makes its continuations repeat: prompt lookup finds drafts."""
    key = (vocab, window, layers, seed, sharpen)
    if key not in _MODELS:
        torch.manual_seed(seed)
        model = Decoder(DecoderConfig(vocab_size=vocab, dim=32, n_layers=layers, n_heads=4, n_kv_heads=2, head_dim=8,
                                      hidden_dim=48, window_size=window)).double().eval()
        with torch.no_grad():
            model.lm_head.weight.mul_(sharpen)
        _MODELS[key] = model
    return _MODELS[key]


def solo(decoder, r) -> list[int]:
    """Plain decoding of one request alone: ``Decoder.generate`` on a ring, no drafts."""
    out = decoder.generate(torch.tensor([r["prompt"]]), r["max_new_tokens"], temperature=r.get("temperature", 0.0),
                           top_k=r.get("top_k"), seed=r.get("seed"))
    return out[0].tolist()


def workload(seed, count=8, vocab=10, k=None):
    """Prompts of 2..15 tokens repeating a short motif (what prompt lookup is for); 0..18 new; every other one plain,
    the others speculative: prompt lookup, or (with ``k``) requests 2 and 6 drafters always wrong and always right,
    with 10 new tokens at least."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        motif = torch.randint(0, vocab, (int(torch.randint(2, 5, (1,), generator=g)),), generator=g).tolist()
        prompt = (motif * 8)[: int(torch.randint(2, 16, (1,), generator=g))]
        new = int(torch.randint(0, 19, (1,), generator=g))
        spec = i % 2 == 0 if k is None or i % 4 != 2 else RightFor(k, right=0 if i == 2 else k)
        out.append(dict(prompt=prompt, max_new_tokens=new if spec is True or not spec else max(new, 10), spec=spec))
    return out


class RightFor(PromptLookup):
    """A drafter that proposes the target's true greedy continuation for ``right`` tokens, then wrong ones:
    acceptance is then exactly ``min(right, m)`` (a test of the block accounting, not of lookup)."""

    def __init__(self, k, right):
        super().__init__(k)
        self.right = right

    def propose(self, tokens, m, temperature=0.0, top_k=None, generator=None):
        model = tiny()
        truth = model.generate(torch.tensor([tokens]), m)[0, len(tokens):].tolist()
        vocab = model.config.vocab_size
        return [t if i < self.right else (t + 1) % vocab for i, t in enumerate(truth)], None


def submit_all(s: Scheduler, requests, k) -> None:
    """Submit ``requests``; ``spec``: True (``PromptLookup(k)``), False (plain) or a drafter."""
    for r in requests:
        drafter = r["spec"] if isinstance(r["spec"], PromptLookup) else PromptLookup(k) if r["spec"] else None
        s.submit(r["prompt"], r["max_new_tokens"], r.get("temperature", 0.0), r.get("top_k"), r.get("seed"),
                 speculative=drafter)


def pool_for(decoder, requests, k, bs, extra=0, **kwargs) -> int:
    """The largest single promise (speculative rows' lookahead included) plus ``extra``: the smallest pool that fits."""
    sizing = Scheduler(decoder, 1, bs, **kwargs)
    return max(1, *(sizing.blocks_needed(len(r["prompt"]), r["max_new_tokens"], k if r["spec"] else 0)
                    for r in requests)) + extra


# ------------------------------------------------------------------ the block invariants, after every step
class BlockAudit:
    """Checks the pool after every step; with prefix caching, every cached block against a recomputation."""

    def __init__(self, s: Scheduler):
        self.s, self.reference = s, {}
        self.cached_seen = 0

    def check(self) -> None:
        s, bs = self.s, self.s.pool.block_size
        holds = [0] * s.pool.num_blocks
        for r in s.running:
            for i, b in enumerate(r.table):
                if b >= 0:
                    assert i * bs < r.written, (
                        f"request {r.id} holds logical block {i} (positions {i * bs}..{(i + 1) * bs - 1}), all at or "
                        f"past written={r.written}: only rejected drafts' keys, it should have gone back")
                    holds[b] += 1
            assert not r.drafts, "drafts outlived their verify"
        for r in s.waiting:
            assert r.table == [] and r.written == 0, f"waiting request {r.id} holds blocks"
        assert [s.pool.ref_count(b) for b in range(s.pool.num_blocks)] == holds, "reference counts != holds"
        if s.prefix_caching:
            self._check_cached()

    def _check_cached(self) -> None:
        """Every hashed block is a full block of some request's accepted tokens, its keys those of a fresh forward."""
        s, bs = self.s, self.s.pool.block_size
        prefixes = {}
        for r in [*s.running, *s.waiting, *s.finished.values()]:
            for i, h in enumerate(block_hashes(r.output, bs)):  # output: accepted tokens only, never drafts
                prefixes[h] = (tuple(r.output[: (i + 1) * bs]), i)
        for block in range(s.pool.num_blocks):
            h = s.pool.hash_of(block)
            if h is None:
                continue
            assert h in prefixes, f"block {block} is cached under a hash of no accepted tokens (a draft's block?)"
            tokens, i = prefixes[h]
            for layer, ((k, v), (k_ref, v_ref)) in enumerate(zip(s.kv, self._keys(tokens))):
                # 1e-6: two chunkings differ by up to 2e-8 here (paged attention and RMSNorm compute in float32);
                # another token's key differs by 1e-2 and more
                same = torch.allclose(k[block], k_ref[i], atol=1e-6) and torch.allclose(v[block], v_ref[i], atol=1e-6)
                assert same, f"cached block {block} (logical {i}) holds keys other than its tokens' (layer {layer})"
            self.cached_seen += 1

    def _keys(self, tokens: tuple):
        """Keys and values of ``tokens`` computed in one fresh forward: ``(blocks, block_size, heads, head_dim)``."""
        if tokens not in self.reference:
            s = self.s
            n = len(tokens) // s.pool.block_size
            kv = [(torch.zeros(n, *k.shape[1:], dtype=k.dtype), torch.zeros(n, *v.shape[1:], dtype=v.dtype))
                  for k, v in s.kv]
            s.decoder.step_paged(torch.tensor([tokens]), torch.tensor([0]), kv, torch.arange(n)[None], s.window_size)
            self.reference[tokens] = kv
        return self.reference[tokens]


def drive(s: Scheduler) -> dict[int, list[int]]:
    """``s.run()``, auditing the blocks after every step; the pool must be whole at the end."""
    audit = BlockAudit(s)
    while s.waiting or s.running:
        s.step()
        audit.check()
    assert s.pool.free_blocks == s.pool.num_blocks, "blocks leaked"
    s.audit = audit
    return {i: r.output for i, r in sorted(s.finished.items())}


# ------------------------------------------------------------------ greedy: plain decoding's tokens
@pytest.mark.parametrize("budget, caching, k", [
    (b, c, k) for b, c, k in itertools.product((None, 3, 8, 64), (False, True), (1, 2, 4))
])
def test_greedy_speculative_rows_beside_plain_rows_give_plain_tokens(budget, caching, k):
    """Eight requests, every other one speculative, blocks of 2, W = 4, a pool of the largest promise + 2."""
    decoder = tiny()
    requests = workload(seed=k, k=k)
    s = Scheduler(decoder, pool_for(decoder, requests, k, 2, 2, token_budget=budget), 2, max_running=5,
                  token_budget=budget, prefix_caching=caching)
    submit_all(s, requests, k)
    outputs = drive(s)
    for i, r in enumerate(requests):
        assert outputs[i] == solo(decoder, r), f"request {i} ({'speculative' if r['spec'] else 'plain'}) differs"
    st_ = s.stats()
    assert st_["spec_accepted"] > 0 and st_["spec_examined"] > st_["spec_accepted"], "drafts both kept and rejected"
    assert all(s.finished[i].spec is None for i, r in enumerate(requests) if not r["spec"])


@pytest.mark.parametrize("caching", [False, True])
def test_a_preempted_speculative_row_recomputes_and_keeps_plain_tokens(caching):
    """A budget of 6 on a pool of exactly the largest promise: speculative rows are preempted and come back."""
    decoder = tiny()
    requests = [dict(prompt=[1, 2, 3] * 3, max_new_tokens=16, spec=True) for _ in range(3)]
    requests += [dict(prompt=[4, 5] * 4, max_new_tokens=14, spec=i == 0) for i in range(2)]
    s = Scheduler(decoder, pool_for(decoder, requests, 4, 2, token_budget=6), 2, max_running=5, token_budget=6,
                  prefix_caching=caching)
    submit_all(s, requests, 4)
    outputs = drive(s)
    for i, r in enumerate(requests):
        assert outputs[i] == solo(decoder, r), f"request {i} differs after preemption"
    preempted = [r for r in s.finished.values() if r.preemptions and r.drafter is not None]
    assert preempted, "no speculative row was preempted: the test does not test what it says"
    assert any(r.spec.accepted for r in preempted), "a preempted row should still have verified drafts"


@pytest.mark.parametrize("budget", [None, 3])
def test_window_and_block_boundaries(budget):
    """W = 4, blocks of 2 and 3, prompts of W - 1, W, W + 1 tokens, prompt + new tokens at W - 1, W, W + 1 and 3W,
    k = 1, 2, 4: a prompt-lookup row and a row whose drafter is right once a round, beside a plain row."""
    decoder, W = tiny(window=4), 4
    kept = examined = 0
    for bs, p, total, k in itertools.product((2, 3), (W - 1, W, W + 1), (W - 1, W, W + 1, 3 * W), (1, 2, 4)):
        if total < p:
            continue
        prompt = ([7, 3, 5] * W)[:p]
        requests = [dict(prompt=prompt, max_new_tokens=total - p, spec=True),
                    dict(prompt=prompt[1:] + [2], max_new_tokens=total - p, spec=RightFor(k, right=1)),
                    dict(prompt=prompt[::-1], max_new_tokens=total - p + 1, spec=False)]
        s = Scheduler(decoder, pool_for(decoder, requests, k, bs, token_budget=budget), bs, token_budget=budget)
        submit_all(s, requests, k)
        outputs = drive(s)
        assert outputs == {i: solo(decoder, r) for i, r in enumerate(requests)}, (bs, p, total, k)
        kept += s.stats()["spec_accepted"]
        examined += s.stats()["spec_examined"]
    assert kept > 0 and examined > kept


@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data(), vocab=st.integers(3, 10), W=st.integers(2, 6), bs=st.integers(1, 4),
       budget=st.one_of(st.none(), st.integers(1, 12)), caching=st.booleans(), k=st.integers(1, 4),
       extra=st.integers(0, 3))
def test_random_configurations(data, vocab, W, bs, budget, caching, k, extra):
    """Random tiny decoders, windows, blocks, budgets and pools: plain tokens, the block audit after every step."""
    decoder = tiny(vocab=vocab, window=W)
    requests = data.draw(st.lists(st.fixed_dictionaries(dict(
        prompt=st.lists(st.integers(0, vocab - 1), min_size=1, max_size=12), max_new_tokens=st.integers(0, 12),
        spec=st.booleans())), min_size=1, max_size=4))
    s = Scheduler(decoder, pool_for(decoder, requests, k, bs, extra, token_budget=budget), bs, max_running=3,
                  token_budget=budget, prefix_caching=caching)
    submit_all(s, requests, k)
    outputs = drive(s)
    for i, r in enumerate(requests):
        assert outputs[i] == solo(decoder, r), f"request {i} differs"


# ------------------------------------------------------------------ blocks, worked by hand
@pytest.mark.parametrize("budget, caching", [(None, False), (None, True), (8, False), (8, True)])
def test_rejected_drafts_blocks_go_back_at_once(budget, caching):
    """W = 4, blocks of 2, a 7-token prompt, k = 4, the drafter right once.

    After the prefill (positions 0..6) the request holds logical blocks 2 and 3 (positions 4..7; the window of
    position 7 starts at 4). The verify feeds [pending, d1..d4] at positions 7..11: blocks 4 and 5 are taken.
    d1 is kept, d2 rejected: written = 9. Block 2 leaves the window; block 5 (positions 10, 11) holds only
    rejected keys and goes back; block 4 stays (position 8 accepted; d2's key at 9 is overwritten next step).
    With prefix caching, blocks 2 and 3 (full of accepted tokens) are hashed, block 4 is not.
    """
    decoder = tiny()
    s = Scheduler(decoder, 8, 2, token_budget=budget, prefix_caching=caching)
    s.submit([1, 2, 3, 4, 5, 6, 7], 12, speculative=RightFor(4, right=1))
    r = s.waiting[0]
    s.step()
    assert r.written == 7 and [i for i, b in enumerate(r.table) if b >= 0] == [2, 3]
    held_before = s.pool.used_blocks
    s.step()
    assert (r.spec.drafted, r.spec.accepted, r.spec.examined) == (4, 1, 2)
    assert r.written == 9 and len(r.tokens) == 3
    assert [i for i, b in enumerate(r.table) if b >= 0] == [3, 4], "the blocks of positions 6..9, no more"
    assert held_before == 2 and s.pool.used_blocks == 2
    if caching:
        assert s.pool.hash_of(r.table[3]) is not None and s.pool.hash_of(r.table[4]) is None
    assert s.trace[-1]["drafted"] == 4 and s.trace[-1]["accepted"] == 1 and s.trace[-1]["decode_tokens"] == 5
    drive(s)
    assert s.finished[0].output == solo(decoder, dict(prompt=[1, 2, 3, 4, 5, 6, 7], max_new_tokens=12))


def test_drafts_take_only_the_budget_left_by_every_running_row():
    """A budget of 3, three 1-token prompts: while all three decode, the budget is theirs (one token each) and the
    speculative row drafts nothing; once the plain rows finish (4 new tokens each), it drafts into the two left."""
    decoder = tiny()
    s = Scheduler(decoder, 32, 2, token_budget=3)
    s.submit([1], 12, speculative=RightFor(4, right=4))
    s.submit([2], 4)
    s.submit([3], 4)
    drive(s)
    assert [t["drafted"] for t in s.trace[:5]] == [0, 0, 0, 0, 2]
    assert [t["running"] for t in s.trace[:4]] == [3, 3, 3, 1]
    assert s.finished[0].output == solo(decoder, dict(prompt=[1], max_new_tokens=12))


def test_drafts_never_preempt_another_request():
    """W = 4, blocks of 2, a budget of 8; a speculative row whose drafter is always right beside a plain row. On a
    pool of 7 a verify of 5 tokens would take the block the plain row needs next: the row drafts fewer (vLLM
    would schedule all its drafts and preempt the plain row); on a pool of 9 it drafts them all."""
    decoder, drafted = tiny(), {}
    for num_blocks in (7, 9):
        s = Scheduler(decoder, num_blocks, 2, token_budget=8)
        s.submit([1, 2, 3], 16, speculative=RightFor(4, right=4))
        s.submit([7, 6, 5], 16)
        outputs = drive(s)
        assert s.stats()["preemptions"] == 0
        assert outputs[1] == solo(decoder, dict(prompt=[7, 6, 5], max_new_tokens=16))
        drafted[num_blocks] = [t["drafted"] for t in s.trace if t["drafted"]]
    assert drafted[9] == [4, 4, 4] and sum(drafted[7]) < 12


def test_a_draft_block_is_never_hashed():
    """Every draft right (a full verify's keys fill whole blocks) or none right: the cached blocks, checked against
    a recomputation after every step, are always blocks of accepted tokens."""
    decoder = tiny()
    for right in (0, 4):
        s = Scheduler(decoder, 12, 2, prefix_caching=True)
        for _ in range(2):  # the second one hits the first one's blocks
            s.submit([1, 2, 3, 4, 5, 6, 7], 14, speculative=RightFor(4, right=right))
        drive(s)
        assert s.audit.cached_seen > 0
        st_ = s.stats()
        assert st_["prefix_hit_tokens"] > 0
        assert st_["spec_accepted"] == (st_["spec_drafted"] if right else 0)
        for i in range(2):
            assert s.finished[i].output == solo(decoder, dict(prompt=[1, 2, 3, 4, 5, 6, 7], max_new_tokens=14))


class RecordingStore(LocalStore):
    """A LocalStore that keeps what it was given: ``(hash, keys, values)`` per put."""

    def __init__(self):
        super().__init__(10**8)
        self.given = []

    def put_block(self, block_hash, layout, keys, values):
        self.given.append((block_hash, keys.clone(), values.clone()))
        super().put_block(block_hash, layout, keys, values)


@pytest.mark.parametrize("budget", [None, 8])
def test_the_store_gets_only_accepted_blocks_and_gives_them_back(budget):
    """A pool of 10 blocks of 2 evicts to a store while speculative rows (a drafter always wrong, so every verify
    writes rejected keys) decode 16 tokens past 13-token prompts: every block the store received is a full block
    of accepted tokens with their keys; a second scheduler on the same store hits them and gives plain tokens."""
    decoder, store = tiny(window=6), RecordingStore()
    prompts = [[(3 * i + j) % 10 for j in range(13)] for i in range(4)]
    first = Scheduler(decoder, 10, 2, token_budget=budget, prefix_caching=True, store=store)
    for p in prompts:
        first.submit(p, 16, speculative=RightFor(4, right=0))
        assert drive(first)[first._ids - 1] == solo(decoder, dict(prompt=p, max_new_tokens=16))
    assert first.stats()["spec_drafted"] > 0 and first.stats()["spec_accepted"] == 0
    assert store.given, "nothing was evicted to the store"
    audit = first.audit
    accepted = {h: (tuple(r.output[: (i + 1) * 2]), i) for r in first.finished.values()
                for i, h in enumerate(block_hashes(r.output, 2))}
    for h, keys, values in store.given:
        assert h in accepted, "the store got a block hashed from tokens no request accepted"
        tokens, i = accepted[h]
        ref = audit._keys(tokens)
        assert torch.allclose(keys, torch.stack([k[i] for k, _ in ref]), atol=1e-6)
        assert torch.allclose(values, torch.stack([v[i] for _, v in ref]), atol=1e-6)
    second = Scheduler(decoder, 10, 2, token_budget=budget, prefix_caching=True, store=store)
    second.submit(prompts[0], 16, speculative=PromptLookup(3))
    assert drive(second)[0] == solo(decoder, dict(prompt=prompts[0], max_new_tokens=16))
    assert second.stats()["store_hit_blocks"] > 0


def test_blocks_needed_counts_the_lookahead():
    """The reserved mode promises the window plus the k drafts of a verify; a lone request never holds more.

    W = 4, blocks of 2, a 1-token prompt, 20 new: a plain decode reads positions n - 3 .. n (4 positions,
    ceil(3 / 2) + 1 = 3 blocks); a verify of k + 1 tokens reads n - 3 .. n + k: with k = 4, 8 positions,
    ceil(7 / 2) + 1 = 5 blocks. With a token budget the budget already bounds a verify: no change.
    """
    s = Scheduler(tiny(), 64, 2)
    assert [s.blocks_needed(1, 20, k) for k in (0, 1, 2, 4)] == [3, 3, 4, 5]
    assert s.blocks_needed(1, 3, 4) == 2, "3 positions ever written fill 2 blocks, whatever the lookahead"
    budget = Scheduler(tiny(), 64, 2, token_budget=3)
    assert budget.blocks_needed(1, 20, 4) == budget.blocks_needed(1, 20) == 4
    peaks = []
    for k, right in ((4, 4), (4, 1), (2, 2)):
        s = Scheduler(tiny(), 64, 2)
        s.submit([1], 20, speculative=RightFor(k, right))
        request, peak, real_hold = s.waiting[0], [0], s._hold

        def hold(r, lo, hi, real_hold=real_hold, peak=peak):
            real_hold(r, lo, hi)
            peak[0] = max(peak[0], sum(b >= 0 for b in r.table))

        s._hold = hold
        s.run()
        assert request.reserved == s.blocks_needed(1, 20, k) >= peak[0], (k, right)
        peaks.append(peak[0])
    assert max(peaks) > s.blocks_needed(1, 20), "a verify needs more than a plain decode's promise"


# ------------------------------------------------------------------ sampling
def test_sampled_rows_equal_the_rings_speculative_loop_with_the_same_seed():
    """Reserved mode, a pool with room: nothing cuts a draft, so each sampled speculative row draws exactly what
    ``speculative_generate`` (ring, batch 1) draws with the same seed; plain sampled rows equal ``generate``."""
    decoder = tiny(vocab=6)
    requests = [dict(prompt=[0, 1, 2, 0, 1][: 2 + i % 4], max_new_tokens=10, temperature=0.8, top_k=None if i % 3
                     else 4, seed=i, spec=i % 4 != 3) for i in range(12)]
    s = Scheduler(decoder, 200, 2, max_running=6)
    submit_all(s, requests, 3)
    outputs = drive(s)
    for i, r in enumerate(requests):
        if r["spec"]:
            g = torch.Generator().manual_seed(r["seed"])
            ref, _ = speculative_generate(decoder, torch.tensor([r["prompt"]]), 10, PromptLookup(3), 0.8, r["top_k"], g)
            assert outputs[i] == ref[0].tolist(), f"speculative request {i}"
        else:
            assert outputs[i] == solo(decoder, r), f"plain request {i}"
    assert s.stats()["spec_accepted"] > 0 and s.stats()["spec_examined"] > s.stats()["spec_accepted"]


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test of ``counts`` against ``probs``: the chi-square survival function at the statistic."""
    expected = probs.double() * counts.sum()
    stat = float(((counts.double() - expected) ** 2 / expected).sum())
    dof = counts.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2)))


def accept_without_ratio_test(logits, drafts, q=None, temperature=0.0, top_k=None, generator=None):
    """A wrong rule: keep every draft, sample the bonus. Sampling no longer follows the target."""
    probs = torch.softmax(logits.double() / temperature, -1)
    return len(drafts), int(torch.multinomial(probs[len(drafts)], 1, generator=generator))


@pytest.mark.parametrize("rule", ["exact", "mutant"])
def test_sampled_rows_follow_the_target_distribution_under_cuts_and_preemption(rule, monkeypatch):
    """600 seeded requests, vocabulary 3, prompt [0, 1], 4 new tokens at temperature 1, k = 3, one scheduler with a
    budget of 64 and a pool of 60 blocks of 2: drafts cut by the budget and the pool, rows preempted. Tokens 2..4
    against their exact distribution (the oracle enumerated); a rule without the ratio test is caught."""
    if rule == "mutant":
        monkeypatch.setattr(scheduler_module, "accept", accept_without_ratio_test)
    model = tiny(vocab=3, window=3, layers=2, sharpen=4.0, seed=3)
    prompt, runs = [0, 1], 600
    s = Scheduler(model, 60, 2, max_running=runs, token_budget=64)
    for seed in range(runs):
        s.submit(prompt, 4, temperature=1.0, seed=seed, speculative=PromptLookup(3))
    outputs = s.run()
    counts = torch.zeros(27)
    for out in outputs.values():
        counts[out[3] * 9 + out[4] * 3 + out[5]] += 1
    seqs = torch.tensor(list(itertools.product(range(3), repeat=4)))  # every continuation of 4 tokens
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.cat([torch.tensor([prompt]).expand(81, 2), seqs], 1)).double(), -1)
    joint = sum(logp[torch.arange(81), 1 + i, seqs[:, i]] for i in range(4)).exp()  # p(t1 t2 t3 t4 | prompt)
    probs = joint.view(3, 27).sum(0)  # marginal of t2 t3 t4
    st_ = s.stats()
    assert st_["preemptions"] > 0
    assert sum(t["drafted"] for t in s.trace) < 3 * st_["spec_rounds"], "some drafts were cut"
    if rule == "exact":
        assert 0 < st_["spec_accepted"] < st_["spec_examined"], "drafts both kept and rejected"
        assert chi_square_p_value(counts, probs) > 1e-3, "speculative rows do not follow the target's distribution"
    else:
        assert chi_square_p_value(counts, probs) < 1e-6, "the test cannot tell a rule without the ratio test"


# ------------------------------------------------------------------ counts
def test_stats_and_trace_count_rounds_drafts_and_acceptance():
    """Per request (``spec``, as SpeculativeStats), per step (trace) and in total (stats) the counts agree; a
    round emits its accepted drafts and one token, so new tokens = rounds + accepted (+ the prefill's pick)."""
    decoder = tiny()
    requests = workload(seed=5)
    s = Scheduler(decoder, 64, 2, max_running=8, token_budget=16)
    submit_all(s, requests, 3)
    drive(s)
    st_ = s.stats()
    specs = [r.spec for r in s.finished.values() if r.spec is not None]
    for key in ("rounds", "drafted", "accepted", "examined"):
        assert st_[f"spec_{key}"] == sum(getattr(x, key) for x in specs)
    assert st_["spec_drafted"] == sum(t["drafted"] for t in s.trace)
    assert st_["spec_accepted"] == sum(t["accepted"] for t in s.trace)
    for r in s.finished.values():
        if r.spec is not None and r.max_new_tokens:
            assert len(r.tokens) == 1 + r.spec.rounds + r.spec.accepted
            assert r.spec.accepted <= r.spec.examined <= r.spec.drafted
    assert 0 < st_["spec_accepted"] / st_["spec_examined"] < 1


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("make, words", [
    (lambda m: early_exit(m, 1, 2), "speculative must be a PromptLookup"),
    (lambda m: 4, "speculative must be a PromptLookup(k)"),
    (lambda m: "lookup", "got str"),
])
def test_a_drafter_of_another_kind_is_refused_by_name(make, words):
    s = Scheduler(tiny(), 16, 2)
    with pytest.raises(ValueError) as info:
        s.submit([1, 2, 3], 4, speculative=make(tiny()))
    assert words in str(info.value)
    assert not s.waiting and s.submit([1], 1) == 0, "the scheduler changed"


def test_k_must_be_positive():
    with pytest.raises(ValueError, match="k must be a positive int"):
        PromptLookup(0)
    drafter = PromptLookup(2)
    drafter.k = 0  # changed after it was built
    s = Scheduler(tiny(), 16, 2)
    with pytest.raises(ValueError, match=r"speculative\.k must be a positive int"):
        s.submit([1, 2, 3], 4, speculative=drafter)
    assert not s.waiting and s.submit([1], 1) == 0
    with pytest.raises(ValueError, match="lookahead must be a non-negative int"):
        s.blocks_needed(3, 4, -1)


def test_a_request_whose_verifies_cannot_fit_is_refused_at_submit():
    """A pool that holds the request plainly (3 blocks) but not its verifies of k + 1 = 5 tokens (5 blocks)."""
    s = Scheduler(tiny(), 3, 2)
    with pytest.raises(ValueError, match=r"can never fit the pool.*verifies of 5.*hold up to 5 blocks"):
        s.submit([1], 20, speculative=PromptLookup(4))
    assert not s.waiting
    s.submit([1], 20)
    assert s.run()[0] == solo(tiny(), dict(prompt=[1], max_new_tokens=20))


def test_each_request_drafts_with_its_own_copy():
    drafter = PromptLookup(3)
    s = Scheduler(tiny(), 32, 2)
    s.submit([1, 2, 1, 2], 6, speculative=drafter)
    s.submit([3, 4, 3, 4], 6, speculative=drafter)
    a, b = s.waiting
    assert a.drafter is not drafter and b.drafter is not drafter and a.drafter is not b.drafter
    assert repr(a.drafter) == repr(drafter)
