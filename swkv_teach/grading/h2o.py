"""Check for exercise 10: H2O's accumulate-and-evict step, ``h2o_keep(scores, weights, positions, budget, recent)``.

The expected answer is always the library's :func:`swkv_teach.caches.h2o.h2o_keep`
(the step :class:`~swkv_teach.H2OKVCache` takes). Scripted cases come first, each
built so that one classic slip gives a different answer from the right one;
then a stream of steps, random cases (batch 1-3, 1-4 heads, 1-5 queries, up to
24 keys in slot order, float16/bfloat16/float32/float64 weights) and random
cases with ties. Ties are where slot order bites: the keys come in the order of
their slots (a wrapped ring: ``[4, 5, 0, 1, 2, 3]``), so ``argsort(total)``,
stable or not, or ``topk`` break ties by slot rather than by age; every tie case
is one where that gives another answer. When an answer differs, the check
compares it with what each known slip would have returned and names the slip it
matches; otherwise it says what kind of difference it is (a different choice
among equal totals, scores not paired with their positions) or plainly which
positions or scores differ.

Right answers written differently pass: positions as a list or a tensor, in any
order (each score stays paired with its position), scores in float32 (float64
and a list of Python floats are accepted too; float16/bfloat16 scores are not,
the statement asks for float32), half-precision arithmetic within rounding.
The library's own ``h2o_keep`` (or a partial/wraps of it) is refused with a
message: it is the expected answer, so it proves nothing.
"""

from __future__ import annotations

import random

import torch

from swkv_teach.caches.h2o import h2o_keep as _oracle
from swkv_teach.caches.scored import head_average
from swkv_teach.grading._h2o_slips import SLIPS, TIES_HINT, avg, keep_after, recent_mask, slot_order_on_ties
from swkv_teach.grading._layout import LAYOUTS, laid_out, name_layout
from swkv_teach.grading._report import ExerciseFailed, call, fail, passed, show, learner_name as _name

__all__ = ["check_h2o_keep"]


# ------------------------------------------------------------------ cases
def _weights(batch, heads, queries, positions, gen, dtype=torch.float32, scale=3.0):
    """Causal attention: query i (the last `queries` positions) gives 0 to keys after it."""
    newest = int(positions.max())
    q_pos = torch.arange(newest - queries + 1, newest + 1)
    logits = torch.randn(batch, heads, queries, len(positions), generator=gen, dtype=torch.float64) * scale
    allowed = positions[None, :] <= q_pos[:, None]
    return torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1).to(dtype)


def _separated(scores, weights, positions, rel) -> bool:
    """True when no two accumulated totals are within `rel` (so rounding cannot reorder a right answer)."""
    total = torch.sort(scores.double() + weights.double().mean(dim=(0, 1)).sum(0)).values
    return len(total) < 2 or bool(((total[1:] - total[:-1]) > rel * total[1:].abs().clamp_min(1e-3)).all())


def _random_case(rng: random.Random, gen: torch.Generator, far: bool = False):
    """``far``: the keys sit in a long conversation (positions around 5e6, 1e9 or just under 2**31), not near 0."""
    while True:
        n = rng.randint(2, 24)
        queries = rng.randint(1, min(5, n))
        budget = rng.randint(1, n + 1)
        recent = rng.randint(0, budget)
        batch, heads = rng.randint(1, 3), rng.randint(1, 4)
        dtype = rng.choice([torch.float32, torch.float64, torch.float16, torch.bfloat16])
        start = rng.randint(0, 50) + (rng.choice([5_000_000, 10**9, 2**31 - 100]) if far else 0)
        positions = torch.randperm(n, generator=gen) + start  # slot order
        old = positions < start + n - queries
        scores = torch.where(old, torch.rand(n, generator=gen, dtype=torch.float64) * rng.choice([0.5, 3.0]), 0.0)
        weights = _weights(batch, heads, queries, positions, gen, dtype)
        rel = 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2
        if _separated(scores, weights, positions, rel):
            return scores.float(), weights, positions, budget, recent


