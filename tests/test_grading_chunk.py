"""Exercise 04's check (the chunk contract) is fair, sharp and covers what the statement leaves free.

Its catalogue of wrong answers is tests/wrong_answers/chunk.py, run by test_grading.py with all the
others; here: right answers written five ways pass, the cases vary every free dimension, the
diagnosis probes tell every named bug apart, and the check stays small and side-effect free.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import swkv_teach
from swkv_teach.grading import EXERCISES, ExerciseFailed, check_chunk_mask
from swkv_teach.grading.chunk import CASTS, PROBES, cases, hypotheses
from swkv_teach.masks import window_mask
from tests.wrong_answers import chunk as wrong


# ------------------------------------------------------------------ right answers, written differently
def broadcast(q_positions, k_positions, window_size):
    """The solution's shape: a column of queries against a row of keys."""
    q, k = q_positions[:, None], k_positions[None, :]
    return (k <= q) & (k > q - window_size)


def python_loops(q_positions, k_positions, window_size):
    """Two loops over plain ints, the mask made on the positions' device."""
    rows = [[p - window_size < s <= p for s in k_positions.tolist()] for p in q_positions.tolist()]
    return torch.tensor(rows, dtype=torch.bool, device=q_positions.device).reshape(len(q_positions),
                                                                                   len(k_positions))


def distance_with_where(q_positions, k_positions, window_size):
    """How far back each key is, then torch.where into a bool tensor."""
    back = q_positions.long().unsqueeze(1) - k_positions.long().unsqueeze(0)  # (queries, keys)
    inside = torch.logical_and(back.ge(0), back.lt(window_size))
    return torch.where(inside, torch.tensor(True, device=back.device), torch.tensor(False, device=back.device))


def sort_then_unsort(q_positions, k_positions, window_size):
    """Sorts the keys, masks in chronological order, then puts the columns back with the inverse permutation."""
    ks, order = k_positions.sort()
    q = q_positions[:, None]
    chrono = (ks[None, :] <= q) & (ks[None, :] > q - window_size)
    return chrono[:, order.argsort()]


def through_numpy(q_positions, k_positions, window_size):
    """NumPy on the CPU, back to the positions' device."""
    q, k = q_positions.cpu().numpy(), k_positions.cpu().numpy()
    m = np.subtract.outer(q, k)
    return torch.from_numpy((m >= 0) & (m < window_size)).to(q_positions.device)


def calls_the_library(q_positions, k_positions, window_size):
    """A function of one's own that calls the library's mask: not the oracle object itself, so it is judged."""
    return swkv_teach.window_mask(q_positions, k_positions, window_size)


def widened_to_int64(q_positions, k_positions, window_size):
    """Casts both to int64 first (mixed int32/int64 made uniform): a widening cast loses nothing."""
    q, k = q_positions.long()[:, None], k_positions.long()[None, :]
    return (k <= q) & (k > q - window_size)


RIGHT = [broadcast, python_loops, distance_with_where, sort_then_unsort, through_numpy, calls_the_library,
         widened_to_int64]


@pytest.mark.parametrize("answer", RIGHT, ids=lambda f: f.__name__)
def test_right_answers_written_differently_pass(answer, capsys):
    check_chunk_mask(answer)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("✅"), out


@pytest.mark.parametrize("oracle", [swkv_teach.window_mask, swkv_teach.masks.window_mask,
                                    functools.partial(swkv_teach.window_mask, num_sinks=0)],
                         ids=["swkv_teach.window_mask", "masks.window_mask", "partial"])
def test_the_librarys_own_mask_is_refused_as_an_answer(oracle):
    with pytest.raises(ExerciseFailed, match="library's own window_mask"):
        check_chunk_mask(oracle)


def test_the_exercise_is_registered():
    ex = EXERCISES["04"]
    assert (ex.slug, ex.call) == ("chunk_mask", "check_chunk_mask(chunk_mask)")


