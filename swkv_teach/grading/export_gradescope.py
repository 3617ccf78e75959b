"""``swkv-teach export gradescope DIR``: a Gradescope autograder, ``DIR/autograder.zip``.

Gradescope's documented layout (https://gradescope-autograders.readthedocs.io/en/latest/specs/):
the zip holds ``setup.sh`` and ``run_autograder`` at its root; Gradescope extracts it to
``/autograder/source``, runs ``setup.sh`` once when it builds the image (as root, Ubuntu), and
``run_autograder`` once per submission, from ``/autograder``, with the student's files in
``/autograder/submission``; whatever it writes to ``/autograder/results/results.json`` is the
grade (``score``, ``output``, and ``tests`` with a ``name``, ``score``, ``max_score`` and
``output`` each), and only that file's ``output`` fields are shown to students.

Gradescope runs the copy at ``/autograder/run_autograder`` ("where your autograder script gets
copied to during the Docker image build process", gradescope/autograder_samples docs/specs.md
line 27), not the one in ``source/``, so the script reads its settings (``swkv_gradescope.json``:
exercises, timeout, memory, CPU) from ``$AUTOGRADER_ROOT/source/`` first, then from beside itself,
and fails the submission loudly, never falling back to defaults, when neither has them.
``AUTOGRADER_ROOT`` (default ``/autograder``) and ``SWKV_PYTHON`` (default
``/autograder/venv/bin/python``) are ours, for running the autograder outside Gradescope;
Gradescope's documentation names neither.

Ours adds the course package itself, as a wheel, so Gradescope grades with exactly the course's
checks and needs no access to the repository: built from the checkout when the package runs from
one, else repacked from the installed package's own files (``pip install swkv-teach`` is enough to
export). ``setup.sh`` installs it, after a CPU build of torch at the course's floor (Gradescope's
autograder documentation offers no GPU; the CUDA wheels are gigabytes), into ``/autograder/venv``,
made from the image's ``python3``: 3.10 on the default base image, Ubuntu 22.04 (docs/base_images.md).
That ``python3`` itself is left as it is, because Gradescope's harness runs on it
(docs/python3_issues.md). ``run_autograder`` calls
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
import re
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
# Gradescope runs this once, as root, when it builds the autograder image (Ubuntu; 22.04 by default).
set -euo pipefail
cd /autograder/source
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq python3 python3-venv python3-pip >/dev/null
# A venv of its own: the image's python3 stays untouched, Gradescope's harness runs on it.
python3 -c 'import sys; sys.exit(0 if sys.version_info >= {python_floor!r} else "swkv-teach needs Python >= {python_text}; this image has " + sys.version.split()[0] + ": choose a newer base image (Ubuntu 22.04 has 3.10)")'
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install -q --upgrade pip
# torch at the course's floor, a CPU build: Gradescope's autograder docs offer no GPU, and CUDA wheels are gigabytes
/autograder/venv/bin/pip install -q "{torch}" --index-url https://download.pytorch.org/whl/cpu
/autograder/venv/bin/pip install -q "./{wheel}{extras}" ipykernel
/autograder/venv/bin/python -c "import swkv_teach, torch, ipykernel; print('swkv-teach', swkv_teach.__version__, 'with torch', torch.__version__, 'installed')"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope copies this script to /autograder/run_autograder and runs it there, once per submission,
# from /autograder; the zip itself is unpacked in /autograder/source. It always leaves a results.json.
ROOT="${AUTOGRADER_ROOT:-/autograder}"
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${SWKV_PYTHON:-/autograder/venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
mkdir -p "$ROOT/results"
rm -f "$ROOT/results/results.json"
"$PYTHON" -m swkv_teach.grading.export_gradescope run --root "$ROOT" \\
    --config "$ROOT/source/swkv_gradescope.json" --config "$HERE/swkv_gradescope.json"
status=$?
if [ ! -s "$ROOT/results/results.json" ]; then
    # Python itself failed (not installed, killed): still a grade and a reason, never a crash
    printf '{"score": 0, "output": "The autograder could not run (exit status %s); please tell your teacher. Your submission was not graded."}\\n' "$status" > "$ROOT/results/results.json"
fi
exit 0
"""


