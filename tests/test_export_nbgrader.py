"""`swkv-teach export nbgrader`: a course folder the real nbgrader releases and autogrades.

The metadata tests run everywhere. The end-to-end test needs nbgrader 0.9 (the ``nbgrader``
extra; ``.ci/run`` installs it) and skips, saying so, without it: it runs
``nbgrader generate_assignment`` and ``nbgrader autograde`` exactly as a teacher would, on a
right, an unanswered and a partly wrong submission, and reads the points from nbgrader's gradebook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from swkv_teach.grading import EXERCISES
from swkv_teach.grading.exercises import fill_in, solution_regions
from swkv_teach.grading.export_nbgrader import export_nbgrader, main, nbgrader_notebook
from swkv_teach.grading.limits import parse_size
from tests import cap_probe
from tests.test_exercises_nbval import WRONG_MASK

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"


def roles(nb):
    return [((c.metadata.get("swkv") or {}).get("role"), c.metadata.get("nbgrader")) for c in nb.cells
            if c.cell_type == "code"]


def test_every_solution_notebook_with_an_exercise_is_exported_with_nbgrader_metadata(tmp_path):
    written = export_nbgrader(tmp_path, SOLUTIONS, "hw1")
    assert (tmp_path / "nbgrader_config.py").exists()
    assert {p.name for p in written} == {p.name for p in SOLUTIONS.glob("*.ipynb")}
    exported_points = {}
    for path in written:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert path.parent == tmp_path / "source" / "hw1"
        for cell in nb.cells:
            swkv, meta = cell.metadata.get("swkv") or {}, cell.metadata.get("nbgrader")
            if cell.cell_type == "markdown":
                assert meta is None and "colab.research.google.com" not in cell.source, "badge to the solutions"
                continue
            assert meta["schema_version"] == 3 and meta["grade_id"] and cell.outputs == []
            if swkv.get("role") == "answer":
                assert (meta["solution"], meta["grade"], meta["locked"]) == (True, False, False)
                assert "### BEGIN SOLUTION" in cell.source and "### END SOLUTION" in cell.source
            elif swkv.get("role") == "check":
                ex = EXERCISES[swkv["exercise"]]
                assert (meta["solution"], meta["grade"], meta["locked"]) == (False, True, True)
                assert cell.source.strip() == ex.call
                exported_points[ex.id] = meta["points"]
            else:
                assert (meta["solution"], meta["grade"], meta["locked"]) == (False, False, True), cell.source[:80]
        ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata]
        assert len(ids) == len(set(ids)), f"{path.name}: grade ids must be unique"
    # every exercise whose solution ships is graded, with the registry's points
    shipped = {str(c.metadata["swkv"]["exercise"]) for p in SOLUTIONS.glob("*.ipynb")
               for c in nbformat.read(p, as_version=4).cells if (c.metadata.get("swkv") or {}).get("role") == "check"}
    assert exported_points == {i: EXERCISES[i].points for i in shipped}


def test_the_solutions_themselves_are_not_changed(tmp_path):
    before = {p.name: p.read_bytes() for p in SOLUTIONS.glob("*.ipynb")}
    export_nbgrader(tmp_path, SOLUTIONS)
    assert {p.name: p.read_bytes() for p in SOLUTIONS.glob("*.ipynb")} == before


def test_a_cell_naming_an_unknown_exercise_is_refused():
    nb = nbformat.read(SOLUTIONS / "01_sliding_window_mask.ipynb", as_version=4)
    check = next(c for c in nb.cells if (c.metadata.get("swkv") or {}).get("role") == "check")
    check.metadata["swkv"]["exercise"] = "99"
    with pytest.raises(ValueError, match="exercise '99' is not in EXERCISES"):
        nbgrader_notebook(nb, "x.ipynb")


def test_command_line_errors_are_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "out"), "--solutions", str(tmp_path)]) == 2
    assert "no solution notebooks" in capsys.readouterr().err
    assert main([str(tmp_path / "out"), "--assignment", "a b"]) == 2
    assert "assignment must be" in capsys.readouterr().err
    assert main([str(tmp_path / "out"), "--cpu", "lots"]) == 2
    assert "--cpu must be a number of seconds, or none; got 'lots'" in capsys.readouterr().err
    assert main([str(tmp_path / "out"), "--memory", "much"]) == 2
    assert "memory must be a size like 2G" in capsys.readouterr().err
    assert not (tmp_path / "out").exists(), "nothing written when an argument is wrong"


# ---------------------------------------------------------------------------- the real nbgrader
def nbgrader_or_skip() -> Path:
    exe = Path(sys.executable).parent / "nbgrader"
    if not exe.exists():
        reason = "nbgrader is not installed (pip install -e '.[nbgrader]'; .ci/run installs it)"
        if os.environ.get("SWKV_REQUIRE_NBGRADER") == "1":
            pytest.fail(f"{reason}, and SWKV_REQUIRE_NBGRADER=1 says this test must run")
        pytest.skip(reason)
    return exe


def answered(released: Path, wrong: dict[str, str] | None = None):
    """The released notebook with the solution's answers put in its stubs (or ``wrong[exercise id]``)."""
    nb = nbformat.read(released, as_version=4)
    sol = nbformat.read(SOLUTIONS / released.name, as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: solution_regions(c.source) for c in nbgrader_notebook(sol).cells
               if c.cell_type == "code" and c.metadata["nbgrader"]["solution"]}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            ex_id = cell.metadata["swkv"]["exercise"]
            cell.source = fill_in(cell.source, [wrong[ex_id]] if ex_id in (wrong or {}) else answers[meta["grade_id"]])
    return nb


