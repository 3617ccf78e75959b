"""Estimate each lesson's reading time from its stored notebook, one method for all lessons.

    python tools/lesson_times.py            # a table: words, code lines, cells, figures, minutes

The method (notebooks/README.md states it too): a learner reads prose at about 100 words a minute (technical
text with formulas and tables, read to be understood, not skimmed), reads code at about 6 lines a minute,
spends about a minute on each code cell's run and output, and about 2 minutes on each figure. The sum is
rounded to the nearest 5 minutes. Exercises are timed apart, as ranges (a first attempt that passes
quickly, or one that needs the hints), and are not part of this estimate. The interview drill adds the
time to answer aloud: the method counts its answers as prose to read.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
WORDS_PER_MIN, CODE_LINES_PER_MIN, MIN_PER_CELL, MIN_PER_FIGURE = 100, 6, 1.0, 2.0


def counts(nb) -> dict[str, int]:
    """Words of prose, lines of code, code cells and figures of a lesson, the two header cells left out."""
    cells = nb.cells[2:]
    words = sum(len(re.findall(r"\w+", c.source)) for c in cells if c.cell_type == "markdown")
    code = [c for c in cells if c.cell_type == "code"]
    lines = sum(1 for c in code for line in c.source.splitlines()
                if line.strip() and not line.strip().startswith(("#", "%")))
    figures = sum(1 for c in code for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
    return {"words": words, "code_lines": lines, "code_cells": len(code), "figures": figures}


def minutes(c: dict[str, int]) -> int:
    raw = (c["words"] / WORDS_PER_MIN + c["code_lines"] / CODE_LINES_PER_MIN + c["code_cells"] * MIN_PER_CELL
           + c["figures"] * MIN_PER_FIGURE)
    return max(5, int(5 * round(raw / 5)))


def main() -> None:
    total = 0
    print(f"{'lesson':<36}{'words':>7}{'code':>6}{'cells':>6}{'figs':>5}{'min':>6}")
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        c = counts(nbformat.read(path, as_version=4))
        total += minutes(c)
        print(f"{path.stem:<36}{c['words']:>7}{c['code_lines']:>6}{c['code_cells']:>6}{c['figures']:>5}{minutes(c):>6}")
    print(f"{'total':<60}{total:>6}")


if __name__ == "__main__":
    sys.exit(main())
