"""Pictures of a KV cache: pure functions from a :class:`~swkv_teach.trace.Trace` to a matplotlib Figure.

Each function draws on ``ax`` when given one (so the widgets can compose a
panel) and otherwise makes its own :class:`matplotlib.figure.Figure`. Figures
are built without pyplot, so nothing accumulates in ``plt.get_fignums()`` and
the inline backend never shows one twice; display them with ``display(fig)``
or as a cell's last expression.

What the pictures mark comes from :func:`swkv_teach.trace.record`, which reads
a real cache's tensors after every step; the attention band comes from
:func:`swkv_teach.masks.window_mask` (window convention: :mod:`swkv_teach.masks`).
Tests find the drawn pieces by ``gid`` (``"token-5"``, ``"slot-2"``, ...).

Measured loss per policy is drawn by :mod:`swkv_teach.plots_quality`, serving by
:mod:`swkv_teach.plots_serving`; their names are importable from here too.
"""

from __future__ import annotations

import torch
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from swkv_teach._figure import DPI
from swkv_teach._figure import figure_and_axes as _figure_and_axes
from swkv_teach.masks import window_mask
# lessons 7 and 8 import these from here: the loss and serving pictures live in their own modules
from swkv_teach.plots_quality import POLICY_COLORS, plot_intervals, plot_position_losses
from swkv_teach.plots_serving import plot_pool_occupancy, plot_throughput
from swkv_teach.trace import Trace, memory_over_steps

__all__ = [
    "POLICY_COLORS",
    "STATE_COLORS",
    "STATE_LABELS",
    "plot_attention_band",
    "plot_comparison",
    "plot_intervals",
    "plot_memory",
    "plot_pool_occupancy",
    "plot_position_losses",
    "plot_scored_step",
    "plot_scores",
    "plot_slots",
    "plot_step",
    "plot_throughput",
    "plot_timeline",
    "plot_token_stream",
]

# colour-blind-safe: blue = held, orange = pinned sink, grey = gone, white = future
STATE_COLORS = {"cached": "#4C72B0", "sink": "#DD8452", "evicted": "#BDBDBD", "unseen": "#FFFFFF"}
STATE_LABELS = {"cached": "in cache", "sink": "sink (pinned)", "evicted": "evicted", "unseen": "not yet seen"}
READ_COLOR = "#2CA02C"
ALERT_COLOR = "#D62728"


def _legend_below(ax, handles, ncol: int = 6) -> None:
    # a (sub)figure legend under the axes: constrained layout makes room for it, whatever the axes' height
    ax.figure.legend(handles=handles, loc="outside lower center", ncol=min(ncol, len(handles)), fontsize=10,
                     frameon=False)


def _check_step(trace: Trace, step) -> int:
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be a swkv_teach.trace.Trace (from record()); got {type(trace).__name__}")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < trace.steps:
        raise ValueError(f"step must be an int in [0, {trace.steps - 1}]; got {step!r}")
    return step


def _states_present(trace: Trace) -> list[str]:
    return ["sink", "cached", "evicted", "unseen"] if trace.num_sinks else ["cached", "evicted", "unseen"]


