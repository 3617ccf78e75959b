"""The teacher's commands from a wheel installed outside any checkout (issue 18).

`swkv-teach export gradescope` refused an ordinary install ("not the course checkout"), and
`swkv-teach grade` there said "not compared (pass --released PATH ...)" for every notebook. Here the
course is built into a wheel, installed into a fresh virtual environment in a temporary folder, and
both commands run from another temporary folder, where no `solutions/` or `exercises/` exists.

Nothing is downloaded: the fresh environment reaches this environment's packages (torch, nbclient,
ipykernel ...) through a ``.pth`` line that names its site-packages folder, and the wheel is
installed with ``--no-deps --no-index``. A ``.pth`` line naming a folder does not run the ``.pth``
files inside it, so this environment's editable install of the course stays invisible there.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import nbformat
import pytest

from swkv_teach.grading import EXERCISES
from swkv_teach.grading.export_gradescope import build_wheel
from tests.test_exercises_nbval import spliced

ROOT = Path(__file__).resolve().parent.parent
MASK = "01_sliding_window_mask.ipynb"
pytestmark = pytest.mark.slow


def run(cmd, cwd, timeout=600):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh environment's bin/ folder, a working folder outside the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(ROOT, tmp)
    env = tmp / "env"
    run([sys.executable, "-m", "venv", "--without-pip", str(env)], tmp)
    purelib = run([str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                  tmp).stdout.strip()
    (Path(purelib) / "_swkv_test_base.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # pip comes from this environment (through the .pth) and installs into the fresh one, its sys.prefix
    run([str(env / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed",
         str(wheel)], tmp)
    work = tmp / "elsewhere"
    work.mkdir()
    return env / "bin", work


def test_the_installed_package_is_the_wheels_not_the_checkout(installed):
    bin_dir, work = installed
    where = run([str(bin_dir / "python"), "-c", "import swkv_teach; print(swkv_teach.__file__)"], work).stdout.strip()
    assert Path(where).is_relative_to(bin_dir.parent) and not Path(where).is_relative_to(ROOT), where
    assert not (work / "solutions").exists() and not (work / "exercises").exists()


def test_export_gradescope_works_from_the_installed_wheel(installed):
    bin_dir, work = installed
    proc = run([str(bin_dir / "swkv-teach"), "export", "gradescope", "gs"], work)
    assert "autograder.zip" in proc.stdout
    with zipfile.ZipFile(work / "gs" / "autograder.zip") as z:
        config = json.loads(z.read("swkv_gradescope.json"))
        inner = next(n for n in z.namelist() if n.endswith(".whl"))
        with zipfile.ZipFile(z.open(inner)) as wheel:
            names = wheel.namelist()
            record = wheel.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
    # every exercise whose notebook the course releases, found here by file name (a second method)
    released = {e.id for e in EXERCISES.values() for p in (ROOT / "exercises").glob("*.ipynb") if e.slug in p.name}
    assert config["exercises"] == sorted(released), config
    assert "swkv_teach/grading/grade.py" in names and "swkv_teach/data/char_decoder.pt" in names
    assert {n.rsplit("/", 1)[-1] for n in names if n.startswith("swkv_teach/released/")} == \
        {p.name for p in (ROOT / "exercises").glob("*.ipynb")}
    assert not any("__pycache__" in n or n.endswith((".pyc", "INSTALLER", "direct_url.json")) for n in names), names
    listed = {line.split(",")[0] for line in record.splitlines() if line}
    assert listed == set(names), "the repacked wheel's RECORD lists exactly its files"


def test_grade_compares_with_the_packaged_exercises_outside_the_checkout(installed):
    """`changed` works from the wheel: an edited check cell is flagged, a clean notebook is not, no 'not compared'."""
    bin_dir, work = installed
    subs = work / "submissions"
    good = spliced(MASK)
    edited = nbformat.from_dict(good)
    next(c for c in edited.cells if c.metadata.get("swkv", {}).get("role") == "check").source = "print('trust me')"
    where = nbformat.v4.new_code_cell("import swkv_teach\nraise RuntimeError('kernel uses ' + swkv_teach.__file__)")
    edited.cells.insert(0, where)
    for student, nb in (("ann", good), ("ben", edited)):
        (subs / student).mkdir(parents=True)
        nbformat.write(nb, subs / student / MASK)
    run([str(bin_dir / "swkv-teach"), "grade", "submissions", "--out", "gb", "--timeout", "60", "--jobs", "2"], work)
    students = {r["student"]: r for r in csv.DictReader((work / "gb" / "students.csv").open())}
    book = {Path(r["notebook"]).parent.name: r for r in csv.DictReader((work / "gb" / "gradebook.csv").open())}
    assert students["ann"]["ex01"] == "2" and students["ann"]["changed"] == "", students["ann"]
    assert "the check cell of exercise 01 was changed or deleted" in students["ben"]["changed"], students["ben"]
    assert not any("not compared" in r["changed"] for r in students.values()), students
    assert f"kernel uses {bin_dir.parent}" in book["ben"]["reason"], "the kernel runs the installed wheel"
