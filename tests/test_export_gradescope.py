"""`swkv-teach export gradescope`: the zip in Gradescope's layout, and its run_autograder on real submissions.

Each submission gets its own autograder root, laid out as Gradescope lays it out (one container per
submission; gradescope/autograder_samples, docs/specs.md lines 22-27): the zip unpacked in
``root/source/``, ``run_autograder`` *copied* to ``root/run_autograder`` and run from there, with
``root`` as the working directory, ``root/submission/*.ipynb`` in, ``root/results/results.json``
out. The zip is exported with settings that all differ from the defaults, so a script that lost its
settings and graded with the defaults fails these tests. This venv's Python stands in for the one
``setup.sh`` installs (``SWKV_PYTHON``), so nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

from swkv_teach.grading import EXERCISES
from swkv_teach.grading.export_gradescope import main
from swkv_teach.grading.limits import parse_size
from tests import cap_probe
from tests.test_exercises_nbval import spliced

ROOT = Path(__file__).resolve().parent.parent
# Every setting differs from the default (all exercises, 60 s, 4G, 600 s CPU).
GRADED, TIMEOUT, MEMORY, CPU = "01,03", 12, "512M", 90
MASK, RING = "01_sliding_window_mask.ipynb", "03_ring_buffer.ipynb"
pytestmark = pytest.mark.slow


def answer_cell(nb):
    return next(n for n, c in enumerate(nb.cells) if c.metadata.get("swkv", {}).get("role") == "answer")


def mask_answer(body: str):
    """Exercise 01 with ``body`` as the function's answer."""
    ex = nbformat.read(ROOT / "exercises" / MASK, as_version=4)
    return spliced(MASK, {answer_cell(ex): [body]})


def with_probe(nb):
    """``nb`` with a first cell that raises, naming the kernel's own caps and the room it has (:mod:`cap_probe`)."""
    nb = nbformat.from_dict(nb)
    nb.cells.insert(0, nbformat.v4.new_code_cell(cap_probe.RAISING))
    return nb


def submissions() -> dict[str, dict[str, object]]:
    """{case: {file name: notebook, or bytes for a raw file}}; the 'missing' case has no submission folder."""
    solved = {MASK: spliced(MASK), RING: spliced(RING)}
    return {
        "solved": solved,
        "unsolved": {MASK: (ROOT / "exercises" / MASK).read_bytes()},
        "malformed": {MASK: nbformat.writes(spliced(MASK)).encode()[:500]},
        "loop": {MASK: mask_answer("    while True:\n        pass")},
        "dead": {MASK: mask_answer("    import os\n    os._exit(3)")},
        "probe": {MASK: with_probe(spliced(MASK))},
        "missing": {},
    }


def unzip(archive: Path, dest: Path) -> Path:
    with zipfile.ZipFile(archive) as z:
        z.extractall(dest)
        for info in z.infolist():  # ZipFile.extractall drops the mode bits; restore them as unzip does
            os.chmod(dest / info.filename, (info.external_attr >> 16) & 0o777)
    return dest


def gradescope_root(tmp: Path, autograder: Path, files: dict | None, config: bool = True) -> Path:
    """An autograder root as Gradescope builds it: ``source/`` unzipped, ``run_autograder`` copied beside it."""
    root = tmp
    unzip(autograder, root / "source")
    if not config:
        (root / "source" / "swkv_gradescope.json").unlink()
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")
    if files is not None:
        (root / "submission").mkdir()
        for name, nb in files.items():
            target = root / "submission" / name
            target.write_bytes(nb) if isinstance(nb, bytes) else nbformat.write(nb, target)
    return root


