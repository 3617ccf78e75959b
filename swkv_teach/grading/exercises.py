"""``swkv-teach make-exercises``: write ``exercises/`` from ``solutions/``, the single source.

In a solution notebook the answer code sits between two marker lines::

    ### BEGIN SOLUTION
    self.k = None
    ### END SOLUTION

The exercise notebook gets, at the same indentation::

    # YOUR CODE HERE
    raise NotImplementedError("exercise 02: replace these two lines with your code")

Everything else is copied (the check cells keep their ``swkv`` metadata, which
``swkv-teach grade`` reads); outputs and execution counts are cleared and the
Colab badge points at the exercise.

A learner's work is never overwritten: ``exercises/.generated.json`` records
the SHA-256 of each file as last written, and a file that no longer matches
its record was edited by someone, so the command refuses (naming it) unless
``--force``, which first saves a copy ``NAME.ipynb.bak-YYYYmmdd-HHMMSS``.
``--check`` writes nothing and exits 1 when ``exercises/`` is out of date.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import nbformat

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = "# YOUR CODE HERE"
MANIFEST = ".generated.json"
HEADER_TAG = "swkv-header"

__all__ = ["fill_in", "main", "make_exercise", "solution_regions", "strip_solutions"]


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _stub_line(indent: str, exercise: str) -> list[str]:
    what = f"exercise {exercise}: " if exercise else ""
    return [indent + STUB, indent + f'raise NotImplementedError("{what}replace these two lines with your code")']


def strip_solutions(source: str, exercise: str = "", where: str = "a cell") -> str:
    """``source`` with every solution region replaced by the two-line stub (same indentation)."""
    out, inside = [], False
    for n, line in enumerate(source.split("\n"), 1):
        mark = line.strip()
        if mark == BEGIN:
            if inside:
                raise ValueError(f"{where}, line {n}: {BEGIN!r} inside another solution region")
            out += _stub_line(_indent(line), exercise)
            inside = True
        elif mark == END:
            if not inside:
                raise ValueError(f"{where}, line {n}: {END!r} without a {BEGIN!r} before it")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{where}: {BEGIN!r} without a closing {END!r}")
    return "\n".join(out)


def solution_regions(source: str) -> list[str]:
    """The answer code of each region in ``source``, lines joined, indentation kept."""
    regions, current = [], None
    for line in source.split("\n"):
        mark = line.strip()
        if mark == BEGIN:
            current = []
        elif mark == END and current is not None:
            regions.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return regions


def fill_in(source: str, answers: list[str]) -> str:
    """Put ``answers`` (one per stub, in order) in place of the stubs of an exercise cell's ``source``.

    The inverse of :func:`strip_solutions`; tests use it to splice solutions, or wrong answers, into exercises.
    """
    lines, out, i, used = source.split("\n"), [], 0, 0
    while i < len(lines):
        if lines[i].strip() == STUB and i + 1 < len(lines) and "raise NotImplementedError" in lines[i + 1]:
            if used >= len(answers):
                raise ValueError(f"more stubs than answers ({len(answers)})")
            out += answers[used].split("\n")
            used += 1
            i += 2
        else:
            out.append(lines[i])
            i += 1
    if used != len(answers):
        raise ValueError(f"{len(answers)} answers for {used} stubs")
    return "\n".join(out)


def make_exercise(solution, rel_solution: str = "", rel_exercise: str = ""):
    """The exercise notebook for a solution notebook (a copy; the solution is not changed)."""
    nb = copy.deepcopy(solution)
    for n, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            exercise = cell.metadata.get("swkv", {}).get("exercise", "")
            cell.source = strip_solutions(cell.source, exercise, where=f"{rel_solution or 'notebook'} cell {n}")
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
        if HEADER_TAG in cell.metadata.get("tags", []) and rel_solution and rel_exercise:
            cell.source = cell.source.replace(f"/{rel_solution}", f"/{rel_exercise}")
    nb.metadata.setdefault("swkv", {})["generated_from"] = rel_solution
    return nb


def render(solution_path: Path, exercises_dir: Path) -> bytes:
    """The bytes ``make-exercises`` writes for one solution notebook (deterministic)."""
    sol = nbformat.read(solution_path, as_version=4)
    rel_sol = f"{solution_path.parent.name}/{solution_path.name}"
    rel_ex = f"{exercises_dir.name}/{solution_path.name}"
    return nbformat.writes(make_exercise(sol, rel_sol, rel_ex)).encode("utf-8") + b"\n"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _load_manifest(path: Path) -> dict:
    try:
        return dict(json.loads(path.read_text()).get("files", {}))
    except (OSError, ValueError, AttributeError):
        return {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="swkv-teach make-exercises", description=__doc__.split("\n\n")[0])
    ap.add_argument("--solutions", type=Path, default=Path("solutions"), help="folder of solution notebooks")
    ap.add_argument("--exercises", type=Path, default=Path("exercises"), help="folder to write (default: exercises)")
    ap.add_argument("--force", action="store_true", help="overwrite edited exercises, after saving a .bak copy")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if exercises/ is out of date")
    args = ap.parse_args(argv)

    sols = sorted(args.solutions.glob("*.ipynb"))
    if not sols:
        print(f"make-exercises: no notebooks in {args.solutions}/", file=sys.stderr)
        return 2
    try:
        planned = {s.name: render(s, args.exercises) for s in sols}
    except (ValueError, OSError, nbformat.reader.NotJSONError) as e:
        print(f"make-exercises: {e}", file=sys.stderr)
        return 2
    manifest_path = args.exercises / MANIFEST
    manifest = _load_manifest(manifest_path)

    if args.check:
        stale = [n for n, data in planned.items()
                 if not (args.exercises / n).exists() or (args.exercises / n).read_bytes() != data]
        stale += [f"{n} (its solution is gone)" for n in manifest if n not in planned and (args.exercises / n).exists()]
        if stale:
            print("make-exercises --check: out of date, run `swkv-teach make-exercises`:\n  " + "\n  ".join(stale),
                  file=sys.stderr)
            return 1
        print(f"make-exercises --check: {len(planned)} exercise notebooks up to date")
        return 0

    edited = []
    for name, data in planned.items():
        target = args.exercises / name
        if target.exists():
            current = target.read_bytes()
            if current != data and _sha(current) != manifest.get(name):
                edited.append(target)
    if edited and not args.force:
        print("make-exercises: refusing to overwrite notebooks changed since they were generated "
              "(your work?):\n  " + "\n  ".join(map(str, edited)) +
              "\nRename them to keep them, or rerun with --force (a .bak copy of each is kept).", file=sys.stderr)
        return 1

    args.exercises.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    written = []
    for name, data in planned.items():
        target = args.exercises / name
        if target in edited:
            backup = target.with_name(f"{name}.bak-{stamp}")
            shutil.copy2(target, backup)
            print(f"make-exercises: kept your version as {backup}")
        if not target.exists() or target.read_bytes() != data:
            target.write_bytes(data)
            written.append(name)
        manifest[name] = _sha(data)
    manifest_path.write_text(json.dumps({"generator": "swkv-teach make-exercises", "files": dict(sorted(manifest.items()))},
                                        indent=1) + "\n")
    print(f"make-exercises: {len(written)} written, {len(planned) - len(written)} already up to date in {args.exercises}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