def plot_token_stream(trace: Trace, step: int, ax=None) -> Figure:
    """The token stream at ``step``: each position coloured in cache / sink / evicted / not yet seen.

    The token that just arrived has a thick outline; for LRU, tokens read (and
    so promoted) at this step carry a green triangle.
    """
    step = _check_step(trace, step)
    fig, ax = _figure_and_axes(ax, (max(6.0, 0.36 * trace.steps), 1.9))
    snap = trace[step]
    for p in range(trace.steps):
        state = snap.state_of(p)
        ax.add_patch(
            Rectangle(
                (p - 0.45, -0.45), 0.9, 0.9, facecolor=STATE_COLORS[state], gid=f"token-{p}",
                edgecolor="black" if p == step else "#888888", linewidth=2.5 if p == step else 0.8,
            )
        )
        ax.text(p, 0, str(p), ha="center", va="center", fontsize=10,
                color="white" if state in ("cached", "sink") else "#333333")
        if trace.tokens is not None:  # the token's text under its cell (record_attention)
            ax.text(p, -0.72, _shown(trace.tokens[p]), ha="center", va="center", fontsize=9, family="monospace",
                    color="#333333")
    for p in snap.hits:
        ax.plot(p, -0.75, marker="^", color=READ_COLOR, markersize=7, gid=f"read-{p}")
    handles = [Patch(facecolor=STATE_COLORS[s], edgecolor="#888888", label=STATE_LABELS[s]) for s in _states_present(trace)]
    handles.append(Patch(facecolor="white", edgecolor="black", linewidth=2.5, label=f"token {step} (new)"))
    if trace.policy == "lru" and any(trace.reads):
        handles.append(Line2D([], [], marker="^", color=READ_COLOR, linestyle="", label="read now (promoted)"))
    _legend_below(ax, handles)
    ax.set_xlim(-0.6, trace.steps - 0.4)
    ax.set_ylim(-1.0, 0.6)
    ax.set_yticks([])
    ax.set_xticks([])  # the number is in each cell
    ax.set_xlabel("token position")
    ax.set_aspect("equal")
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"{trace.label}, step {step}: token {step} arrives; {len(snap.cached)} tokens cached", fontsize=10)
    return fig


def plot_slots(trace: Trace, step: int, ax=None) -> Figure:
    """The cache's storage at ``step``: each slot with the token it holds, its age and the write pointer.

    ``ring``/``sinks``: slot ``s`` of the ring buffer (sinks pinned in front),
    and an arrow at the slot the next token will overwrite. ``sliding``: the
    tensor's index (index 0 is sliced off next). ``lru``: recency order, least
    recently used (next to go) first. Age = ``step - position``.
    """
    step = _check_step(trace, step)
    snap = trace[step]
    slots = snap.slots if snap.slots is not None else snap.held + (None,) * (trace.window_size - len(snap.held))
    fig, ax = _figure_and_axes(ax, (max(4.5, 1.0 * len(slots)), 2.3))
    for s, p in enumerate(slots):
        state = "unseen" if p is None else ("sink" if p in snap.sinks else "cached")
        new = p == step
        ax.add_patch(
            Rectangle((s - 0.45, -0.45), 0.9, 0.9, facecolor=STATE_COLORS[state], gid=f"slot-{s}",
                      edgecolor="black" if new else "#888888", linewidth=2.5 if new else 0.8)
        )
        if p is not None:
            ax.text(s, 0.08, f"t{p}", ha="center", va="center", fontsize=11, color="white", weight="bold")
            ax.text(s, -0.25, f"age {step - p}", ha="center", va="center", fontsize=10, color="white")
    if snap.next_slot is not None:
        ax.annotate("next write", xy=(snap.next_slot, 0.5), xytext=(snap.next_slot, 1.05), ha="center",
                    fontsize=10, arrowprops=dict(arrowstyle="->", color=ALERT_COLOR, lw=1.5), color=ALERT_COLOR)
    elif len(snap.held) == len(slots) and trace.policy in ("sliding", "lru"):
        ax.annotate("evicted next", xy=(0, 0.5), xytext=(0, 1.05), ha="center", fontsize=10,
                    arrowprops=dict(arrowstyle="->", color=ALERT_COLOR, lw=1.5), color=ALERT_COLOR)
    what = {"ring": "ring slot", "sinks": "slot", "sliding": "tensor index", "lru": "recency rank (LRU first)"}
    ax.set_xticks(range(len(slots)))
    ax.set_xlabel(what[trace.policy])
    ax.set_xlim(-0.6, len(slots) - 0.4)
    ax.set_ylim(-0.6, 1.4)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    handles = [Patch(facecolor=STATE_COLORS["cached"], label="holds token (tN)")]
    if trace.num_sinks:
        handles.append(Patch(facecolor=STATE_COLORS["sink"], label="sink slot"))
    handles += [Patch(facecolor="white", edgecolor="#888888", label="empty"),
                Patch(facecolor="white", edgecolor="black", linewidth=2.5, label="just written")]
    _legend_below(ax, handles)
    ax.set_title(f"{trace.label}: storage after step {step}", fontsize=10)
    return fig


