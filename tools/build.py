"""Build notebooks from their plain-text sources, executed, with outputs stored.

Usage::

    python tools/build.py                    # every lesson and solution, then exercises/
    python tools/build.py 03_ring            # only sources whose path contains "03_ring"
    python tools/build.py solutions          # every solution, then exercises/
    python tools/build.py --check            # fail if a stored notebook is out of step with its source

A source is a jupytext percent file beside its notebook: ``notebooks/03_ring_buffer.py`` builds
``notebooks/03_ring_buffer.ipynb``. Edit the ``.py`` file (any editor, or JupyterLab with jupytext),
then run this (the sources are not paired with their notebooks: the build makes the .ipynb). See
:mod:`nbtools` for what the build adds (Colab badge, set-up cell, stable ids).

Solutions are the single source of the graded exercises: answer code sits between
``### BEGIN SOLUTION`` / ``### END SOLUTION``; check cells carry
``swkv={"exercise": "03", "points": 3, "role": "check"}`` in their ``# %%`` line, and their code
must be the registry's call (``swkv_teach.grading.EXERCISES``). When a solution was rebuilt,
``exercises/`` is regenerated with ``swkv-teach make-exercises``. Stops at the first notebook that
fails, so a broken notebook is never left half rebuilt behind a green summary.
"""

from __future__ import annotations

import subprocess
import sys
import time

import nbformat

import nbtools


def check_solution_cells(nb, rel: str) -> None:
    """Check cells call the registry's check with its points; answer cells hold a solution region."""
    from swkv_teach.grading import EXERCISES

    for cell in nb.cells:
        meta = cell.metadata.get("swkv")
        if not meta:
            continue
        ex = EXERCISES.get(meta.get("exercise"))
        if ex is None:
            raise SystemExit(f"{rel}: a cell names exercise {meta.get('exercise')!r}, not in EXERCISES")
        if meta.get("role") == "check" and (cell.source.strip() != ex.call or meta.get("points") != ex.points):
            raise SystemExit(f"{rel}: the check cell of exercise {ex.id} must be `{ex.call}` with points "
                             f"{ex.points}; got `{cell.source.strip()}` with points {meta.get('points')}")
        if meta.get("role") == "answer" and "### BEGIN SOLUTION" not in cell.source:
            raise SystemExit(f"{rel}: the answer cell of exercise {ex.id} has no ### BEGIN SOLUTION region")


def build(src, run: bool = True) -> None:
    rel = str(src.with_suffix(".ipynb").relative_to(nbtools.ROOT))
    nb = nbtools.assemble(src)
    if rel.startswith("solutions/"):
        check_solution_cells(nb, rel)
    if run:
        t0 = time.perf_counter()
        nbtools.execute(nb, src.parent)
        print(f"build: {rel} executed in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    nbformat.write(nb, src.with_suffix(".ipynb"))


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    unknown = [a for a in argv if a.startswith("-") and a != "--check"]
    if unknown:
        # an unknown flag must not fall through to "rebuild everything"
        print(f"build: unknown option {unknown[0]!r}; the only option is --check (see --help)", file=sys.stderr)
        return 2
    check = "--check" in argv
    filters = [a for a in argv if not a.startswith("-")]
    todo = nbtools.sources(filters)
    if not todo:
        print(f"build: no notebook source matches {filters}", file=sys.stderr)
        return 2
    if check:
        stale = {str(s.relative_to(nbtools.ROOT)): d for s in todo if (d := nbtools.differences(s))}
        for name, diffs in stale.items():
            print(f"build: {name} is out of step with its notebook: {'; '.join(diffs[:3])}", file=sys.stderr)
        return 1 if stale else 0
    for src in todo:
        build(src)
    if any(s.parent.name == "solutions" for s in todo):
        return subprocess.run([sys.executable, "-m", "swkv_teach.cli", "make-exercises"],
                              cwd=nbtools.ROOT).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
