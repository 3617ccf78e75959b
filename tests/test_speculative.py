"""Speculative decoding (issue 39): greedy gives plain decoding's tokens, sampling its distribution.

The specification: ``Decoder.generate(..., speculative=drafter)`` drafts ``k`` tokens, verifies them in
one forward of ``k + 1`` queries over rings with ``k`` lookahead slots, keeps the agreeing prefix and
rolls the rest back. Greedy, it emits exactly the tokens of ``generate`` without it, past the window,
for both drafters and every ``k``; sampled, each token follows the target's distribution (Leviathan
et al. 2023 §2.3): a chi-square test against distributions computed exactly, which a rule accepting
drafts without the ratio test fails.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swkv_teach import Decoder, DecoderConfig, load_pretrained, make_cache
from swkv_teach.caches import RingBufferKVCache
from swkv_teach.model import LayerCaches
from swkv_teach.speculative import (
    DraftModel,
    PromptLookup,
    accept_sampled,
    early_exit,
    speculative_generate,
    verify,
)


def tiny(vocab=24, window=6, layers=3, seed=0, sharpen=30.0) -> Decoder:
    """A random decoder whose head is scaled up, in float64: its greedy choices are far from ties (top-2 logit gaps
    of 6e-4 and more over 50 random prompts) and its rounding far below them, on any BLAS. The shipped checkpoint's
    test below runs in float32 (its smallest gap there: 0.31)."""
    torch.manual_seed(seed)
    model = Decoder(DecoderConfig(vocab_size=vocab, dim=32, n_layers=layers, n_heads=4, n_kv_heads=2, head_dim=8,
                                  hidden_dim=48, window_size=window)).double().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model


@pytest.fixture(scope="module")
def shipped():
    return load_pretrained()


# --------------------------------------------------------------------------- greedy: the same tokens
@settings(max_examples=30, deadline=None, derandomize=True)
@given(prompt=st.lists(st.integers(0, 23), min_size=1, max_size=14), k=st.integers(1, 8),
       drafter=st.sampled_from(["lookup", "exit1", "exit2"]), new=st.integers(0, 30))
def test_greedy_speculative_gives_the_tokens_of_plain_greedy(prompt, k, drafter, new):
    """Random prompts on a W = 6 model, lengths past the window, both drafters, k = 1..8."""
    model = tiny()
    ids = torch.tensor([prompt])
    d = PromptLookup(k) if drafter == "lookup" else early_exit(model, int(drafter[-1]), k)
    plain = model.generate(ids, new)
    fast = model.generate(ids, new, speculative=d)
    assert torch.equal(fast, plain), f"first difference at {(fast != plain).nonzero()[:1].tolist()}"


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("drafter", ["lookup", "exit"])
def test_greedy_speculative_on_the_shipped_checkpoint_past_its_window(shipped, k, drafter):
    model, tok = shipped
    text = "    def update(self, k_new, v_new):\n        slot = self._claim_slot()\n        self._k_slots[slot]"
    ids = torch.tensor([tok.encode(text)])
    d = PromptLookup(k) if drafter == "lookup" else early_exit(model, 2, k)
    fast, stats = speculative_generate(model, ids, 40, d)
    assert ids.shape[1] > model.config.window_size  # the prompt alone fills the window: every round is past it
    assert torch.equal(fast, model.generate(ids, 40))
    assert stats.accepted > 0 and stats.examined > stats.accepted  # drafts were kept and rolled back both
    assert stats.rounds < 39  # fewer target forwards than tokens


def test_a_full_depth_draft_is_always_accepted():
    """early_exit with every layer is the target itself: greedy, every draft is accepted (no rollback ever)."""
    model = tiny()
    _, stats = speculative_generate(model, torch.tensor([[1, 2, 3]]), 40, early_exit(model, 3, 4))
    assert stats.drafted > 0 and stats.accepted == stats.drafted and stats.acceptance_rate == 1.0
    assert stats.rounds == 8 and stats.drafted == 31  # 39 tokens after the first: 7 rounds of 4 + 1, then 3 + 1


def test_early_exit_shares_the_weights_and_leaves_the_random_state_alone():
    model = tiny()
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    draft = early_exit(model, 2, 3)
    assert torch.equal(torch.rand(3), expected)
    assert draft.model.layers[1] is model.layers[1] and len(draft.model.layers) == 2
    assert draft.model.lm_head is model.lm_head and draft.model.embed is model.embed


def test_prompt_lookup_finds_the_longest_suffix_earliest():
    # vLLM's docstring example (ngram_proposer.py): [4, 2, 3] follows the match of [2, 3]
    assert PromptLookup(4, max_ngram=3, min_ngram=2).propose([1, 2, 3, 4, 2, 3], 4)[0] == [4, 2, 3]
    # a 2-gram match beats an earlier 1-gram one; of two 2-gram matches the earliest wins
    tokens = [5, 3, 9, 7, 3, 1, 7, 3, 8, 7, 3]
    assert PromptLookup(3, max_ngram=2).propose(tokens, 3)[0] == [1, 7, 3]
    assert PromptLookup(3, max_ngram=1).propose(tokens, 3)[0] == [9, 7, 3]
    assert PromptLookup(3).propose(tokens, 2)[0] == [1, 7]  # m caps the proposal
    assert PromptLookup(3).propose([1, 2, 3], 3) == ([], None)  # no earlier occurrence
    assert PromptLookup(3).propose([4], 3) == ([], None)


# --------------------------------------------------------------------------- the verify in place
def _rings(model, k, in_place=True):
    W = model.config.window_size
    caches = LayerCaches([RingBufferKVCache(W, lookahead=k) for _ in model.layers], W)
    if not in_place:  # the way every verify went before update_in_place: update, then a mask from positions
        for cache in caches:
            cache.reads_in_place = False
    return caches


@pytest.mark.parametrize("offset", [-1, 0, 1])
@pytest.mark.parametrize("laps", [0, 1, 2])
def test_a_verify_in_place_gives_the_logits_of_the_masked_path_and_of_the_oracle(offset, laps):
    """Verifies of 1..k + 1 tokens after W - 1, W, W + 1 tokens (and laps of the W + k slots), each followed
    by the rollback of a rejection, in float32: the rows equal what update + a window mask gives, and the
    full-sequence forward of the tokens as they stand (the rejected ones gone), to float32 rounding."""
    torch.manual_seed(1)
    model = tiny(window=5).float()
    W, k = 5, 3
    n = max(1, W + offset + laps * (W + k))
    seq = torch.randint(0, 24, (1, n))
    fast, masked = _rings(model, k), _rings(model, k, in_place=False)
    model.step(seq, fast)
    model.step(seq, masked)
    g = torch.Generator().manual_seed(offset + 10 * laps)
    for c in [1, k + 1, 2, k + 1, 1, 3, k + 1, k + 1, 1, 2]:  # past the next wrap whatever n is
        chunk = torch.randint(0, 24, (1, c), generator=g)
        got, want = model.step(chunk, fast)[0], model.step(chunk, masked)[0]
        oracle = model(torch.cat([seq, chunk], dim=1))[0, -c:]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got, oracle, rtol=1e-5, atol=1e-5)
        keep = int(torch.randint(1, c + 1, (), generator=g))  # the accepted drafts and the pending token
        for cache in (*fast, *masked):
            cache.rollback(c - keep)
        seq = torch.cat([seq, chunk[:, :keep]], dim=1)


def test_the_decoder_verifies_in_place_once_the_rings_have_gone_round():
    """The fast path is taken, not just correct: past the first lap a verify (and a one-token step) never calls
    the rings' update, whose chunk path gathers the window and whose caller builds a mask."""
    model = tiny()
    caches = _rings(model, 4)
    model.step(torch.randint(0, 24, (1, 12)), caches)  # W + k = 10 slots: the rings have wrapped
    for cache in caches:
        cache.update = None  # calling it now would raise TypeError
    model.step(torch.randint(0, 24, (1, 5)), caches)
    model.step(torch.randint(0, 24, (1, 1)), caches)
    assert caches[0].seen == 18


