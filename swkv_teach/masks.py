"""The window convention, written down once, and the masks built from it.

The convention
--------------
With window ``W``, the query at absolute position ``i`` attends to the keys at
positions ``j`` with::

    i - W < j <= i          (W keys, the query's own key included)

Worked example, ``W = 3``: query 5 sees keys 3, 4 and 5; key 2 is just out
(``5 - 3 < 2`` is false). Query 1 sees keys 0 and 1 only: there is nothing
before position 0.

Who else counts this way, and who does not
-------------------------------------------
"Window ``W``" is ambiguous in the literature: ``W`` keys, or ``W`` keys
*before* the query plus the query's own (``W + 1``). Ours is the first.

* Hugging Face ``transformers``: ``kv_idx > q_idx - sliding_window``
  (``masking_utils.sliding_window_overlay``). Its flash-attention path passed
  ``window_size=(W, W)``, i.e. ``W + 1`` keys, until PR #40163 (fixing issue
  #39408), first released in v4.56.0; since then every backend sees ``W``.
* flash-attention: ``window_size=(W - 1, 0)``; its docstring says query ``i``
  sees keys ``[i - window_size[0], i + window_size[1]]`` inclusive
  (``flash_attn_interface.py``, ``flash_attn_qkvpacked_func``; ``flash_attn_func``
  states the same with the offset ``seqlen_k - seqlen_q`` for unequal lengths).
* xFormers' ``make_local_attention(W)``, which mistral-inference (then
  mistral-src) uses for Mistral 7B: ``torch.triu(mask, diagonal=shift - W + 1)``
  (``xformers/ops/fmha/attn_bias.py``).
* **Not** Mistral's one-file reference: ``one_file_ref.py`` (mistral-src,
  first commit c18d5b9, line 261) bands its prefill mask with
  ``torch.triu(mask, diagonal=-sliding_window)``, which admits ``j >= i - W``:
  ``W + 1`` keys. Its decode path reads a rolling buffer of ``W`` slots, so
  the same file sees ``W`` keys per query when decoding. The Mistral 7B paper
  (Jiang et al. 2023, section 2) words it the ``W + 1`` way: position ``i``
  attends to "positions between i - W and i". A model trained on one count
  and served with the other sees one key more or fewer at every position past
  the window; the tests check the boundary at ``W - 1``, ``W`` and ``W + 1``.

Sources, with links: ``docs/references.md``. The lessons show the reference's
mask next to ours (lesson 0).

With ``num_sinks = S`` (attention sinks, StreamingLLM) the first ``S``
positions are visible to every later query as well::

    j <= i  and  (j < S  or  i - W < j)

Every other place in the package (caches, attention, grading, plots, lessons)
points here instead of restating the rule.
"""

from __future__ import annotations

import torch

from swkv_teach._validate import check_nonnegative_int, check_positive_int

__all__ = ["allowed", "sliding_window_mask", "window_mask"]


def allowed(i, j, window_size: int, num_sinks: int = 0):
    """The convention as a predicate: may query position ``i`` attend to key ``j``?

    Works on Python ints and on broadcastable integer tensors alike (``&`` and
    ``|`` mean the same on bools and bool tensors), so the masks below and the
    tests share one definition.
    """
    in_window = j > i - window_size
    if num_sinks:  # (skipped when 0: this runs in every layer of every decode step)
        in_window = in_window | (j < num_sinks)
    return (j <= i) & in_window


def sliding_window_mask(seq_len: int, window_size: int, device=None) -> torch.Tensor:
    """The ``(seq_len, seq_len)`` bool mask of sliding-window causal attention.

    ``mask[i, j]`` is True where query ``i`` may attend to key ``j``, i.e.
    ``i - W < j <= i`` (see the module docstring). Example, ``W = 2``::

        >>> sliding_window_mask(4, 2).int()
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 1, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
    """
    check_nonnegative_int("seq_len", seq_len)
    check_positive_int("window_size", window_size)
    pos = torch.arange(seq_len, device=device)
    return window_mask(pos, pos, window_size)


def window_mask(q_positions, k_positions, window_size: int, num_sinks: int = 0) -> torch.Tensor:
    """The general mask, from absolute positions: ``(len(q), len(k))`` bool.

    Args:
        q_positions: 1-D integer tensor (or sequence) of the queries' absolute positions.
        k_positions: 1-D integer tensor (or sequence) of the keys' absolute
            positions, in whatever order a cache returned them (a ring buffer's
            slot order is fine).
        window_size: ``W`` of the convention.
        num_sinks: first positions every query may also see (0 for none).

    Returns:
        ``mask[a, b]`` True where query ``q_positions[a]`` may attend to key
        ``k_positions[b]``. Because it is built from positions, one rule covers
        whole sequences, chunked prefill, ring order and sinks.
    """
    check_positive_int("window_size", window_size)
    check_nonnegative_int("num_sinks", num_sinks)
    q = torch.as_tensor(q_positions)
    k = torch.as_tensor(k_positions, device=q.device)
    for name, t in (("q_positions", q), ("k_positions", k)):
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D (one absolute position per token); got shape {tuple(t.shape)}")
        if t.is_floating_point() or t.dtype == torch.bool:
            raise TypeError(f"{name} must hold integer positions; got dtype {t.dtype}")
    return allowed(q[:, None], k[None, :], window_size, num_sinks)
