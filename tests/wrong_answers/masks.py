"""Wrong answers to exercise 02, sliding_window_mask(seq_len, window_size)."""

import torch

from tests.wrong_answers import wrong


def _ij(T):
    return torch.arange(T)[:, None], torch.arange(T)[None, :]


@wrong("check_sliding_window_mask", "off by one", "w - 1")
def mask_w_minus_1(seq_len, window_size):
    """`j > i - W + 1`: each query sees W - 1 keys."""
    i, j = _ij(seq_len)
    return (j <= i) & (j > i - window_size + 1)


@wrong("check_sliding_window_mask", "off by one", "w + 1")
def mask_w_plus_1(seq_len, window_size):
    """`j >= i - W`: each query sees W + 1 keys."""
    i, j = _ij(seq_len)
    return (j <= i) & (j >= i - window_size)


@wrong("check_sliding_window_mask", "not causal")
def mask_symmetric_band(seq_len, window_size):
    """`|i - j| < W`: a band that lets queries see later keys."""
    i, j = _ij(seq_len)
    return (i - j).abs() < window_size


@wrong("check_sliding_window_mask", "plain causal")
def mask_causal_only(seq_len, window_size):
    """Causal, window forgotten."""
    i, j = _ij(seq_len)
    return j <= i


@wrong("check_sliding_window_mask", "transposed")
def mask_transposed(seq_len, window_size):
    """Rows and columns swapped (keys as rows)."""
    i, j = _ij(seq_len)
    return ((j <= i) & (j > i - window_size)).T


@wrong("check_sliding_window_mask", "torch.bool", "float")
def mask_float(seq_len, window_size):
    """Right pattern as 0./1. floats: SDPA would *add* it to the scores."""
    i, j = _ij(seq_len)
    return ((j <= i) & (j > i - window_size)).float()


@wrong("check_sliding_window_mask", "inverted")
def mask_inverted(seq_len, window_size):
    """True where attention is *forbidden*."""
    i, j = _ij(seq_len)
    return ~((j <= i) & (j > i - window_size))


@wrong("check_sliding_window_mask", "not causal", "j <= i")
def window_without_causality(seq_len, window_size):
    """Only the lower edge of the band (i - j < W): every later key is visible too."""
    i = torch.arange(seq_len)[:, None]
    j = torch.arange(seq_len)[None, :]
    return (i - j) < window_size
