"""Exercise 14, part 1: the exact law of the acceptance rule, the cases it is drawn on, and the test.

Given the target's distributions ``p`` ``(m + 1, V)``, the drafts ``d_0 .. d_{m-1}`` and the drafter's ``q``
``(m, V)`` (None: one-hot at each draft), the rule of Leviathan et al. 2023 (§2.3) / Chen et al. 2023
(Algorithm 2) returns ``(a, token)`` with probability

    P(a = j, token = t) = α_0 ··· α_{j-1} (1 - α_j) r_j(t)      for j < m
    P(a = m, token = t) = α_0 ··· α_{m-1} p_m(t)                 (the bonus)

with ``α_i = min(1, p_i(d_i) / q_i(d_i))`` and ``r_i = norm(max(0, p_i - q_i))`` (one-hot ``q``: ``p_i`` with
``d_i`` zeroed). The draws are independent, so this is the whole law of one call, whatever order and number of
random numbers an implementation uses: :func:`law` computes it exactly (float64), and a learner's answer is
judged on the counts of its ``(a, token)`` over many calls.

**The test** (:func:`verdict`): for each outcome cell with probability ``π`` and observed frequency ``x`` over
``n`` calls, Chernoff's bound ``P(freq >= x) <= exp(-n KL(x || π))`` (and the same below ``π``) is a p-value
that needs no normal approximation, so a cell of probability 0 or 1 is judged like any other (as one of
``FLOOR`` = 1e-7: an outcome the rule cannot give, seen three times in 2,000 calls, fails; seen once, it may be
a uniform that came out exactly 0). A cell fails below ``ALPHA`` = 1e-9: over the ~300 cells of the check, a
right answer fails with probability under 1e-6, whatever random numbers it draws. With 2,000 calls a cell of
probability 0.25 is caught off by 0.07 or more; every mistake :data:`MISTAKES` names is many times farther
(``tests/test_grading_speculative.py`` measures it).

**Naming the mistake**: each entry of :data:`MISTAKES` is the law of one plausible wrong rule (every draft
kept, the ratio ignoring ``q``, one uniform for all drafts, the correction drawn from ``p``, the bonus from the
wrong row, ``a`` counting the rejected draft, ...). When a case fails, the first mistake whose law differs from
the rule's on that case and fits the counts (the same test, looser) is named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

__all__ = ["ALPHA", "Case", "MISTAKES", "Rule", "cases", "law", "verdict"]

ALPHA = 1e-9  # per cell: a right answer fails the whole check with probability < 1e-6
FLOOR = 1e-7  # the probability a cell the rule never (or always) gives is judged with
FIT = 1e-6  # a mistake's law "fits" counts that pass this looser test against it


# ============================================================================ the rule and its variants
def _ratio(p_i, q_i, d) -> float:
    q_d = 1.0 if q_i is None else float(q_i[d])
    return min(1.0, float(p_i[d]) / q_d)


def _residual(p_i, q_i, d) -> torch.Tensor:
    if q_i is None:
        r = p_i.double().clone()
        r[d] = 0.0
    else:
        r = (p_i.double() - q_i.double()).clamp(min=0.0)
    s = float(r.sum())
    return p_i.double() / float(p_i.double().sum()) if s <= 0 else r / s


def _norm(row) -> torch.Tensor:
    row = row.double()
    return row / float(row.sum())


def _one_hot(V: int, t: int) -> torch.Tensor:
    x = torch.zeros(V, dtype=torch.float64)
    x[t] = 1.0
    return x


@dataclass(frozen=True)
class Rule:
    """An acceptance rule by its parts: the probability of keeping draft ``i``, what a rejection at ``i`` draws,
    the bonus, and whether one uniform serves every draft (then draft ``i`` is kept iff ``u < alpha_i``)."""

    alpha: Callable = lambda p, q, drafts, i: _ratio(p[i], None if q is None else q[i], drafts[i])
    residual: Callable = lambda p, q, drafts, i: _residual(p[i], None if q is None else q[i], drafts[i])
    bonus: Callable = lambda p, q, drafts: _norm(p[len(drafts)])
    shared_u: bool = False
    shift_a: bool = False  # a reported one too high after a rejection (the rejected draft counted)


RIGHT = Rule()


def law(p: torch.Tensor, drafts: list, q: torch.Tensor | None, rule: Rule = RIGHT) -> torch.Tensor:
    """``P(a = j, token = t)`` as an ``(m + 1, V)`` float64 tensor (rows: ``a``; columns: ``token``)."""
    m, V = len(drafts), p.shape[-1]
    out = torch.zeros(m + 1, V, dtype=torch.float64)
    alphas = [rule.alpha(p, q, drafts, i) for i in range(m)]
    reach = 1.0  # P(the first j drafts are all kept)
    for j in range(m):
        kept = min(alphas[: j + 1]) if rule.shared_u else reach * alphas[j]
        out[min(j + 1, m) if rule.shift_a else j] += (reach - kept) * rule.residual(p, q, drafts, j)
        reach = kept
    out[m] += reach * rule.bonus(p, q, drafts)
    return out


# ============================================================================ the mistakes the check can name
def _greedy_alpha(p, q, drafts, i):
    return 1.0 if drafts[i] == int(p[i].argmax()) else 0.0


def _argmax_of(row) -> torch.Tensor:
    return _one_hot(row.shape[-1], int(row.argmax()))


def _shifted(p, i):
    return p[min(i + 1, p.shape[0] - 1)]


@dataclass(frozen=True)
class Mistake:
    key: str
    rule: Rule
    message: str
    when: Callable = field(default=lambda p, q, drafts: True)  # cases where the mistake applies at all


MISTAKES = [
    Mistake("one-hot drafts all kept", Rule(alpha=lambda p, q, d, i: 1.0 if q is None else _ratio(p[i], q[i], d[i])),
            "with q None (a drafter that does not sample, such as prompt lookup) every draft was kept. Its q is "
            "one-hot at the draft, so the ratio test still applies: keep d with probability p(d) / 1 = p(d).",
            when=lambda p, q, d: q is None),
    Mistake("every draft kept", Rule(alpha=lambda p, q, d, i: 1.0),
            "your accept keeps drafts the rule would reject: it looks like every draft is accepted, with no ratio "
            "test. When sampling, draft d is kept with probability min(1, p(d) / q(d)): keeping it always hands "
            "out the drafter's distribution q, not the target's p."),
    Mistake("greedy rule", Rule(alpha=_greedy_alpha, residual=lambda p, q, d, i: _argmax_of(p[i]),
                                bonus=lambda p, q, d: _argmax_of(p[len(d)])),
            "your accept keeps a draft when it is the target's most likely token and returns argmaxes: that is the "
            "greedy rule, with no ratio test and no sampling. Sampling keeps d with probability min(1, p(d) / q(d)) "
            "and draws the correction and the bonus."),
    Mistake("accepts with p(d)", Rule(alpha=lambda p, q, d, i: float(p[i, d[i]])),
            "your accept keeps draft d with probability p(d), ignoring q: that is the rule for one-hot drafts only. "
            "With a sampling drafter the ratio is p(d) / q(d) (kept with probability min(1, p(d) / q(d))).",
            when=lambda p, q, d: q is not None),
    Mistake("threshold", Rule(alpha=lambda p, q, d, i: 1.0 if _ratio(p[i], None if q is None else q[i], d[i]) >= 1
                              else 0.0),
            "your accept keeps d exactly when p(d) >= q(d), with no random draw: a threshold, not a probability. "
            "Draw u from the generator and keep d when u < p(d) / q(d)."),
    Mistake("ratio inverted", Rule(alpha=lambda p, q, d, i: 1.0 if float(p[i, d[i]]) == 0 else min(
                1.0, (1.0 if q is None else float(q[i, d[i]])) / float(p[i, d[i]]))),
            "your accept keeps d with probability q(d) / p(d): the ratio is upside down. The target's p goes on top: "
            "min(1, p(d) / q(d)), so a draft the target dislikes (p(d) small) is rarely kept."),
    Mistake("one uniform", Rule(shared_u=True),
            "your accept compares every draft with one and the same uniform: the decisions must be independent. "
            "Draw a new u for each draft you examine."),
    Mistake("correction from p", Rule(residual=lambda p, q, d, i: _norm(p[i])),
            "after a rejection your accept draws the token from p itself; it must come from the residual "
            "norm(max(0, p - q)) (for q None: p with the rejected draft's entry set to 0), the mass the drafter "
            "did not already hand out. Drawing from p gives tokens the drafter over-proposed twice."),
    Mistake("residual q - p", Rule(residual=lambda p, q, d, i: _residual(q[i], p[i], d[i]) if q is not None
                                   else _residual(p[i], None, d[i])),
            "after a rejection your accept draws from max(0, q - p): the residual the wrong way round. It is "
            "max(0, p - q), what the target wants beyond what the drafter proposes.",
            when=lambda p, q, d: q is not None),
    Mistake("argmax correction", Rule(residual=lambda p, q, d, i: _argmax_of(
                _residual(p[i], None if q is None else q[i], d[i]))),
            "after a rejection your accept returns the residual's most likely token; it must draw one from it "
            "(torch.multinomial(residual, 1, generator=generator))."),
    Mistake("bonus from p[m-1]", Rule(bonus=lambda p, q, d: _norm(p[max(len(d) - 1, 0)])),
            "when every draft is accepted your bonus token comes from p[m - 1], the last draft's row; it is drawn "
            "from p[m], the row after the last draft (the forward computed it: that is why it is free).",
            when=lambda p, q, d: len(d) > 0),
    Mistake("bonus is the last draft", Rule(bonus=lambda p, q, d: _one_hot(p.shape[-1], d[-1])),
            "when every draft is accepted you return the last draft again as the token: no bonus token. The "
            "bonus is a new token drawn from p[m], after the last draft.", when=lambda p, q, d: len(d) > 0),
    Mistake("a counts the rejected draft", Rule(shift_a=True),
            "off by one in the accepted count: after a rejection at draft i you return a = i + 1, counting the "
            "rejected draft. a counts the drafts kept: drafts[:a] are emitted, then the token.",
            when=lambda p, q, d: len(d) > 0),
    Mistake("rows shifted", Rule(alpha=lambda p, q, d, i: _ratio(_shifted(p, i), None if q is None else q[i], d[i]),
                                 residual=lambda p, q, d, i: _residual(_shifted(p, i), None if q is None else q[i],
                                                                       d[i])),
            "draft i is judged against p[i + 1]: the rows are misaligned. Row 0 of p is the target's distribution "
            "for the token after the pending one, the very position d_0 was drafted for: judge d_i by p[i].",
            when=lambda p, q, d: len(d) > 0),
]


# ============================================================================ the test
def _kl(x: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """Bernoulli KL(x || pi), elementwise, float64: inf where x > 0 = pi, or x < 1 = pi."""
    return (torch.xlogy(x, x) - torch.xlogy(x, pi) + torch.xlogy(1 - x, 1 - x) - torch.xlogy(1 - x, 1 - pi))


def verdict(counts: torch.Tensor, expected: torch.Tensor, alpha: float = ALPHA) -> tuple | None:
    """The worst outcome cell ``(a, token)`` whose count fails the test against ``expected``, else None.

    ``counts`` and ``expected`` are ``(m + 1, V)``. A cell the rule never gives fails from three occurrences (in
    300 or 2,000 calls), far below what any mistake makes; such a cell is named first.
    """
    n = float(counts.sum())
    x = counts.double() / n
    # a cell of probability 0 (or 1) is judged as one of FLOOR: an answer that draws u and keeps d when
    # u <= p(d) / q(d) keeps a draft of p(d) = 0 when u is exactly 0 (a float32 uniform is, with probability
    # 2**-24), and one such draw must not fail it; a rule that gives the cell any real probability fails at once
    pi = expected.double().clamp(FLOOR, 1.0 - FLOOR)
    log_p = -n * _kl(x, pi)
    failing = log_p < math.log(alpha)
    if not bool(failing.any()):
        return None
    never = failing & (expected <= 0) & (counts > 0)  # say first what the rule cannot give at all
    pick = torch.where(never if bool(never.any()) else failing, log_p, torch.full_like(log_p, math.inf))
    return divmod(int(torch.argmin(pick)), counts.shape[1])


def named(counts: torch.Tensor, p, drafts, q) -> Mistake | None:
    """The first mistake whose law differs from the rule's on this case and fits the counts."""
    right = law(p, drafts, q)
    for mk in MISTAKES:
        if not mk.when(p, q, drafts):
            continue
        theirs = law(p, drafts, q, mk.rule)
        if float((theirs - right).abs().sum()) < 0.1:  # this case cannot tell them apart
            continue
        if verdict(counts, theirs, FIT) is None:
            return mk
    return None