def _uniform_weights(batch, heads, queries, positions, dtype):
    """Each query spreads its attention evenly over the keys it may see, so keys seen by every query tie."""
    newest = int(positions.max())
    q_pos = torch.arange(newest - queries + 1, newest + 1)
    allowed = (positions[None, :] <= q_pos[:, None]).double()
    w = allowed / allowed.sum(dim=-1, keepdim=True)
    return w.expand(batch, heads, queries, len(positions)).to(dtype).contiguous()


def _tie_case(rng: random.Random, gen: torch.Generator, far: bool = False):
    """Equal totals at the eviction boundary, keys in slot order (a wrapped ring, or shuffled); ``far``: at
    positions just under 2**31, where float32 (spacing 128 there) merges neighbouring positions.

    Kept only when breaking the ties by slot gives another answer than by age; any other two totals are
    far apart, so a right answer in any precision keeps the same tokens.
    """
    while True:
        n = rng.randint(4, 16)
        queries = rng.randint(1, 3)
        budget = rng.randint(1, n - 1)
        recent = rng.randint(0, min(budget, 3))
        batch, heads = rng.randint(1, 3), rng.randint(1, 4)
        dtype = rng.choice([torch.float32, torch.float64, torch.float16, torch.bfloat16])
        start = rng.randint(0, 40) + (2**31 - 100 if far else 0)
        if rng.random() < 0.5:  # a ring after a wrap: [4, 5, 0, 1, 2, 3]
            positions = torch.roll(torch.arange(start, start + n), rng.randint(1, n - 1))
        else:
            positions = torch.randperm(n, generator=gen) + start
        scores = torch.tensor([rng.choice([0.0, 0.0, 0.5, 1.0]) for _ in range(n)])
        scores = scores.masked_fill(positions > start + n - 1 - queries, 0.0)  # this step's tokens: no score yet
        if rng.random() < 0.5:
            weights = torch.zeros(batch, heads, queries, n, dtype=dtype)
        else:
            weights = _uniform_weights(batch, heads, queries, positions, dtype)
        values = torch.unique(scores.double() + weights.double().mean(dim=(0, 1)).sum(0))
        if ((values[1:] - values[:-1]) <= 3e-2 * values[1:].abs()).any():
            continue
        args = (scores, weights, positions, budget, recent)
        by_slot = keep_after(scores + avg(weights).sum(0), positions, budget, recent_mask(positions, recent),
                              slot_order_on_ties)[0]
        if _oracle(*args)[0].tolist() != by_slot.tolist():
            return args


