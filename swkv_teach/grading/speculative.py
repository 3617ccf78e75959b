"""Check for exercise 14: speculative decoding's acceptance rule, and verify-and-rollback on a ring with lookahead.

The learner writes ``accept(p, drafts, q, generator) -> (a, token)`` (Leviathan et al. 2023 §2.3, Chen et al.
2023 Algorithm 2), ``speculative_caches(model, k)`` (one ``RingBufferKVCache(W, lookahead=k)`` per layer) and
``verify(model, caches, pending, drafts) -> (a, token)`` (greedy: one forward of ``[pending, *drafts]``, the
agreeing prefix kept, ``m - a`` tokens rolled back in every ring). The library's :mod:`swkv_teach.speculative`
is the answer key, refused as an answer (handed in, wrapped, or called from inside: :func:`._own.calls_to`).

**Part 1** (:mod:`._speculative_law`): ``accept`` is called 300 to 2,000 times on each of eleven cases (sure
ones first: every draft kept with a certain bonus, a draft the target never makes, one-hot drafts certain and
impossible; then the worked example, one-hot drafts, ``p == q``, disjoint supports, zeros in ``p``, no drafts,
random float64 rows), and the counts of each ``(a, token)`` are tested against their exact probabilities. The
statement leaves free how many random numbers are drawn and in which order, so only the distribution is judged;
it fixes where they come from: the ``generator`` (two calls seeded alike must agree, torch's global state and
Python's ``random`` must not move). Also checked: the return types and ranges, and ``p``, ``q``, ``drafts`` left
unchanged (a residual written into ``p[i]``, a view, changes the caller's ``p``).

**Part 2** (:mod:`._speculative_rounds`): about 140 rounds on tiny random decoders against the library's
``verify``, what was fed, what was returned and every ring's state compared after each round.

Failures name the mistake when the evidence fits one (a law of a wrong rule, a spy's record of the calls), and
otherwise say what differs.
"""

from __future__ import annotations

import random
import sys

import torch

from swkv_teach import speculative as lib
from swkv_teach.device import device as pick_device
from swkv_teach.grading._own import calls_to, is_own
from swkv_teach.grading._report import ExerciseFailed, call, fail, passed, show
from swkv_teach.grading._report import learner_name as _name
from swkv_teach.grading._speculative_law import Case, _residual, _rows, cases, law, named, verdict
from swkv_teach.grading._speculative_rounds import check_rounds

__all__ = ["check_speculative_accept", "check_speculative_decoding"]

CHECK = "check_speculative_decoding"
ANSWER_KEY = (lib.accept_sampled, lib.accept_greedy, lib.verify, lib.speculative_generate)


# ============================================================================ part 1: accept
def _refuse(title: str, answer, own) -> None:
    if is_own(answer, own):
        raise fail(title, f"{_name(answer)} is the library's own swkv_teach.speculative.{own.__name__} (or built on "
                   "it), the check's answer key: it shows nothing about your code.",
                   hint="pass the function you wrote. If you did write one, an import that ran after it replaced it: "
                   "run your cell again.")


def _outcome(case: Case, got, n: int) -> tuple[int, int]:
    """``(a, token)`` as ints in range, or a failure that says what is wrong with this one call."""
    m, V = len(case.drafts), case.p.shape[1]
    where, data = case.where(), case.data()
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise fail(where, f"call {n}: accept returned {show(got, 80)} ({type(got).__name__}); expected a tuple "
                   "(a, token).", data, hint="return a, token: the number of drafts accepted, then the token drawn.")
    out = []
    for name, x in zip(("a", "token"), got):
        try:
            out.append(int(x.__index__()))
        except (AttributeError, TypeError, ValueError, RuntimeError):
            if x is None and name == "token":
                raise fail(where, f"call {n}: accept returned (a, token) = ({show(got[0])}, None).", data,
                           hint="when every draft is accepted the token is the bonus, one more token drawn from "
                           "p[m] (the forward computed it anyway): int(torch.multinomial(p[m], 1, "
                           "generator=generator)).") from None
            raise fail(where, f"call {n}: accept returned {name} = {show(x, 60)} ({type(x).__name__}); expected a "
                       "Python int.", data, hint="return int(a), int(token).") from None
    a, token = out
    if not 0 <= a <= m:
        extra = (" a counts the drafts accepted, at most len(drafts): pending (or the bonus) is not a draft."
                 if a == m + 1 else "")
        raise fail(where, f"call {n}: accept returned a = {a} for {m} draft{'s' if m != 1 else ''}.{extra}", data,
                   hint="a is in 0..m: the number of leading drafts kept.")
    if not 0 <= token < V:
        raise fail(where, f"call {n}: accept returned token = {token}; the vocabulary is 0..{V - 1}.", data)
    return a, token