# ============================================================================ the cases
@dataclass
class Case:
    """One call of ``accept`` repeated ``n`` times: ``p`` ``(m + 1, V)``, ``drafts``, ``q`` ``(m, V)`` or None."""

    title: str
    p: torch.Tensor
    drafts: list
    q: torch.Tensor | None
    n: int = 2000
    seed: int = 0

    def where(self) -> str:
        return f"accept, case '{self.title}'"

    def data(self) -> str:
        q = "None (one-hot drafts)" if self.q is None else _rows(self.q)
        return f"the case: p = {_rows(self.p)}, drafts = {self.drafts}, q = {q}"


def _rows(t: torch.Tensor) -> str:
    return "[" + ", ".join("[" + ", ".join(f"{float(x):.3g}" for x in row) + "]" for row in t) + "]"


def _t(rows, dtype=torch.float32):
    t = torch.tensor(rows, dtype=torch.float64)
    return (t / t.sum(-1, keepdim=True)).to(dtype)


def _random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(seed)
    V, m = 6, 3
    p = torch.rand(m + 1, V, generator=g, dtype=torch.float64) ** 2
    p[torch.arange(m + 1), torch.randint(0, V, (m + 1,), generator=g)] = 0.0  # a zero per row, as top-k makes
    q = torch.rand(m, V, generator=g, dtype=torch.float64) ** 2 + 0.02
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    drafts = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(m)]
    return Case("random distributions in float64 (drafts drawn from q)", p, drafts, q, seed=seed)


