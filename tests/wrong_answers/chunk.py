"""Wrong answers to exercise 04, chunk_mask(q_positions, k_positions, window_size).

Each is a mistake a learner makes on the chunk contract; the words after the check name must
appear in the message that rejects it. The last two have no named diagnosis: their messages must
say plainly which query and key differ.
"""

import functools

import torch

import swkv_teach
from tests.wrong_answers import wrong

NAME = "check_chunk_mask"


def _qk(q_positions, k_positions):
    return q_positions[:, None], k_positions[None, :]


@wrong(NAME, "w + 1", "mistral")
def mistral_reference_w_plus_1(q_positions, k_positions, window_size):
    """`k >= q - W`, Mistral's one_file_ref.py convention: W + 1 keys per query."""
    q, k = _qk(q_positions, k_positions)
    return (k <= q) & (k >= q - window_size)


@wrong(NAME, "w - 1")
def w_minus_1(q_positions, k_positions, window_size):
    """`k > q - W + 1`: the query's own key forgotten in the count, W - 1 keys."""
    q, k = _qk(q_positions, k_positions)
    return (k <= q) & (k > q - window_size + 1)


@wrong(NAME, "not causal", "later tokens")
def window_without_causality(q_positions, k_positions, window_size):
    """Only the window's lower edge: the chunk's later tokens are visible to its earlier queries."""
    q, k = _qk(q_positions, k_positions)
    return k > q - window_size


@wrong(NAME, "not causal", "|q - k|")
def symmetric_band(q_positions, k_positions, window_size):
    """`|q - k| < W`: a band around the query, later keys included."""
    q, k = _qk(q_positions, k_positions)
    return (q - k).abs() < window_size


@wrong(NAME, "plain causal")
def causal_only(q_positions, k_positions, window_size):
    """Causal, the window forgotten (the cache already trimmed, hasn't it?)."""
    q, k = _qk(q_positions, k_positions)
    return k <= q


@wrong(NAME, "slot order", "k_positions[j]")
def positions_from_column_index(q_positions, k_positions, window_size):
    """Assumes the keys are chronological and end at the chunk: key j at newest - len(k) + 1 + j."""
    n = len(k_positions)
    k = q_positions.max() - n + 1 + torch.arange(n, device=k_positions.device)
    q = q_positions[:, None]
    return (k[None, :] <= q) & (k[None, :] > q - window_size)


@wrong(NAME, "lengths", "not from the positions")
def mask_from_lengths(q_positions, k_positions, window_size):
    """Exercise 01's mask on indices: queries are the last len(q) of len(k) keys, positions unused."""
    nq, nk = len(q_positions), len(k_positions)
    i = torch.arange(nk - nq, nk, device=q_positions.device)[:, None]
    j = torch.arange(nk, device=q_positions.device)[None, :]
    return (j <= i) & (j > i - window_size)


@wrong(NAME, "sorted", "k_positions[j]")
def sorts_keys_first(q_positions, k_positions, window_size):
    """Sorts k_positions (to 'fix' the ring order) and returns the mask in sorted column order."""
    q, k = _qk(q_positions, k_positions.sort().values)
    return (k <= q) & (k > q - window_size)


@wrong(NAME, "transposed")
def keys_on_rows(q_positions, k_positions, window_size):
    """Rows are keys, columns queries: shape (keys, queries)."""
    k, q = k_positions[:, None], q_positions[None, :]
    return (k <= q) & (k > q - window_size)


@wrong(NAME, "additive", "-inf")
def additive_float_mask(q_positions, k_positions, window_size):
    """0 / -inf floats, the form added to the scores, instead of the bool mask."""
    q, k = _qk(q_positions, k_positions)
    keep = (k <= q) & (k > q - window_size)
    return torch.zeros(keep.shape, device=keep.device).masked_fill(~keep, float("-inf"))


@wrong(NAME, "float", "adds")
def zero_one_floats(q_positions, k_positions, window_size):
    """Right pattern as 0./1. floats."""
    q, k = _qk(q_positions, k_positions)
    return ((k <= q) & (k > q - window_size)).float()


@wrong(NAME, "torch.bool", "0/1 integer mask")
def zero_one_integers(q_positions, k_positions, window_size):
    """Right pattern as int64 via .long()."""
    q, k = _qk(q_positions, k_positions)
    return ((k <= q) & (k > q - window_size)).long()


