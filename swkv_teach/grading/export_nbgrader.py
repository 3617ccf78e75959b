"""``swkv-teach export nbgrader DIR [--assignment NAME]``: the exercises as an nbgrader course folder.

Writes ``DIR/nbgrader_config.py`` and ``DIR/source/NAME/`` (default ``swkv``)
with one notebook per solution notebook that holds an exercise. A teacher then
runs nbgrader's own commands in ``DIR``: ``nbgrader generate_assignment NAME``,
release, collect, ``nbgrader autograde NAME``.

What is translated, cell by cell (the source is ``solutions/``, the single
source of the exercises, read through its ``swkv`` cell metadata and
:data:`~swkv_teach.grading.EXERCISES`, never a list kept here):

- an answer cell (``swkv.role == "answer"``) becomes an nbgrader *solution*
  cell; its ``### BEGIN SOLUTION`` / ``### END SOLUTION`` regions are
  nbgrader's own markers, so ``generate_assignment`` stubs them out;
- a check cell (``swkv.role == "check"``) becomes an *autograded test* cell,
  locked, worth the registry's points: nbgrader runs the official check, and a
  check that raises scores 0;
- every other code cell (set-up, imports, demos) is locked, so autograde puts
  back the released version of any a student edited.

Markdown cells are copied unchanged except the "Open in Colab" badge, which
points at the solutions on GitHub and is dropped. Nothing here re-implements
a check: the test cells call the same ``check_*`` functions as ``swkv-teach grade``.

Student code runs under the caps ``swkv-teach grade`` sets (``--memory``, ``--cpu``):
nbgrader starts its kernels itself, and its ``Execute`` preprocessor passes its own
``kernel_manager_class`` (nbgrader 0.9, ``preprocessors/execute.py``), so the caps come
with the kernel: ``DIR/kernels/swkv-capped/kernel.json`` starts the launcher of
:mod:`.kernel`, which caps its own process and then becomes ipykernel. The config
puts ``DIR`` on ``JUPYTER_PATH`` and names that kernel for every notebook nbgrader
executes, and has kernels talk to nbgrader over Unix sockets (no TCP warning).
The kernel runs nbgrader's own Python (jupyter_client puts it in place of
``python``), which must have swkv-teach installed, as the checks need anyway.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

import nbformat

from swkv_teach.grading import EXERCISES
from swkv_teach.grading.exercises import BEGIN, HEADER_TAG

__all__ = ["CODE_STUB", "checked_exercises", "export_nbgrader", "nbgrader_notebook", "released_exercises"]

SCHEMA_VERSION = 3  # nbgrader's cell metadata schema since 0.6
CODE_STUB = '# YOUR CODE HERE\nraise NotImplementedError("replace these two lines with your code")'

CONFIG = '''"""nbgrader configuration for the swkv-teach exercises (written by `swkv-teach export nbgrader`).

Run nbgrader's commands from this folder: nbgrader generate_assignment {name}; nbgrader autograde {name}.
"""

c = get_config()  # noqa: F821 (nbgrader provides it)

c.CourseDirectory.course_id = "swkv-teach"
# Answers are written in place of the same two lines the course's own exercises/ show.
c.ClearSolutions.code_stub = {{"python": {stub!r}}}
c.ClearSolutions.begin_solution_delimeter = "BEGIN SOLUTION"
c.ClearSolutions.end_solution_delimeter = "END SOLUTION"
# Seconds per cell before autograde interrupts it (an infinite loop in a submission).
c.Execute.timeout = {timeout}

# Student code runs capped as under `swkv-teach grade`: {caps}.
# Every notebook nbgrader executes runs in the kernel kernels/{kernel}/kernel.json beside this file,
# which sets the caps, then starts ipykernel (edit its argv to change them); JUPYTER_PATH finds it.
import os  # noqa: E402

_here = os.path.dirname(os.path.abspath(__file__))
if _here not in os.environ.get("JUPYTER_PATH", "").split(os.pathsep):
    os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (_here, os.environ.get("JUPYTER_PATH")) if p)
c.Execute.kernel_name = "{kernel}"
# Kernels talk to nbgrader over Unix sockets in Jupyter's private runtime folder, not TCP ports.
if os.name == "posix":
    from jupyter_core.paths import jupyter_runtime_dir

    os.makedirs(jupyter_runtime_dir(), mode=0o700, exist_ok=True)
    c.KernelManager.transport = "ipc"
    c.KernelManager.ip = os.path.join(jupyter_runtime_dir(), "swkv-nbgrader-kernel")
'''


def _nbgrader_meta(grade_id: str, *, solution=False, grade=False, locked=False, points=None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": SCHEMA_VERSION,
            "solution": solution, "task": False}
    if grade:
        meta["points"] = points
    return meta


def nbgrader_notebook(solution, where: str = "notebook"):
    """An nbgrader source notebook (a copy) from a solution notebook; raises ValueError on bad metadata."""
    nb = copy.deepcopy(solution)
    cells, counts = [], {}
    for n, cell in enumerate(nb.cells):
        if HEADER_TAG in cell.metadata.get("tags", []) and cell.cell_type == "markdown":
            continue  # the Colab badge links to the solution
        cell.metadata.pop("nbgrader", None)
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            swkv = cell.metadata.get("swkv") or {}
            role, ex_id = swkv.get("role"), str(swkv.get("exercise", ""))
            if role in ("answer", "check") and ex_id not in EXERCISES:
                raise ValueError(f"{where} cell {n}: exercise {ex_id!r} is not in EXERCISES ({', '.join(EXERCISES)})")
            key = f"ex{ex_id}-{role}"
            counts[key] = counts.get(key, 0) + 1
            suffix = "" if counts[key] == 1 else f"-{counts[key]}"
            if role == "answer":
                if BEGIN not in cell.source:
                    raise ValueError(f"{where} cell {n}: the answer cell of exercise {ex_id} has no {BEGIN!r} region")
                cell.metadata["nbgrader"] = _nbgrader_meta(key + suffix, solution=True)
            elif role == "check":
                cell.metadata["nbgrader"] = _nbgrader_meta(key + suffix, grade=True, locked=True,
                                                           points=EXERCISES[ex_id].points)
            else:
                cell.metadata["nbgrader"] = _nbgrader_meta(f"locked-{n:02d}", locked=True)
        cells.append(cell)
    nb.cells = cells
    nb.metadata.get("swkv", {}).pop("generated_from", None)
    return nb


def checked_exercises(nb) -> list[str]:
    """Ids of the registry's exercises that have a check cell in notebook ``nb`` (from its ``swkv`` metadata)."""
    found = {str((c.metadata.get("swkv") or {}).get("exercise", "")) for c in nb.cells
             if (c.metadata.get("swkv") or {}).get("role") == "check"}
    return sorted(found & set(EXERCISES))


