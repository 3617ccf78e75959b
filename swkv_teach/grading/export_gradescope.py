"""``swkv-teach export gradescope DIR``: a Gradescope autograder, ``DIR/autograder.zip``.

Gradescope's documented layout (https://gradescope-autograders.readthedocs.io/en/latest/specs/):
the zip holds ``setup.sh`` and ``run_autograder`` at its root; Gradescope extracts it to
``/autograder/source``, runs ``setup.sh`` once when it builds the image (as root, Ubuntu), and
``run_autograder`` once per submission, from ``/autograder``, with the student's files in
``/autograder/submission``; whatever it writes to ``/autograder/results/results.json`` is the
grade (``score``, ``output``, and ``tests`` with a ``name``, ``score``, ``max_score`` and
``output`` each), and only that file's ``output`` fields are shown to students.

Ours adds the course package itself, as a wheel built from this checkout, so Gradescope grades
with exactly the course's checks and needs no access to the repository. ``setup.sh`` installs it
with a CPU build of torch into ``/autograder/venv``. ``run_autograder`` calls
``python -m swkv_teach.grading.export_gradescope run``, which grades every ``.ipynb`` of the
submission with :func:`~swkv_teach.grading.grade.grade_notebook` (the engine of
``swkv-teach grade``: a copy of each notebook in a fresh kernel, the official checks, per-cell
timeout, memory and CPU caps) and always writes ``results.json``: a malformed notebook, an
infinite loop, a dead kernel, a missing submission, even a broken Python, give 0 points and say why.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

from swkv_teach.grading import EXERCISES

__all__ = ["autograde", "export_gradescope", "main"]

CONFIG_NAME = "swkv_gradescope.json"

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image (Ubuntu).
set -euo pipefail
cd /autograder/source
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq python3 python3-venv python3-pip >/dev/null
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install -q --upgrade pip
# a CPU build of torch: Gradescope's graders have no GPU, and the CUDA wheels are gigabytes
/autograder/venv/bin/pip install -q torch --index-url https://download.pytorch.org/whl/cpu
/autograder/venv/bin/pip install -q ./{wheel} ipykernel
/autograder/venv/bin/python -c "import swkv_teach, ipykernel; print('swkv-teach', swkv_teach.__version__, 'installed')"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this once per submission, from /autograder. It always leaves a results.json.
ROOT="${AUTOGRADER_ROOT:-/autograder}"
SOURCE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${SWKV_PYTHON:-/autograder/venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
mkdir -p "$ROOT/results"
rm -f "$ROOT/results/results.json"
"$PYTHON" -m swkv_teach.grading.export_gradescope run --root "$ROOT" --config "$SOURCE/swkv_gradescope.json"
status=$?
if [ ! -s "$ROOT/results/results.json" ]; then
    # Python itself failed (not installed, killed): still a grade and a reason, never a crash
    printf '{"score": 0, "output": "The autograder could not run (exit status %s); please tell your teacher. Your submission was not graded."}\\n' "$status" > "$ROOT/results/results.json"
fi
exit 0
"""


def _project_root() -> Path:
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").exists():
        raise ValueError(f"{root} is not the course checkout (no pyproject.toml): export from a clone of the course")
    return root


def build_wheel(project: Path, dest: Path) -> Path:
    """The course package as a wheel in ``dest`` (offline: uses the installed setuptools).

    Built from a clean copy of what the package needs, never in the checkout, where setuptools'
    ``build/`` folder would keep, and ship, modules deleted since an earlier build.
    """
    with tempfile.TemporaryDirectory(prefix="swkv-wheel-") as tmp:
        src, wheels_dir = Path(tmp) / "src", Path(tmp) / "wheels"
        shutil.copytree(project / "swkv_teach", src / "swkv_teach",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(project / name, src / name)
        run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                              "-w", str(wheels_dir), str(src)], capture_output=True, text=True)
        wheels = list(wheels_dir.glob("swkv_teach-*.whl"))
        if run.returncode or len(wheels) != 1:
            raise ValueError(f"building the course wheel failed:\n{run.stdout[-1500:]}{run.stderr[-1500:]}")
        return Path(shutil.copy(wheels[0], dest / wheels[0].name))


def _exercise_ids(spec: str | None, default: list[str] | None = None) -> list[str]:
    if not spec:
        return sorted(default or EXERCISES)
    ids = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [i for i in ids if i not in EXERCISES]
    if unknown or not ids:
        raise ValueError(f"--exercises must name exercises in EXERCISES ({', '.join(sorted(EXERCISES))}); got {spec!r}")
    return sorted(set(ids))