@wrong(NAME, "hard-coded to 4")
def hard_coded_window(q_positions, k_positions, window_size):
    """The window of the worked example, 4, instead of window_size."""
    q, k = _qk(q_positions, k_positions)
    return (k <= q) & (k > q - 4)


@wrong(NAME, "inverted")
def inverted(q_positions, k_positions, window_size):
    """True where attention is forbidden."""
    q, k = _qk(q_positions, k_positions)
    return ~((k <= q) & (k > q - window_size))


@wrong(NAME, "newest query's row", "decode mask")
def decode_row_for_every_query(q_positions, k_positions, window_size):
    """The one-token decode mask (newest position) repeated for every query of the chunk."""
    p = q_positions.max()
    row = (k_positions <= p) & (k_positions > p - window_size)
    return row[None, :].expand(len(q_positions), -1)


@wrong(NAME, "consecutive", "q_positions[i]")
def queries_assumed_consecutive(q_positions, k_positions, window_size):
    """Rebuilds the queries as q_positions[0] + arange(len(q))."""
    q = (q_positions[0] + torch.arange(len(q_positions), device=q_positions.device))[:, None]
    k = k_positions[None, :]
    return (k <= q) & (k > q - window_size)


@wrong(NAME, "in place", "q_positions")
def unsqueezes_in_place(q_positions, k_positions, window_size):
    """unsqueeze_ instead of unsqueeze: the right mask, but the caller's q_positions is now (queries, 1)."""
    q = q_positions.unsqueeze_(1)
    k = k_positions[None, :]
    return (k <= q) & (k > q - window_size)


@wrong(NAME, "device", needs_accelerator=True)
def loops_into_a_cpu_tensor(q_positions, k_positions, window_size):
    """Python loops filling torch.zeros(...) created without device=: a CPU mask for GPU positions."""
    qs, ks = q_positions.tolist(), k_positions.tolist()
    m = torch.zeros(len(qs), len(ks), dtype=torch.bool)
    for a, p in enumerate(qs):
        for b, s in enumerate(ks):
            m[a, b] = p - window_size < s <= p
    return m


@wrong(NAME, "bfloat16", "cast")
def positions_cast_to_bfloat16(q_positions, k_positions, window_size):
    """Casts the positions to the attention dtype, bfloat16, before comparing: exact only up to 256."""
    q, k = _qk(q_positions.to(torch.bfloat16), k_positions.to(torch.bfloat16))
    return (k <= q) & (k > q - window_size)


@wrong(NAME, "float16", "cast", "2048")
def positions_cast_to_half(q_positions, k_positions, window_size):
    """.half() positions: exact only up to 2048, inf past 65504."""
    q, k = _qk(q_positions.half(), k_positions.half())
    return (k <= q) & (k > q - window_size)


@wrong(NAME, "int16", "wraps")
def positions_cast_to_int16(q_positions, k_positions, window_size):
    """int16 positions 'to save memory': 32768 wraps to -32768."""
    q, k = _qk(q_positions.to(torch.int16), k_positions.to(torch.int16))
    return (k <= q) & (k > q - window_size)


@wrong(NAME, "int32", "2**31")
def positions_cast_to_int32(q_positions, k_positions, window_size):
    """.int() on both 'so the dtypes match': int64 positions past 2**31 - 1 wrap."""
    q, k = _qk(q_positions.int(), k_positions.int())
    return (k <= q) & (k > q - window_size)


@wrong(NAME, "float32", "2**24")
def positions_cast_to_float32(q_positions, k_positions, window_size):
    """.float() on both 'so the dtypes match': exact only up to 2**24."""
    q, k = _qk(q_positions.float(), k_positions.float())
    return (k <= q) & (k > q - window_size)


@wrong(NAME, "view", "in place", "sub_")
def shifts_in_place_and_restores(q_positions, k_positions, window_size):
    """q_positions.sub_(W), compare, then add_(W) to 'restore' it: wrong when q_positions is k_positions[-c:]."""
    lo = q_positions.sub_(window_size)[:, None]
    k = k_positions[None, :]
    mask = (k > lo) & (k <= lo + window_size)
    q_positions.add_(window_size)
    return mask


@wrong(NAME, "view", "out-of-place")
def keys_made_relative_in_place(q_positions, k_positions, window_size):
    """k_positions.sub_(first query) to work with small numbers, then add_ back: q, a view of k, moves too."""
    first = int(q_positions[0])
    k = k_positions.sub_(first)[None, :]
    q = (q_positions - first)[:, None]
    mask = (k <= q) & (k > q - window_size)
    k_positions.add_(first)
    return mask