def released_exercises(solutions: Path) -> list[str]:
    """Ids of the exercises whose solution notebooks ship in ``solutions/`` (what a class is given)."""
    return sorted({i for p in solutions.glob("*.ipynb") for i in checked_exercises(nbformat.read(p, as_version=4))})


def export_nbgrader(out: Path, solutions: Path, assignment: str = "swkv", timeout: int = 120,
                    memory: str | None = "4G", cpu: float | None = 600) -> list[Path]:
    """Write ``out/nbgrader_config.py``, the capped kernel ``out/kernels/swkv-capped/`` and
    ``out/source/<assignment>/*.ipynb``; return the notebooks written. ``None`` leaves a cap off."""
    from swkv_teach.grading.kernel import KERNEL_NAME, write_kernelspec
    from swkv_teach.grading.limits import Limits

    if not re.fullmatch(r"[A-Za-z0-9_-]+", assignment):
        raise ValueError(f"assignment must be letters, digits, '_' or '-' (nbgrader uses it as a folder); got {assignment!r}")
    sources = sorted(solutions.glob("*.ipynb"))
    if not sources:
        raise ValueError(f"no solution notebooks in {solutions}/ (run from the course checkout, or pass --solutions)")
    planned = {}
    for path in sources:
        nb = nbformat.read(path, as_version=4)
        if checked_exercises(nb):
            planned[path.name] = nbgrader_notebook(nb, where=str(path))
    if not planned:
        raise ValueError(f"no notebook in {solutions}/ has a check cell of an exercise in EXERCISES")
    caps = Limits(memory, cpu).describe()  # refuses a bad size here, not in nbgrader
    dest = out / "source" / assignment
    dest.mkdir(parents=True, exist_ok=True)
    write_kernelspec(out, memory, cpu)
    (out / "nbgrader_config.py").write_text(CONFIG.format(name=assignment, stub=CODE_STUB, timeout=timeout,
                                                          caps=caps, kernel=KERNEL_NAME))
    written = []
    for name, nb in planned.items():
        nbformat.write(nb, dest / name)
        written.append(dest / name)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="swkv-teach export nbgrader", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the nbgrader course folder to write (created if missing)")
    ap.add_argument("--assignment", default="swkv", help="assignment name (default: swkv)")
    ap.add_argument("--solutions", type=Path, default=Path("solutions"), help="solution notebooks (default: solutions)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per cell when nbgrader autogrades (default 120)")
    ap.add_argument("--memory", default="4G", help="address-space cap per kernel, e.g. 2G (default 4G; none: no cap)")
    ap.add_argument("--cpu", default="600", help="CPU seconds per kernel (default 600; none: no cap)")
    args = ap.parse_args(argv)
    try:
        memory = None if args.memory.lower() == "none" else args.memory
        try:
            cpu = None if args.cpu.lower() == "none" else float(args.cpu)
        except ValueError:
            raise ValueError(f"--cpu must be a number of seconds, or none; got {args.cpu!r}") from None
        written = export_nbgrader(args.out, args.solutions, args.assignment, args.timeout, memory, cpu)
    except (ValueError, OSError) as e:
        print(f"swkv-teach export nbgrader: {e}", file=sys.stderr)
        return 2
    print(f"swkv-teach export nbgrader: {len(written)} notebook(s) in {args.out / 'source' / args.assignment}/ "
          f"and {args.out / 'nbgrader_config.py'}\n  next: cd {args.out} && nbgrader generate_assignment {args.assignment}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
