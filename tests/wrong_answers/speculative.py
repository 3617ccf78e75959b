"""Wrong answers to exercise 14 (accept, speculative_caches, verify), written from its statement alone.

Each is a plausible slip of someone who read the exercise text (solutions/14_speculative_verify.py), not the
check: the acceptance rule without its ratio test, with the wrong residual, a forgotten bonus, an accepted count
off by one, randomness from the wrong place; a verify that feeds the drafts one at a time, forgets the pending
token, rolls back the wrong count or only one layer, compares the wrong rows; rings without lookahead, with a
wider window, one ring for every layer. :func:`answer` builds the object the check takes (the three functions as
attributes) from right parts with one part replaced; its name and docstring are the wrong part's.
"""

import functools
import random

import torch

from swkv_teach.caches import RingBufferKVCache
from swkv_teach.model import LayerCaches
from tests.wrong_answers import wrong

CHECK = "check_speculative_decoding"


# ------------------------------------------------------------------ right parts, as the statement describes them
def good_accept(p, drafts, q, generator):
    for i, d in enumerate(drafts):
        ratio = float(p[i, d]) / (1.0 if q is None else float(q[i, d]))
        if float(torch.rand((), generator=generator)) < ratio:
            continue
        if q is None:
            r = p[i].clone()
            r[d] = 0.0
        else:
            r = (p[i] - q[i]).clamp(min=0.0)
        return i, int(torch.multinomial(r, 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def good_caches(model, k):
    W = model.config.window_size
    return LayerCaches([RingBufferKVCache(W, lookahead=k) for _ in model.layers], W)


def _ids(model, tokens):
    return torch.tensor([tokens], device=next(model.parameters()).device)


def good_verify(model, caches, pending, drafts):
    best = model.step(_ids(model, [pending, *drafts]), caches)[0].argmax(-1).tolist()
    a = 0
    while a < len(drafts) and drafts[a] == best[a]:
        a += 1
    for c in caches:
        c.rollback(len(drafts) - a)
    return a, best[a]


def answer(bad, accept=good_accept, caches=good_caches, verify=good_verify):
    """The object the check takes, named and documented by ``bad`` (the wrong part)."""
    return type(bad.__name__, (), {"__doc__": bad.__doc__, "accept": staticmethod(accept),
                                    "speculative_caches": staticmethod(caches), "verify": staticmethod(verify)})


def _residual(p, q, i, d):
    if q is None:
        r = p[i].clone()
        r[d] = 0.0
        return r
    return (p[i] - q[i]).clamp(min=0.0)


# ------------------------------------------------------------------ part 1: the acceptance rule
def accept_every_draft(p, drafts, q, generator):
    """No ratio test: every draft kept (as greedy keeps a draft it agrees with), then the bonus from p[m]."""
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def accept_with_p_only(p, drafts, q, generator):
    """Accepts d with probability p(d) whatever q is: the one-hot rule used for every drafter."""
    for i, d in enumerate(drafts):
        if float(torch.rand((), generator=generator)) < float(p[i, d]):
            continue
        return i, int(torch.multinomial(_residual(p, q, i, d), 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def correction_from_p(p, drafts, q, generator):
    """After a rejection the token is drawn from p[i] itself, not from the residual max(0, p - q)."""
    for i, d in enumerate(drafts):
        ratio = float(p[i, d]) / (1.0 if q is None else float(q[i, d]))
        if float(torch.rand((), generator=generator)) < ratio:
            continue
        return i, int(torch.multinomial(p[i], 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def residual_q_minus_p(p, drafts, q, generator):
    """The residual taken the wrong way round: max(0, q - p), what the drafter over-proposed."""
    for i, d in enumerate(drafts):
        ratio = float(p[i, d]) / (1.0 if q is None else float(q[i, d]))
        if float(torch.rand((), generator=generator)) < ratio:
            continue
        if q is None:
            return i, int(torch.multinomial(_residual(p, q, i, d), 1, generator=generator))
        return i, int(torch.multinomial((q[i] - p[i]).clamp(min=0.0), 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def no_bonus(p, drafts, q, generator):
    """When every draft is accepted there is nothing to add: returns (m, None)."""
    a, token = good_accept(p, drafts, q, generator)
    return (a, None) if a == len(drafts) else (a, token)


def bonus_is_last_draft(p, drafts, q, generator):
    """When every draft is accepted, 'the token' returned is the last draft again (no bonus drawn)."""
    a, token = good_accept(p, drafts, q, generator)
    if a == len(drafts) and drafts:
        return a, drafts[-1]
    return a, token


def bonus_from_previous_row(p, drafts, q, generator):
    """The bonus is drawn from p[m - 1] (the last draft's row), not p[m]."""
    a, token = good_accept(p, drafts, q, generator)
    if a == len(drafts):
        return a, int(torch.multinomial(p[max(a - 1, 0)], 1, generator=generator))
    return a, token


def a_counts_the_rejected_draft(p, drafts, q, generator):
    """On a rejection at i returns a = i + 1: counts the draft it just examined."""
    for i, d in enumerate(drafts):
        ratio = float(p[i, d]) / (1.0 if q is None else float(q[i, d]))
        if float(torch.rand((), generator=generator)) < ratio:
            continue
        return i + 1, int(torch.multinomial(_residual(p, q, i, d), 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def one_uniform_for_all(p, drafts, q, generator):
    """Draws one u and compares every draft's ratio with it: the acceptances are no longer independent."""
    u = float(torch.rand((), generator=generator))
    for i, d in enumerate(drafts):
        ratio = float(p[i, d]) / (1.0 if q is None else float(q[i, d]))
        if u < ratio:
            continue
        return i, int(torch.multinomial(_residual(p, q, i, d), 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def global_torch_rng(p, drafts, q, generator):
    """torch.rand(()) and torch.multinomial without generator=: draws from torch's global state."""
    for i, d in enumerate(drafts):
        ratio = float(p[i, d]) / (1.0 if q is None else float(q[i, d]))
        if float(torch.rand(())) < ratio:
            continue
        return i, int(torch.multinomial(_residual(p, q, i, d), 1))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1))


def python_random(p, drafts, q, generator):
    """The uniforms come from Python's random.random(): a seeded generator does not reproduce the run."""
    for i, d in enumerate(drafts):
        ratio = float(p[i, d]) / (1.0 if q is None else float(q[i, d]))
        if random.random() < ratio:
            continue
        return i, int(torch.multinomial(_residual(p, q, i, d), 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def categorical_sample(p, drafts, q, generator):
    """Samples tokens with torch.distributions.Categorical(probs=...).sample(), which takes no generator."""
    for i, d in enumerate(drafts):
        ratio = float(p[i, d]) / (1.0 if q is None else float(q[i, d]))
        if float(torch.rand((), generator=generator)) < ratio:
            continue
        return i, int(torch.distributions.Categorical(probs=_residual(p, q, i, d)).sample())
    return len(drafts), int(torch.distributions.Categorical(probs=p[len(drafts)]).sample())


def greedy_rule_when_sampling(p, drafts, q, generator):
    """Keeps a draft iff it is the target's most likely token, and returns argmaxes: the greedy rule, no ratio."""
    for i, d in enumerate(drafts):
        if d == int(p[i].argmax()):
            continue
        return i, int(p[i].argmax())
    return len(drafts), int(p[len(drafts)].argmax())


def residual_in_place(p, drafts, q, generator):
    """For q None zeroes the draft's entry in p[i] itself (a view): the caller's p is changed."""
    for i, d in enumerate(drafts):
        ratio = float(p[i, d]) / (1.0 if q is None else float(q[i, d]))
        if float(torch.rand((), generator=generator)) < ratio:
            continue
        if q is None:
            r = p[i]
            r[d] = 0.0
        else:
            r = (p[i] - q[i]).clamp(min=0.0)
        return i, int(torch.multinomial(r, 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def deterministic_drafter_always_right(p, drafts, q, generator):
    """q None read as 'the drafter is certain': one-hot drafts all accepted without a test."""
    if q is None:
        return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))
    return good_accept(p, drafts, q, generator)


def ratio_upside_down(p, drafts, q, generator):
    """Accepts with probability q(d) / p(d): the ratio inverted."""
    for i, d in enumerate(drafts):
        q_d = 1.0 if q is None else float(q[i, d])
        p_d = float(p[i, d])
        if p_d > 0 and float(torch.rand((), generator=generator)) < q_d / p_d:
            continue
        if p_d == 0:
            continue  # q/p infinite: "certainly accepted"
        return i, int(torch.multinomial(_residual(p, q, i, d), 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def accept_if_target_likes_it_more(p, drafts, q, generator):
    """Keeps d iff p(d) >= q(d), no random draw: a threshold instead of a probability."""
    for i, d in enumerate(drafts):
        if float(p[i, d]) >= (1.0 if q is None else float(q[i, d])):
            continue
        return i, int(torch.multinomial(_residual(p, q, i, d), 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def argmax_correction(p, drafts, q, generator):
    """After a rejection returns the residual's most likely token instead of drawing one."""
    for i, d in enumerate(drafts):
        ratio = float(p[i, d]) / (1.0 if q is None else float(q[i, d]))
        if float(torch.rand((), generator=generator)) < ratio:
            continue
        return i, int(_residual(p, q, i, d).argmax())
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def q_rows_shifted(p, drafts, q, generator):
    """Pairs draft i with q[i] but p[i + 1] (row 0 taken as 'the pending token's own' row)."""
    m = len(drafts)
    for i, d in enumerate(drafts):
        row = min(i + 1, m)
        ratio = float(p[row, d]) / (1.0 if q is None else float(q[i, d]))
        if float(torch.rand((), generator=generator)) < ratio:
            continue
        r = p[row].clone()
        if q is None:
            r[d] = 0.0
        else:
            r = (r - q[i]).clamp(min=0.0)
        if float(r.sum()) <= 0:
            r = p[row]
        return i, int(torch.multinomial(r, 1, generator=generator))
    return m, int(torch.multinomial(p[m], 1, generator=generator))


ACCEPT_SLIPS = [
    (accept_every_draft, ("every draft is accepted", "ratio test")),
    (accept_with_p_only, ("probability p(d), ignoring q",)),
    (correction_from_p, ("draws the token from p itself", "residual")),
    (residual_q_minus_p, ("max(0, q - p)", "wrong way round")),
    (no_bonus, ("none", "bonus")),
    (bonus_is_last_draft, ("last draft again", "no bonus")),
    (bonus_from_previous_row, ("p[m - 1]", "bonus")),
    (a_counts_the_rejected_draft, ("off by one", "counting the rejected draft")),
    (one_uniform_for_all, ("one and the same uniform",)),
    (global_torch_rng, ("torch's global random state", "generator=generator")),
    (python_random, ("python's random module",)),
    (categorical_sample, ("torch's global random state", "distributions")),
    (greedy_rule_when_sampling, ("greedy rule",)),
    (residual_in_place, ("changed the caller's p", "clone()")),
    (deterministic_drafter_always_right, ("q none", "every draft was kept")),
    (ratio_upside_down, ("upside down",)),
    (accept_if_target_likes_it_more, ("threshold",)),
    (argmax_correction, ("most likely token", "draw one")),
    (q_rows_shifted, ("misaligned", "p[i + 1]")),
]
for fn, words in ACCEPT_SLIPS:
    name = "Accept" + fn.__name__.title().replace("_", "")
    globals()[name] = wrong(CHECK, *words)(answer(fn, accept=fn))


# ------------------------------------------------------------------ part 2: the caches
def rings_without_lookahead(model, k):
    """Rings of the window alone: RingBufferKVCache(W), k forgotten (what model.new_caches('ring') builds)."""
    W = model.config.window_size
    return LayerCaches([RingBufferKVCache(W) for _ in model.layers], W)


def rings_of_window_plus_k(model, k):
    """The k extra slots added to the window: RingBufferKVCache(W + k), so queries see k keys too many."""
    W = model.config.window_size
    return LayerCaches([RingBufferKVCache(W + k) for _ in model.layers], W + k)


def one_ring_for_every_layer(model, k):
    """[ring] * n_layers: one ring object shared by every layer."""
    W = model.config.window_size
    return LayerCaches([RingBufferKVCache(W, lookahead=k)] * len(model.layers), W)


def sliding_caches(model, k):
    """model.new_caches('sliding'): caches that cannot take tokens back."""
    return model.new_caches("sliding")


@functools.lru_cache(maxsize=None)
def _built(model, k):
    return good_caches(model, k)


def memoised_caches(model, k):
    """Caches built once per (model, k) and handed out again: two sequences decode through the same rings."""
    return _built(model, k)


CACHES_SLIPS = [
    (rings_without_lookahead, ("lookahead=0", "overwrite")),
    (rings_of_window_plus_k, ("spare slots went into the window",)),
    (one_ring_for_every_layer, ("same ring object",)),
    (sliding_caches, ("cannot take tokens back",)),
    (memoised_caches, ("two calls", "same ring objects")),
]
for fn, words in CACHES_SLIPS:
    globals()["Caches" + fn.__name__.title().replace("_", "")] = wrong(CHECK, *words)(answer(fn, caches=fn))


# ------------------------------------------------------------------ part 2: verify
def _count(best, drafts):
    a = 0
    while a < len(drafts) and drafts[a] == best[a]:
        a += 1
    return a


def _rollback(caches, r):
    for c in caches:
        c.rollback(r)


def one_token_at_a_time(model, caches, pending, drafts):
    """Steps pending, then each draft, one forward each: m + 1 forwards instead of one."""
    best = [int(model.step(_ids(model, [t]), caches)[0, -1].argmax()) for t in [pending, *drafts]]
    a = _count(best, drafts)
    _rollback(caches, len(drafts) - a)
    return a, best[a]


def pending_then_drafts(model, caches, pending, drafts):
    """Feeds pending alone, then the drafts as one chunk: two forwards."""
    first = model.step(_ids(model, [pending]), caches)[0]
    rest = model.step(_ids(model, drafts), caches)[0] if drafts else first[:0]
    best = torch.cat([first, rest]).argmax(-1).tolist()
    a = _count(best, drafts)
    _rollback(caches, len(drafts) - a)
    return a, best[a]


def drafts_without_pending(model, caches, pending, drafts):
    """Feeds only the drafts (pending taken to be in the caches already); row i read as draft i's verdict."""
    if not drafts:
        return 0, int(model.step(_ids(model, [pending]), caches)[0, -1].argmax())
    logits = model.step(_ids(model, drafts), caches)[0]
    best = [pending] + logits.argmax(-1).tolist()  # pending "predicts itself"
    a = _count(best[1:], drafts)
    _rollback(caches, len(drafts) - a)
    return a, best[a + 1] if a + 1 < len(best) else best[-1]


def never_rolls_back(model, caches, pending, drafts):
    """Computes a and token right but forgets the rollback: rejected drafts stay in the rings."""
    best = model.step(_ids(model, [pending, *drafts]), caches)[0].argmax(-1).tolist()
    a = _count(best, drafts)
    return a, best[a]


def rolls_back_the_accepted(model, caches, pending, drafts):
    """rollback(a): takes back the accepted drafts instead of the rejected ones."""
    best = model.step(_ids(model, [pending, *drafts]), caches)[0].argmax(-1).tolist()
    a = _count(best, drafts)
    _rollback(caches, a)
    return a, best[a]


def rolls_back_one_too_many(model, caches, pending, drafts):
    """rollback(m - a + 1): 'the chunk had m + 1 tokens', so the last kept one goes too."""
    best = model.step(_ids(model, [pending, *drafts]), caches)[0].argmax(-1).tolist()
    a = _count(best, drafts)
    _rollback(caches, len(drafts) - a + 1)
    return a, best[a]


def rolls_back_first_layer_only(model, caches, pending, drafts):
    """caches[0].rollback(m - a): the other layers keep the rejected drafts."""
    best = model.step(_ids(model, [pending, *drafts]), caches)[0].argmax(-1).tolist()
    a = _count(best, drafts)
    caches[0].rollback(len(drafts) - a)
    return a, best[a]


def rolls_back_k_minus_a(model, caches, pending, drafts):
    """rollback(k - a) with k read from the ring's lookahead: wrong whenever fewer than k drafts came."""
    best = model.step(_ids(model, [pending, *drafts]), caches)[0].argmax(-1).tolist()
    a = _count(best, drafts)
    _rollback(caches, caches[0].lookahead - a)
    return a, best[a]


def compares_with_the_next_row(model, caches, pending, drafts):
    """Compares draft i with row i + 1 ('row i + 1 is where draft i sits'), token from the row after."""
    best = model.step(_ids(model, [pending, *drafts]), caches)[0].argmax(-1).tolist()
    a = 0
    while a < len(drafts) and drafts[a] == best[a + 1]:
        a += 1
    _rollback(caches, len(drafts) - a)
    return a, best[min(a + 1, len(drafts))]


def counts_every_agreement(model, caches, pending, drafts):
    """a = how many drafts agree with their row, anywhere: does not stop at the first disagreement."""
    best = model.step(_ids(model, [pending, *drafts]), caches)[0].argmax(-1).tolist()
    a = sum(d == b for d, b in zip(drafts, best))
    _rollback(caches, len(drafts) - a)
    return a, best[a]


def no_bonus_in_verify(model, caches, pending, drafts):
    """When every draft agrees, returns the last draft as the token (no bonus from the last row)."""
    best = model.step(_ids(model, [pending, *drafts]), caches)[0].argmax(-1).tolist()
    a = _count(best, drafts)
    _rollback(caches, len(drafts) - a)
    if a == len(drafts) and drafts:
        return a, drafts[-1]
    return a, best[a]


def bonus_none_in_verify(model, caches, pending, drafts):
    """Returns (m, None) when every draft agrees: 'no correction needed', so no token."""
    best = model.step(_ids(model, [pending, *drafts]), caches)[0].argmax(-1).tolist()
    a = _count(best, drafts)
    _rollback(caches, len(drafts) - a)
    return (a, None) if a == len(drafts) else (a, best[a])


def returns_the_rejected_draft(model, caches, pending, drafts):
    """On a rejection returns drafts[a], the draft the target rejected, instead of the target's choice."""
    best = model.step(_ids(model, [pending, *drafts]), caches)[0].argmax(-1).tolist()
    a = _count(best, drafts)
    _rollback(caches, len(drafts) - a)
    return a, drafts[a] if a < len(drafts) else best[a]


def token_from_the_last_row(model, caches, pending, drafts):
    """The token is always the last row's choice, even after a rejection."""
    best = model.step(_ids(model, [pending, *drafts]), caches)[0].argmax(-1).tolist()
    a = _count(best, drafts)
    _rollback(caches, len(drafts) - a)
    return a, best[-1]


def feeds_the_token_too(model, caches, pending, drafts):
    """After the rollback also steps the new token, 'so the caches are up to date'."""
    best = model.step(_ids(model, [pending, *drafts]), caches)[0].argmax(-1).tolist()
    a = _count(best, drafts)
    _rollback(caches, len(drafts) - a)
    model.step(_ids(model, [best[a]]), caches)
    return a, best[a]


def a_counts_pending(model, caches, pending, drafts):
    """Returns a + 1: counts pending among the accepted tokens."""
    best = model.step(_ids(model, [pending, *drafts]), caches)[0].argmax(-1).tolist()
    a = _count(best, drafts)
    _rollback(caches, len(drafts) - a)
    return a + 1, best[a]


def tensor_count(model, caches, pending, drafts):
    """Vectorised count kept as a tensor: rollback(m - a) gets a tensor, a is returned as a tensor."""
    logits = model.step(_ids(model, [pending, *drafts]), caches)[0]
    best = logits.argmax(-1)
    agree = (best[:-1] == torch.tensor(drafts, dtype=torch.long, device=best.device)).long()
    a = agree.cumprod(0).sum()
    _rollback(caches, len(drafts) - a)
    return a, best[a]


def ids_on_the_cpu(model, caches, pending, drafts):
    """torch.tensor([[pending, *drafts]]) without device=: on a GPU the model refuses CPU ids."""
    best = model.step(torch.tensor([[pending, *drafts]]), caches)[0].argmax(-1).tolist()
    a = _count(best, drafts)
    _rollback(caches, len(drafts) - a)
    return a, best[a]


def library_verify(model, caches, pending, drafts):
    """Hands the work to the library's swkv_teach.speculative.verify."""
    from swkv_teach import speculative

    return speculative.verify(model, caches, pending, drafts)


def drafts_list_extended(model, caches, pending, drafts):
    """drafts.append(token) for the caller's convenience, then rolls back len(drafts) - a: one too many."""
    best = model.step(_ids(model, [pending, *drafts]), caches)[0].argmax(-1).tolist()
    a = _count(best, drafts)
    drafts.append(best[a])
    _rollback(caches, len(drafts) - a)
    return a, best[a]


VERIFY_SLIPS = [
    (one_token_at_a_time, ("forwards of one token each",), False),
    (pending_then_drafts, ("two forwards",), False),
    (drafts_without_pending, ("without pending",), False),
    (never_rolls_back, ("never rolled back",), False),
    (rolls_back_the_accepted, ("rolled back a = ", "instead of m - a"), False),
    (rolls_back_one_too_many, ("one more than the",), False),
    (rolls_back_first_layer_only, ("layers [0] only",), False),
    (rolls_back_k_minus_a, ("k - a", "len(drafts)"), False),
    (compares_with_the_next_row, ("misaligned",), False),
    (counts_every_agreement, ("also after a disagreement",), False),
    (no_bonus_in_verify, ("bonus is missing",), False),
    (bonus_none_in_verify, ("token = none", "bonus"), False),
    (returns_the_rejected_draft, ("draft the target rejected",), False),
    (token_from_the_last_row, ("last row's choice",), False),
    (feeds_the_token_too, ("must not be fed",), False),
    (a_counts_pending, ("pending is not a draft",), False),
    (tensor_count, ("python int", "rollback"), False),
    (ids_on_the_cpu, ("device",), True),
    (library_verify, ("library's", "speculative.verify"), False),
    (drafts_list_extended, ("changed the caller's drafts",), False),
]
for fn, words, accel in VERIFY_SLIPS:
    globals()["Verify" + fn.__name__.title().replace("_", "")] = wrong(CHECK, *words, needs_accelerator=accel)(
        answer(fn, verify=fn))


def _library_accept(p, drafts, q, generator):
    """Wraps the library's swkv_teach.speculative.accept_sampled."""
    from swkv_teach.speculative import accept_sampled

    return accept_sampled(p, drafts, q, generator)


AcceptLibraryAcceptSampled = wrong(CHECK, "library's", "accept_sampled")(
    answer(_library_accept, accept=_library_accept))