def run_autograder(script: Path, root: Path) -> tuple[dict, subprocess.CompletedProcess]:
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), SWKV_PYTHON=sys.executable, OMP_NUM_THREADS="1")
    proc = subprocess.run([str(script)], env=env, cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((root / "results" / "results.json").read_text()), proc


@pytest.fixture(scope="module")
def autograder(tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    assert main([str(out), "--exercises", GRADED, "--timeout", str(TIMEOUT), "--memory", MEMORY,
                 "--cpu", str(CPU)]) == 0
    return out / "autograder.zip"


@pytest.fixture(scope="module")
def results(autograder, tmp_path_factory):
    """{case: (results.json as a dict, seconds run_autograder took)}, each run as Gradescope runs it."""

    def run(case, files):
        root = gradescope_root(tmp_path_factory.mktemp(case), autograder, None if case == "missing" else files)
        t0 = time.perf_counter()
        result, _ = run_autograder(root / "run_autograder", root)
        return case, (result, time.perf_counter() - t0)

    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(pool.map(lambda kv: run(*kv), submissions().items()))
    print("\nrun_autograder seconds per submission: " + ", ".join(f"{c} {t:.1f}" for c, (_, t) in done.items()))
    for case, (result, _) in done.items():
        print(f"results.json ({case}):\n" + json.dumps(result, indent=1, ensure_ascii=False))
    return done


def test_the_zip_has_gradescopes_layout_and_the_course_wheel(autograder):
    with zipfile.ZipFile(autograder) as z:
        names = z.namelist()
        modes = {i.filename: (i.external_attr >> 16) for i in z.infolist()}
        setup = z.read("setup.sh").decode()
    assert {"setup.sh", "run_autograder"} <= set(names), "both must sit at the zip's root"
    assert all(modes[n] & stat.S_IXUSR for n in ("setup.sh", "run_autograder"))
    wheels = [n for n in names if n.startswith("swkv_teach-") and n.endswith(".whl")]
    assert len(wheels) == 1 and f"./{wheels[0]}" in setup
    assert "download.pytorch.org/whl/cpu" in setup, "Gradescope's graders have no GPU: a CPU torch"
    with zipfile.ZipFile(autograder) as z:
        config = json.loads(z.read("swkv_gradescope.json"))
    assert config == {"exercises": ["01", "03"], "timeout": TIMEOUT, "memory": MEMORY, "cpu": CPU}
    with zipfile.ZipFile(autograder) as z, zipfile.ZipFile(z.open(wheels[0])) as wheel:
        inside = wheel.namelist()
    assert "swkv_teach/grading/grade.py" in inside and any(n.startswith("swkv_teach/data/") for n in inside)
    released = {n.split("/")[-1] for n in inside if n.startswith("swkv_teach/released/")}
    assert released == {p.name for p in (ROOT / "exercises").glob("*.ipynb")}, "the released exercises ship inside"


def scores(result):
    return {t["name"].split(":")[0]: (t["score"], t["max_score"]) for t in result["tests"]}


def test_every_results_file_follows_the_spec(results):
    for case, (result, _) in results.items():
        assert isinstance(result["score"], (int, float)) and isinstance(result["output"], str) and result["output"]
        assert [t["name"].split(":")[0] for t in result["tests"]] == [f"Exercise {i}" for i in GRADED.split(",")], case
        for t in result["tests"]:
            assert {"name", "score", "max_score", "output"} <= set(t) and t["output"], (case, t)
        assert result["score"] == sum(t["score"] for t in result["tests"]), case


def test_a_solved_submission_scores_full_points_with_the_checks_feedback(results):
    result = results["solved"][0]
    assert scores(result) == {f"Exercise {i}": (EXERCISES[i].points,) * 2 for i in GRADED.split(",")}
    assert all("✅" in t["output"] for t in result["tests"])


def test_an_unsolved_submission_scores_zero_and_says_not_implemented(results):
    result = results["unsolved"][0]
    assert result["score"] == 0
    mask, ring = result["tests"]
    assert "not implemented" in mask["output"].lower(), mask
    assert "No submitted notebook attempts exercise 03" in ring["output"], ring


@pytest.mark.parametrize("case, words", [
    ("malformed", "These files are not valid notebooks, so they were not graded: 01_sliding_window_mask.ipynb"),
    ("loop", f"longer than {TIMEOUT} s"),
    ("dead", "kernel died"),
    ("missing", "No .ipynb file in your submission"),
])
def test_a_broken_submission_scores_zero_with_an_explanation(results, case, words):
    result = results[case][0]
    assert result["score"] == 0
    assert words.lower() in json.dumps(result, ensure_ascii=False).lower(), result


def test_the_copied_script_grades_with_the_exported_memory_and_cpu_caps(results):
    """Regression (issue 18): Gradescope runs the copy at /autograder/run_autograder, which looked for its
    settings beside itself, missed them and graded with the defaults in silence (4G, 600 s). The probe
    cell reports the caps its kernel actually ran under: MEMORY of room for its code beyond what the kernel
    maps with torch and the checks loaded (issue 35), and CPU seconds."""
    result = results["probe"][0]
    cap_probe.assert_room(cap_probe.room_seen(result["output"]), parse_size(MEMORY), CPU)
    assert scores(result)["Exercise 01"] == (EXERCISES["01"].points,) * 2, "the probe's answer is right"


def test_the_copied_script_fails_loudly_without_its_settings(autograder, tmp_path):
    """No swkv_gradescope.json under source/ nor beside the script: 0 points and a reason, never the defaults."""
    root = gradescope_root(tmp_path, autograder, {MASK: spliced(MASK)}, config=False)
    result, proc = run_autograder(root / "run_autograder", root)
    assert result["score"] == 0 and "tests" not in result, result
    assert "swkv_gradescope.json is missing" in result["output"], result["output"]
    assert str(root / "source" / "swkv_gradescope.json") in result["output"], "it says where it looked"
    assert "FileNotFoundError" in proc.stdout + proc.stderr, "the teacher's log (results/stdout) says so too"


def test_an_unzipped_copy_run_in_place_reads_the_settings_beside_it(autograder, tmp_path):
    """Outside Gradescope (a teacher trying the zip), the script finds its settings in its own folder."""
    here = unzip(autograder, tmp_path / "unzipped")
    root = tmp_path / "root"
    root.mkdir()
    result, proc = run_autograder(here / "run_autograder", root)
    assert f"settings from {here / 'swkv_gradescope.json'}" in proc.stdout, proc.stdout[-1500:]
    assert [t["name"].split(":")[0] for t in result["tests"]] == ["Exercise 01", "Exercise 03"]


def test_setup_sh_installs_a_cpu_torch_at_the_course_floor_and_checks_python(autograder):
    """setup.sh pins the floor pyproject declares (read here with tomllib, not from the wheel), on the CPU index."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch = next(d for d in project["dependencies"] if re.match(r"torch\b", d)).replace(" ", "")
    floor = re.search(r">=(\d+)\.(\d+)", project["requires-python"]).groups()
    with zipfile.ZipFile(autograder) as z:
        setup = z.read("setup.sh").decode()
    assert f'pip install -q "{torch}" --index-url https://download.pytorch.org/whl/cpu' in setup, setup
    assert f"sys.version_info >= ({floor[0]}, {floor[1]})" in setup, setup
    assert subprocess.run(["bash", "-n"], input=setup, text=True).returncode == 0, "setup.sh is valid bash"


def test_setup_sh_installs_transformers_only_when_an_exercise_needs_it(tmp_path):
    """Exercise 11's check runs tiny transformers models: its assignment's setup.sh installs the course with
    its `hf` extra (whose floor pyproject declares); an assignment without it installs the bare course."""
    from swkv_teach.grading.export_gradescope import EXTRA_FOR, _setup_sh, course_wheel

    hf_ids = [e.id for e in EXERCISES.values() if e.slug in EXTRA_FOR]
    assert hf_ids == ["11"], "the HF cache-layer exercise is the one needing transformers"
    wheel = course_wheel(tmp_path)
    with_hf, without = _setup_sh(wheel, ["03", "11"]), _setup_sh(wheel, ["01", "03"])
    assert f'pip install -q "./{wheel.name}[hf]" ipykernel' in with_hf, with_hf
    assert f'pip install -q "./{wheel.name}" ipykernel' in without, without
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("transformers>=") for d in extras["hf"]), "the hf extra brings transformers"


def test_a_python_that_cannot_build_wheels_is_told_what_to_install(monkeypatch, tmp_path):
    """A fresh venv's setuptools (65.5) has no bdist_wheel and no wheel package beside it: pip's "invalid command
    'bdist_wheel'" reached the teacher raw. Now the export says what is missing and what to run."""
    import setuptools

    from swkv_teach.grading.export_gradescope import build_wheel

    monkeypatch.setattr(setuptools, "__version__", "65.5.0")
    monkeypatch.setitem(sys.modules, "wheel", None)
    with pytest.raises(ValueError, match=r"needs setuptools >= 70\.1 or the wheel package; this Python has "
                                         r"setuptools 65\.5 and no wheel: .* -m pip install -U setuptools"):
        build_wheel(ROOT, tmp_path)
    monkeypatch.undo()
    from swkv_teach.grading.export_gradescope import _wheel_builder_missing

    if _wheel_builder_missing() is None:  # this Python's own setuptools (or wheel) builds it
        assert build_wheel(ROOT, tmp_path).name.startswith("swkv_teach-")
