"""Right answers to exercise 01, sliding_window_mask(seq_len, window_size)."""

import torch

from tests.right_answers import right

# swkv_teach.sliding_window_mask itself is refused by the check (it is the oracle).


@right("check_sliding_window_mask")
def mask_with_tril(seq_len, window_size):
    """tril & triu(diagonal=-(W - 1))."""
    ones = torch.ones(seq_len, seq_len, dtype=torch.bool)
    return torch.tril(ones) & torch.triu(ones, diagonal=-(window_size - 1))


@right("check_sliding_window_mask")
def mask_from_loops(seq_len, window_size):
    """Two Python loops."""
    m = torch.zeros(seq_len, seq_len, dtype=torch.bool)
    for i in range(seq_len):
        for j in range(max(0, i - window_size + 1), i + 1):
            m[i, j] = True
    return m


@right("check_sliding_window_mask")
def mask_from_distance(seq_len, window_size):
    """From the distance d = i - j: 0 <= d < W."""
    d = torch.arange(seq_len)[:, None] - torch.arange(seq_len)[None, :]
    return (d >= 0) & (d < window_size)
