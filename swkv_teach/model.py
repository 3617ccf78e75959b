"""A Mistral-style decoder, small enough to read top to bottom, that drives the KV caches.

References: Mistral 7B (Jiang et al. 2023) for sliding-window attention with
grouped-query attention; Hugging Face's ``modeling_mistral.py`` for the exact
layout (RoPE on split halves via ``rotate_half``, RMSNorm in float32, SwiGLU);
nanoGPT for the shape of this file.

Window convention: :mod:`swkv_teach.masks` (query ``i`` sees keys
``i - W < j <= i``, plus the first ``num_sinks`` when asked).

Three ways to run the same weights, which the tests hold equal:

* :meth:`Decoder.forward` — the oracle: the whole sequence at once, no cache.
* :meth:`Decoder.score` — the same logits, fed through per-layer caches in
  chunks of ``chunk_size`` tokens (``step`` underneath).
* :meth:`Decoder.generate` — the prompt as one chunk, then one token per step;
  the caches hold at most ``W`` tokens, so memory stays flat however long it runs.

The decoder knows a cache only through the :class:`~swkv_teach.caches.KVCache`
interface: ``update`` (keys *after* RoPE in, keys to attend over out),
``positions`` (their absolute positions, for the mask) and ``seen`` (where
the next token's rotary position starts). Never ``len(cache)``: a full
window holds ``W`` tokens however many came before. Two optional class
attributes, with safe defaults on the interface, let it do less or more:
``one_token_in_window`` (no mask for one query) and ``wants_attention`` (then
it passes the attention weights to ``observe``).

What a decode step does once, not once per layer: the new tokens' positions
and their RoPE angles (:meth:`Decoder.step`). What it skips: the mask, when
one query attends over a cache that returns only keys inside its window
(``KVCache.one_token_in_window``, see :func:`needs_no_mask`); the window's
mask tensor, when a prompt no longer than the window attends over itself
(causal, see :meth:`Attention.attend`). Lesson 4 spells the step out with the
mask; tests/test_fast_path.py holds every shortcut to it and to the oracle.

A cache that evicts by attention (``wants_attention``: H2O, TOVA) gets its
layer's attention probabilities through ``observe``; only such layers pay for
the explicit softmax (:meth:`Attention.attend_with_weights`). A cache that sets
``reads_in_place`` (the paged cache; a ring with lookahead, for up to
``in_place_tokens`` = k + 1 queries: a verify) hands the step its whole pool or
buffer and a mask of each query's window (``update_in_place``), so attention
reads the keys where they lie (:meth:`Attention.attend_in_place`).

Compiled decoding: :meth:`Decoder.compiled_ring` gives a
:class:`~swkv_teach.compiled_ring.CompiledRing` (its own file), whose one-token
step over fixed ring buffers ``torch.compile`` takes whole (``fullgraph=True``; position, slot and
mask are tensors), and ``generate(..., compile=True)`` uses it after an eager prompt
(``compile="aot"``: the same step compiled ahead of time by AOTInductor, no dynamo per call).

Serving: :meth:`Decoder.step_paged` runs one forward over many sequences, each
at its own position (per-row RoPE angles), keys written into blocks of one pool
and read through block tables with :func:`~swkv_teach.attention.paged_attention`;
:mod:`swkv_teach.serving` schedules requests onto it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from swkv_teach._validate import check_nonnegative_int, check_positive_int
from swkv_teach.attention import PagedPlan, attend_paged, cached_attention, paged_plan
from swkv_teach.caches import CACHE_KINDS, KVCache, make_cache
from swkv_teach.caches.layers import LayerCaches
from swkv_teach.caches.pool import write_to_blocks
from swkv_teach.masks import window_mask
from swkv_teach.rope import apply_rotary, rotary

if TYPE_CHECKING:
    from swkv_teach.compiled_ring import CompiledRing

__all__ = ["Attention", "Block", "Decoder", "DecoderConfig", "LayerCaches", "MLP", "RMSNorm", "needs_no_mask", "rotary"]


@dataclass
class DecoderConfig:
    vocab_size: int = 128
    dim: int = 64  # hidden size (HF: hidden_size)
    n_layers: int = 2
    n_heads: int = 4  # query heads
    n_kv_heads: int = 2  # grouped-query attention: each key/value head serves n_heads // n_kv_heads query heads
    head_dim: int = 16  # Mistral sets it explicitly; it need not be dim // n_heads
    hidden_dim: int = 128  # SwiGLU inner size (HF: intermediate_size)
    window_size: int = 8  # sliding window W, the package's convention (HF: sliding_window)
    rope_theta: float = 10000.0  # RoPE base; Mistral 7B v0.1 uses 10000, later models 1e6
    norm_eps: float = 1e-6
    tie_embeddings: bool = False  # share the input embedding with the output head

    def __post_init__(self):
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim", "window_size"):
            check_positive_int(name, getattr(self, name))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads must be a multiple of n_kv_heads; got n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even (RoPE rotates pairs of dims); got {self.head_dim}")


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, computed in float32 whatever the input dtype (as Hugging Face does)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if x.dtype == w.dtype == torch.float32:
            # the three lines below in one call (a decode step has 5 norms); in float32 there is no
            # cast between them to keep, and tests/test_fast_path.py checks the two agree bit for bit
            return F.rms_norm(x, w.shape, w, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _stack_on_load(state_dict: dict, prefix: str, fused: str, parts: tuple[str, ...]) -> None:
    """Load separate projections (Hugging Face's names, older checkpoints) into the fused one, rows stacked.

    A fused ``Linear`` whose rows are ``parts``' rows one after the other
    computes the same outputs, concatenated; the model splits them back.
    """
    names = [f"{prefix}{part}.weight" for part in parts]
    if all(name in state_dict for name in names):
        state_dict[f"{prefix}{fused}.weight"] = torch.cat([state_dict.pop(name) for name in names])


class Attention(nn.Module):
    """Grouped-query attention with a sliding window; the mask comes from absolute positions."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        c = config
        # q, k and v from one matmul: rows [0, nh·hd) project the queries, the next nkv·hd the keys,
        # the last nkv·hd the values (Hugging Face's q_proj, k_proj, v_proj stacked in that order;
        # a state dict with those three loads too, see _load_from_state_dict)
        self.qkv_proj = nn.Linear(c.dim, (c.n_heads + 2 * c.n_kv_heads) * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        _stack_on_load(state_dict, prefix, "qkv_proj", ("q_proj", "k_proj", "v_proj"))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def qkv(
        self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project and rotate: q ``(B, n_heads, T, hd)``, k and v ``(B, n_kv_heads, T, hd)``, RoPE applied.

        ``rope``: ``rotary(positions, ...)`` when the caller already has it
        (:meth:`Decoder.step` computes it once for all layers).
        """
        B, T, _ = x.shape
        c = self.config
        nh, nkv = c.n_heads, c.n_kv_heads
        if rope is None:
            positions = positions.to(x.device)  # positions made on the CPU must not break a GPU run
            rope = rotary(positions, c.head_dim, c.rope_theta, x.dtype)
        qkv = self.qkv_proj(x).view(B, T, nh + 2 * nkv, c.head_dim).transpose(1, 2)  # (B, nh + 2·nkv, T, hd)
        qk = apply_rotary(qkv[:, : nh + nkv], *rope)  # queries and keys rotated together, by the same angles
        return qk[:, :nh], qk[:, nh:], qkv[:, nh + nkv :]

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
        num_sinks: int = 0,
        window_size: int | None = None,
    ) -> torch.Tensor:
        """Queries ``(B, nh, T, hd)`` over keys/values ``(B, nkv, n, hd)`` in any order -> ``(B, T, dim)``.

        ``k_positions`` ``(n,)`` are the keys' absolute positions (a cache's
        ``positions``); the mask is :func:`~swkv_teach.masks.window_mask`
        with ``window_size`` (default: the config's) and ``num_sinks``.
        """
        B, nh, T, hd = q.shape
        W = self.config.window_size if window_size is None else window_size
        # GQA: key/value head h serves query heads h*group .. h*group + group - 1 (HF's repeat_kv);
        # SDPA does the grouping itself, so the window is not copied group times per step
        if T <= W and k.shape[-2] == T and _same_consecutive(q_positions, k_positions):
            # the keys are the queries' own tokens, consecutive, at most W of them (a prompt no longer
            # than the window, in a fresh cache or the oracle): every earlier key is inside every query's
            # window, so the window mask is the causal one, which SDPA applies without building it
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[-3] != nh)
        else:
            y = cached_attention(q, k, v, q_positions, k_positions, W, num_sinks)  # (B, nh, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, nh * hd))

    def attend_with_weights(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
        num_sinks: int = 0,
        window_size: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`attend` with the softmax spelled out: ``(B, T, dim)`` and the probabilities ``(B, nh, T, n)``.

        Only for caches that evict by attention (``wants_attention``): a fused
        kernel never materialises the probabilities, so every other cache keeps
        :meth:`attend`. Softmax in float32, as Hugging Face's eager attention.
        """
        B, nh, T, hd = q.shape
        W = self.config.window_size if window_size is None else window_size
        group = nh // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # HF's repeat_kv layout
        mask = window_mask(q_positions, k_positions, W, num_sinks).to(q.device)  # (T, n)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)  # (B, nh, T, n)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")).float(), dim=-1).to(q.dtype)
        y = weights @ v  # (B, nh, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, nh * hd)), weights

    def attend_unmasked(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One query ``(B, nh, 1, hd)`` over keys/values ``(B, nkv, n, hd)`` it may all see -> ``(B, 1, dim)``.

        ``bias``: an additive mask (0 or ``-inf``) or a boolean one (True = attend), broadcastable to
        ``(B, nkv, group, n)``, made by
        the cache, not from positions: a paged cache's pool also holds slots the query must not see
        (:meth:`~swkv_teach.caches.PagedKVCache.update_in_place`).

        The caller vouches that every key is visible (:func:`needs_no_mask`), so
        there is no mask to build. GQA without a copy: the ``group`` query heads
        of key head ``h`` are one token's queries over the same keys, so they go
        in as ``group`` queries of head ``h`` (with no mask, SDPA cannot tell
        them from a sequence); each key is then read once per key head, not
        once per query head.
        """
        B, nh, _, hd = q.shape
        nkv = k.shape[1]
        y = F.scaled_dot_product_attention(q.reshape(B, nkv, nh // nkv, hd), k, v, attn_mask=bias)  # (B, nkv, g, hd)
        return self.o_proj(y.reshape(B, 1, nh * hd))

    def attend_in_place(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Queries ``(B, nh, T, hd)`` over a cache's buffers ``(B, nkv, n, hd)``, masked by its bias: ``(B, T, dim)``.

        ``bias``: additive (0 or ``-inf``) ``(T, n)``, or anything broadcastable to ``(B, nh, T, n)``,
        from ``update_in_place`` (:meth:`~swkv_teach.caches.RingBufferKVCache.update_in_place`,
        :meth:`~swkv_teach.caches.PagedKVCache.update_in_place`). One query goes through
        :meth:`attend_unmasked` (its query heads as a group of queries per key head).
        """
        B, nh, T, hd = q.shape
        if T == 1:
            return self.attend_unmasked(q, k, v, bias)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=k.shape[-3] != nh)  # (B, nh, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, nh * hd))


def _same_consecutive(q_positions, k_positions) -> bool:
    """Whether both are the same run of consecutive positions ``p, p + 1, ...`` (in that order)."""
    if not (isinstance(q_positions, torch.Tensor) and isinstance(k_positions, torch.Tensor)):
        return False
    if q_positions.shape != k_positions.shape or q_positions.dim() != 1 or q_positions.is_floating_point():
        return False
    k_positions = k_positions.to(q_positions.device)
    return torch.equal(q_positions, k_positions) and bool((q_positions.diff() == 1).all())


def needs_no_mask(cache, tokens: int, window_size: int, num_sinks: int) -> bool:
    """Whether the keys ``cache.update`` just returned are all visible to its new queries, so no mask is needed.

    True for one new token and a cache that declares
    ``one_token_in_window`` (every key a one-token update returns is inside
    the cache's own window and sinks; tests/test_fast_path.py checks it at
    every step of every such cache), when that window and those sinks are no wider
    than the mask's: :func:`~swkv_teach.masks.window_mask` would then be all
    True. A chunk's queries each need their own window, so chunks are masked.
    """
    return (
        tokens == 1
        and getattr(cache, "one_token_in_window", False)
        and cache.window_size <= window_size
        and getattr(cache, "num_sinks", 0) <= num_sinks
    )


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        # gate and up from one matmul: rows [0, hidden) are Hugging Face's gate_proj, the rest its up_proj
        self.gate_up_proj = nn.Linear(config.dim, 2 * config.hidden_dim, bias=False)
        self.down_proj = nn.Linear(config.hidden_dim, config.dim, bias=False)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        _stack_on_load(state_dict, prefix, "gate_up_proj", ("gate_proj", "up_proj"))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.dim, config.norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.dim, config.norm_eps)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache | None = None,
        num_sinks: int = 0,
        window_size: int | None = None,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``x`` ``(B, T, dim)`` at absolute ``positions`` ``(T,)`` -> ``(B, T, dim)``.

        Without a cache the tokens attend among themselves (the oracle); with
        one, the cache turns this chunk's keys into what it should attend over.
        ``rope``: the positions' ``rotary`` angles, when the caller made them once for every layer.
        """
        W = self.attn.config.window_size if window_size is None else window_size
        q, k, v = self.attn.qkv(self.attn_norm(x), positions, rope)
        if cache is None:
            y = self.attn.attend(q, k, v, positions, positions, num_sinks, W)
        elif (getattr(cache, "reads_in_place", False) and x.shape[1] <= getattr(cache, "in_place_tokens", 1)
              and cache.window_size <= W and not num_sinks):
            # a paged cache (one query) or a ring with lookahead (a verify's k + 1 queries): the queries read the
            # buffers where they lie, slots outside their windows masked by a bias the cache keeps (the caches'
            # update_in_place); nothing gathered, no mask built from positions
            y = self.attn.attend_in_place(q, *cache.update_in_place(k, v))
        else:
            k, v = cache.update(k, v)  # keys cached after RoPE
            if getattr(cache, "wants_attention", False):  # H2O, TOVA: they evict by these probabilities
                y, weights = self.attn.attend_with_weights(q, k, v, positions, cache.positions, num_sinks, W)
                cache.observe(weights)
            elif needs_no_mask(cache, x.shape[1], W, num_sinks):  # one query, every key in its window
                y = self.attn.attend_unmasked(q, k, v)
            else:
                y = self.attn.attend(q, k, v, positions, cache.positions, num_sinks, W)
        x = x + y
        return x + self.mlp(self.mlp_norm(x))

    def forward_ring_slot(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], k_buf: torch.Tensor, v_buf: torch.Tensor,
        slot: torch.Tensor, visible: torch.Tensor,
    ) -> torch.Tensor:
        """:meth:`forward` for one token ``(B, 1, dim)`` over a ring's buffers, shapes and addresses fixed.

        The new key and value go into ``slot`` ``(1,)`` of ``k_buf``/``v_buf`` ``(B, nkv, W, hd)`` (in place),
        then the query attends over all ``W`` slots with ``visible`` ``(1, W)`` as SDPA's boolean mask
        (:func:`~swkv_teach.caches.ring.ring_slot_and_mask`): what the eager ring's
        ``update`` + :meth:`Attention.attend_unmasked` compute, with no shape that depends on the step.
        """
        q, k, v = self.attn.qkv(self.attn_norm(x), None, rope)  # q (B, nh, 1, hd); k, v (B, nkv, 1, hd)
        k_buf.index_copy_(2, slot, k)
        v_buf.index_copy_(2, slot, v)
        x = x + self.attn.attend_unmasked(q, k_buf, v_buf, visible)
        return x + self.mlp(self.mlp_norm(x))

    def forward_paged(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], k_cache: torch.Tensor,
        v_cache: torch.Tensor, slots: torch.Tensor, plan: PagedPlan,
    ) -> torch.Tensor:
        """:meth:`forward` for a batch of sequences at their own positions, keys in a shared block pool.

        The new keys and values go into ``slots`` of ``k_cache``/``v_cache`` (``(num_blocks,
        block_size, n_kv_heads, head_dim)``), then every row attends through its block table as
        ``plan`` says (:func:`~swkv_teach.attention.paged_plan`, made once per forward by
        :meth:`Decoder.step_paged`): :func:`~swkv_teach.attention.paged_attention` in two halves.
        """
        B, T, _ = x.shape
        q, k, v = self.attn.qkv(self.attn_norm(x), None, rope)  # q (B, nh, T, hd); k, v (B, nkv, T, hd)
        write_to_blocks(k_cache, v_cache, slots, k, v)
        y = attend_paged(q.transpose(1, 2), k_cache, v_cache, plan)
        x = x + self.attn.o_proj(y.reshape(B, T, -1))  # y (B, T, nh, hd)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """Token embedding, ``n_layers`` blocks, final norm, output head (tied or not)."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        # GPT-2's trick: shrink the projections that add into the residual stream, one pair per layer
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # ------------------------------------------------------------------ checks
    def _check_ids(self, name: str, ids) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
            got = f"shape {tuple(ids.shape)} dtype {ids.dtype}" if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise ValueError(f"{name} must be a 2-D long tensor (batch, tokens); got {got}")
        if ids.shape[1] < 1:
            raise ValueError(f"{name} must hold at least one token; got shape {tuple(ids.shape)}")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.config.vocab_size:
            raise ValueError(f"{name} must hold token ids in [0, {self.config.vocab_size}); got values in [{lo}, {hi}]")
        return ids

    @staticmethod
    def _check_kind(kind) -> str:
        if kind not in CACHE_KINDS:
            raise ValueError(f"cache must be one of {CACHE_KINDS}; got {kind!r}")
        return kind

    # ------------------------------------------------------------------ oracle
    def forward(self, input_ids: torch.Tensor, num_sinks: int = 0, window_size: int | None = None) -> torch.Tensor:
        """The oracle: logits ``(B, T, vocab)`` for the whole sequence, sliding-window mask, no cache.

        ``num_sinks``/``window_size`` change the mask only (same weights), so
        a sinks cache or a different window has an oracle too.
        """
        B, T = input_ids.shape
        check_nonnegative_int("num_sinks", num_sinks)
        positions = torch.arange(T, device=input_ids.device)  # (T,)
        x = self.embed(input_ids)  # (B, T, dim)
        rope = rotary(positions, self.config.head_dim, self.config.rope_theta, x.dtype)  # once, for every layer
        for layer in self.layers:
            x = layer(x, positions, None, num_sinks, window_size, rope)
        return self.lm_head(self.norm(x))  # (B, T, vocab)

    # ------------------------------------------------------------------ with caches
    def new_caches(self, kind: str = "ring", num_sinks: int = 4, window_size: int | None = None) -> LayerCaches:
        """Fresh caches, one per layer, of ``kind`` (see :data:`~swkv_teach.caches.CACHE_KINDS`).

        ``window_size`` defaults to the config's; ``num_sinks`` is used by ``"sinks"`` only.
        """
        self._check_kind(kind)
        W = self.config.window_size if window_size is None else check_positive_int("window_size", window_size)
        S = check_positive_int("num_sinks", num_sinks) if kind == "sinks" else 0
        return LayerCaches([make_cache(kind, W, num_sinks) for _ in self.layers], W, S)

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, caches: list[KVCache]) -> torch.Tensor:
        """Feed ``c`` new tokens ``(B, c)`` through ``caches``; logits ``(B, c, vocab)``.

        Inference only (no autograd graph): a KV cache holds values, and a graph
        threaded through it would keep every past step alive.

        Their positions start at ``caches[0].seen`` (every layer has seen the
        same tokens). ``caches`` from :meth:`new_caches` carry their window and
        sinks; a plain list gets the config's window and no sinks.
        """
        if len(caches) != len(self.layers):
            raise ValueError(f"caches must hold one cache per layer ({len(self.layers)}); got {len(caches)}")
        W = getattr(caches, "window_size", self.config.window_size)
        S = getattr(caches, "num_sinks", 0)
        B, c = input_ids.shape
        start = caches[0].seen
        positions = torch.arange(start, start + c, device=input_ids.device)  # (c,) absolute
        x = self.embed(input_ids)  # (B, c, dim)
        rope = rotary(positions, self.config.head_dim, self.config.rope_theta, x.dtype)  # once, for every layer
        for layer, cache in zip(self.layers, caches):
            x = layer(x, positions, cache, S, W, rope)
        return self.lm_head(self.norm(x))  # (B, c, vocab)

    @torch.no_grad()
    def step_paged(
        self,
        input_ids: torch.Tensor,
        start: torch.Tensor,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        block_table: torch.Tensor,
        window_size: int | None = None,
    ) -> torch.Tensor:
        """One forward over ``B`` sequences, each at its own position, their keys in blocks of one pool.

        The batched step of continuous batching (:mod:`swkv_teach.serving`): row ``b``'s ``c``
        new tokens sit at positions ``start[b] .. start[b] + c - 1`` (their RoPE angles per row),
        their keys and values are written into the pool through ``block_table``, and every query
        attends as :func:`~swkv_teach.attention.paged_attention` does (``cache_seqlens = start + c``),
        its plan (slots and mask) made once for all layers.

        Args:
            input_ids: ``(B, c)`` long, the new tokens of each row (``c = 1`` when decoding).
            start: ``(B,)`` integers, tokens each row has already written (its next position).
            kv: one ``(k_cache, v_cache)`` per layer, each ``(num_blocks, block_size, n_kv_heads,
                head_dim)`` in the model's dtype; the new tokens are written into them.
            block_table: ``(B, max_blocks)`` integers: row ``b``'s logical block ``i`` lives in pool
                block ``block_table[b, i]``; the blocks of the new positions must be valid, blocks
                outside every window may be -1.
            window_size: ``W`` (default the config's).
        Returns:
            logits ``(B, c, vocab)``.
        """
        self._check_ids("input_ids", input_ids)
        if len(kv) != len(self.layers):
            raise ValueError(f"kv must hold one (k_cache, v_cache) per layer ({len(self.layers)}); got {len(kv)}")
        W = self.config.window_size if window_size is None else check_positive_int("window_size", window_size)
        B, c = input_ids.shape
        device = input_ids.device
        start = torch.as_tensor(start, device=device).long()
        if start.shape != (B,) or bool((start < 0).any()):
            raise ValueError(f"start must be (batch,) = ({B},) non-negative positions; got {start.tolist()}")
        table = torch.as_tensor(block_table, device=device).long()
        positions = start[:, None] + torch.arange(c, device=device)  # (B, c) absolute, per row
        block_size = kv[0][0].shape[1]
        blocks = table.gather(1, positions // block_size)  # (B, c): where the new tokens' keys go
        if bool((blocks < 0).any()):
            raise ValueError("block_table must give a block for every new token's position; got -1 there")
        slots = blocks * block_size + positions % block_size  # (B, c) flat pool slots
        x = self.embed(input_ids)  # (B, c, dim)
        cos, sin = rotary(positions.flatten(), self.config.head_dim, self.config.rope_theta, x.dtype)  # (B*c, hd)
        rope = (cos.view(B, 1, c, -1), sin.view(B, 1, c, -1))  # per-row angles, broadcast over heads
        # where every row's keys lie and which queries see them: checked and computed once, for every layer
        plan = paged_plan(start + c, table, c, block_size, kv[0][0].shape[0], W)
        for layer, (k_cache, v_cache) in zip(self.layers, kv):
            x = layer.forward_paged(x, rope, k_cache, v_cache, slots, plan)
        return self.lm_head(self.norm(x))  # (B, c, vocab)

    def compiled_ring(self, batch: int = 1, mode: str = "default") -> "CompiledRing":
        """The :class:`CompiledRing` for ``batch`` rows and ``mode``, made on first use and kept.

        ``mode``: torch.compile's (``"default"``, ``"reduce-overhead"``, ...) or ``"aot"`` (the step
        exported and compiled ahead of time by AOTInductor: :class:`~swkv_teach.ahead_of_time.AheadOfTime`).

        Kept per (batch, mode, dtype, device) so every later sequence reuses its buffers and its graph:
        no recompilation per call. Moving or casting the model afterwards makes a new one.
        """
        check_positive_int("batch", batch)
        from torch._inductor import list_mode_options  # imported here: inductor is heavy and only compiling needs it

        modes = ["aot", *list_mode_options()]  # torch.compile's modes, as the torch installed names them
        if not isinstance(mode, str) or mode not in modes:
            raise ValueError(f"mode must be a torch.compile mode string or 'aot' (one of {modes}); got {mode!r}")
        p = next(self.parameters())
        key = (batch, mode, p.dtype, p.device)
        rings = self.__dict__.setdefault("_compiled_rings", {})  # not a submodule, not in state_dict
        if rings.get(key) is None:
            from swkv_teach.compiled_ring import CompiledRing  # it builds on this module's layers

            rings[key] = CompiledRing(self, batch, mode)
        return rings[key]

    @torch.no_grad()
    def score(
        self,
        input_ids: torch.Tensor,
        cache: str = "ring",
        chunk_size: int = 1,
        num_sinks: int = 4,
        window_size: int | None = None,
    ) -> torch.Tensor:
        """Logits ``(B, T, vocab)`` of ``input_ids`` ``(B, T)`` computed through fresh caches, ``chunk_size`` tokens a step.

        With ``"ring"`` or ``"naive"`` this equals ``forward(input_ids)``; with
        ``"sinks"`` it equals ``forward(input_ids, num_sinks=num_sinks)``.
        """
        self._check_ids("input_ids", input_ids)
        check_positive_int("chunk_size", chunk_size)
        caches = self.new_caches(cache, num_sinks, window_size)
        T = input_ids.shape[1]
        chunks = [self.step(input_ids[:, s : s + chunk_size], caches) for s in range(0, T, chunk_size)]
        return torch.cat(chunks, dim=1)

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        cache: str = "ring",
        temperature: float = 0.0,
        top_k: int | None = None,
        seed: int | None = None,
        num_sinks: int = 4,
        compile: bool | str = False,
        speculative=None,
    ) -> torch.Tensor:
        """Continue ``prompt_ids`` ``(B, Tp)`` by ``max_new_tokens``; returns ``(B, Tp + max_new_tokens)``.

        The prompt goes through the caches as one chunk, then one token per
        step. ``temperature=0`` is greedy (argmax); otherwise sample from
        ``softmax(logits / temperature)``, restricted to the ``top_k`` most
        likely tokens when given, with ``torch.Generator`` seeded by ``seed``.

        ``compile``: with ``cache="ring"``, run the one-token steps through
        :meth:`compiled_ring` (``True`` = torch.compile's default mode, or a mode
        string such as ``"reduce-overhead"`` for CUDA graphs, or ``"aot"``: compiled
        ahead of time by AOTInductor); the prompt stays eager.
        The first call compiles (seconds); later calls of the same batch size reuse the graph.

        ``speculative``: a drafter (:class:`~swkv_teach.speculative.PromptLookup`,
        :func:`~swkv_teach.speculative.early_exit`, :class:`~swkv_teach.speculative.DraftModel`), batch 1,
        ``cache="ring"``: each step drafts ``k`` tokens, verifies them in one forward over rings with
        ``k`` lookahead slots and rolls back the rejected ones (:mod:`swkv_teach.speculative`). Greedy,
        the same tokens; sampled, the same distribution.
        """
        self._check_ids("prompt_ids", prompt_ids)
        check_nonnegative_int("max_new_tokens", max_new_tokens)
        self._check_kind(cache)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"temperature must be a number >= 0 (0 = greedy); got {temperature!r}")
        if top_k is not None:
            check_positive_int("top_k", top_k)
        generator = None
        if seed is not None:
            generator = torch.Generator(device=prompt_ids.device).manual_seed(check_nonnegative_int("seed", seed))
        if speculative is not None:
            if cache != "ring" or compile is not False:
                raise ValueError(f"speculative decoding runs on cache='ring' (it rolls back), not compiled; "
                                 f"got cache={cache!r}, compile={compile!r}")
            if not callable(getattr(speculative, "generate", None)):  # a swkv_teach.speculative.Drafter
                raise ValueError(f"speculative must be a drafter (PromptLookup(k), early_exit(model, layers, k), "
                                 f"DraftModel(model, k), or a Drafter of your own); got {type(speculative).__name__}")
            return speculative.generate(self, prompt_ids, max_new_tokens, temperature, top_k, generator)

        if compile is not False:
            if compile is not True and not isinstance(compile, str):
                raise ValueError(f"compile must be False, True, a torch.compile mode string or 'aot'; got {compile!r}")
            if cache != "ring":
                raise ValueError(f"compile needs cache='ring' (the one cache with a fixed-shape step); got {cache!r}")
            ring = self.compiled_ring(prompt_ids.shape[0], "default" if compile is True else compile)
            caches, step = ring.new_caches(), ring.step
        else:
            caches, step = self.new_caches(cache, num_sinks), self.step
        out = [prompt_ids]
        logits = self.step(prompt_ids, caches)[:, -1]  # (B, vocab); the prompt is one eager chunk either way
        for i in range(max_new_tokens):
            next_id = self._pick(logits, temperature, top_k, generator)  # (B, 1)
            out.append(next_id)
            if i + 1 < max_new_tokens:
                logits = step(next_id, caches)[:, -1]
        return torch.cat(out, dim=1)

    @staticmethod
    def _pick(logits: torch.Tensor, temperature: float, top_k: int | None, generator) -> torch.Tensor:
        """Next token ``(B, 1)`` from last-position logits ``(B, vocab)``."""
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        logits = logits.float() / temperature
        if top_k is not None and top_k < logits.shape[-1]:
            kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