def plot_attention_band(trace: Trace, step: int, ax=None) -> Figure:
    """The (query, key) grid of the window mask, the current query's row outlined.

    Cells come from :func:`swkv_teach.masks.window_mask` (with the trace's
    sinks). Dots mark the keys the cache holds at ``step`` on that row; a red
    cross is a key the cache holds that the window forbids (LRU after reads).
    """
    step = _check_step(trace, step)
    T, S, W = trace.steps, trace.num_sinks, trace.window_size
    fig, ax = _figure_and_axes(ax, (4.8, 4.6))
    pos = torch.arange(T)
    band = window_mask(pos, pos, W)
    full = window_mask(pos, pos, W, S)
    grid = band.int() + 2 * (full & ~band).int()  # 0 masked, 1 in window, 2 sink only
    ax.imshow(grid.numpy(), cmap=ListedColormap(["#FFFFFF", "#9ECAE1", "#FDAE6B"]), vmin=0, vmax=2,
              interpolation="nearest", gid="mask")
    ax.add_patch(Rectangle((-0.5, step - 0.5), T, 1, fill=False, edgecolor="black", linewidth=2, gid="query-row"))
    snap = trace[step]
    ok = [j for j in snap.cached if bool(full[step, j])]
    bad = [j for j in snap.cached if not bool(full[step, j])]
    ax.plot(ok, [step] * len(ok), "o", color="#08306B", markersize=4, linestyle="", gid="held")
    ax.plot(bad, [step] * len(bad), "x", color=ALERT_COLOR, markersize=7, mew=2, linestyle="", gid="held-outside")
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    handles = [Patch(facecolor="#9ECAE1", label=f"may attend: i-{W} < j <= i")]
    if S:
        handles.append(Patch(facecolor="#FDAE6B", label=f"sink: j < {S}"))
    handles += [Patch(facecolor="white", edgecolor="#888888", label="masked"),
                Line2D([], [], marker="o", color="#08306B", linestyle="", label=f"held at step {step}")]
    if bad:
        handles.append(Line2D([], [], marker="x", color=ALERT_COLOR, mew=2, linestyle="", label="held, outside window"))
    ax.legend(handles=handles, loc="upper right", fontsize=10, framealpha=0.9)
    ax.set_title(f"window mask (W={W}{f', S={S}' if S else ''}), query {step} outlined", fontsize=10)
    return fig


def plot_step(trace: Trace, step: int) -> Figure:
    """The widget's panel: token stream on top, storage and attention band below."""
    step = _check_step(trace, step)
    fig = Figure(figsize=(max(8.0, 0.36 * trace.steps), 6.4), dpi=DPI, layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1, 2.6])
    plot_token_stream(trace, step, ax=top.add_subplot())
    left, right = bottom.subfigures(1, 2, width_ratios=[1.3, 1])  # one subfigure each: own legends
    plot_slots(trace, step, ax=left.add_subplot())
    plot_attention_band(trace, step, ax=right.add_subplot())
    return fig