MEMORY, CPU = "512M", 90  # not the defaults (4G, 600 s)
PROBE_MARK = cap_probe.MARK


def with_probe(nb):
    """``nb`` with a first cell printing its kernel's caps and the room they leave (:mod:`cap_probe`)."""
    nb = nbformat.from_dict(nb)
    nb.cells.insert(0, nbformat.v4.new_code_cell(cap_probe.SOURCE))
    return nb


@pytest.fixture(scope="module")
def gradebook(tmp_path_factory):
    """{student: {notebook: {exercise id: points}}} and {student: total} after nbgrader autograde."""
    exe = nbgrader_or_skip()
    course = tmp_path_factory.mktemp("course")
    assert main([str(course), "--assignment", "swkv", "--timeout", "60", "--solutions", str(SOLUTIONS),
                 "--memory", MEMORY, "--cpu", str(CPU)]) == 0
    env = dict(os.environ, PATH=f"{exe.parent}{os.pathsep}{os.environ['PATH']}")  # nbgrader calls `alembic`

    def nbgrader(*args):
        run = subprocess.run([str(exe), *args], cwd=course, env=env, capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        return run

    nbgrader("generate_assignment", "swkv")
    released = sorted((course / "release" / "swkv").glob("*.ipynb"))
    assert released, "generate_assignment released nothing"
    for nb_path in released:  # the released copy carries stubs, not answers
        assert "### BEGIN SOLUTION" not in nb_path.read_text()
    submissions = {
        "right": {p.name: answered(p) for p in released},
        "blank": {p.name: nbformat.read(p, as_version=4) for p in released[:2]},
        "wrong": {p.name: answered(p, {"01": WRONG_MASK}) for p in released
                  if p.name.startswith(("02_", "03_"))},
        "cheat": {p.name: answered(p, {"01": WRONG_MASK}) for p in released if p.name.startswith("01_")},
        "probe": {p.name: with_probe(answered(p)) for p in released if p.name.startswith("01_")},
    }
    cheat = next(iter(submissions["cheat"].values()))
    next(c for c in cheat.cells if c.metadata.get("nbgrader", {}).get("grade")).source = "print('all good')"
    for student, notebooks in submissions.items():
        d = course / "submitted" / student / "swkv"
        d.mkdir(parents=True)
        for name, nb in notebooks.items():
            nbformat.write(nb, d / name)
    autograde = nbgrader("autograde", "swkv")
    nbgrader("export", "--to", str(course / "grades.csv"))

    from nbgrader.api import Gradebook

    points, totals = {}, {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for student in submissions:
            sub = gb.find_submission("swkv", student)
            totals[student] = (sub.score, sub.max_score)
            points[student] = {nb.name: {g.cell.name.split("-")[0][2:]: g.score for g in nb.grades}
                               for nb in sub.notebooks}
    print("\nnbgrader grades.csv:\n" + (course / "grades.csv").read_text())
    print("points per exercise: " + json.dumps({s: {k: v for nb in p.values() for k, v in nb.items()}
                                                for s, p in points.items()}))
    probe = nbformat.read(course / "autograded" / "probe" / "swkv" / "01_sliding_window_mask.ipynb", as_version=4)
    seen = "".join(o.get("text", "") for c in probe.cells if PROBE_MARK in c.source for o in c.outputs)
    return points, totals, submissions, {"log": autograde.stdout + autograde.stderr, "probe": seen}


@pytest.mark.slow
def test_nbgrader_autograde_gives_full_points_to_right_answers(gradebook):
    points, totals, submissions = gradebook[:3]
    max_points = sum(EXERCISES[i].points for nb in points["right"].values() for i in nb)
    assert totals["right"] == (max_points, max_points)
    for name, scores in points["right"].items():
        assert all(scores[i] == EXERCISES[i].points for i in scores), (name, scores)
    assert len(points["right"]) == len(submissions["right"])


@pytest.mark.slow
def test_nbgrader_autograde_gives_zero_to_an_unanswered_notebook(gradebook):
    points, totals, submissions = gradebook[:3]
    for name in submissions["blank"]:
        nb = name.removesuffix(".ipynb")
        assert points["blank"][nb] and all(v == 0 for v in points["blank"][nb].values()), points["blank"][nb]
    assert totals["blank"][0] == 0


@pytest.mark.slow
def test_nbgrader_autograde_gives_zero_to_the_wrong_exercise_only(gradebook):
    points = gradebook[0]["wrong"]
    assert points["01_sliding_window_mask"] == {"01": 0}
    assert points["03_ring_buffer"] == {"03": EXERCISES["03"].points}


def test_export_names_its_platforms(capsys):
    from swkv_teach.grading.export import main as export

    assert export(["-h"]) == 0 and "nbgrader" in capsys.readouterr().out
    assert export(["moodle"]) == 2 and "unknown platform 'moodle'" in capsys.readouterr().err


@pytest.mark.slow
def test_nbgrader_puts_back_a_locked_check_cell_the_student_edited(gradebook):
    """The cheat replaced the check under a wrong answer by a print; autograde runs the released check."""
    assert gradebook[0]["cheat"]["01_sliding_window_mask"] == {"01": 0}


@pytest.mark.slow
def test_nbgrader_runs_student_code_under_the_exported_memory_and_cpu_caps(gradebook):
    """Issue 18: the nbgrader route had no memory or CPU cap. The probe cell, a student's own, reports the
    limits of the kernel nbgrader autograde ran it in: MEMORY of room beyond what the kernel maps with torch
    and the checks loaded (issue 35), a mapping past that room refused."""
    points, _, _, extra = gradebook
    cap_probe.assert_room(cap_probe.room_seen(extra["probe"]), parse_size(MEMORY), CPU)
    assert points["probe"]["01_sliding_window_mask"] == {"01": EXERCISES["01"].points}, "right answers still pass"


@pytest.mark.slow
def test_nbgrader_kernels_print_no_tcp_warning(gradebook):
    assert "without encryption" not in gradebook[3]["log"], gradebook[3]["log"][-3000:]


def test_the_export_writes_the_capped_kernel_and_names_it_in_the_config(tmp_path):
    export_nbgrader(tmp_path, SOLUTIONS, memory="3G", cpu=45)
    spec = json.loads((tmp_path / "kernels" / "swkv-capped" / "kernel.json").read_text())
    assert spec["argv"][:3] == ["python", "-m", "swkv_teach.grading.kernel"]
    assert spec["argv"][3:] == ["--memory", "3G", "--cpu", "45", "-f", "{connection_file}"]
    assert spec["env"] == {"MALLOC_ARENA_MAX": "2"}, "threads share two malloc arenas: the room is the same on any machine"
    config = (tmp_path / "nbgrader_config.py").read_text()
    assert 'c.Execute.kernel_name = "swkv-capped"' in config and "JUPYTER_PATH" in config
    assert 'c.KernelManager.transport = "ipc"' in config
    with pytest.raises(ValueError, match="memory must be a size"):
        export_nbgrader(tmp_path / "bad", SOLUTIONS, memory="lots")


@pytest.mark.slow
def test_the_capped_kernel_caps_itself_without_nbgrader(tmp_path, monkeypatch):
    """The kernelspec alone, started by nbclient as any Jupyter frontend would: the limits hold from the first cell."""
    from nbclient import NotebookClient

    export_nbgrader(tmp_path, SOLUTIONS, memory="1.5G", cpu=30)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cap_probe.SOURCE),
                                         nbformat.v4.new_code_cell("import sys; print('torch' in sys.modules)")])
    NotebookClient(nb, kernel_name="swkv-capped", timeout=120).execute()
    cap_probe.assert_room(cap_probe.room_seen(nb.cells[0].outputs[0]["text"]), 3 * 2**29, 30)
    assert nb.cells[1].outputs[0]["text"].strip() == "True", "torch was loaded before the cap, not charged to the code"
