"""Measuring eviction policies honestly: held-out segments, equal memory, 95 % intervals, attention sinks.

Lesson 8's measurements, as functions a notebook calls and a test can check:

* :func:`heldout_segments`: the held-out standard-library files (``train.HELDOUT_FILES``,
  never trained on) cut into independent, non-overlapping segments, the unit of resampling.
* :func:`policy_losses`: each segment's mean next-character loss (nats/char) under one
  policy at ``budget`` stored tokens per layer. Window and sinks are one batched
  ``Decoder.forward`` with their mask (their cached scoring equals it); LRU, H2O and
  TOVA go through :func:`swkv_teach.rowwise.rowwise_losses`, every segment evicting
  by its own attention.
* :func:`interval` and :func:`paired_difference`: percentile bootstrap over segments.
  Two policies are scored on the *same* segments, so the question "is B better than
  A" is answered by the interval of the per-segment differences, which is much
  narrower than two overlapping intervals suggest (segments differ far more from
  each other than policies do on one segment).
* :func:`ratio_interval`: a rate counted over independent units (drafts accepted per drafts
  examined, over prompts; lesson 13), the units resampled whole.
* :func:`attention_maps` and :func:`sink_shares`: how much attention each layer and
  head puts on the first token(s) (StreamingLLM's "attention sinks", Xiao et al. 2023, §3.1).
* :func:`streaming_losses`: StreamingLLM's experiment (§3.1, Fig. 3; §4): per-position loss
  of dense attention, a window of ``budget`` and sinks + window as a text runs past the
  budget and past the training context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from swkv_teach._validate import check_positive_int
from swkv_teach.masks import window_mask
from swkv_teach.model import Decoder, rotary
from swkv_teach.rowwise import rowwise_losses
from swkv_teach.train import HELDOUT_FILES, read_stdlib

__all__ = [
    "POLICIES",
    "Interval",
    "attention_maps",
    "compare",
    "heldout_segments",
    "interval",
    "paired_difference",
    "policy_losses",
    "ratio_interval",
    "sink_shares",
    "sinks_in_cache_positions",
    "streaming_losses",
]

POLICIES = ("window", "sinks + window", "LRU, read by attention", "H2O", "TOVA")
NO_WINDOW = 1 << 30  # a mask window wider than any text: causal attention only


def heldout_segments(tokenizer, length: int = 256, text: str | None = None, max_segments: int | None = None) -> torch.Tensor:
    """``(n, length + 1)`` token ids: consecutive, non-overlapping pieces of the held-out text.

    Row ``r`` is ``text[r * (length + 1) : (r + 1) * (length + 1)]``: its first ``length``
    characters are inputs, its last ``length`` the targets, and no character is in two
    rows, so the rows are independent samples for the bootstrap. The tail too short
    for a row is dropped. ``text`` defaults to ``train.HELDOUT_FILES`` read from this
    interpreter's standard library (21 031 characters on CPython 3.11).
    """
    check_positive_int("length", length)
    if text is None:
        text, _ = read_stdlib(HELDOUT_FILES)
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    n = len(ids) // (length + 1)
    if max_segments is not None:
        n = min(n, check_positive_int("max_segments", max_segments))
    if n < 2:
        raise ValueError(f"text must hold at least two segments of length + 1 = {length + 1} tokens; got {len(ids)}")
    return ids[: n * (length + 1)].view(n, length + 1)


def _losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none").view(targets.shape)


@torch.no_grad()
def position_losses(model: Decoder, segments: torch.Tensor, policy: str, budget: int, recent: int | None = None,
                    num_sinks: int = 4) -> torch.Tensor:
    """Per-position losses ``(n, T)`` of ``segments`` ``(n, T + 1)`` under ``policy`` with ``budget`` stored tokens.

    ``policy`` is one of :data:`POLICIES`, or ``"dense"`` (no eviction, causal attention only).
    ``"sinks + window"`` spends ``num_sinks`` of the budget on sinks and the rest on the window;
    ``recent`` is H2O's recent window (default ``budget // 2``). LRU, H2O and TOVA keep the
    model's own mask window (``model.config.window_size``), as ``Decoder.step`` does.
    """
    check_positive_int("budget", budget)
    x, y = segments[:, :-1], segments[:, 1:]
    if policy == "dense":
        return _losses(model(x, window_size=NO_WINDOW), y)
    if policy == "window":
        return _losses(model(x, window_size=budget), y)
    if policy == "sinks + window":
        if budget <= num_sinks:
            raise ValueError(f"budget must exceed num_sinks={num_sinks} for sinks + window; got {budget}")
        return _losses(model(x, num_sinks=num_sinks, window_size=budget - num_sinks), y)
    kinds = {"LRU, read by attention": "lru", "H2O": "h2o", "TOVA": "tova"}
    if policy not in kinds:
        raise ValueError(f"policy must be one of {POLICIES + ('dense',)}; got {policy!r}")
    return rowwise_losses(model, segments, kinds[policy], budget, recent)


def policy_losses(model: Decoder, segments: torch.Tensor, policy: str, budget: int, recent: int | None = None,
                  num_sinks: int = 4) -> torch.Tensor:
    """Each segment's mean loss ``(n,)`` in nats/char: :func:`position_losses` averaged over positions."""
    return position_losses(model, segments, policy, budget, recent, num_sinks).mean(dim=1)


