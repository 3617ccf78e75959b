"""Exercise 14's check beyond the catalogue run by tests/test_grading.py (``-k speculative``: each wrong answer of
tests/wrong_answers/speculative.py refused with its named message, each right answer of
tests/right_answers/speculative.py passing).

Here: the exact law the statistical test uses is the rule's (the library's sampler follows it, and it hands out
``p`` as Leviathan et al.'s theorem says); the test passes counts drawn from that law whatever the seed, and
refuses counts drawn from each mistake's law, naming it; the library's own functions are refused however they
are handed in; the decoders' paths keep clear of argmax ties, so answers whose sums round otherwise agree.
"""

from __future__ import annotations

import copy
import functools
import math
import sys
import types

import pytest
import torch

from swkv_teach import speculative as lib
from swkv_teach.grading import ExerciseFailed, check_speculative_accept, check_speculative_decoding
from swkv_teach.grading import _speculative_law as L
from swkv_teach.grading import _speculative_rounds as R
from swkv_teach.grading._own import calls_to
from tests.right_answers import load as load_right
from tests.wrong_answers import load as load_wrong
from tests.wrong_answers.speculative import good_accept, good_caches, good_verify

CHECK = "check_speculative_decoding"


def test_the_catalogue_holds_at_least_15_wrong_and_5_right_answers_each_naming_its_bug():
    wrong = [w for w in load_wrong() if w.check == CHECK]
    right = [r for r in load_right() if r.check == CHECK]
    assert len(wrong) >= 15 and len(right) >= 5, (len(wrong), len(right))
    assert all(w.words and w.__doc__ for w in wrong), [w.__name__ for w in wrong if not w.words]
    parts = {"accept": sum(w.accept is not good_accept for w in wrong),
             "speculative_caches": sum(w.speculative_caches is not good_caches for w in wrong),
             "verify": sum(w.verify is not good_verify for w in wrong)}
    assert all(n >= 5 for n in parts.values()), parts  # each part has mistakes of its own


# ------------------------------------------------------------------ the law
def test_the_library_sampler_follows_the_law_on_every_case():
    """A second method: the library's accept_sampled, 3,000 seeded draws per case, against the closed form."""
    for case in L.cases():
        g = torch.Generator().manual_seed(99)
        counts = torch.zeros(len(case.drafts) + 1, case.p.shape[1])
        for _ in range(3000):
            a, t = lib.accept_sampled(case.p, case.drafts, case.q, g)
            counts[a, t] += 1
        assert L.verdict(counts, L.law(case.p, case.drafts, case.q)) is None, case.title


@pytest.mark.parametrize("seed", range(5))
def test_the_law_hands_out_p_exactly_as_leviathan_et_al_prove(seed):
    """The first token emitted (the draft if kept, else the correction), drafts drawn from q, is distributed as p:
    sum over d of q(d) [P(keep d) 1{t = d} + P(reject d, token t)] = p(t); with one-hot drafts, for each d."""
    g = torch.Generator().manual_seed(seed)
    V = 6
    p = torch.rand(2, V, generator=g, dtype=torch.float64) ** 3
    p[:, seed % V] = 0.0  # a zero, as top-k makes
    q = torch.rand(1, V, generator=g, dtype=torch.float64) ** 2 + 0.01
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    first = torch.zeros(V, dtype=torch.float64)
    for d in range(V):
        law = L.law(p, [d], q)
        first[d] += q[0, d] * law[1].sum()
        first += q[0, d] * law[0]
    assert torch.allclose(first, p[0], atol=1e-12)
    for d in range(V):
        if p[0, d] < 1:
            law = L.law(p, [d], None)
            emitted = law[0].clone()
            emitted[d] += law[1].sum()
            assert torch.allclose(emitted, p[0], atol=1e-12)


def test_right_counts_pass_whatever_the_seed_and_each_mistakes_counts_are_named():
    """Counts drawn straight from the right law pass on every case for 100 seeds (the test's false alarms: the
    check's ALPHA per cell). Counts drawn from each mistake's law fail on some case, and the first case that
    fails names that very mistake: the cases tell the mistakes apart."""
    g = torch.Generator().manual_seed(0)

    def draw(law, n):
        flat = torch.multinomial(law.flatten().float(), n, replacement=True, generator=g)
        return torch.bincount(flat, minlength=law.numel()).view(law.shape).double()

    for _ in range(100):
        for case in L.cases():
            assert L.verdict(draw(L.law(case.p, case.drafts, case.q), case.n),
                             L.law(case.p, case.drafts, case.q)) is None, case.title
    for mk in L.MISTAKES:
        for case in L.cases():
            if not mk.when(case.p, case.q, case.drafts):
                continue
            counts = draw(L.law(case.p, case.drafts, case.q, mk.rule), case.n)
            if L.verdict(counts, L.law(case.p, case.drafts, case.q)) is not None:
                assert L.named(counts, case.p, case.drafts, case.q) is mk, (mk.key, case.title)
                break
        else:
            pytest.fail(f"no case catches the mistake {mk.key!r}")


