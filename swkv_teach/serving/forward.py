"""One decoder forward over ragged rows: decode tokens and prefill chunks side by side (varlen).

:meth:`Decoder.step_paged <swkv_teach.model.Decoder.step_paged>` takes ``c`` new tokens for
every row; a vLLM v1 step mixes rows of 1 token (decoding) with rows of hundreds (a prompt's
chunk). Here every row's tokens are packed one after another, ``(total_q,)``, as
FlashAttention's ``flash_attn_varlen_func`` packs its queries (see
:func:`~swkv_teach.attention.paged_attention`), and the decoder's layers run on the packed
tokens as one sequence of ``total_q`` tokens: norms, projections and the MLP act per token,
RoPE takes each token's own position, and only attention needs the rows, which
:func:`~swkv_teach.attention.paged_varlen_plan` gives each query.
"""

from __future__ import annotations

import torch

from swkv_teach.attention import paged_varlen_plan
from swkv_teach.model import rotary

__all__ = ["step_varlen"]


@torch.no_grad()
def step_varlen(decoder, input_ids: torch.Tensor, cu_seqlens_q: torch.Tensor, start: torch.Tensor,
                kv: list[tuple[torch.Tensor, torch.Tensor]], block_table: torch.Tensor,
                window_size: int | None = None, logits_at: torch.Tensor | None = None) -> torch.Tensor:
    """Feed row ``b`` its tokens ``input_ids[cu_seqlens_q[b] : cu_seqlens_q[b + 1]]`` at positions ``start[b] ..``.

    Args:
        decoder: a :class:`~swkv_teach.model.Decoder`.
        input_ids: ``(total_q,)`` long, every row's new tokens one after another.
        cu_seqlens_q: ``(batch + 1,)`` integers, 0 first, ``total_q`` last (FlashAttention's layout).
        start: ``(batch,)`` tokens each row has already written (its first new token's position).
        kv: one ``(k_cache, v_cache)`` per layer, ``(num_blocks, block_size, n_kv_heads, head_dim)``;
            the new keys and values are written into them.
        block_table: ``(batch, max_blocks)``: row ``b``'s logical block ``i`` is pool block
            ``block_table[b, i]``; every new position's block must be valid.
        window_size: ``W`` (default the config's).
        logits_at: indices into the packed tokens whose logits are wanted (vLLM's
            ``logits_indices``: each row's last token, where a new token is picked); None: all.
    Returns:
        logits ``(len(logits_at), vocab)`` (or ``(total_q, vocab)``).
    """
    c = decoder.config
    W = c.window_size if window_size is None else window_size
    device = input_ids.device
    cu = cu_seqlens_q.to(device=device, dtype=torch.long)
    counts = cu.diff()
    N, B = input_ids.shape[0], counts.shape[0]
    if N == B and bool((counts == 1).all()):
        # every row decodes one token: that is step_paged's batch of (B, 1), the same computation with
        # less planning (FlashAttention's varlen kernel with all query lengths 1 is its decode kernel)
        logits = decoder.step_paged(input_ids[:, None], start, kv, block_table, W)[:, 0]  # (B, vocab)
        return logits if logits_at is None else logits[logits_at]
    decoder._check_ids("input_ids", input_ids[None])
    start = torch.as_tensor(start, device=device).long()
    if start.shape != (B,) or bool((start < 0).any()):
        raise ValueError(f"start must be (batch,) = ({B},) non-negative positions; got {start.tolist()}")
    table = torch.as_tensor(block_table, device=device).long()
    row = torch.repeat_interleave(torch.arange(B, device=device), counts)  # (N,) each token's row
    positions = start[row] + torch.arange(N, device=device) - cu[:-1][row]  # (N,) absolute, per token
    block_size = kv[0][0].shape[1]
    blocks = table[row, positions // block_size]
    if bool((blocks < 0).any()):
        raise ValueError("block_table must give a block for every new token's position; got -1 there")
    slots = (blocks * block_size + positions % block_size)[None]  # (1, N) flat pool slots
    x = decoder.embed(input_ids)[None]  # (1, N, dim): the packed rows as one sequence
    cos, sin = rotary(positions, c.head_dim, c.rope_theta, x.dtype)  # (N, hd)
    rope = (cos.view(1, 1, N, -1), sin.view(1, 1, N, -1))
    max_q = int(counts.max())
    plan = paged_varlen_plan(cu, max_q, start + counts, table, block_size, kv[0][0].shape[0], W)
    for layer, (k_cache, v_cache) in zip(decoder.layers, kv):
        x = layer.forward_paged(x, rope, k_cache, v_cache, slots, plan)
    h = x[0] if logits_at is None else x[0, logits_at]
    return decoder.lm_head(decoder.norm(h))