def plot_timeline(trace: Trace, ax=None, differs=None) -> Figure:
    """Every step at once: row = step, column = token position, colour = that token's state then.

    ``differs`` (a set of ``(step, position)``) outlines cells where another
    policy disagrees; :func:`swkv_teach.widgets.compare_policies` fills it.
    """
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be a swkv_teach.trace.Trace (from record()); got {type(trace).__name__}")
    fig, ax = _figure_and_axes(ax, (5.0, 5.0))
    order = ["cached", "sink", "evicted", "unseen"]
    grid = [[order.index(trace[t].state_of(p)) for p in range(trace.steps)] for t in range(trace.steps)]
    ax.imshow(grid, cmap=ListedColormap([STATE_COLORS[s] for s in order]), vmin=0, vmax=3,
              interpolation="nearest", gid="timeline")
    for t, p in sorted(differs or ()):
        ax.add_patch(Rectangle((p - 0.5, t - 0.5), 1, 1, fill=False, edgecolor=ALERT_COLOR, linewidth=1.5))
    reads = [(p, t) for t in range(trace.steps) for p in trace[t].hits]
    if reads:
        ax.plot(*zip(*reads), "^", color=READ_COLOR, markersize=3, linestyle="")
    ax.set_xlabel("token position")
    ax.set_ylabel("step")
    handles = [Patch(facecolor=STATE_COLORS[s], edgecolor="#888888", label=STATE_LABELS[s]) for s in _states_present(trace)]
    if reads:
        handles.append(Line2D([], [], marker="^", color=READ_COLOR, linestyle="", label="read (promoted)"))
    if differs:
        handles.append(Patch(fill=False, edgecolor=ALERT_COLOR, label="policies differ"))
    _legend_below(ax, handles, ncol=3)
    ax.set_title(trace.label, fontsize=10)
    return fig


def plot_comparison(traces) -> Figure:
    """Timelines of the same token stream under several policies, side by side.

    Cells where a policy holds a different set of tokens than the first one
    are outlined in red: with no reads LRU matches the sliding window exactly.
    """
    traces = list(traces)
    if len(traces) < 2 or not all(isinstance(t, Trace) for t in traces):
        raise TypeError(f"traces must be at least two Trace objects; got {[type(t).__name__ for t in traces]}")
    if len({t.steps for t in traces}) != 1:
        raise ValueError(f"traces must cover the same stream; got steps {[t.steps for t in traces]}")
    first, steps = traces[0], traces[0].steps
    fig = Figure(figsize=(4.6 * len(traces), 5.4), dpi=DPI, layout="constrained")
    for sub, trace in zip(fig.subfigures(1, len(traces)), traces):
        differs = {(t, p) for t in range(steps) for p in range(t + 1)
                   if (p in first[t].cached) != (p in trace[t].cached)}
        plot_timeline(trace, ax=sub.add_subplot(), differs=differs)
    fig.suptitle(f"The same {steps}-token stream under {len(traces)} policies", fontsize=11)
    return fig


def _bytes_unit(nbytes: int) -> tuple[float, str]:
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if nbytes >= scale:
            return scale, unit
    return 1, "B"


def plot_memory(
    steps: int = 32768,
    window_size: int = 4096,
    num_layers: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    dtype: torch.dtype = torch.float16,
    ax=None,
) -> Figure:
    """KV memory held after each token: an unbounded cache grows, a sliding window goes flat at ``W``.

    Left axis in tokens, right axis in bytes for the given shape (default
    7B-class: 32 layers, 8 kv heads, head_dim 128, float16). The numbers come
    from :func:`swkv_teach.trace.memory_over_steps`.
    """
    mem = memory_over_steps(steps, window_size, num_layers, num_kv_heads, head_dim, dtype)
    fig, ax = _figure_and_axes(ax, (6.4, 3.6))
    x = mem["tokens_seen"]
    ax.plot(x, mem["unbounded_tokens"], color=ALERT_COLOR, lw=2, label="unbounded cache", gid="unbounded")
    ax.plot(x, mem["window_tokens"], color=STATE_COLORS["cached"], lw=2, label=f"sliding window, W={window_size}",
            gid="window")
    per_token = mem["bytes_per_token"]
    scale, unit = _bytes_unit(max(mem["unbounded_bytes"]))
    right = ax.secondary_yaxis("right", functions=(lambda t: t * per_token / scale, lambda b: b * scale / per_token))
    right.set_ylabel(f"memory ({unit})")
    ax.set_xlabel("tokens seen")
    ax.set_ylabel("tokens held")
    ax.set_xlim(0, steps)
    ax.set_ylim(0, steps * 1.05)
    flat_scale, flat_unit = _bytes_unit(mem["window_bytes"][-1])
    ax.annotate(f"flat from token {window_size}: {mem['window_bytes'][-1] / flat_scale:.0f} {flat_unit}",
                xy=(min(window_size, steps), min(window_size, steps)), xytext=(0.35, 0.22),
                textcoords="axes fraction", fontsize=10, arrowprops=dict(arrowstyle="->", color="#444444"))
    ax.legend(loc="upper left", fontsize=10)
    ax.grid(alpha=0.3)
    itemsize = torch.empty((), dtype=dtype).element_size()
    ax.set_title(f"KV memory: {num_layers} layers x {num_kv_heads} kv heads x {head_dim} dims, "
                 f"{str(dtype).replace('torch.', '')} ({per_token // 1024} KiB/token)"
                 if itemsize and per_token >= 1024 else f"KV memory ({per_token} B/token)", fontsize=10)
    return fig


