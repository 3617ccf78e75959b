"""Pictures of serving: a shared block pool over a scheduler's steps, and throughput against the batch (lesson 7).

The numbers come from :class:`swkv_teach.serving.Scheduler` (its ``trace``) and
:func:`swkv_teach.bench.serving.serving_throughput`.

``plot_throughput`` draws on ``ax`` when given one; ``plot_pool_occupancy`` makes its own
two-panel Figure (both without pyplot, as :mod:`swkv_teach.plots`); :mod:`swkv_teach.plots`
re-exports these names, so
``from swkv_teach.plots import plot_pool_occupancy, plot_throughput`` keeps working.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from swkv_teach._figure import DPI
from swkv_teach._figure import figure_and_axes as _figure_and_axes

__all__ = ["plot_pool_occupancy", "plot_throughput"]


def plot_pool_occupancy(trace, num_blocks: int | None = None) -> Figure:
    """Blocks of a shared pool over the steps of a :class:`~swkv_teach.serving.Scheduler` run.

    ``trace`` is ``Scheduler.trace``: one dict per step with ``step``, ``used_blocks``,
    ``reserved_blocks``, ``running`` and ``waiting``. Top: blocks held and blocks promised at
    admission (and the pool's size, when ``num_blocks`` is given); below, on the same steps,
    requests running and waiting. Lines drawn as steps (a value holds until the next step);
    their gids are ``used``, ``reserved``, ``pool``, ``running``, ``waiting``.
    """
    if not trace:
        raise ValueError("trace is empty: run the scheduler (Scheduler.run or .step) before plotting its trace")
    fig = Figure(figsize=(9.0, 4.6), dpi=DPI, layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    steps = [t["step"] for t in trace]
    top.step(steps, [t["reserved_blocks"] for t in trace], where="post", color="#DD8452", ls="--", lw=1.4,
             label="blocks promised\n(each request's peak,\nreserved at admission)", gid="reserved")
    top.step(steps, [t["used_blocks"] for t in trace], where="post", color="#4C72B0", lw=1.8,
             label="blocks in use", gid="used")
    if num_blocks is not None:
        top.axhline(num_blocks, color="0.3", ls=":", lw=1.2, label=f"pool: {num_blocks} blocks", gid="pool")
    top.set(ylabel="blocks", title="Pool occupancy over the scheduler's steps")
    top.set_ylim(bottom=0)
    top.grid(alpha=0.3)
    top.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    bottom.step(steps, [t["running"] for t in trace], where="post", color="#55A868", lw=1.6,
                label="requests running", gid="running")
    bottom.step(steps, [t["waiting"] for t in trace], where="post", color="#8172B3", lw=1.4, ls="--",
                label="requests waiting", gid="waiting")
    bottom.set(xlabel="scheduler step (one decode forward over the running requests)", ylabel="requests")
    bottom.set_ylim(bottom=0)
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def plot_throughput(result, ax=None) -> Figure:
    """Tokens/s against the most requests per forward: :func:`swkv_teach.bench.serving.serving_throughput`'s result.

    One line through the medians (gid ``batched``) with min..max bars, each point labelled
    with its ratio to one by one; a dashed line at one by one's median (gid ``one-by-one``).
    """
    fig, ax = _figure_and_axes(ax, (6.8, 4.0))
    rows = result["rows"]
    cs = [r["concurrency"] for r in rows]
    med = [r["tokens_per_s"]["median"] for r in rows]
    low = [r["tokens_per_s"]["median"] - r["tokens_per_s"]["min"] for r in rows]
    high = [r["tokens_per_s"]["max"] - r["tokens_per_s"]["median"] for r in rows]
    bars = ax.errorbar(cs, med, yerr=[low, high], marker="o", capsize=3, lw=1.8, color="#4C72B0",
                       label="continuous batching (one forward per step)")
    bars.lines[0].set_gid("batched")
    for c, m, r in zip(cs, med, rows):
        ax.annotate(f"×{r['ratio_to_one_by_one']:.1f}", (c, m), textcoords="offset points", xytext=(6, -14),
                    ha="left", fontsize=9)  # below right of its point: under a rising line, clear of the others
    base = result["one_by_one"]["tokens_per_s"]["median"]
    ax.axhline(base, color="0.4", ls="--", lw=1.2, label="one by one (generate, batch 1)", gid="one-by-one")
    ax.set_xscale("log", base=2)
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.set_xlim(min(cs) / 1.4, max(cs) * 1.6)  # room for the last point's label
    ax.set_ylim(0, max(max(m + h for m, h in zip(med, high)), base) * 1.15)
    ax.set(xlabel="most requests per decode forward", ylabel="new tokens / s (whole queue)",
           title="Throughput against the batch")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="upper left")
    return fig