@pytest.mark.parametrize("n", [300, 2000])
def test_an_outcome_the_rule_never_gives_fails_from_three_draws_not_from_one(n):
    """An answer keeping d when u <= p(d) / q(d) keeps a draft of p(d) = 0 when the uniform is exactly 0 (a float32
    torch.rand is, with probability 2**-24): one such draw must not fail it. Three do, and the cell is named."""
    law = torch.tensor([[0.5, 0.0], [0.0, 0.5]], dtype=torch.float64)
    for stray, failed in ((1, None), (2, None), (3, (0, 1))):
        counts = torch.tensor([[n // 2 - stray, stray], [0, n // 2]], dtype=torch.float64)
        assert L.verdict(counts, law) == failed, (n, stray)


def test_each_mistake_misses_by_far_more_than_the_tests_threshold():
    """Power: on its best case, each mistake's law is at least 3x the test's -log(ALPHA) away from the rule's
    (n KL at the worst cell), or gives an outcome the rule never does."""
    for mk in L.MISTAKES:
        best = 0.0
        for case in L.cases():
            if not mk.when(case.p, case.q, case.drafts):
                continue
            right, theirs = L.law(case.p, case.drafts, case.q), L.law(case.p, case.drafts, case.q, mk.rule)
            if bool(((right == 0) & (theirs > 0.01)).any()):
                best = math.inf
                break
            best = max(best, float((case.n * L._kl(theirs, right)).max()))
        assert best >= 3 * -math.log(L.ALPHA), (mk.key, best)


# ------------------------------------------------------------------ refusals and kind reports
@pytest.mark.parametrize("how", ["itself", "partial", "wraps"])
def test_the_librarys_functions_are_refused_however_handed_in(how):
    def hand(f):
        if how == "partial":
            return functools.partial(f)
        if how == "wraps":
            return functools.wraps(f)(lambda *a, **k: f(*a, **k))
        return f

    with pytest.raises(ExerciseFailed, match="library's own swkv_teach.speculative.accept_sampled"):
        check_speculative_accept(hand(lib.accept_sampled))
    with pytest.raises(ExerciseFailed, match="library's own swkv_teach.speculative.verify"):
        check_speculative_decoding(good_accept, good_caches, hand(lib.verify))


def test_a_stub_is_reported_as_not_implemented():
    def stub(*args):
        raise NotImplementedError("exercise 14: replace these two lines with your code")

    with pytest.raises(ExerciseFailed, match="not implemented yet"):
        check_speculative_accept(stub)
    with pytest.raises(ExerciseFailed, match="not implemented yet"):
        check_speculative_decoding(good_accept, stub, good_verify)


def test_calls_to_records_calls_by_any_name_and_puts_the_previous_profiler_back():
    def previous(frame, event, arg):
        return None

    sys.setprofile(previous)
    try:
        alias = lib.accept_greedy
        with calls_to(lib.accept_greedy, lib.speculative_generate) as hits:
            alias(torch.zeros(1, 3), [])
            torch.no_grad()(lambda: None)()  # shares the decorator's wrapper with speculative_generate: not a hit
        assert hits == ["accept_greedy"]
        assert sys.getprofile() is previous
    finally:
        sys.setprofile(None)


# ------------------------------------------------------------------ part 2's decoders
def test_the_checks_paths_keep_clear_of_argmax_ties(monkeypatch):
    """Along the path a right answer takes, every row whose choice is compared has its top two logits apart
    (float32 by 1e-4, bfloat16 by 0.1): an answer whose sums round otherwise (rings with more lookahead, a
    forward written from the parts, another argmax) makes the same choices. Measured: 1.0e-3 and 0.35."""
    gaps = {}
    real = lib.verify

    def measuring(model, caches, pending, drafts):
        logits = model.step(torch.tensor([[pending, *drafts]], device=next(model.parameters()).device),
                            copy.deepcopy(caches))[0].float()
        a, _ = lib.accept_greedy(logits, drafts)
        top = logits[: a + 1].topk(2, dim=-1).values
        dtype = next(model.parameters()).dtype
        gaps[dtype] = min(gaps.get(dtype, math.inf), float((top[:, 0] - top[:, 1]).min()))
        return real(model, caches, pending, drafts)

    monkeypatch.setattr(R, "lib", types.SimpleNamespace(
        verify=measuring, accept_greedy=lib.accept_greedy, accept_sampled=lib.accept_sampled,
        speculative_generate=lib.speculative_generate))
    assert R.check_rounds(good_caches, good_verify, torch.device("cpu")) > 100
    assert gaps[torch.float32] > 1e-4 and gaps[torch.bfloat16] > 0.1, gaps


def test_rings_with_one_lookahead_slot_fewer_than_k_pass_and_two_fewer_do_not():
    """The lookahead is judged by what it does: pending is always kept, so a verify takes back at most k tokens,
    and a ring can take back lookahead + 1 right after a write. Two slots short, the ring refuses a rollback the
    next query's window needs, and the message names the lookahead."""
    from swkv_teach.caches import RingBufferKVCache
    from swkv_teach.model import LayerCaches

    def rings(spare):
        def make(model, k):
            W = model.config.window_size
            return LayerCaches([RingBufferKVCache(W, lookahead=max(k - spare, 0)) for _ in model.layers], W)

        return make

    assert R.check_rounds(rings(1), good_verify, torch.device("cpu")) > 100
    with pytest.raises(ExerciseFailed, match="built with lookahead=0 for rounds of up to k = 2"):
        R.check_rounds(rings(2), good_verify, torch.device("cpu"))
