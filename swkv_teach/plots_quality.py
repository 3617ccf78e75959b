"""Pictures of measured quality: held-out loss per eviction policy and budget, and loss by position (lesson 8).

The numbers come from :mod:`swkv_teach.evaluate` (intervals over segments, per-position losses);
each policy keeps one colour (:data:`POLICY_COLORS`) across the lesson's figures.

Each function draws on ``ax`` when given one and otherwise makes its own Figure (without
pyplot, as :mod:`swkv_teach.plots` does); :mod:`swkv_teach.plots` re-exports these names, so
``from swkv_teach.plots import POLICY_COLORS, plot_intervals, plot_position_losses`` keeps working.
"""

from __future__ import annotations

import torch
from matplotlib.figure import Figure

from swkv_teach._figure import figure_and_axes as _figure_and_axes

__all__ = ["POLICY_COLORS", "plot_intervals", "plot_position_losses"]

POLICY_COLORS = {"window": "#4C72B0", "sinks + window": "#DD8452", "LRU, read by attention": "#8172B3",
                 "H2O": "#55A868", "TOVA": "#C44E52", "dense": "#555555",
                 "sinks + window, cache positions": "#937860"}


def plot_intervals(table, title: str = "", ax=None, ylabel: str = "held-out loss (nats/char, lower is better)") -> Figure:
    """Means with 95 % intervals: ``table`` is ``{policy: {budget: interval}}``, any interval with ``mean``, ``low``, ``high``.

    One line per policy over the budgets (log-2 axis), each point with its interval as an
    error bar, policies nudged sideways so the bars do not hide each other.
    """
    fig, ax = _figure_and_axes(ax, (7.5, 4.2))
    names = list(table)
    for k, name in enumerate(names):
        budgets = sorted(table[name])
        shift = 2 ** ((k - (len(names) - 1) / 2) * 0.04)  # a few percent along the log axis
        xs = [b * shift for b in budgets]
        iv = [table[name][b] for b in budgets]
        bars = ax.errorbar(xs, [i.mean for i in iv], yerr=[[i.mean - i.low for i in iv], [i.high - i.mean for i in iv]],
                           marker="o", ms=4, capsize=3, lw=1.4, color=POLICY_COLORS.get(name), label=name)
        bars.lines[0].set_gid(f"policy-{name}")  # the line through the means (not the caps)
    all_budgets = sorted({b for row in table.values() for b in row})
    ax.set_xscale("log", base=2)
    ax.set_xticks(all_budgets, [str(b) for b in all_budgets])
    ax.set(xlabel="stored tokens per layer (B)", ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="upper right")
    return fig


def plot_position_losses(curves, bin_size: int = 32, title: str = "", ax=None, marks=()) -> Figure:
    """Mean loss by position: ``curves`` is ``{name: (segments, T) losses}``; averaged over segments and bins of ``bin_size``.

    ``marks``: positions to draw as dashed vertical lines (the budget, the training context).
    """
    fig, ax = _figure_and_axes(ax, (8.0, 4.0))
    for name, losses in curves.items():
        losses = torch.as_tensor(losses, dtype=torch.float64)
        T = losses.shape[1] // bin_size * bin_size
        binned = losses[:, :T].reshape(losses.shape[0], -1, bin_size).mean(dim=(0, 2))
        centres = torch.arange(binned.shape[0]) * bin_size + bin_size / 2
        ax.plot(centres.tolist(), binned.tolist(), marker=".", lw=1.4, color=POLICY_COLORS.get(name), label=name,
                gid=f"curve-{name}")
    for x in marks:
        ax.axvline(x, color="#888888", ls="--", lw=1)
    ax.set(xlabel="position in the text", ylabel="loss (nats/char)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    return fig