def cases() -> list[Case]:
    """The check's cases: the sure ones first (one possible ``a``), then the statistical ones."""
    sure = [
        Case("every draft kept (p >= q at each draft), a certain bonus",
             _t([[.1, .4, .2, .2, .1], [.5, .2, .1, .1, .1], [0, 0, 0, 1, 0]]), [1, 0],
             _t([[.2, .2, .2, .2, .2], [.5, .1, .1, .1, .2]]), n=300, seed=1),
        Case("a draft the target never makes (p(d) = 0): rejected, the residual one-hot",
             _t([[0, 0, 0, 1, 0], [.2, .2, .2, .2, .2], [.2, .2, .2, .2, .2]]), [0, 1],
             _t([[.3, .3, .2, .1, .1], [.2, .2, .2, .2, .2]]), n=300, seed=2),
        Case("one-hot drafts (q None): the first certain, the second impossible",
             _t([[0, 0, 1, 0, 0], [0, 0, 0, 0, 1], [.2, .2, .2, .2, .2]]), [2, 1], None, n=300, seed=3),
    ]
    stat = [
        Case("no drafts (m = 0): one token from p[0]", _t([[.1, .2, .3, .4, 0]]), [], None, seed=4),
        Case("the worked example", _t([[.1, .2, .3, .4], [.25, .25, .25, .25]]), [2], _t([[.1, .1, .6, .2]]),
             seed=5),
        Case("a draft the target likes half as much as the drafter",
             _t([[.05, .15, .3, .1, .4], [.4, .1, .1, .1, .3]]), [2], _t([[.1, .05, .6, .05, .2]]), seed=6),
        Case("one-hot drafts (q None), kept with probability 0.6 and 0.5",
             _t([[.1, .6, .1, .1, .1], [.2, .2, .5, .05, .05], [.3, .3, .2, .1, .1]]), [1, 2], None, seed=7),
        Case("p equal to q: every draft kept", _t([[.3, .1, .2, .4, 0], [.1, .1, .5, .1, .2],
                                                   [.25, .25, 0, .25, .25], [.6, .1, .1, .1, .1]]), [3, 2, 0],
             _t([[.3, .1, .2, .4, 0], [.1, .1, .5, .1, .2], [.25, .25, 0, .25, .25]]), seed=8),
        Case("disjoint supports: p and q share no token", _t([[.5, .5, 0, 0, 0], [.2, .2, .2, .2, .2]]), [3],
             _t([[0, 0, .3, .3, .4]]), seed=9),
        Case("zeros in p (a top-k target), three drafts kept with probability 0.75, 0.5, 0.8",
             _t([[.3, .3, .4, 0, 0], [.5, 0, 0, .25, .25], [0, .4, .2, .4, 0], [.5, .5, 0, 0, 0]]), [2, 3, 1],
             _t([[.1, .1, .5333333, .1333333, .1333333], [.1, .2, .2, .5, 0], [.1, .5, .2, .1, .1]]), seed=10),
        _random_case(11),
    ]
    return sure + stat