def test_the_catalogue_names_eight_or_more_distinct_bugs():
    from tests.wrong_answers import CATALOGUE

    mine = [w for w in CATALOGUE if w.check == "check_chunk_mask"]
    assert len(mine) >= 8 and all(w.__module__ == wrong.__name__ for w in mine)
    assert len({w.words for w in mine}) == len(mine), "two wrong answers expect the same message"


# ------------------------------------------------------------------ what the cases cover
def test_cases_vary_every_free_dimension():
    all_cases = cases()
    windows = {c.W for c in all_cases}
    assert windows == set(range(1, 10))
    chunk_sizes = {(len(c.q), c.W) for c in all_cases}
    assert all((1, W) in chunk_sizes and any(n > W for n, w in chunk_sizes if w == W) for W in windows), \
        "every window sees one-token updates and chunks longer than itself"
    assert all(max(int(c.q.max()) for c in all_cases if c.W == W) >= max(4 * W, 20) for W in windows), \
        "long sequences: at least 4W (and 20) positions for every window"
    assert max(len(c.k) for c in all_cases) >= 20
    unsorted_keys = [c for c in all_cases if not torch.equal(c.k, c.k.sort().values)]
    assert any(len(c.q) == 1 for c in unsorted_keys) and any(len(c.q) > 1 for c in unsorted_keys)
    assert any(int(c.q.min()) > 3 * c.W and len(c.k) > c.W for c in unsorted_keys), "keys after several wraps"
    assert any(len(c.k) > 1 and int(torch.diff(c.k.sort().values).max()) > 1 for c in all_cases), "keys with gaps"
    assert any(not torch.equal(c.q, c.q.sort().values) for c in all_cases), "queries in any order"
    too_old = [c for c in all_cases if bool((c.k[None, :] <= c.q[:, None] - c.W).all(0).any())]
    assert too_old, "some keys no query may see (the boundary at W + 1)"


def test_some_positions_are_past_what_each_lossy_cast_holds():
    """For each cast a learner might make, a case whose mask that cast gets wrong, run with int64 where it must be."""
    from swkv_teach.masks import allowed

    big = [c for c in cases() if c.big]
    for dt, name, _ in CASTS:
        assert any(not torch.equal(allowed(c.q.to(dt)[:, None], c.k.to(dt)[None, :], c.W), window_mask(c.q, c.k, c.W))
                   for c in big), name
    top = torch.iinfo(torch.int32).max
    for c in big:  # whatever does not fit int32 comes as int64, each tensor in its own dtype
        assert int(c.q.max()) <= top or c.dtypes[0] == torch.int64, c.label
        assert int(c.k.max()) <= top or c.dtypes[1] == torch.int64, c.label


def test_the_two_dtypes_are_mixed_where_narrowing_one_to_the_other_loses_a_position():
    """"int32 or int64 (not necessarily the same)": a case for each direction where casting the int64 tensor to
    the int32 one's dtype wraps, and one 2**32 apart where a relative difference narrowed to int32 wraps."""
    from swkv_teach.masks import allowed

    mixed = [c for c in cases() if c.dtypes in ((torch.int64, torch.int32), (torch.int32, torch.int64))]
    for narrowed in (0, 1):  # q to int32, then k to int32
        assert any(not torch.equal(allowed(*(t.to(torch.int32).long() if i == narrowed else t
                                             for i, t in enumerate((c.q[:, None], c.k[None, :]))), c.W),
                                   window_mask(c.q, c.k, c.W)) for c in mixed), narrowed
    assert any(int(c.q.min()) - int(c.k.min()) > 2**32 - 2 for c in cases())


def test_queries_come_as_a_view_of_the_keys_as_after_a_cache_update():
    """When the queries are the keys' last entries (and share their dtype), q_positions is k_positions[-c:]."""
    shared = []

    def spy(q_positions, k_positions, window_size):
        shared.append(q_positions.data_ptr() == k_positions[len(k_positions) - len(q_positions):].data_ptr())
        return window_mask(q_positions, k_positions, window_size)

    check_chunk_mask(spy)
    assert 0.2 * len(shared) < sum(shared) < len(shared)


