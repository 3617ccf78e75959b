"""``students.csv``: one row per student for ``swkv-teach grade SUBMISSIONS/`` with ``SUBMISSIONS/<student>/*.ipynb``.

A row holds the student (the folder's name), the points per exercise (the best over the
student's notebooks), the total and the maximum (the same for every row: all exercises any
student attempted), each notebook's status, and ``changed``: what in the submission differs
from the released exercise outside the answer regions.

``changed`` compares code cells with the released notebook of the same exercise (found in
``--released``, through its check cells' ``swkv`` metadata; by default ``./exercises``, else
the exercises shipped with the package, see :func:`default_released`):

- the check cell must be there, unchanged (the official check decides the points anyway:
  the flag says a student edited or deleted it, not that the grade is wrong);
- every other released code cell (set-up, imports, demos) must be there, unchanged;
- the answer cell is the learner's: its stub, def line, docstring and annotations
  included, they may rewrite all of it, so it is never compared.

Cells a student added are allowed, and markdown is not compared. nbgrader does the same for
its locked cells with checksums; here the release itself is the reference.
"""

from __future__ import annotations

import csv
from pathlib import Path

import nbformat

from swkv_teach.grading import EXERCISES

__all__ = ["changes", "default_released", "packaged_released", "released_by_exercise", "student_of", "write_students"]

ASK_RELEASED = "pass --released PATH (the course's exercises/ folder)"


def student_of(notebook: Path, folders: list[Path]) -> str | None:
    """The student folder holding ``notebook`` under one of ``folders``, or None (a loose notebook)."""
    for folder in folders:
        try:
            parts = notebook.resolve().relative_to(folder.resolve()).parts
        except ValueError:
            continue
        if len(parts) >= 2:
            return parts[0]
    return None


def released_by_exercise(released: Path | None) -> dict[str, object]:
    """{exercise id: released notebook} from the check cells' metadata of ``released/*.ipynb``."""
    found = {}
    for path in sorted(released.glob("*.ipynb")) if released and released.is_dir() else []:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            meta = cell.metadata.get("swkv") or {}
            if meta.get("role") == "check" and str(meta.get("exercise")) in EXERCISES:
                found[str(meta["exercise"])] = nb
    return found


def packaged_released() -> Path | None:
    """The released exercises that come with the package: ``swkv_teach/released/`` in an installed wheel
    (pyproject maps the course's ``exercises/`` there at build time), else ``exercises/`` beside the
    package in a checkout or an editable install; None when neither holds any."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "released", package.parent / "exercises"):
        if released_by_exercise(candidate):
            return candidate
    return None


def default_released(cwd: Path | None = None) -> Path | None:
    """``--released`` when not given: ``./exercises`` if it exists, else :func:`packaged_released`."""
    here = (cwd or Path.cwd()) / "exercises"
    return here if here.is_dir() else packaged_released()


def _role(cell) -> tuple[str | None, str]:
    meta = cell.metadata.get("swkv") or {}
    return meta.get("role"), str(meta.get("exercise", ""))


def changes(submission, release) -> list[str]:
    """What differs from ``release`` outside the answer regions, as short sentences (empty: nothing)."""
    code = [c for c in submission.cells if c.cell_type == "code"]
    sources = {c.source.strip() for c in code}
    found = []
    for n, cell in enumerate(c for c in release.cells if c.cell_type == "code"):
        role, ex_id = _role(cell)
        if role == "check":
            if cell.source.strip() not in sources:
                found.append(f"the check cell of exercise {ex_id} was changed or deleted")
        elif role == "answer":
            continue  # the learner's to rewrite, stub, signature and docstring included
        elif cell.source.strip() and cell.source.strip() not in sources:
            first = next((ln for ln in cell.source.strip().split("\n") if ln.strip()), "")[:50]
            found.append(f"released code cell {n + 1} ({first!r}) was changed or deleted")
    return found


def write_students(rows: list[dict], paths: list[Path], folders: list[Path], released: Path | None,
                   out: Path) -> Path | None:
    """Write ``out/students.csv`` from the gradebook ``rows`` (one per notebook in ``paths``); None if no student folders."""
    students: dict[str, list[tuple[dict, Path]]] = {}
    for row, path in zip(rows, paths):
        who = student_of(path, folders)
        if who is not None:
            students.setdefault(who, []).append((row, path))
    if not students:
        return None
    reference = released_by_exercise(released)
    attempted = sorted({i for rs in students.values() for r, _ in rs for i in r["exercises"]})
    most = sum(EXERCISES[i].points for i in attempted)
    target = out / "students.csv"
    with target.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student"] + [f"ex{i}" for i in attempted] + ["total", "max", "statuses", "changed"])
        for who in sorted(students):
            best: dict[str, int] = {}
            statuses, changed = [], []
            for row, path in students[who]:
                for i, pts in row["exercises"].items():
                    best[i] = max(best.get(i, 0), pts or 0)
                statuses.append(f"{path.name}: {row['status']}")
                changed += _changed(path, row, reference, released)
            w.writerow([who] + [best.get(i, 0) if i in best else "" for i in attempted]
                       + [sum(best.values()), most, "; ".join(statuses), "; ".join(changed)])
    return target


def _changed(path: Path, row: dict, reference: dict, released: Path | None) -> list[str]:
    ids = sorted(row["exercises"])
    if not ids:
        return []
    if not reference:
        return [f"{path.name}: not compared ({ASK_RELEASED})" if released is None else
                f"{path.name}: not compared (no released exercises in {released}; {ASK_RELEASED})"]
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception:
        return []  # unreadable: its status says so already
    found, seen = [], set()
    for ex_id in ids:
        release = reference.get(ex_id)
        if release is None or id(release) in seen:
            continue
        seen.add(id(release))
        found += [f"{path.name}: {c}" for c in changes(nb, release)]
    return found
