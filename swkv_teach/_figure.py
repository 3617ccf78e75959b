"""The one way the plotting modules make a Figure: without pyplot, constrained layout, one DPI."""

from __future__ import annotations

from matplotlib.figure import Figure

DPI = 100


def figure_and_axes(ax, figsize: tuple[float, float]):
    """``(figure, axes)``: ``ax`` and its figure when given (a widget composing a panel), else a new Figure.

    Built without pyplot, so nothing accumulates in ``plt.get_fignums()`` and the inline
    backend never shows a figure twice.
    """
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=figsize, dpi=DPI, layout="constrained")
    return fig, fig.add_subplot()
