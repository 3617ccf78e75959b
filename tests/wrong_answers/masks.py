"""Wrong answers to exercise 01, sliding_window_mask(seq_len, window_size)."""

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


# ---------------------------------------------------------------- issue 10: blind spots and misdiagnoses
@wrong("check_sliding_window_mask", "shifted by one", "future key")
def mask_shifted_onto_future(seq_len, window_size):
    """`i - W + 1 < j <= i + 1`: W keys per query, but shifted one step into the future."""
    i, j = _ij(seq_len)
    return (j <= i + 1) & (j > i - window_size + 1)


@wrong("check_sliding_window_mask", "column only")
def mask_cut_by_column(seq_len, window_size):
    """Causal, then only the last W columns of the whole sequence: the decode-time picture applied to every row."""
    i, j = _ij(seq_len)
    return (j <= i) & (j >= seq_len - window_size)


_BUFFER = torch.ones(16, 16, dtype=torch.bool).tril()


@wrong("check_sliding_window_mask", "(16, 16)", "(20, 20)")
def mask_from_a_fixed_buffer(seq_len, window_size):
    """Slices a precomputed 16 x 16 causal buffer: right up to 16 tokens, the wrong shape beyond."""
    i, j = _ij(seq_len)
    return _BUFFER[:seq_len, :seq_len] & (j > i - window_size)[:16, :16]


# ---------------------------------------------------------------- the library's own answer handed in
from swkv_teach import sliding_window_mask as _library_mask  # noqa: E402


@wrong("check_sliding_window_mask", "library's own", "swkv_teach.sliding_window_mask")
def library_mask(seq_len, window_size):
    """The library's sliding_window_mask behind functools.wraps (an import of swkv_teach.sliding_window_mask)."""
    return _library_mask(seq_len, window_size)


library_mask.__wrapped__ = _library_mask


_FIRST: list = []


@wrong("check_sliding_window_mask", "window_size is ignored", "first window_size seen")
def first_window_cached(seq_len, window_size):
    """Builds a 64 x 64 band for the first window_size it is given, keeps it in a module-level list, slices it."""
    if not _FIRST:
        i, j = torch.arange(64)[:, None], torch.arange(64)[None, :]
        _FIRST.append((j <= i) & (j > i - window_size))
    return _FIRST[0][:seq_len, :seq_len]


@wrong("check_sliding_window_mask", "shifted by one into the past", "does not see itself")
def mask_strictly_past_band(seq_len, window_size):
    """`(j < i) & (j >= i - W)`: W keys, but the band slid one step into the past (no query sees itself)."""
    i, j = _ij(seq_len)
    return (j < i) & (j >= i - window_size)


_TABLE = torch.tril(torch.ones(64, 64, dtype=torch.bool))


@wrong("check_sliding_window_mask", "shape (64, 64)", "expected (65, 65)")
def mask_sliced_from_a_table_of_64(seq_len, window_size):
    """A causal table built once at 64 x 64 and sliced: too small past 64 tokens."""
    i, j = _ij(min(seq_len, 64))
    return _TABLE[:seq_len, :seq_len] & (j > i - window_size)


@wrong("check_sliding_window_mask", "seq_len=129", "all false")
def mask_int8_indices(seq_len, window_size):
    """Indices built as int8 "to save memory": they wrap past 127, so long masks go wrong."""
    i = torch.arange(seq_len).to(torch.int8)[:, None]
    j = torch.arange(seq_len).to(torch.int8)[None, :]
    return (j <= i) & (j > i - window_size)