def _call(case: Case, accept, *args):
    """``accept(*args)``; what it raises is reported with the case's data (``p``, ``drafts``, ``q``)."""
    try:
        return call(case.where(), "accept()", accept, *args)
    except ExerciseFailed as e:
        if "not implemented yet" in str(e):
            raise
        lines = str(e).splitlines()
        at = next((i for i, line in enumerate(lines) if line.startswith("   hint: ")), len(lines))
        new = ExerciseFailed("\n".join(lines[:at] + [f"   {case.data()}"] + lines[at:]))
        new.generic = getattr(e, "generic", False)
        raise new from None


def _unchanged(case: Case, p, q, drafts, n: int) -> None:
    for name, mine, pristine in (("p", p, case.p), ("q", q, case.q)):
        if pristine is not None and not torch.equal(mine, pristine):
            raise fail(case.where(), f"call {n}: your accept changed the caller's {name}: it is now "
                       f"{_rows(mine)}.", case.data(),
                       hint="p[i] is a view of p: writing into it (residual = p[i]; residual[d] = 0) writes into "
                       "p. Copy first: residual = p[i].clone(). The caller keeps p for the next draft and for its "
                       "own statistics.")
    if drafts != case.drafts:
        raise fail(case.where(), f"call {n}: your accept changed the caller's drafts list: it is now {drafts}.",
                   case.data(), hint="leave drafts as it was: the caller emits drafts[:a].")


def _frequencies(counts: torch.Tensor) -> list:
    return [round(float(x), 3) for x in (counts.sum(1) / counts.sum())]


def _generic(case: Case) -> str:
    m = len(case.drafts)
    alphas, residuals = [], []
    for i, d in enumerate(case.drafts):
        q_i = None if case.q is None else case.q[i]
        alphas.append(round(min(1.0, float(case.p[i, d]) / (1.0 if q_i is None else float(q_i[d]))), 3))
        residuals.append([round(float(x), 3) for x in _residual(case.p[i], q_i, d)])
    return (f"here the rule keeps the drafts with probabilities {alphas}; after a rejection at draft i it draws "
            f"from the residuals {residuals} (row i); with all {m} kept, the bonus from p[{m}]. Compare each with "
            "what your code does for this case.")


def _run_case(accept, case: Case) -> int:
    g = torch.Generator().manual_seed(1000 + case.seed)
    m, V = len(case.drafts), case.p.shape[1]
    p, q = case.p.clone(), None if case.q is None else case.q.clone()
    tally = [[0] * V for _ in range(m + 1)]  # plain ints: a tensor's += costs more than the answer's own call
    for n in range(1, case.n + 1):
        drafts = list(case.drafts)
        got = _call(case, accept, p, drafts, q, g)
        _unchanged(case, p, q, drafts, n)
        a, token = _outcome(case, got, n)
        tally[a][token] += 1
    counts = torch.tensor(tally, dtype=torch.float64)
    expected = law(case.p, case.drafts, case.q)
    bad = verdict(counts, expected)
    if bad is None:
        return case.n
    j, t = bad
    c, e = int(counts[j, t]), float(expected[j, t])
    seen = (f"over {case.n} calls, (a, token) = ({j}, {t}) came {c} times ({100 * c / case.n:.1f}%); the rule "
            + ("never returns it." if e == 0 else f"gives it {100 * e:.1f}%."))
    by_a = (f"how often each a came, a = 0..{m}: yours {_frequencies(counts)}, the rule's "
            f"{_frequencies(expected)}")
    mistake = named(counts, case.p, case.drafts, case.q)
    raise fail(case.where(), seen, by_a, case.data(), hint=mistake.message if mistake else _generic(case))


def _rng_states() -> tuple:
    numpy = sys.modules.get("numpy")
    np_state = numpy.random.get_state()[1].tobytes() if numpy is not None else None
    return torch.random.get_rng_state(), random.getstate(), np_state