def _scripted():
    """(title, scores, weights, positions, budget, recent): each makes one slip visible."""
    g = torch.Generator().manual_seed(10)
    cases = []
    # the most-attended token: position 1 gets nearly all the attention, 2 almost none
    p = torch.tensor([0, 1, 2, 3, 4])
    w = torch.zeros(1, 1, 1, 5)
    w[..., :] = torch.tensor([0.10, 0.60, 0.02, 0.08, 0.20])
    old = torch.tensor([0.2, 0.1, 0.05, 0.0, 0.0])  # the lowest OLD score (3) is not the lowest total (2)
    cases.append(("one query, old scores [0.2, 0.1, 0.05, 0, 0], budget 4, recent 1: which token goes?", old, w, p,
                  4, 1))
    # heads disagree: head 0 loves 1, heads 1-3 share out evenly but ignore 1 a little
    w = torch.zeros(2, 4, 1, 5)
    w[:, 0, 0] = torch.tensor([0.02, 0.90, 0.02, 0.02, 0.04])
    w[:, 1:, 0] = torch.tensor([0.30, 0.01, 0.25, 0.20, 0.24])
    cases.append(("4 heads that disagree, batch 2", torch.zeros(5), w, p, 4, 1))
    # batch rows disagree
    w = torch.zeros(2, 2, 1, 5)
    w[0, :, 0] = torch.tensor([0.05, 0.50, 0.05, 0.20, 0.20])
    w[1, :, 0] = torch.tensor([0.40, 0.02, 0.30, 0.08, 0.20])
    cases.append(("batch rows that disagree", torch.zeros(5), w, p, 4, 1))
    # old scores matter: 0 was a heavy hitter before, gets little now
    w = torch.zeros(1, 2, 1, 5)
    w[..., 0, :] = torch.tensor([0.01, 0.30, 0.29, 0.20, 0.20])
    cases.append(("old scores [2.0, 0.1, 0.2, 0.3, 0]", torch.tensor([2.0, 0.1, 0.2, 0.3, 0.0]), w, p, 4, 1))
    # the recent window: the lowest scores are the newest tokens
    w = torch.zeros(1, 2, 1, 6)
    w[..., 0, :] = torch.tensor([0.40, 0.25, 0.15, 0.12, 0.05, 0.03])
    cases.append(("recent window 3, the newest tokens attended least", torch.zeros(6), w, torch.arange(6), 4, 3))
    # slot order: positions are not sorted; the newest sit in the middle
    pos = torch.tensor([4, 9, 5, 6, 7, 8])
    w = torch.zeros(1, 1, 1, 6)
    w[..., 0, :] = torch.tensor([0.30, 0.02, 0.25, 0.20, 0.18, 0.05])
    cases.append(("keys in slot order: positions [4, 9, 5, 6, 7, 8]", torch.zeros(6), w, pos, 4, 2))
    # a chunk of 3 queries; accumulate over all of them; over budget by 3
    pos = torch.arange(10, 18)
    scores = torch.tensor([0.9, 0.1, 0.5, 0.3, 0.6, 0.0, 0.0, 0.0])
    w = _weights(1, 2, 3, pos, g)
    cases.append(("a chunk of 3 queries, 8 keys, budget 5, recent 1", scores, w, pos, 5, 1))
    # the newest token is the heaviest hitter: it must not take a heavy-hitter place as well
    w = torch.zeros(1, 2, 1, 6)
    w[..., 0, :] = torch.tensor([0.10, 0.05, 0.15, 0.12, 0.08, 0.50])
    cases.append(("the newest token is attended most, budget 4, recent 2", torch.zeros(6), w, torch.arange(6), 4, 2))
    # ties: all-zero attention and scores
    cases.append(("all-zero attention (ties)", torch.zeros(6), torch.zeros(1, 2, 1, 6), torch.arange(6), 4, 1))
    # ties with the keys in a ring's slot order after a wrap: slot order is not age order
    cases.append(("all-zero attention (ties), keys in ring slot order after a wrap", torch.zeros(6),
                  torch.zeros(1, 2, 1, 6), torch.tensor([4, 5, 0, 1, 2, 3]), 4, 1))
    w = torch.full((2, 3, 1, 6), 1 / 6).to(torch.bfloat16)  # every key the same share: the old scores decide
    cases.append(("equal scores (ties) in slot order, batch 2, 3 heads, bfloat16",  # slot != age != newest first
                  torch.tensor([0.5, 0.5, 0.0, 1.0, 0.5, 0.5]), w, torch.tensor([5, 7, 8, 3, 4, 6]), 4, 1))
    # precision: old scores 4e-4 apart, which bfloat16 merges (adding in the weights' dtype loses their order)
    cases.append(("old scores 0.3024 and 0.3020 (one bfloat16 value), bfloat16 attention all zero",
                  torch.tensor([0.9, 0.3024, 0.3020, 0.7, 0.5, 0.0]), torch.zeros(1, 1, 1, 6, dtype=torch.bfloat16),
                  torch.arange(6), 5, 1))
    # precision: two queries' bfloat16 shares 0.25 + 2**-10, which a bfloat16 sum rounds to 0.25 (a tie)
    w = torch.tensor([[0.375, 0.25, 2**-10, 0.125, 0.25, 0.0],
                      [0.25, 0.3125, 0.25, 0.125, 0.0625, 0.0]]).view(1, 1, 2, 6).to(torch.bfloat16)
    cases.append(("bfloat16 attention of 2 queries: token 2 gets 0.25 + 2**-10 (bfloat16 rounds the sum to 0.25)",
                  torch.zeros(6), w, torch.arange(6), 5, 1))
    # late positions, close scores: a sort key mixing score and position (score * 1000 + pos * 1e-3) misranks
    cases.append(("old scores 0.300 and 0.299 at positions 3000 and 8000",
                  torch.tensor([0.9, 0.300, 0.299, 0.8, 0.7, 0.0]), torch.zeros(1, 1, 1, 6), torch.tensor([0, 3000, 8000, 8001, 8002, 8003]), 5, 1))
    # budget == recent: every candidate goes (cands[-k:] with k = 0 keeps them all); positions far past len()
    w = _weights(1, 2, 1, torch.arange(100, 106), g)
    cases.append(("budget 2 == recent 2: no heavy hitter stays", torch.tensor([0.9, 0.3, 0.6, 0.2, 0.4, 0.0]), w,
                  torch.tensor([103, 105, 100, 104, 101, 102]), 2, 2))
    # a long conversation: positions in the millions and billions (int32 still holds them: an answer may hand
    # int32 positions back), where eps * position outweighs a score
    cases.append(("old scores 0.4 at position 0 and 0.1 at position 5,000,000, budget 1, recent 0",
                  torch.tensor([0.4, 0.1]), torch.zeros(1, 1, 1, 2), torch.tensor([0, 5_000_000]), 1, 0))
    cases.append(("old scores 0.25 at position 3 and 0.1 at position 2 * 10**9, budget 2, recent 1",
                  torch.tensor([0.1, 0.25, 0.0]), torch.zeros(1, 2, 1, 3),
                  torch.tensor([2 * 10**9, 3, 2 * 10**9 + 1]), 2, 1))
    # under budget: nothing evicted, still accumulated
    w = _weights(2, 3, 2, torch.arange(4), g)
    cases.append(("under budget (4 keys, budget 6)", torch.tensor([0.5, 0.25, 0.0, 0.0]), w, torch.arange(4), 6, 2))
    return cases


