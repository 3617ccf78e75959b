"""Rebuild every notebook: runs each ``tools/build_*.py`` builder, in name order, in a fresh process.

Usage::

    python tools/build_all.py              # everything (lessons, then solutions)
    python tools/build_all.py lesson_03    # only the builders whose name contains "lesson_03"

Run it after changing a builder, the library, or pyproject's ``Repository`` line (every
notebook's Colab badge and set-up cell are generated from it). When the solutions were rebuilt,
exercises/ is regenerated from them with ``swkv-teach make-exercises``. Stops at the first step
that fails, so a broken notebook is never left half rebuilt behind a green summary.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent


def builders(filters: list[str]) -> list[Path]:
    """Every ``build_*.py`` beside this file except this one, in name order, keeping those matching a filter."""
    found = sorted(p for p in TOOLS.glob("build_*.py") if p.name != Path(__file__).name)
    if filters:
        found = [p for p in found if any(f in p.stem for f in filters)]
    return found


def run(name: str, command: list[str]) -> int:
    t0 = time.perf_counter()
    result = subprocess.run(command, cwd=TOOLS.parent)
    print(f"build_all: {name} {'ok' if result.returncode == 0 else 'FAILED'}"
          f" in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return result.returncode


def main(argv: list[str] | None = None) -> int:
    filters = sys.argv[1:] if argv is None else argv
    todo = builders(filters)
    if not todo:
        print(f"build_all: no tools/build_*.py matches {filters}", file=sys.stderr)
        return 2
    for script in todo:
        # a fresh interpreter per builder: no state leaks from one notebook's build into the next
        rc = run(script.name, [sys.executable, str(script)])
        if rc != 0:
            return rc
    if any(p.stem == "build_solutions" for p in todo):
        return run("make-exercises", [sys.executable, "-m", "swkv_teach.cli", "make-exercises"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