@dataclass(frozen=True)
class Interval:
    """A mean and its 95 % (or ``level``) bootstrap interval."""

    mean: float
    low: float
    high: float

    @property
    def excludes_zero(self) -> bool:
        """For a difference: whether the interval says which side is better."""
        return self.low > 0 or self.high < 0

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


def _percentile(statistic, n: int, point: float, level: float, n_boot: int, seed: int) -> Interval:
    """``point`` with the percentile interval of ``statistic(idx)`` over ``n_boot`` resamples of ``n`` units.

    ``idx`` ``(n_boot, n)``: unit indices drawn with replacement; ``statistic`` maps it to ``(n_boot,)``.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1); got {level}")
    check_positive_int("n_boot", n_boot)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (n_boot, n), generator=g)
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(statistic(idx), q).tolist()
    return Interval(point, lo, hi)


def _bootstrap(values: torch.Tensor, level: float, n_boot: int, seed: int) -> Interval:
    values = torch.as_tensor(values, dtype=torch.float64).flatten()
    if len(values) < 2:
        raise ValueError(f"values must hold at least two segments to resample; got {len(values)}")
    return _percentile(lambda idx: values[idx].mean(dim=1), len(values), float(values.mean()), level, n_boot, seed)


def interval(values, level: float = 0.95, n_boot: int = 2000, seed: int = 0) -> Interval:
    """Mean of per-segment ``values`` with a percentile-bootstrap interval (segments resampled with replacement)."""
    return _bootstrap(values, level, n_boot, seed)


def paired_difference(a, b, level: float = 0.95, n_boot: int = 2000, seed: int = 0) -> Interval:
    """Mean of ``a - b`` segment by segment, with its bootstrap interval: the same segments resampled for both.

    ``a`` and ``b`` must score the same segments in the same order. An interval that
    excludes 0 says ``b`` is lower (``mean > 0``) or higher than ``a``, at that level.
    """
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if a.shape != b.shape:
        raise ValueError(f"a and b must score the same segments; got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    return _bootstrap(a - b, level, n_boot, seed)


def ratio_interval(numerators, denominators, level: float = 0.95, n_boot: int = 2000, seed: int = 0) -> Interval:
    """``sum(numerators) / sum(denominators)`` with a percentile-bootstrap interval, units resampled whole.

    One entry per independent unit (a prompt): drafts accepted and drafts examined, or plain and
    speculative seconds. Events inside one unit are not independent (drafts are accepted in runs, a
    slow second slows every step in it), so the unit is resampled, never the event: a binomial
    interval over all drafts would be narrower than the data allow. Example: ``[1, 3] / [2, 2]`` is
    1.0, and its resamples are 0.5, 1.0 or 1.5.
    """
    num = torch.as_tensor(numerators, dtype=torch.float64).flatten()
    den = torch.as_tensor(denominators, dtype=torch.float64).flatten()
    if num.shape != den.shape:
        raise ValueError(f"numerators and denominators must count the same units; got {len(num)} and {len(den)}")
    if len(num) < 2:
        raise ValueError(f"ratio_interval needs at least two units to resample; got {len(num)}")
    if not bool((den > 0).all()):
        raise ValueError(f"every denominator must be > 0 (a unit with nothing counted); got {den.tolist()}")
    return _percentile(lambda idx: num[idx].sum(dim=1) / den[idx].sum(dim=1), len(num), float(num.sum() / den.sum()),
                       level, n_boot, seed)


def compare(model: Decoder, segments: torch.Tensor, budgets, policies=POLICIES, recent_fraction: float = 0.5) -> dict:
    """``{policy: {budget: per-segment losses (n,)}}`` at equal memory; H2O's recent window is ``recent_fraction`` of it."""
    out = {}
    for name in policies:
        out[name] = {}
        for B in budgets:
            recent = int(B * recent_fraction) if name == "H2O" else None
            out[name][B] = policy_losses(model, segments, name, B, recent)
    return out


@torch.no_grad()
def attention_maps(model: Decoder, ids: torch.Tensor, window_size: int | None = None) -> list[torch.Tensor]:
    """The oracle pass of ``ids`` ``(B, T)`` with every layer's attention probabilities: ``(B, n_heads, T, T)`` each.

    The same computation as ``Decoder.forward`` (the blocks' own ``qkv``, ``attend_with_weights``
    and MLP), the softmax spelled out; ``window_size`` as in ``forward``.
    """
    T = ids.shape[1]
    positions = torch.arange(T, device=ids.device)
    x = model.embed(ids)
    rope = rotary(positions, model.config.head_dim, model.config.rope_theta, x.dtype)
    W = model.config.window_size if window_size is None else window_size
    maps = []
    for layer in model.layers:
        q, k, v = layer.attn.qkv(layer.attn_norm(x), positions, rope)
        y, weights = layer.attn.attend_with_weights(q, k, v, positions, positions, 0, W)
        maps.append(weights)
        x = x + y
        x = x + layer.mlp(layer.mlp_norm(x))
    return maps