def test_cases_are_the_same_every_time():
    a, b = cases(), cases()
    assert all(torch.equal(x.q, y.q) and torch.equal(x.k, y.k) and x.W == y.W for x, y in zip(a, b))


def test_every_dtype_pair_and_the_course_device_are_used():
    seen = set()

    def spy(q_positions, k_positions, window_size):
        seen.add((q_positions.dtype, k_positions.dtype, q_positions.device.type, k_positions.device.type))
        return window_mask(q_positions, k_positions, window_size)

    check_chunk_mask(spy)
    dev = swkv_teach.device().type
    assert seen == {(a, b, dev, dev) for a in (torch.int32, torch.int64) for b in (torch.int32, torch.int64)}


# ------------------------------------------------------------------ diagnosis
def test_the_probes_tell_every_named_bug_apart():
    """A named bug must explain all probes; so no two hypotheses (nor the right mask) may agree on all of them."""
    per_probe = []
    for p in PROBES:
        masks, names = zip(*hypotheses(p.q, p.k, p.W))
        per_probe.append([*masks, window_mask(p.q, p.k, p.W)])
    names = [*names, "right"]
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            assert not all(m[a].shape == m[b].shape and torch.equal(m[a], m[b]) for m in per_probe), \
                (names[a], names[b])


def test_an_unknown_bug_is_described_not_guessed():
    """A mask right everywhere except one (query, key) pair is told which pair, with no bug name."""
    def one_pair_off(q_positions, k_positions, window_size):
        m = window_mask(q_positions, k_positions, window_size)
        if len(k_positions) > 20:
            m[0, 0] = ~m[0, 0]
        return m

    with pytest.raises(ExerciseFailed) as info:
        check_chunk_mask(one_pair_off)
    msg = str(info.value)
    assert "(row 0)" in msg and "(column 0)" in msg and "whatever the order of the keys" in msg
    assert "keys with gaps" in msg


def test_a_crash_in_a_probe_does_not_hide_the_failure():
    def crashes_unless_small(q_positions, k_positions, window_size):
        if window_size > 2:
            raise RuntimeError("boom")
        q, k = q_positions[:, None], k_positions[None, :]
        return (k <= q) & (k >= q - window_size)  # W + 1

    with pytest.raises(ExerciseFailed, match="W \\+ 1 keys"):
        check_chunk_mask(crashes_unless_small)


# ------------------------------------------------------------------ small and clean
def test_the_check_calls_the_answer_a_bounded_number_of_times():
    """Under 5 s on a CPU comes from the size of the work: about 250 tiny masks, each up to 12 x 28, a quarter of
    them asked again with strided (not contiguous) positions."""
    calls = []

    def counting(q_positions, k_positions, window_size):
        calls.append(len(q_positions) * len(k_positions))
        return window_mask(q_positions, k_positions, window_size)

    check_chunk_mask(counting)
    n = len(cases())
    assert n < len(calls) <= n + n // 4 and n <= 300 and max(calls) <= 12 * 28


def test_the_check_leaves_the_global_random_state_alone():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    check_chunk_mask(broadcast)
    assert torch.equal(before, torch.get_rng_state())


def test_an_answer_that_writes_into_its_inputs_cannot_change_the_cases_or_probes():
    """Every call gets its own copy: on the CPU, .to() of an int64 tensor would hand over the original."""
    saved = [(p.q.clone(), p.k.clone()) for p in PROBES]

    def zeroes_its_keys_at_the_probes(q_positions, k_positions, window_size):
        q, k = q_positions[:, None], k_positions[None, :]
        mask = (k <= q) & (k >= q - window_size)  # W + 1, so the check probes it
        if len(k_positions) in {len(p.k) for p in PROBES}:
            k_positions.zero_()
            q_positions.zero_()
        return mask

    with pytest.raises(ExerciseFailed):
        check_chunk_mask(zeroes_its_keys_at_the_probes)
    assert all(torch.equal(p.q, q) and torch.equal(p.k, k) for p, (q, k) in zip(PROBES, saved))
    check_chunk_mask(broadcast)  # and the next answer is judged on the same cases