library_window_mask_partial = wrong(NAME, "library's own", "window_mask")(
    functools.partial(swkv_teach.window_mask, num_sinks=0))
library_window_mask_partial.__name__ = "library_window_mask_partial"
library_window_mask_partial.__module__ = __name__
library_window_mask_partial.__doc__ = "functools.partial(swkv_teach.window_mask, num_sinks=0): the check's own oracle."


@wrong(NAME, "query at position", "column")
def unsorts_with_the_wrong_permutation(q_positions, k_positions, window_size):
    """Sorts the keys, builds the mask, then 'un-sorts' with order instead of its inverse."""
    ks, order = k_positions.sort()
    q = q_positions[:, None]
    m = (ks[None, :] <= q) & (ks[None, :] > q - window_size)
    return m[:, order]


@wrong(NAME, "key at position 0", "expected visible")
def window_start_clamped_at_zero(q_positions, k_positions, window_size):
    """`k > max(q - W, 0)`: 'no negative positions', which hides key 0 from the first W queries."""
    q, k = _qk(q_positions, k_positions)
    return (k <= q) & (k > (q - window_size).clamp(min=0))


# ---------------------------------------------------------------- issue 18: holes and true diagnoses


@wrong("check_chunk_mask", "int32 overflow", "q_positions - window_size")
def chunk_adds_window_to_keys(q_positions, k_positions, window_size):
    """Writes the window test as s + W > p: in int32 that overflows near 2**31 - 1."""
    p, s = q_positions[:, None], k_positions[None, :]
    return (s <= p) & (s + window_size > p)


# ---------------------------------------------------------------- issue 18: written as a learner would, unseen


@wrong("check_chunk_mask", "own key is masked", "k <= q")
def chunk_excludes_self(q_positions, k_positions, window_size):
    """Strictly earlier keys only (s < p): the query's own key is masked."""
    p, s = q_positions[:, None], k_positions[None, :]
    return (s < p) & (s > p - window_size)


@wrong(NAME, "q_positions", "narrowed to int32", "int64")
def query_cast_to_the_keys_dtype(q_positions, k_positions, window_size):
    """`q_positions.to(k_positions.dtype)` "to compare like with like": an int64 query past 2**31 wraps in int32."""
    q = q_positions.to(k_positions.dtype)[:, None]
    k = k_positions[None, :]
    return (k <= q) & (k > q - window_size)


@wrong(NAME, "made relative", "int32")
def relative_to_the_first_query_in_int32(q_positions, k_positions, window_size):
    """Subtracts the first query position "to keep numbers small", then narrows to int32: keys 2**32 older wrap."""
    base = q_positions[0]
    q = (q_positions - base).int()[:, None]
    k = (k_positions - base).int()[None, :]
    return (k <= q) & (k > q - window_size)


@wrong(NAME, "float64", "2**53")
def positions_cast_to_float64(q_positions, k_positions, window_size):
    """`.double()` "so the comparison is exact": float64 holds integers exactly only up to 2**53."""
    q, k = q_positions.double()[:, None], k_positions.double()[None, :]
    return (k <= q) & (k > q - window_size)


@wrong(NAME, "in place", "sub_", "put it back", "even for a moment")
def shifts_a_copy_taken_between_sub_and_add(q_positions, k_positions, window_size):
    """q_positions.sub_(W) cloned at once, then add_(W) back before comparing: the mask is right and the inputs equal
    at the end, but they moved for a moment (with q a view of k, k's tail too), which the statement forbids."""
    lo = q_positions.sub_(window_size).clone()
    q_positions.add_(window_size)
    k = k_positions[None, :]
    return (k > lo[:, None]) & (k <= q_positions[:, None])


@wrong(NAME, "in place", "put it back")
def clamps_keys_in_place_and_restores(q_positions, k_positions, window_size):
    """Saves k_positions, clamps it in place to 'ignore future keys', then copies the saved values back with
    k_positions[:] = saved: right mask, inputs equal at the end, but written into meanwhile."""
    saved = k_positions.clone()
    newest = int(q_positions.max())
    k_positions.clamp_(max=newest + 1)
    mask = (k_positions[None, :] <= q_positions[:, None]) & (k_positions[None, :] > q_positions[:, None] - window_size)
    k_positions[:] = saved
    return mask