def sink_shares(model: Decoder, ids: torch.Tensor, first: int = 1, queries: slice = slice(16, None),
                window_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Share of attention on the first ``first`` positions, per layer and head: ``(layers, heads)``, and chance's share.

    Averaged over the rows of ``ids`` and the query positions in ``queries`` (default 16
    onwards: the first queries have few keys to choose from, so any head looks like a
    sink there). The second tensor ``(layers,)`` is what uniform attention over each
    query's visible keys would give on average, the share with no sink at all.
    """
    check_positive_int("first", first)
    T = ids.shape[1]
    q_pos = torch.arange(T)[queries]
    if len(q_pos) == 0:
        raise ValueError(f"queries must select some of the {T} positions; got {queries}")
    W = model.config.window_size if window_size is None else window_size
    shares = torch.stack([w[:, :, q_pos, :first].sum(-1).float().mean(dim=(0, 2)) for w in attention_maps(model, ids, W)])
    visible = torch.clamp(q_pos + 1, max=W).double()  # keys i - W < j <= i
    oldest = torch.clamp(q_pos - W + 1, min=0)
    sees_first = torch.clamp(torch.clamp(q_pos + 1, max=first) - oldest, min=0).double()  # of the keys j < first
    chance = float((sees_first / visible).mean())
    return shares, torch.full((len(model.layers),), chance)


@torch.no_grad()
def sinks_in_cache_positions(model: Decoder, segments: torch.Tensor, budget: int, num_sinks: int = 4) -> torch.Tensor:
    """Per-position losses ``(n, T)`` of sinks + window with StreamingLLM's positions *within the cache* (§3.2).

    StreamingLLM caches keys before RoPE and rotates them by their slot in the cache, so
    once the cache is full the newest query sits at ``budget - 1`` and sink ``s`` at ``s``:
    a sink is always ``budget - 1 - s`` away, never further than the model was trained on.
    The library's :class:`~swkv_teach.caches.SinkKVCache` keeps true positions instead
    (a sink ``i - s`` away). Window keys are at the same distance either way (RoPE sees
    only differences), so only the sink scores change: here they are computed with the
    query rotated to ``min(i, budget - 1)`` and the sink keys to their own positions.
    """
    if budget <= num_sinks:
        raise ValueError(f"budget must exceed num_sinks={num_sinks}; got {budget}")
    x_ids, targets = segments[:, :-1], segments[:, 1:]
    T, c = x_ids.shape[1], model.config
    pos = torch.arange(T)
    in_cache = torch.clamp(pos, max=budget - 1)  # the newest query's slot in a StreamingLLM cache
    rope_true = rotary(pos, c.head_dim, c.rope_theta, torch.float32)
    rope_cache = rotary(in_cache, c.head_dim, c.rope_theta, torch.float32)
    window = window_mask(pos, pos, budget - num_sinks)  # (T, T) recent keys
    sink = (pos[None, :] < num_sinks) & (pos[None, :] <= pos[:, None]) & ~window  # sinks not already in the window
    group = c.n_heads // c.n_kv_heads
    x = model.embed(x_ids)
    for layer in model.layers:
        h = layer.attn_norm(x)
        q, k, v = layer.attn.qkv(h, pos, rope_true)
        q_c, k_c, _ = layer.attn.qkv(h, in_cache, rope_cache)  # sink keys: in_cache == pos for s < num_sinks
        k, k_c, v = (t.repeat_interleave(group, dim=1) for t in (k, k_c, v))
        scores = torch.where(sink, q_c @ k_c.transpose(-2, -1), q @ k.transpose(-2, -1)) / c.head_dim**0.5
        w = torch.softmax(scores.masked_fill(~(window | sink), float("-inf")), dim=-1)
        y = (w @ v).transpose(1, 2).reshape(x.shape[0], T, -1)
        x = x + layer.attn.o_proj(y)
        x = x + layer.mlp(layer.mlp_norm(x))
    return _losses(model.lm_head(model.norm(x)), targets)


def streaming_losses(model: Decoder, segments: torch.Tensor, budget: int, num_sinks: int = 4) -> dict:
    """StreamingLLM's comparison: per-position losses ``(n, T)`` under four ways to read a long text.

    ``"dense"`` (every key, causal only), ``"window"`` (the last ``budget``), ``"sinks + window"``
    (the first ``num_sinks`` plus the last ``budget - num_sinks``, true positions, as
    :class:`~swkv_teach.caches.SinkKVCache`) and ``"sinks + window, cache positions"``
    (the same keys at StreamingLLM's positions within the cache, :func:`sinks_in_cache_positions`).
    """
    out = {name: position_losses(model, segments, name, budget, num_sinks=num_sinks)
           for name in ("dense", "window", "sinks + window")}
    out["sinks + window, cache positions"] = sinks_in_cache_positions(model, segments, budget, num_sinks)
    return out