# --------------------------------------------------------------------------- sampling: the same distribution
def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test of ``counts`` against ``probs`` (cells of expected count < 5 pooled into one)."""
    n = counts.sum()
    expected = probs.double() * n
    small = expected < 5
    obs = torch.cat([counts[~small].double(), counts[small].double().sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2))  # chi2 sf


def accept_without_ratio(p, drafts, q, generator=None):
    """The mutant: every draft accepted (no min(1, p/q) test), then a bonus token from p."""
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def markov_run(rule, P, Q, k, length, generator, deterministic=False):
    """Speculative sampling of ``length`` tokens from the Markov chain ``P`` (start state 0), drafts from ``Q``.

    ``deterministic``: the drafter proposes ``argmax Q`` (a one-hot q, as prompt lookup does).
    """
    out = [0]
    while len(out) - 1 < length:
        m = min(k, length - (len(out) - 1) - 1)
        drafts, q_rows, prev = [], [], out[-1]
        for _ in range(m):
            d = int(Q[prev].argmax()) if deterministic else int(torch.multinomial(Q[prev], 1, generator=generator))
            drafts.append(d)
            q_rows.append(Q[prev])
            prev = d
        context = [out[-1], *drafts]
        p = P[torch.tensor(context)]  # (m + 1, V): the target's distribution after each token
        a, token = rule(p, drafts, None if deterministic or not m else torch.stack(q_rows), generator)
        out += drafts[:a] + [token]
    return out[1:]


def markov_reference(P, length):
    V = P.shape[0]
    probs = torch.zeros(V**length, dtype=torch.float64)
    for i, seq in enumerate(itertools.product(range(V), repeat=length)):
        prob, prev = 1.0, 0
        for t in seq:
            prob *= float(P[prev, t])
            prev = t
        probs[i] = prob
    return probs


def markov_counts(rule, deterministic, runs=2000, V=3, length=3, k=2):
    g = torch.Generator().manual_seed(1234)
    P = torch.distributions.Dirichlet(torch.full((V,), 0.6)).sample((V,)).double()
    Q = torch.distributions.Dirichlet(torch.full((V,), 0.6)).sample((V,)).double()
    counts = torch.zeros(V**length)
    for _ in range(runs):
        seq = markov_run(rule, P, Q, k, length, g, deterministic)
        counts[sum(t * V ** (length - 1 - i) for i, t in enumerate(seq))] += 1
    return counts, markov_reference(P, length)


@pytest.mark.parametrize("deterministic", [False, True])
def test_speculative_sampling_follows_the_target_distribution_and_the_mutant_does_not(deterministic):
    """Three tokens of a 3-state Markov chain (27 cells), drafts from another chain, 2000 fixed-seed runs."""
    torch.manual_seed(0)
    counts, probs = markov_counts(accept_sampled, deterministic)
    assert chi_square_p_value(counts, probs) > 1e-3, "speculative sampling does not follow the target's distribution"
    torch.manual_seed(0)
    counts, probs = markov_counts(accept_without_ratio, deterministic)
    assert chi_square_p_value(counts, probs) < 1e-6, "the test cannot tell a rule without the ratio test"


def test_sampling_through_the_decoder_follows_the_model_distribution():
    """The whole loop (a draft model's samples, verify, rollbacks of both rings), a vocabulary of 3: tokens 2..4
    of 600 seeded generations against their exact distribution, computed by enumerating the oracle."""
    model = tiny(vocab=3, window=3, layers=2, sharpen=4.0, seed=3)
    prompt, draft = torch.tensor([[0, 1]]), DraftModel(tiny(vocab=3, window=3, layers=1, sharpen=4.0, seed=7), 3)
    runs, counts, rates = 600, torch.zeros(27), []
    for seed in range(runs):
        g = torch.Generator().manual_seed(seed)
        out, stats = speculative_generate(model, prompt, 4, draft, temperature=1.0, generator=g)
        rates.append(stats.acceptance_rate)
        t = out[0, 3:].tolist()
        counts[t[0] * 9 + t[1] * 3 + t[2]] += 1
    seqs = torch.tensor(list(itertools.product(range(3), repeat=4)))  # every continuation of 4 tokens
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.cat([prompt.expand(81, 2), seqs], 1)).double(), -1)  # (81, 6, 3)
    joint = sum(logp[torch.arange(81), 1 + i, seqs[:, i]] for i in range(4)).exp()  # p(t1 t2 t3 t4 | prompt)
    probs = joint.view(3, 27).sum(0)  # marginal of t2 t3 t4
    assert abs(float(probs.sum()) - 1) < 1e-9
    assert 0.2 < sum(rates) / runs < 0.95  # drafts both kept and rejected: the test runs both branches
    assert chi_square_p_value(counts, probs) > 1e-3


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("make", [lambda m: PromptLookup(0), lambda m: PromptLookup(-2), lambda m: early_exit(m, 1, 0),
                                  lambda m: DraftModel(m, 0)])
def test_k_must_be_positive(make):
    with pytest.raises(ValueError, match="k must be a positive int"):
        make(tiny())


def test_more_drafts_than_the_rings_lookahead_is_refused_and_nothing_changes():
    model = tiny()
    caches = LayerCaches([RingBufferKVCache(6, lookahead=2) for _ in model.layers], 6)
    model.step(torch.tensor([[1, 2, 3, 4, 5, 6, 7]]), caches)
    with pytest.raises(ValueError, match=r"drafts: 3 tokens, more than caches\[0\]'s lookahead=2"):
        verify(model, caches, 1, [2, 3, 4])
    assert all(c.seen == 7 for c in caches)
    a, _ = verify(model, caches, 1, [2, 3])  # within the lookahead: fine
    assert all(c.seen == 8 + a for c in caches)


def test_caches_that_cannot_roll_back_are_refused_by_name():
    model = tiny()
    caches = LayerCaches([make_cache("naive", 6) for _ in model.layers], 6)
    with pytest.raises(ValueError, match="SlidingWindowKVCache, which cannot take tokens back"):
        verify(model, caches, 1, [2])


def test_a_drafter_of_another_vocabulary_is_refused():
    model, other = tiny(vocab=24), tiny(vocab=30)
    with pytest.raises(ValueError, match="draft model's vocab_size is 30, the target's is 24"):
        model.generate(torch.tensor([[1, 2]]), 5, speculative=DraftModel(other, 2))


@pytest.mark.parametrize("kwargs,match", [
    ({"cache": "naive"}, "cache='ring'"),
    ({"compile": True}, "not compiled"),
])
def test_generate_refuses_speculative_decoding_off_the_eager_ring(kwargs, match):
    model = tiny()
    with pytest.raises(ValueError, match=match):
        model.generate(torch.tensor([[1, 2]]), 5, speculative=PromptLookup(2), **kwargs)


def test_batches_and_non_drafters_are_refused():
    model = tiny()
    with pytest.raises(ValueError, match="batch 1.*got prompt_ids of batch 2"):
        model.generate(torch.tensor([[1, 2], [3, 4]]), 5, speculative=PromptLookup(2))
    with pytest.raises(ValueError, match="speculative must be a drafter"):
        model.generate(torch.tensor([[1, 2]]), 5, speculative=4)
    with pytest.raises(ValueError, match=r"layers must be an int in \[1, 3\]"):
        early_exit(model, 4)