def _shown(token: str) -> str:
    """A token's text as one readable cell label: whitespace made visible."""
    return {" ": "␣", "\n": "⏎", "\t": "⇥"}.get(token, token)


def plot_scores(trace: Trace, step: int, ax=None) -> Figure:
    """Why an attention-evicting cache keeps what it keeps: each stored token's score at ``step``.

    One bar per stored position (from :func:`swkv_teach.trace.record_attention`):
    H2O's accumulated attention or TOVA's newest-query weight. Hatched bars are
    H2O's protected recent tokens; the red bar is the one the next token evicts
    (lowest score outside the protected ones, ties to the oldest).
    """
    step = _check_step(trace, step)
    snap = trace[step]
    if snap.scores is None:
        raise ValueError(f"trace must come from record_attention (h2o or tova) to have scores; got policy {trace.policy!r}")
    fig, ax = _figure_and_axes(ax, (max(6.0, 0.5 * trace.window_size), 2.6))
    order = sorted((p, sc) for p, sc in zip(snap.slots, snap.scores) if p is not None)
    for x, (p, sc) in enumerate(order):
        color = ALERT_COLOR if p == snap.next_out else STATE_COLORS["cached"]
        ax.bar(x, sc, color=color, hatch="//" if p in snap.protected else None, edgecolor="white", gid=f"score-{p}")
    labels = [f"{p}\n{_shown(trace.tokens[p])}" if trace.tokens is not None else str(p) for p, _ in order]
    ax.set_xticks(range(len(order)), labels, fontsize=9)
    ax.set_xlim(-0.6, trace.window_size - 0.4)
    what = "accumulated attention (H2O)" if trace.policy == "h2o" else "newest query's attention (TOVA)"
    ax.set_ylabel("score", fontsize=10)
    ax.set_xlabel("stored token (position, text)", fontsize=10)
    handles = [Patch(facecolor=STATE_COLORS["cached"], label="stored"),
               Patch(facecolor=ALERT_COLOR, label="evicted by the next token")]
    if trace.policy == "h2o":
        handles.append(Patch(facecolor="white", edgecolor="#444444", hatch="//", label="recent: never evicted"))
    _legend_below(ax, handles)
    ax.set_title(f"{trace.label}, step {step}: score of each stored token = {what}", fontsize=10)
    return fig


def plot_scored_step(trace: Trace, window: Trace, step: int) -> Figure:
    """The explorer's panel for H2O/TOVA: the policy's token stream, the window's beside it, and the scores."""
    step = _check_step(trace, step)
    if not isinstance(window, Trace) or window.steps != trace.steps:
        raise ValueError(f"window must be a Trace of the same {trace.steps} steps; got {window!r:.60}")
    fig = Figure(figsize=(max(8.0, 0.36 * trace.steps), 7.0), dpi=DPI, layout="constrained")
    top, middle, bottom = fig.subfigures(3, 1, height_ratios=[1.1, 1, 1.5])
    plot_token_stream(trace, step, ax=top.add_subplot())
    window = Trace(window.policy, window.window_size, window.num_sinks, window.steps, window.reads,
                   window.snapshots, trace.tokens, None)  # the same text under the window's cells
    plot_token_stream(window, step, ax=middle.add_subplot())
    plot_scores(trace, step, ax=bottom.add_subplot())
    return fig