def _project_root() -> Path | None:
    """The course checkout this package runs from (an editable install or the source tree), or None."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if pyproject.exists() and 'name = "swkv-teach"' in pyproject.read_text():
        return root
    return None


def _wheel_builder_missing() -> str | None:
    """Why this Python cannot build a wheel offline, or None: setuptools has its own ``bdist_wheel`` from 70.1,
    older ones need the ``wheel`` package (a fresh venv's bundled setuptools 65.5 has neither)."""
    import importlib.util

    try:
        import setuptools

        version = tuple(int(x) for x in setuptools.__version__.split(".")[:2])
    except (ImportError, ValueError):
        version = (0, 0)
    try:
        has_wheel = importlib.util.find_spec("wheel") is not None
    except ValueError:  # set to None in sys.modules
        has_wheel = False
    if version >= (70, 1) or has_wheel:
        return None
    found = "no setuptools" if version == (0, 0) else f"setuptools {'.'.join(map(str, version))}"
    return (f"building the course wheel needs setuptools >= 70.1 or the wheel package; this Python has {found} and "
            f"no wheel: {sys.executable} -m pip install -U setuptools")


def build_wheel(project: Path, dest: Path) -> Path:
    """The course package as a wheel in ``dest`` (offline: uses the installed setuptools).

    Built from a clean copy of what the package needs (pyproject maps ``exercises/`` into the
    package as ``swkv_teach/released/``), never in the checkout, where setuptools' ``build/``
    folder would keep, and ship, modules deleted since an earlier build.
    """
    missing = _wheel_builder_missing()
    if missing:
        raise ValueError(missing)
    with tempfile.TemporaryDirectory(prefix="swkv-wheel-") as tmp:
        src, wheels_dir = Path(tmp) / "src", Path(tmp) / "wheels"
        for name in ("swkv_teach", "exercises"):
            shutil.copytree(project / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.bak-*"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(project / name, src / name)
        run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                              "-w", str(wheels_dir), str(src)], capture_output=True, text=True)
        wheels = list(wheels_dir.glob("swkv_teach-*.whl"))
        if run.returncode or len(wheels) != 1:
            raise ValueError(f"building the course wheel failed:\n{run.stdout[-1500:]}{run.stderr[-1500:]}")
        return Path(shutil.copy(wheels[0], dest / wheels[0].name))


_NOT_IN_WHEEL = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}  # written by the installer, not the wheel