def export_gradescope(out: Path, exercises: str | None = None, timeout: float = 60, memory: str = "4G",
                      cpu: float = 600, solutions: Path = Path("solutions")) -> Path:
    """Write ``out/autograder.zip``; return its path.

    It grades ``exercises`` (comma-separated ids), by default every exercise whose solution notebook
    ships in ``solutions/``: what the class was given, each worth the registry's points.
    """
    from swkv_teach.grading.export_nbgrader import released_exercises
    from swkv_teach.grading.limits import parse_size

    shipped = released_exercises(solutions) if solutions.is_dir() else []
    if not exercises and not shipped:
        raise ValueError(f"no exercise notebooks in {solutions}/: run from the course checkout, or pass --exercises")
    ids = _exercise_ids(exercises, shipped)
    parse_size(memory)  # fail here, not on Gradescope
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="swkv-gradescope-") as tmp:
        wheel = build_wheel(_project_root(), Path(tmp))
        config = {"exercises": ids, "timeout": timeout, "memory": memory, "cpu": cpu}
        target = out / "autograder.zip"
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
            for name, text in (("setup.sh", SETUP_SH.format(wheel=wheel.name)), ("run_autograder", RUN_AUTOGRADER)):
                info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
                info.external_attr = (stat.S_IFREG | 0o755) << 16  # executable once unzipped
                z.writestr(info, text)
            info = zipfile.ZipInfo(CONFIG_NAME, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            z.writestr(info, json.dumps(config, indent=1) + "\n")
            z.write(wheel, wheel.name)
    return target


# ------------------------------------------------------------------------ on Gradescope, per submission
def _feedback_for(row: dict, ex_id: str) -> str:
    return next((f for f in row["feedback"] if f.startswith(f"[{ex_id}]")), "")


def autograde(root: Path, exercises: list[str], timeout: float = 60, memory: str | None = "4G",
              cpu: float | None = 600) -> dict:
    """Grade ``root/submission`` and return the results.json dict (also written to ``root/results/``)."""
    from swkv_teach.grading.grade import _collect, grade_notebook

    t0 = time.perf_counter()
    submission = root / "submission"
    notebooks = _collect([str(submission)]) if submission.is_dir() else []
    best: dict[str, tuple[int, str, str]] = {}  # exercise -> (points, feedback, notebook)
    lines, unreadable = [], []
    for path in notebooks:
        shown = str(path.relative_to(submission))
        row = grade_notebook(path, timeout=timeout, display=shown, memory=memory, cpu=cpu)
        total = sum(v or 0 for v in row["exercises"].values())
        lines.append(f"{shown}: {row['status']} ({row['reason']}), {total} point(s)")
        if row["status"] == "unreadable":
            unreadable.append(shown)
        for ex_id, pts in row["exercises"].items():
            if ex_id in exercises and (ex_id not in best or (pts or 0) > best[ex_id][0]):
                fb = _feedback_for(row, ex_id)
                if not pts and row["status"] not in ("ok", "errors", "failed"):
                    fb += f"\n    ({row['status']}: {row['reason']})"
                best[ex_id] = (pts or 0, fb, shown)
    tests = []
    for ex_id in exercises:
        e = EXERCISES[ex_id]
        name = f"Exercise {ex_id}: {e.check}({e.target})"
        if ex_id in best:
            pts, fb, shown = best[ex_id]
            output = f"{shown}\n{fb}"
        else:
            pts, output = 0, (f"No submitted notebook attempts exercise {ex_id} (a cell calling {e.call}, or its "
                              f"name '{e.slug}' in the file name). Upload the exercise notebook with your answer.")
            if unreadable:
                output += (f" These files are not valid notebooks, so they were not graded: {', '.join(unreadable)} "
                           "(download the notebook again with File > Download > .ipynb; do not edit it as text).")
        tests.append({"name": name, "score": pts, "max_score": e.points, "output": output,
                      "status": "passed" if pts == e.points else "failed"})
    score = sum(t["score"] for t in tests)
    most = sum(t["max_score"] for t in tests)
    if not notebooks:
        head = ("No .ipynb file in your submission: upload your exercise notebooks (in Colab: File > Download > "
                "Download .ipynb). Nothing was graded.")
    else:
        head = f"Score {score}/{most} from {len(notebooks)} notebook(s):"
    results = {"score": score, "output": "\n".join([head, *lines]), "tests": tests,
               "execution_time": round(time.perf_counter() - t0, 1)}
    _write(root, results)
    return results


def _write(root: Path, results: dict) -> None:
    (root / "results").mkdir(parents=True, exist_ok=True)
    tmp = root / "results" / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    os.replace(tmp, root / "results" / "results.json")


def _run(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m swkv_teach.grading.export_gradescope run")
    ap.add_argument("--root", type=Path, default=Path(os.environ.get("AUTOGRADER_ROOT", "/autograder")))
    ap.add_argument("--config", type=Path, default=None, help=f"the zip's {CONFIG_NAME}")
    args = ap.parse_args(argv)
    try:
        config = json.loads(args.config.read_text()) if args.config and args.config.exists() else {}
        exercises = _exercise_ids(",".join(config.get("exercises", [])) or None)
        results = autograde(args.root, exercises, timeout=config.get("timeout", 60),
                            memory=config.get("memory", "4G"), cpu=config.get("cpu", 600))
        print(results["output"])
    except Exception as e:  # never leave Gradescope without a results file
        traceback.print_exc()
        _write(args.root, {"score": 0, "output": f"The autograder failed ({type(e).__name__}: {e}); please tell "
                           "your teacher. Your submission was not graded."})
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:
        return _run(argv[1:])
    ap = argparse.ArgumentParser(prog="swkv-teach export gradescope", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="folder to write autograder.zip into")
    ap.add_argument("--exercises", default=None, help="comma-separated exercise ids graded (default: all in --solutions)")
    ap.add_argument("--solutions", type=Path, default=Path("solutions"), help="solution notebooks (default: solutions)")
    ap.add_argument("--timeout", type=float, default=60, help="seconds per cell (default 60)")
    ap.add_argument("--memory", default="4G", help="address-space cap per notebook kernel (default 4G)")
    ap.add_argument("--cpu", type=float, default=600, help="CPU seconds per notebook kernel (default 600)")
    args = ap.parse_args(argv)
    try:
        target = export_gradescope(args.out, args.exercises, args.timeout, args.memory, args.cpu, args.solutions)
    except (ValueError, OSError) as e:
        print(f"swkv-teach export gradescope: {e}", file=sys.stderr)
        return 2
    print(f"swkv-teach export gradescope: {target} (upload it as the assignment's autograder)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