# ------------------------------------------------------------------ one case
def _normalise(case, got, n_keys):
    """Learner's (positions, scores) -> (positions list, float64 scores), sorted by position; or raise fail."""
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise fail(case, f"returned {show(got)}; expected a pair (kept_positions, kept_scores).",
                   hint="return two things: the kept positions and their accumulated scores.")
    pos, sc = got
    try:
        pos = torch.as_tensor(pos)
        sc = torch.as_tensor(sc)
        if any(t.layout != torch.strided or t.is_nested or t.is_meta for t in (pos, sc)):
            raise ValueError("not a dense tensor")
        pos, sc = pos.flatten(), sc.flatten()
    except Exception:
        raise fail(case, f"returned {show(got)}; expected ordinary tensors or lists.") from None
    if pos.is_floating_point() or pos.dtype == torch.bool or not sc.is_floating_point():
        raise fail(case, f"returned positions of dtype {pos.dtype} and scores of dtype {sc.dtype}; expected integer "
                   "positions and floating-point scores.",
                   hint="positions are the absolute positions from `positions` (not indices or a mask); scores "
                   "are float.")
    if torch.finfo(sc.dtype).bits < 32:  # a tensor, an array or a list of 0-d tensors in half precision
        raise fail(case, f"returned the scores in {str(sc.dtype)[6:]}; the exercise asks for float32 "
                   "(float64 is accepted too).",
                   hint="compute and return the scores in float32 (scores.float() + weights.float()...), without "
                   "casting back to the weights' dtype: a half-precision score keeps only 3-4 significant digits, "
                   "and as it grows step after step the small differences that rank the tokens are rounded away.")
    if len(pos) != len(sc):
        raise fail(case, f"returned {len(pos)} positions but {len(sc)} scores; expected one score per kept position.")
    order = torch.argsort(pos.cpu())
    return pos.cpu()[order].tolist(), sc.detach().cpu().double()[order]


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for scores from weights of ``dtype``: float32/float64 to rounding of the sum, float16/bfloat16
    to their own 3-4 significant digits (the learner may add in the weights' dtype)."""
    return (2e-2, 2e-3) if dtype in (torch.float16, torch.bfloat16) else (1e-5, 1e-6)


def _slip_answer(slip, args):
    """A slip's (positions sorted, scores in that order) on ``args``; None if the slip cannot run there."""
    try:
        sp, ss = slip(*args)
    except Exception:
        return None
    order = torch.argsort(sp)
    return sp[order].tolist(), ss[order].double()


def _confirmed(found, probe) -> list:
    """The slips in ``found`` (name, hint) that also explain the learner's answers on every scripted case
    (``probe(args)`` gives the learner's normalised answer, or None where it cannot be read): a slip is named only
    when all the evidence fits it."""
    if probe is None:
        return found
    slips = {name: slip for name, _, slip in SLIPS}
    kept = list(found)
    for _, s, w, p, b, r in _scripted():
        mine = probe((s, w, p, b, r))
        if mine is None:
            continue
        rtol, atol = _tolerance(w.dtype)
        survivors = []
        for name, hint in kept:
            theirs = _slip_answer(slips[name], (s, w, p, b, r))
            if theirs is None or (theirs[0] == mine[0] and len(theirs[1]) == len(mine[1])
                                  and torch.allclose(theirs[1], mine[1], rtol, atol)):
                survivors.append((name, hint))
        kept = survivors
    return kept


BIG_HINT = ("something loses the positions' order when they are large: an 'epsilon' tie-break (total + eps * "
            "position) grows with the conversation until it outweighs real score differences, and positions.float() "
            "holds integers exactly only up to 2**24 (near 2**31 its values are 128 apart, so every tie there "
            "falls back to slot order). Break ties by age with two sorts (by position, then a stable sort by total), "
            "on the integer positions as given.")


def _diagnose(case, args, got_pos, got_sc, exp_pos, exp_sc, rtol, atol, probe=None):
    """The failure to report: the slip the answer matches (positions and scores, else positions), or the plain diff.

    ``probe``: the learner's answer on other arguments, to confirm a slip on the scripted cases before naming it."""
    shown = dict(expected=f"positions {exp_pos}, scores {[round(x, 4) for x in exp_sc.tolist()]}",
                 got=f"positions {got_pos}, scores {[round(x, 4) for x in got_sc.tolist()]}")
    answers = [(name, hint, *answer) for name, hint, slip in SLIPS
               if (answer := _slip_answer(slip, args)) is not None]  # a slip that cannot run here is not theirs
    for full in (True, False):  # exact matches first; then matches on the (wrong) positions alone
        found = [(name, hint) for name, hint, sp, ss in answers
                 if sp == got_pos and ((len(ss) == len(got_sc) and torch.allclose(ss, got_sc, rtol, atol))
                                       if full else sp != exp_pos)]
        found = _confirmed(found, probe) if full else found
        if found and not full and int(args[2].max()) >= 10**6:
            break  # far into a conversation, a match on positions alone is a coincidence: see below
        if found:  # on this case several slips may give the same answer: name them all
            names = "; or ".join(name for name, _ in found)
            hints = " / ".join(hint for _, hint in found[:2])
            return fail(case, f"your answer matches this slip: {names}.", hint=hints, **shown)
    scores, weights, positions, budget, recent = args
    total = dict(zip(positions.tolist(), (scores.float() + head_average(weights).sum(0)).tolist()))
    protected = {p for p in total if p > max(total) - recent}
    big = int(positions.max()) >= 10**6
    if (got_pos != exp_pos and len(got_pos) == len(exp_pos) == len(set(got_pos)) and set(got_pos) <= set(total)
            and protected <= set(got_pos) and sorted(total[p] for p in got_pos) == sorted(total[p] for p in exp_pos)):
        if big:
            return fail(case, "chose other tokens than H2O among EQUAL totals, at positions in the millions (the ties "
                        "at small positions before it were broken right).", hint=BIG_HINT, **shown)
        return fail(case, "kept as many tokens, with the same totals, as H2O, but chose other tokens among EQUAL "
                    "totals: ties must be broken by age (position), not by slot.", hint=TIES_HINT, **shown)
    if got_pos != exp_pos and big:
        return fail(case, "kept other positions than H2O keeps, at positions in the millions (the cases with small "
                    "positions before it passed).", expected=exp_pos, got=got_pos, hint=BIG_HINT)
    if got_pos != exp_pos:
        return fail(case, "kept other positions than H2O keeps.", expected=exp_pos, got=got_pos,
                    hint="total = scores + weights averaged over batch and heads, summed over queries; never evict "
                    "the `recent` newest positions; evict the lowest totals (oldest first among ties) until "
                    "`budget` remain.")
    if len(got_sc) == len(exp_sc) and torch.allclose(got_sc.sort().values, exp_sc.sort().values, rtol, atol):
        return fail(case, "kept the right positions and the right scores, but the scores are not paired with their "
                    "positions: each score must sit at the same index as the position it belongs to.",
                    hint="if you sort the positions (or pick them in another order), reorder the scores the same way: "
                    "order = torch.argsort(kept_positions); return kept_positions[order], kept_scores[order] (or "
                    "return both unsorted).", **shown)
    return fail(case, "kept the right positions, but their scores differ.",
                expected=[round(x, 5) for x in exp_sc.tolist()], got=[round(x, 5) for x in got_sc.tolist()],
                hint="return the ACCUMULATED scores of the kept tokens: the old score plus this step's attention "
                "(averaged over batch and heads, summed over queries), in float32.")


def _one(fn, title, scores, weights, positions, budget, recent, device, laid: bool = False):
    """One call; ``laid``: weights transposed in memory and positions strided, as views (not contiguous)."""
    args_cpu = (scores, weights, positions, budget, recent)
    exp_pos, exp_sc = _oracle(*args_cpu)
    exp_pos, exp_sc = exp_pos.tolist(), exp_sc.double()
    case = (f"{_name(fn)}(scores, weights, positions, budget={budget}, recent={recent}), {title}\n"
            f"   positions {positions.tolist()}, weights shape {tuple(weights.shape)} {str(weights.dtype)[6:]}")
    s_in, w_in, p_in = scores.to(device), weights.to(device), positions.to(device)
    if laid:
        w_in, p_in = laid_out(w_in, "transposed"), laid_out(p_in, "strided")
        case += f"\n   weights {LAYOUTS['transposed']}, positions {LAYOUTS['strided']}: neither contiguous"
    copies = (s_in.clone(), w_in.clone(), p_in.clone())
    try:
        got = call(case, f"{_name(fn)}(...)", fn, s_in, w_in, p_in, budget, recent)
    except ExerciseFailed as e:
        if laid and " raised " in str(e):
            raise name_layout(e, "weights (or positions)", "transposed") from None
        raise
    for name, before, after in zip(("scores", "weights", "positions"), copies, (s_in, w_in, p_in)):
        if not torch.equal(before, after):
            raise fail(case, f"your function changed the `{name}` it was given (in place).",
                       hint="the caller still needs its tensors: compute new ones (scores + ..., not scores += ...).")
    got_pos, got_sc = _normalise(case, got, len(positions))
    rtol, atol = _tolerance(weights.dtype)
    if got_pos != exp_pos or not torch.allclose(got_sc, exp_sc, rtol, atol):
        def probe(args):
            try:
                a = [t.to(device).clone() if isinstance(t, torch.Tensor) else t for t in args]
                return _normalise(case, fn(*a), len(args[2]))
            except Exception:
                return None

        raise _diagnose(case, args_cpu, got_pos, got_sc, exp_pos, exp_sc, rtol, atol, probe)


def _stream(fn, device, steps: int = 40) -> None:
    """A cache's life: each step feeds the keys kept so far (in slot order) plus new tokens, checked every step.

    The next step starts from the library's answer, so the message names the first step that differs.
    """
    gen, rng = torch.Generator().manual_seed(11), random.Random(11)
    budget, recent = 6, 2
    positions, scores, seen = torch.zeros(0, dtype=torch.long), torch.zeros(0), 0
    for step in range(steps):
        c = 3 if step == 0 else rng.choice([1, 1, 1, 2])
        new = torch.arange(seen, seen + c)
        seen += c
        positions = torch.cat([positions, new])
        scores = torch.cat([scores, torch.zeros(c)])
        order = torch.randperm(len(positions), generator=gen)  # slot order: not chronological
        positions, scores = positions[order], scores[order]
        weights = _weights(2, 2, c, positions, gen)
        if not _separated(scores, weights, positions, 1e-4):
            weights = _weights(2, 2, c, positions, gen, scale=5.0)
        _one(fn, f"a stream, step {step + 1} ({seen} tokens seen, budget 6, recent 2)", scores, weights, positions,
             budget, recent, device)
        positions, scores = _oracle(scores, weights, positions, budget, recent)


def _silent_stream(fn, device, steps: int = 16) -> None:
    """All-zero attention: H2O degrades to a sliding window. New tokens take the freed slots, as in a ring."""
    rng = random.Random(12)
    budget, recent = 5, 1
    slots, seen = [], 0  # positions in slot order; None where a token was evicted
    for step in range(steps):
        c = 3 if step == 0 else rng.choice([1, 1, 2])
        for p in range(seen, seen + c):  # the first free slot, else a new one at the end
            if None in slots:
                slots[slots.index(None)] = p
            else:
                slots.append(p)
        seen += c
        slots = [p for p in slots if p is not None]
        positions = torch.tensor(slots)
        dtype = (torch.float32, torch.float16)[step % 2]
        weights = torch.zeros(1 + step % 2, 2, c, len(slots), dtype=dtype)
        _one(fn, f"a stream with all-zero attention, step {step + 1} ({seen} tokens seen, budget {budget}, recent "
             f"{recent}): keys in the slots they were written to", torch.zeros(len(slots)), weights, positions,
             budget, recent, device)
        kept = set(_oracle(torch.zeros(len(slots)), weights, positions, budget, recent)[0].tolist())
        slots = [p if p in kept else None for p in slots]


def _is_the_library(fn) -> bool:
    """The library's own h2o_keep, or a thin wrapper of it (functools.partial, functools.wraps)."""
    return any(x is _oracle or getattr(x, "__code__", None) is _oracle.__code__
               for x in (fn, getattr(fn, "func", None), getattr(fn, "__wrapped__", None)))


def check_h2o_keep(fn) -> None:
    """Exercise 10: ``fn(scores, weights, positions, budget, recent) -> (kept_positions, kept_scores)``."""
    if not callable(fn) or isinstance(fn, type):
        raise fail(f"check_h2o_keep({show(fn)})", f"expected your function h2o_keep; got {show(fn)}.",
                   hint="pass the function itself: check_h2o_keep(h2o_keep).")
    if _is_the_library(fn):
        raise fail(f"check_h2o_keep({_name(fn)})",
                   "this is the library's own swkv_teach.caches.h2o.h2o_keep, the answer the check compares with, "
                   "so checking it proves nothing about your code.",
                   hint="pass the h2o_keep you wrote in the cell above. If you did write one, an import that runs "
                   "after it (from swkv_teach.caches.h2o import h2o_keep) replaced it: run your cell again.")
    from swkv_teach.device import device

    dev = device()
    n = 0
    for title, scores, weights, positions, budget, recent in _scripted():
        _one(fn, title, scores, weights, positions, budget, recent, dev)
        n += 1
    _stream(fn, dev)
    _silent_stream(fn, dev)
    rng, gen = random.Random(10), torch.Generator().manual_seed(10)
    for i in range(60):
        scores, weights, positions, budget, recent = _random_case(rng, gen)
        _one(fn, f"random case {i + 1}", scores, weights, positions, budget, recent, dev if i % 2 else "cpu")
        if i % 3 == 2 and weights.shape[1] > 1 and weights.shape[2] > 1:  # the same numbers, not contiguous
            _one(fn, f"random case {i + 1}", scores, weights, positions, budget, recent, dev if i % 2 else "cpu",
                 laid=True)
    far = random.Random(13), torch.Generator().manual_seed(13)  # their own stream: the cases above stay as they were
    for i in range(20):
        scores, weights, positions, budget, recent = _random_case(*far, far=True)
        _one(fn, f"random case far into a conversation {i + 1}", scores, weights, positions, budget, recent,
             dev if i % 2 else "cpu")
    for i in range(20):
        scores, weights, positions, budget, recent = _tie_case(rng, gen)
        _one(fn, f"random case with ties {i + 1}", scores, weights, positions, budget, recent,
             dev if i % 2 else "cpu")
    for i in range(10):  # ties far into a conversation: broken by age there too
        scores, weights, positions, budget, recent = _tie_case(*far, far=True)
        _one(fn, f"random case with ties at positions near 2**31 {i + 1}", scores, weights, positions, budget,
             recent, dev if i % 2 else "cpu")
    passed(f"{_name(fn)} accumulates and evicts as H2O does, like the library's H2OKVCache ({n} scripted cases, "
           "a 40-step stream, a 16-step stream of ties, 60 random cases, 20 at positions up to 2**31, 20 with ties and 10 "
           "with ties near 2**31: "
           "batch 1-3, 1-4 heads, chunks of 1-5 queries, keys in slot order, 4 dtypes, weights and positions not "
           "contiguous in some).")