def repack_installed(dest: Path) -> Path:
    """The installed course package as a wheel in ``dest``, rebuilt from the files its RECORD lists.

    An installed wheel keeps every file it shipped (code, data, released exercises, ``*.dist-info``
    with ``METADATA``, ``WHEEL`` and ``entry_points.txt``); what the installer added (compiled
    ``.pyc``, console scripts outside site-packages, ``INSTALLER``, ``direct_url.json``) is left out
    and a new ``RECORD`` is written, as the wheel format asks (PEP 427).
    """
    import base64
    import hashlib
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution("swkv-teach")
    except PackageNotFoundError:
        raise ValueError("swkv-teach is neither a checkout nor an installed package here; pip install it first") from None
    wheel_meta = dist.read_text("WHEEL") or ""
    tags = [ln.split(":", 1)[1].strip() for ln in wheel_meta.splitlines() if ln.startswith("Tag:")]
    if not tags:
        raise ValueError(f"cannot rebuild a wheel from {dist.locate_file('')}: its dist-info has no WHEEL tag "
                         "(an editable or legacy install?); export from the course checkout instead")
    files = [f for f in dist.files or [] if not str(f).startswith("..") and "__pycache__" not in f.parts
             and not (f.parts[0].endswith(".dist-info") and f.name in _NOT_IN_WHEEL)]
    info_dir = next(f.parts[0] for f in files if f.parts[0].endswith(".dist-info"))
    name = f"{info_dir.removesuffix('.dist-info')}-{tags[0]}.whl"
    record = []
    target = dest / name
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(files, key=str):
            data = Path(dist.locate_file(f)).read_bytes()
            z.writestr(str(f), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{f},sha256={digest},{len(data)}")
        record.append(f"{info_dir}/RECORD,,")
        z.writestr(f"{info_dir}/RECORD", "\n".join(record) + "\n")
    return target


def course_wheel(dest: Path) -> Path:
    """The wheel the autograder installs: built from the checkout when there is one, else repacked from the install."""
    project = _project_root()
    return build_wheel(project, dest) if project else repack_installed(dest)


# Exercises whose checks import more than the course's required dependencies, and the extra that brings it.
EXTRA_FOR = {"hf_cache_layer": "hf"}  # exercise 11 runs tiny transformers models (built locally, nothing downloaded)


def _setup_sh(wheel: Path, ids: list[str] = ()) -> str:
    """``setup.sh`` for ``wheel``: its torch requirement and Python floor, read from the wheel's own METADATA,
    and the extras the graded exercises ``ids`` need (``EXTRA_FOR``)."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    torch = next((ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Requires-Dist:")
                  and re.match(r"torch\b", ln.split(":", 1)[1].strip()) and "extra" not in ln), "torch")
    floor = re.search(r">=\s*(\d+)\.(\d+)", next((ln for ln in meta.splitlines() if ln.startswith("Requires-Python:")), ""))
    python_floor = (int(floor.group(1)), int(floor.group(2))) if floor else (3, 10)
    extras = sorted({EXTRA_FOR[EXERCISES[i].slug] for i in ids if EXERCISES[i].slug in EXTRA_FOR})
    return SETUP_SH.format(wheel=wheel.name, torch=torch.replace(" ", ""), python_floor=python_floor,
                           extras=f"[{','.join(extras)}]" if extras else "",
                           python_text=".".join(map(str, python_floor)))


def _exercise_ids(spec: str | None, default: list[str] | None = None) -> list[str]:
    if not spec:
        return sorted(default or EXERCISES)
    ids = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [i for i in ids if i not in EXERCISES]
    if unknown or not ids:
        raise ValueError(f"--exercises must name exercises in EXERCISES ({', '.join(sorted(EXERCISES))}); got {spec!r}")
    return sorted(set(ids))


def export_gradescope(out: Path, exercises: str | None = None, timeout: float = 60, memory: str = "4G",
                      cpu: float = 600, solutions: Path | None = None) -> Path:
    """Write ``out/autograder.zip``; return its path.

    It grades ``exercises`` (comma-separated ids), by default every exercise the class was given:
    those whose solution notebooks are in ``solutions`` (default ``./solutions`` when it exists), else
    those of the released exercises shipped with the package. Each is worth the registry's points.
    """
    from swkv_teach.grading.export_nbgrader import released_exercises
    from swkv_teach.grading.limits import parse_size
    from swkv_teach.grading.students import packaged_released

    if solutions is None:
        solutions = Path("solutions") if Path("solutions").is_dir() else packaged_released()
    shipped = released_exercises(solutions) if solutions and solutions.is_dir() else []
    if not exercises and not shipped:
        raise ValueError(f"no exercise notebooks in {solutions}: pass --exercises, or --solutions PATH")
    ids = _exercise_ids(exercises, shipped)
    parse_size(memory)  # fail here, not on Gradescope
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="swkv-gradescope-") as tmp:
        wheel = course_wheel(Path(tmp))
        config = {"exercises": ids, "timeout": timeout, "memory": memory, "cpu": cpu}
        target = out / "autograder.zip"
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
            for name, text in (("setup.sh", _setup_sh(wheel, ids)), ("run_autograder", RUN_AUTOGRADER)):
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
    ap.add_argument("--config", type=Path, action="append", default=[],
                    help=f"where the zip's {CONFIG_NAME} may be (repeat: the first that exists is read)")
    args = ap.parse_args(argv)
    try:
        found = next((p for p in args.config if p.is_file()), None)
        if found is None:  # never grade with defaults the teacher did not choose
            looked = ", ".join(map(str, args.config)) or "nowhere (no --config)"
            raise FileNotFoundError(f"{CONFIG_NAME} is missing (looked in {looked}): upload the autograder.zip "
                                    "that `swkv-teach export gradescope` wrote, unchanged")
        config = json.loads(found.read_text())
        print(f"swkv-teach autograder: settings from {found}: {json.dumps(config)}")
        exercises = _exercise_ids(",".join(config["exercises"]))
        results = autograde(args.root, exercises, timeout=config["timeout"], memory=config["memory"], cpu=config["cpu"])
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
    ap.add_argument("--solutions", type=Path, default=None,
                    help="solution (or released exercise) notebooks naming the exercises graded (default: ./solutions "
                         "if it exists, else the exercises shipped with the package)")
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
