"""Exercise 14, part 2: naming a verify's slip from what the check saw (:mod:`._speculative_rounds`).

Each function reads a round (``run``: the model, the pending token, the spy's record of the learner's forwards,
updates and rollbacks, the scenario) and returns the most specific explanation that is true, or raises the
failure itself (:func:`check_fed`): what was fed, what was returned, how the rings were rolled back, why a
verify raised. Nothing here changes what the learner's code computes.
"""

from __future__ import annotations

import torch

from swkv_teach.grading._report import ExerciseFailed, fail, rehint

__all__ = ["check_fed", "explain_answer", "explain_raise", "explain_rings"]


# ============================================================================ 1. what was fed
def check_fed(case: str, run, drafts: list) -> None:
    """One forward of ``[pending, *drafts]``, through every layer's ring once, nothing fed after it."""
    spy, chunk = run.spy, [run.pending, *drafts]
    fed = [ids[0] if ids and isinstance(ids[0], list) else ids for ids in spy.fed]
    ups = spy.updates
    m = len(drafts)
    if not fed:
        raise fail(case, "your verify did not run the model: the drafts were never checked by the target.",
                   hint="logits = model.step(torch.tensor([[pending, *drafts]], device=...), caches).")
    if len(fed) > 1 and all(len(f) == 1 for f in fed) and [f[0] for f in fed[: m + 1]] == chunk:
        raise fail(case, f"your verify ran {len(fed)} forwards of one token each ({fed}): verifying the drafts one "
                   "at a time costs m + 1 decode steps, the very cost speculative decoding exists to avoid.",
                   hint="one forward for the whole chunk: model.step(ids, caches) with ids of shape (1, m + 1); the "
                   "chunk's queries are masked to their own windows, so row i is what a one-token step gives.")
    if len(fed) == 2 and fed[0] == [run.pending] and fed[1] == drafts:
        raise fail(case, f"your verify ran two forwards, [pending] then the drafts ({fed}): one forward of "
                   "[pending, *drafts] does both for the price of one.",
                   hint="ids = [[pending, *drafts]], one model.step.")
    if fed[0] == drafts and m:
        raise fail(case, f"your verify fed the drafts {drafts} without pending = {run.pending}: pending is not yet "
                   "in the caches, so every draft is placed one position too early and row 0 is not the target's "
                   "verdict on d_0.", hint="the chunk is [pending, *drafts]: pending first, at position "
                   "caches[0].seen.")
    if fed[0] != chunk:
        raise fail(case, f"your verify's first forward fed {fed[0]}; expected [pending, *drafts] = {chunk}.",
                   hint="ids = torch.tensor([[pending, *drafts]], device=...).")
    if len(fed) > 1:
        extra = fed[1:]
        raise fail(case, f"after the verify's forward of {chunk} yours ran {len(extra)} more ({extra}): the new "
                   "token must not be fed yet.",
                   hint="return (a, token) without feeding token: like pending, it goes first in the next round's "
                   "verify, which computes its keys together with the next drafts.")
    for L, u in enumerate(ups):
        if u != [m + 1]:
            raise fail(case, f"layer {L}'s ring got {u or 'no'} update{'s' if len(u) != 1 else ''} of tokens during "
                       f"your verify; one forward of {m + 1} tokens through the caches gives one update of {m + 1}.",
                       hint="run the chunk through the caches (model.step(ids, caches)), not model(ids), which "
                       "ignores them.")


