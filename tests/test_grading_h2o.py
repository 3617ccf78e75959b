"""Exercise 10's check (H2O's accumulate-and-evict): every wrong answer in tests/wrong_answers/h2o.py is
rejected with a message naming its slip; right answers written in other styles pass."""

from __future__ import annotations

import functools

import pytest
import torch

from swkv_teach.caches.h2o import h2o_keep
from swkv_teach.grading import ExerciseFailed
from swkv_teach.grading.h2o import check_h2o_keep
from tests.wrong_answers import CATALOGUE
from tests.wrong_answers import h2o as _h2o  # noqa: F401  (registers the catalogue entries)

WRONG = [w for w in CATALOGUE if w.check == "check_h2o_keep"]


def passes(fn, capsys):
    check_h2o_keep(fn)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("✅"), out


def test_the_catalogue_is_large():
    assert len(WRONG) >= 20
    assert all(w.__doc__ and w.__doc__.strip() for w in WRONG)


@pytest.mark.parametrize("answer", WRONG, ids=lambda w: w.__name__)
def test_each_wrong_answer_is_rejected_with_a_message_that_names_its_slip(answer, capsys):
    with pytest.raises(ExerciseFailed) as info:
        check_h2o_keep(answer)
    message = str(info.value).lower()
    missing = [w for w in answer.words if w.lower() not in message]
    assert not missing, f"{answer.__name__}: {answer.__doc__.strip()}\nmessage lacks {missing}:\n{info.value}"
    assert "✅" not in capsys.readouterr().out


# ------------------------------------------------------------------ right answers, written differently
def loops_and_lists(scores, weights, positions, budget, recent):
    """Plain Python over lists, positions returned as a list in slot order."""
    w = weights.double().mean(dim=(0, 1)).tolist()  # (queries, keys)
    pos = positions.tolist()
    total = [float(scores[j]) + sum(row[j] for row in w) for j in range(len(pos))]
    newest = max(pos)
    candidates = sorted((total[j], pos[j], j) for j in range(len(pos)) if pos[j] <= newest - recent)
    drop = {j for _, _, j in candidates[: max(0, len(pos) - budget)]}
    keep = [j for j in range(len(pos)) if j not in drop]
    return [pos[j] for j in keep], torch.tensor([total[j] for j in keep], dtype=torch.float64)


def topk_on_the_old(scores, weights, positions, budget, recent):
    """topk of the heavy hitters among the tokens outside the recent window, recent ones kept whole."""
    total = scores.float() + torch.einsum("bhqk->k", weights.float()) / (weights.shape[0] * weights.shape[1])
    if len(positions) <= budget:
        return positions, total
    recent_mask = positions > positions.max() - recent
    old = torch.nonzero(~recent_mask).flatten()
    # ties broken toward the newer token: add a tiny, order-preserving position term
    by_age = torch.argsort(torch.argsort(positions[old])).double()
    key = total[old].double() + by_age * 1e-12
    heavy = old[torch.topk(key, budget - int(recent_mask.sum())).indices]
    keep = torch.cat([heavy, torch.nonzero(recent_mask).flatten()])
    return positions[keep], total[keep]


def half_precision_on_device(scores, weights, positions, budget, recent):
    """Stays in the weights' dtype for the average, sorts with lexsort-by-two-argsorts. Wrong: the statement says
    "compute in float32 or float64", and bfloat16 rounds a sum 0.25 + 2**-10 to 0.25 (a tie that evicts the wrong
    token); it passed every case until the check gained that one."""
    total = scores + weights.mean(dim=(0, 1)).sum(dim=0).to(scores.dtype)
    protected = positions > positions.max() - recent
    order = torch.argsort(positions)
    order = order[torch.argsort(total[order], stable=True)]
    order = order[~protected[order]]
    keep = torch.ones_like(positions, dtype=torch.bool)
    keep[order[: max(0, len(positions) - budget)]] = False
    return positions[keep], total[keep]


def sort_by_score_then_position(scores, weights, positions, budget, recent):
    """The statement's recipe written with one sorted() over (score, position) pairs; int32 positions back."""
    total = scores.float() + weights.float().mean(dim=(0, 1)).sum(dim=0)
    newest = int(positions.max())
    pairs = sorted((float(t), int(p)) for t, p in zip(total, positions) if p <= newest - recent)
    gone = {p for _, p in pairs[: max(0, len(positions) - budget)]}
    keep = torch.tensor([int(p) not in gone for p in positions])
    return positions[keep].to(torch.int32), total[keep]


def own_h2o_keep(scores, weights, positions, budget, recent):
    """The library's recipe, typed by the learner (a function of its own, not the library's object)."""
    total = scores.float() + weights.float().mean(dim=(0, 1)).sum(dim=0)
    protected = positions > positions.max() - recent
    order = torch.argsort(positions)
    order = order[torch.argsort(total[order], stable=True)]
    order = order[~protected[order]]
    keep = torch.ones(len(positions), dtype=torch.bool, device=positions.device)
    keep[order[: max(0, len(positions) - budget)]] = False
    return positions[keep], total[keep]