def _moved(before: tuple) -> str | None:
    torch_state, py_state, np_state = _rng_states()
    if not torch.equal(torch_state, before[0]):
        return ("your accept draws from torch's global random state (torch.rand(...), torch.multinomial(...) "
                "without generator=, torch.distributions' .sample(), torch.randperm...): pass "
                "generator=generator to every draw, so a seed reproduces a run and two sequences do not share a "
                "stream.")
    if py_state != before[1]:
        return "your accept draws from Python's random module: draw from the generator given (torch.rand((), " \
               "generator=generator))."
    if np_state != before[2]:
        return "your accept draws from NumPy's global random state: draw from the generator given."
    return None


def _reproducible(accept) -> None:
    case = cases()[-1]  # random rows, three drafts: (a, token) takes many values
    before = _rng_states()
    results = []
    for seed in range(24):
        pair = []
        for _ in range(2):
            g = torch.Generator().manual_seed(seed)
            pair.append(_outcome(case, _call(case, accept, case.p.clone(), list(case.drafts), case.q.clone(), g),
                                 seed + 1))
        results.append(pair)
    moved = _moved(before)
    differ = [(s, a, b) for s, (a, b) in enumerate(results) if a != b]
    if differ or moved:
        s, a, b = differ[0] if differ else (None, None, None)
        text = (f"two calls with generators seeded alike (torch.Generator().manual_seed({s})) returned {a} and {b}."
                if differ else "the calls moved a random state other than the generator's.")
        raise fail(case.where(), text, case.data(),
                   hint=moved or "draw every random number from generator (torch.rand((), generator=generator), "
                   "torch.multinomial(..., generator=generator)) and nothing else: no clock, no id(), no state kept "
                   "between calls.")


def _accept_part(accept) -> tuple[int, int]:
    """Run part 1; returns (cases, calls)."""
    title = f"{CHECK}: accept"
    if not callable(accept):
        raise fail(title, f"accept is {show(accept, 60)} ({type(accept).__name__}), not a function.",
                   hint="pass your function: check_speculative_accept(accept).")
    _refuse(title, accept, lib.accept_sampled)
    all_cases = cases()
    before = _rng_states()
    first = all_cases[0]
    with calls_to(*ANSWER_KEY) as hits:  # one call watched: an answer built on the library calls it every time
        _outcome(first, _call(first, accept, first.p.clone(), list(first.drafts), first.q.clone(),
                              torch.Generator()), 1)
    if hits:
        raise fail(title, f"your accept called the library's swkv_teach.speculative.{hits[0]}, the check's answer "
                   "key: it shows nothing about your code.", hint="write the rule yourself.")
    _reproducible(accept)
    calls = sum(_run_case(accept, case) for case in all_cases)
    moved = _moved(before)
    if moved:
        raise fail(title, "your accept returned the right distribution, but moved a random state other than the "
                   "generator's.", hint=moved)
    return len(all_cases), calls


def check_speculative_accept(accept) -> None:
    """Exercise 14, part 1 alone: ``accept(p, drafts, q, generator) -> (a, token)``."""
    n_cases, calls = _accept_part(accept)
    passed(f"{_name(accept)} follows the acceptance rule: {n_cases} cases, {calls:,} calls, every (a, token) as often "
           "as its exact probability; reproducible from the generator alone.")


# ============================================================================ the whole exercise
def check_speculative_decoding(accept, speculative_caches=None, verify=None) -> None:
    """Exercise 14: ``accept``, ``speculative_caches`` and ``verify`` (or one object holding all three)."""
    if speculative_caches is None and verify is None:
        holder = accept
        accept, speculative_caches, verify = (getattr(holder, n, None) for n in
                                              ("accept", "speculative_caches", "verify"))
    title = f"{CHECK}({_name(accept)}, {_name(speculative_caches)}, {_name(verify)})"
    if not (callable(accept) and callable(speculative_caches) and callable(verify)):
        raise fail(title, "expected your three functions.",
                   hint="call check_speculative_decoding(accept, speculative_caches, verify).")
    _refuse(title, verify, lib.verify)
    n_cases, calls = _accept_part(accept)
    rounds = check_rounds(speculative_caches, verify, pick_device())
    passed(f"{_name(accept)} follows the acceptance rule ({n_cases} cases, {calls:,} calls, every (a, token) as often "
           f"as its exact probability), and {_name(verify)} over your rings matches the library's verify in "
           f"{rounds} rounds (windows 1 to 6, k 1 to 4, float32 and bfloat16, two sequences at once): one forward "
           "each, the same tokens, every ring rolled back to the same keys and positions.")
