"""plot_intervals and plot_position_losses: lesson 8's two pictures draw the numbers they are given."""

from __future__ import annotations

import matplotlib
import pytest
import torch
from matplotlib.figure import Figure

from swkv_teach.evaluate import Interval
from swkv_teach.plots import plot_intervals, plot_position_losses, plot_scores
from swkv_teach.trace import record

matplotlib.use("Agg")


def test_each_policy_is_a_line_through_its_means_with_its_intervals_as_bars():
    table = {"window": {8: Interval(1.6, 1.5, 1.7), 16: Interval(1.55, 1.5, 1.6)},
             "TOVA": {8: Interval(1.7, 1.65, 1.8), 16: Interval(1.5, 1.45, 1.52)}}
    fig = plot_intervals(table, title="t")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    for name, row in table.items():
        (line,) = [ln for ln in ax.get_lines() if ln.get_gid() == f"policy-{name}"]
        assert list(line.get_ydata()) == pytest.approx([row[8].mean, row[16].mean])
    # the error bars' segments span low..high (matplotlib stores them as a LineCollection per errorbar)
    spans = sorted(tuple(round(float(y), 6) for y in seg[:, 1]) for c in ax.collections for seg in c.get_segments())
    assert (1.5, 1.7) in spans and (1.45, 1.52) in spans and (1.65, 1.8) in spans
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8", "16"]


def test_position_curves_are_bin_means_over_segments():
    losses = torch.arange(2 * 8, dtype=torch.float64).view(2, 8)  # rows 0..7 and 8..15
    fig = plot_position_losses({"window": losses}, bin_size=4, marks=(4,))
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_gid() == "curve-window"]
    # by hand: bin 0 = mean of 0..3 and 8..11 = 5.5; bin 1 = mean of 4..7 and 12..15 = 9.5; centres 2 and 6
    assert list(line.get_xdata()) == [2.0, 6.0] and list(line.get_ydata()) == [5.5, 9.5]


def test_scores_need_an_attention_trace():
    with pytest.raises(ValueError, match="record_attention"):
        plot_scores(record("ring", 4, 8), 5)
