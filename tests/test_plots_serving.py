"""plot_pool_occupancy and plot_throughput: lesson 7's serving pictures draw the numbers they are given."""

from __future__ import annotations

import matplotlib
import pytest
from matplotlib.figure import Figure

from swkv_teach.plots import plot_pool_occupancy, plot_throughput

matplotlib.use("Agg")


def _line(ax, gid):
    lines = [ln for ln in ax.get_lines() if ln.get_gid() == gid]
    assert len(lines) == 1, f"expected one line with gid {gid!r}; found {len(lines)}"
    return lines[0]


# a hand-written trace: two requests admitted at step 0, a third waits until step 2, all done at step 4
TRACE = [
    {"step": 0, "running": 2, "waiting": 1, "used_blocks": 3, "reserved_blocks": 6},
    {"step": 1, "running": 2, "waiting": 1, "used_blocks": 4, "reserved_blocks": 6},
    {"step": 2, "running": 2, "waiting": 0, "used_blocks": 5, "reserved_blocks": 7},
    {"step": 3, "running": 1, "waiting": 0, "used_blocks": 2, "reserved_blocks": 3},
    {"step": 4, "running": 0, "waiting": 0, "used_blocks": 0, "reserved_blocks": 0},
]


def test_occupancy_draws_blocks_held_and_promised_at_every_step():
    fig = plot_pool_occupancy(TRACE, num_blocks=8)
    assert isinstance(fig, Figure)
    top, bottom = fig.axes
    assert list(_line(top, "used").get_xdata()) == [0, 1, 2, 3, 4]
    assert list(_line(top, "used").get_ydata()) == [3, 4, 5, 2, 0]
    assert list(_line(top, "reserved").get_ydata()) == [6, 6, 7, 3, 0]
    assert list(_line(top, "pool").get_ydata()) == [8, 8]  # a horizontal line at the pool's size
    assert list(_line(bottom, "running").get_ydata()) == [2, 2, 2, 1, 0]
    assert list(_line(bottom, "waiting").get_ydata()) == [1, 1, 0, 0, 0]
    # a value holds until the next step (a step plot, not a line through the points)
    assert _line(top, "used").get_drawstyle() == "steps-post"


def test_occupancy_without_a_pool_size_draws_no_pool_line_and_refuses_an_empty_trace():
    fig = plot_pool_occupancy(TRACE)
    assert not [ln for ln in fig.axes[0].get_lines() if ln.get_gid() == "pool"]
    with pytest.raises(ValueError, match="trace is empty"):
        plot_pool_occupancy([])


def _row(c, median, lo, hi, ratio):
    return {"concurrency": c, "tokens_per_s": {"median": median, "min": lo, "max": hi}, "ratio_to_one_by_one": ratio}


RESULT = {"one_by_one": {"tokens_per_s": {"median": 1000.0, "min": 990.0, "max": 1010.0}},
          "rows": [_row(1, 500.0, 480.0, 520.0, 0.5), _row(4, 1500.0, 1400.0, 1550.0, 1.5),
                   _row(16, 3000.0, 2900.0, 3200.0, 3.0)]}


def test_throughput_draws_medians_with_min_max_bars_and_the_one_by_one_line():
    fig = plot_throughput(RESULT)
    ax = fig.axes[0]
    assert list(_line(ax, "batched").get_xdata()) == [1, 4, 16]
    assert list(_line(ax, "batched").get_ydata()) == [500.0, 1500.0, 3000.0]
    assert list(_line(ax, "one-by-one").get_ydata()) == [1000.0, 1000.0]
    # the bars span min..max of each concurrency (matplotlib keeps them as segments of a LineCollection)
    spans = sorted(tuple(float(y) for y in seg[:, 1]) for c in ax.collections for seg in c.get_segments())
    assert spans == [(480.0, 520.0), (1400.0, 1550.0), (2900.0, 3200.0)]
    # each point is labelled with its ratio to one by one, and the axis shows the concurrencies tried
    assert sorted(t.get_text() for t in ax.texts) == ["×0.5", "×1.5", "×3.0"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "16"]
    assert ax.get_ylim()[1] > 3200.0  # the tallest bar is not cut off
