"""The window convention: query i attends keys j with i - W < j <= i (plus sinks j < S)."""

import pytest
import torch

from swkv_teach.masks import allowed, sliding_window_mask, window_mask


def test_worked_example_window_3_query_5_sees_keys_3_4_5():
    mask = sliding_window_mask(8, 3)
    assert torch.nonzero(mask[5]).flatten().tolist() == [3, 4, 5]
    assert torch.nonzero(mask[1]).flatten().tolist() == [0, 1]


@pytest.mark.parametrize("W", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("T", [1, 4, 9, 17])
def test_mask_matches_the_predicate_cell_by_cell(T, W):
    mask = sliding_window_mask(T, W)
    assert mask.dtype == torch.bool and mask.shape == (T, T)
    for i in range(T):
        for j in range(T):
            assert bool(mask[i, j]) == (i - W < j <= i), (i, j)


@pytest.mark.parametrize("W", [2, 3, 4, 7])
def test_boundary_rows_at_w_minus_1_w_and_w_plus_1(W):
    mask = sliding_window_mask(W + 2, W)
    # query W-1 is the last that still sees key 0; it sees W keys
    assert mask[W - 1, 0] and mask[W - 1].sum() == W
    # query W has just lost key 0 and still sees W keys, itself included
    assert not mask[W, 0] and mask[W, 1] and mask[W, W] and mask[W].sum() == W
    # query W+1 has lost keys 0 and 1
    assert not mask[W + 1, 1] and mask[W + 1, 2] and mask[W + 1].sum() == W


def test_each_row_holds_min_i_plus_1_and_w_keys():
    T, W = 12, 5
    counts = sliding_window_mask(T, W).sum(dim=1).tolist()
    assert counts == [min(i + 1, W) for i in range(T)]


def test_window_at_least_sequence_length_is_plain_causal():
    T = 6
    assert torch.equal(sliding_window_mask(T, T), torch.ones(T, T).tril().bool())
    assert torch.equal(sliding_window_mask(T, 100), torch.ones(T, T).tril().bool())


def test_window_1_sees_only_itself():
    assert torch.equal(sliding_window_mask(5, 1), torch.eye(5, dtype=torch.bool))


def test_window_mask_follows_keys_in_any_order():
    """A ring buffer returns keys in slot order: the mask must follow the positions, not the index."""
    q = torch.arange(10, 13)
    k = torch.tensor([9, 12, 7, 10, 11, 8])
    mask = window_mask(q, k, 3)
    for a, i in enumerate(q.tolist()):
        for b, j in enumerate(k.tolist()):
            assert bool(mask[a, b]) == (i - 3 < j <= i)


def test_window_mask_agrees_with_sliding_window_mask():
    pos = torch.arange(11)
    assert torch.equal(window_mask(pos, pos, 4), sliding_window_mask(11, 4))


def test_sinks_stay_visible_to_every_later_query():
    pos = torch.arange(12)
    mask = window_mask(pos, pos, 3, num_sinks=2)
    assert mask[11, 0] and mask[11, 1] and not mask[11, 2] and not mask[11, 8] and mask[11, 9]
    assert not mask[0, 1], "sinks are still causal: query 0 cannot see key 1"
    assert mask[5].sum() == 2 + 3


def test_allowed_is_the_same_rule_on_ints_and_tensors():
    for i in range(8):
        for j in range(8):
            assert allowed(i, j, 3, 1) == bool(allowed(torch.tensor(i), torch.tensor(j), 3, 1))


@pytest.mark.parametrize("bad", [0, -2, 2.0, True, "3", None])
def test_bad_window_size_names_the_argument(bad):
    with pytest.raises((TypeError, ValueError), match="window_size"):
        sliding_window_mask(4, bad)
    with pytest.raises((TypeError, ValueError), match="window_size"):
        window_mask(torch.arange(3), torch.arange(3), bad)


def test_bad_positions_are_named():
    with pytest.raises(ValueError, match="q_positions.*1-D"):
        window_mask(torch.zeros(2, 2, dtype=torch.long), torch.arange(3), 2)
    with pytest.raises(TypeError, match="k_positions.*integer"):
        window_mask(torch.arange(3), torch.tensor([0.0, 1.0]), 2)
    with pytest.raises((TypeError, ValueError), match="seq_len"):
        sliding_window_mask(-1, 2)
    with pytest.raises((TypeError, ValueError), match="num_sinks"):
        window_mask(torch.arange(3), torch.arange(3), 2, num_sinks=-1)