def flat_heads_int32_positions(scores, weights, positions, budget, recent):
    """Batch and heads flattened with reshape (a copy where the weights are not contiguous), positions handed back
    as int32 (the check's largest positions stay below 2**31), ties broken by a lexsort of two argsorts."""
    B, H, Q, K = weights.shape
    total = scores.float() + weights.reshape(B * H, Q, K).double().mean(0).sum(0).float()
    pos = positions.to(torch.int32)
    protected = pos > pos.max() - recent
    order = torch.argsort(pos)
    order = order[torch.argsort(total[order], stable=True)]
    order = order[~protected[order]]
    keep = torch.ones(len(pos), dtype=torch.bool, device=pos.device)
    keep[order[: max(0, len(pos) - budget)]] = False
    return pos[keep], total[keep]


@pytest.mark.parametrize("answer", [own_h2o_keep, loops_and_lists, topk_on_the_old, sort_by_score_then_position,
                                    flat_heads_int32_positions])
def test_right_answers_written_differently_pass(answer, capsys):
    passes(answer, capsys)


def test_averaging_in_half_precision_is_refused_and_named():
    with pytest.raises(ExerciseFailed) as info:
        check_h2o_keep(half_precision_on_device)
    msg = str(info.value)
    assert "2**-10" in msg and "half-precision dtype" in msg and "float32" in msg, msg


@pytest.mark.parametrize("library", [h2o_keep, functools.partial(h2o_keep), functools.wraps(h2o_keep)(
    lambda *a: h2o_keep(*a))], ids=["itself", "partial", "wraps"])
def test_the_librarys_own_h2o_keep_is_refused_kindly(library, capsys):
    with pytest.raises(ExerciseFailed) as info:
        check_h2o_keep(library)
    assert "library's own" in str(info.value) and "the h2o_keep you wrote" in str(info.value)
    assert capsys.readouterr().out == ""  # refused before any case runs


def test_ties_are_tested_with_keys_in_ring_slot_order():
    """positions [4, 5, 0, 1, 2, 3], all scores 0, budget 4, recent 1: the oldest go (0, 1), not slots 0 and 2."""
    from tests.wrong_answers.h2o import ties_by_slot_stable_argsort

    with pytest.raises(ExerciseFailed) as info:
        check_h2o_keep(ties_by_slot_stable_argsort)
    msg = str(info.value)
    assert "positions [4, 5, 0, 1, 2, 3]" in msg
    assert "expected: positions [2, 3, 4, 5]" in msg and "got     : positions [1, 2, 3, 5]" in msg


@pytest.mark.parametrize("garbage", [None, 42, "h2o_keep", h2o_keep.__class__, lambda *a: None,
                                     lambda *a: 1 / 0, lambda *a: (torch.zeros(2), "x"),
                                     lambda s, w, p, b, r: (p.float(), s)])
def test_garbage_is_a_failure_not_a_crash(garbage):
    with pytest.raises(ExerciseFailed) as info:
        check_h2o_keep(garbage)
    assert str(info.value).startswith("❌")


def test_a_failure_shows_the_case_expected_and_got():
    from tests.wrong_answers.h2o import evicts_most_attended

    with pytest.raises(ExerciseFailed) as info:
        check_h2o_keep(evicts_most_attended)
    msg = str(info.value)
    assert "budget=4, recent=1" in msg and "positions [0, 1, 2, 3, 4]" in msg and "old scores" in msg
    assert "expected: positions [0, 1, 3, 4]" in msg and "got     : positions [0, 2, 3, 4]" in msg


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("as_", ["tensor", "numpy", "list of 0-d tensors"])
def test_half_precision_scores_are_refused_however_returned(half, as_):
    def answer(scores, weights, positions, budget, recent):
        kept, sc = own_h2o_keep(scores, weights, positions, budget, recent)
        sc = sc.to(half)
        return kept, {"tensor": sc, "numpy": sc.float().numpy().astype("float16"), "list of 0-d tensors": list(sc)}[as_]

    with pytest.raises(ExerciseFailed) as info:
        check_h2o_keep(answer)
    assert "float32" in str(info.value) and "returned the scores in" in str(info.value)


@pytest.mark.parametrize("as_", ["float64", "list of floats", "numpy float32"])
def test_scores_at_least_as_precise_as_float32_pass(as_, capsys):
    def answer(scores, weights, positions, budget, recent):
        kept, sc = own_h2o_keep(scores, weights, positions, budget, recent)
        return kept, {"float64": sc.double(), "list of floats": sc.tolist(), "numpy float32": sc.numpy()}[as_]

    passes(answer, capsys)