# ============================================================================ 2. what was returned
def explain_answer(run, scratch, drafts: list, got: tuple, want: tuple) -> str:
    """Name the slip from the target's choice at each row (recomputed on the reference's rings before the round)."""
    dev = next(run.model.parameters()).device
    with torch.no_grad():
        best = run.model.step(torch.tensor([[run.pending, *drafts]], device=dev), scratch)[0].argmax(-1).tolist()
    m, (a, token), (a_exp, t_exp) = len(drafts), got, want
    rows = f"the target's choices, rows 0..{m}: {best}; drafts: {drafts}"
    shifted = 0
    while shifted < m and drafts[shifted] == best[shifted + 1]:
        shifted += 1
    agree = sum(d == b for d, b in zip(drafts, best))
    if a == a_exp + 1 and token == t_exp:
        return (f"{rows}. Your a is one more than the drafts accepted: pending is not a draft. a counts the "
                "leading drafts equal to their row's choice.")
    if a == shifted != a_exp:
        return (f"{rows}. Your a compares draft i with row i + 1. Row i predicts the token AFTER position i of the "
                "chunk [pending, *drafts]: row 0 (after pending) is where d_0 should be, so d_i is checked against "
                "row i.")
    if a == agree != a_exp:
        return (f"{rows}. Your a counts every draft that agrees with its row ({agree}), also after a disagreement. "
                "The first rejected draft ends the round: what follows it was drafted after a token the target "
                "did not choose. Stop counting at the first draft that differs.")
    if a == a_exp == m and token != t_exp:
        if m and token == drafts[-1]:
            return (f"{rows}. Every draft was accepted and your token is the last draft again: the bonus is "
                    f"missing. The last row, row m = {m}, predicted one more token: token = best[m] = {t_exp}.")
        return (f"{rows}. Every draft was accepted; the token is then the bonus, the choice of the last row "
                f"(row m = {m}): {t_exp}.")
    if a == a_exp < m and token != t_exp:
        if token == drafts[a]:
            return (f"{rows}. Your token is the draft the target rejected (d_{a} = {drafts[a]}); it is the "
                    f"target's own choice at that row, the correction: best[{a}] = {t_exp}.")
        if token == best[a + 1] and a + 1 < m:
            return (f"{rows}. Your token is the choice of row a + 1; the rows are misaligned. Row i predicts the "
                    "token after position i of [pending, *drafts]: the correction is row a's choice, "
                    f"best[{a}] = {t_exp}.")
        if token == best[m]:
            return (f"{rows}. After a rejection your token is the last row's choice; the rows after the rejected "
                    f"draft were computed after a token that will not be kept. The correction is row a's choice: "
                    f"best[{a}] = {t_exp}.")
        return f"{rows}. The token is the choice at row a: best[{a}] = {t_exp}."
    return f"{rows}. a is the number of leading drafts equal to their row's choice; token is best[a]."


# ============================================================================ 3. how the rings were rolled back
def explain_rings(run, m: int, a: int) -> str:
    """Why a ring's state differs, from the rollbacks the spy recorded (``m`` drafts, ``a`` accepted)."""
    r = m - a
    calls = run.spy.rollbacks
    got = [sum(int(x) for x in rs) if all(isinstance(x, int) for x in rs) else None for rs in calls]
    k = run.sc.k
    why = (f"The m - a = {r} rejected drafts must be forgotten by every layer's ring, pending and the accepted "
           "drafts kept: for cache in caches: cache.rollback(len(drafts) - a).")
    if not any(calls) and r:
        return f"your verify never rolled back: the rejected drafts stay in the rings. {why}"
    if all(g == got[0] for g in got):
        g = got[0]
        if g == k - a != r and m < k:
            return (f"your verify rolled back k - a = {g} with k = {k} (the rings' lookahead), but this round had "
                    f"m = {m} drafts: m is len(drafts), which may be less than k. {why}")
        if g == a != r:
            return f"your verify rolled back a = {a} (the accepted drafts) instead of m - a = {r}. {why}"
        if g == r + 1:
            return (f"your verify rolled back {g}, one more than the {r} rejected drafts: the last kept token "
                    f"(pending or an accepted draft) went too. {why}")
        if g == r - 1:
            return f"your verify rolled back {g}, one fewer than the {r} rejected drafts. {why}"
        return f"your verify rolled back {g} tokens per layer. {why}"
    rolled = [L for L, g in enumerate(got) if g]
    return (f"your verify rolled back layers {rolled} only (by {[g for g in got]}): every layer's ring saw the "
            f"chunk, so every one must forget the rejected drafts. {why}")


# ============================================================================ 4. a verify that raised
def explain_raise(e: ExerciseFailed, run) -> ExerciseFailed:
    """A verify that raised: rings too small for the rollback, a tensor handed to rollback, ids on the CPU."""
    text = str(e)
    k = run.sc.k
    looks = [getattr(c, "lookahead", 0) for c in run.rings]
    if "rollback" in text and "got tensor" in text:
        return rehint(e, "cache.rollback takes a Python int: a count kept as a tensor (a vectorised sum) must be "
                      "turned into one, a = int(...), before m - a is handed to rollback (and returned).")
    if "rollback" in text and min(looks) < k:
        return rehint(e, f"your rings were built with lookahead={min(looks)} for rounds of up to k = {k} drafts. A "
                      "verify writes m + 1 tokens into each ring; without spare slots the newest of them overwrite "
                      "the slots of the oldest tokens the next query's window still needs, so once more than "
                      "lookahead + 1 drafts are rejected the ring cannot take them back (the library's rollback "
                      "refuses rather than leave a hole in the window). speculative_caches must build "
                      "RingBufferKVCache(W, lookahead=k).")
    if "device" in text.lower() and ("cpu" in text.lower() or "cuda" in text.lower()):
        return rehint(e, "the ids must be on the model's device: torch.tensor([[pending, *drafts]], "
                      "device=next(model.parameters()).device).")
    return e
