"""`swkv-teach export gradescope`: the zip in Gradescope's layout, and its run_autograder on real submissions.

Each submission gets its own autograder root, as on Gradescope (one container per submission):
``root/submission/*.ipynb`` in, ``root/results/results.json`` out. The unzipped ``run_autograder``
runs exactly as Gradescope calls it, with this venv's Python standing in for the one ``setup.sh``
installs (``SWKV_PYTHON``), so nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from swkv_teach.grading import EXERCISES
from swkv_teach.grading.export_gradescope import main
from tests.test_exercises_nbval import spliced

ROOT = Path(__file__).resolve().parent.parent
GRADED = "02,03"  # two exercises keep the test short; the engine is the same for all
MASK, RING = "02_sliding_window_mask.ipynb", "03_ring_buffer.ipynb"
pytestmark = pytest.mark.slow


def answer_cell(nb):
    return next(n for n, c in enumerate(nb.cells) if c.metadata.get("swkv", {}).get("role") == "answer")


def mask_answer(body: str):
    """Exercise 02 with ``body`` as the function's answer."""
    ex = nbformat.read(ROOT / "exercises" / MASK, as_version=4)
    return spliced(MASK, {answer_cell(ex): [body]})


def submissions() -> dict[str, dict[str, object]]:
    """{case: {file name: notebook, or bytes for a raw file}}; the 'missing' case has no submission folder."""
    solved = {MASK: spliced(MASK), RING: spliced(RING)}
    return {
        "solved": solved,
        "unsolved": {MASK: (ROOT / "exercises" / MASK).read_bytes()},
        "malformed": {MASK: nbformat.writes(spliced(MASK)).encode()[:500]},
        "loop": {MASK: mask_answer("    while True:\n        pass")},
        "dead": {MASK: mask_answer("    import os\n    os._exit(3)")},
        "missing": {},
    }


@pytest.fixture(scope="module")
def autograder(tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    assert main([str(out), "--exercises", GRADED, "--timeout", "8", "--memory", "2G", "--cpu", "120"]) == 0
    return out / "autograder.zip"


@pytest.fixture(scope="module")
def results(autograder, tmp_path_factory):
    """{case: (results.json as a dict, seconds run_autograder took)}."""
    source = tmp_path_factory.mktemp("source")
    with zipfile.ZipFile(autograder) as z:
        z.extractall(source)
        for info in z.infolist():  # ZipFile.extractall drops the mode bits; restore them as unzip does
            os.chmod(source / info.filename, (info.external_attr >> 16) & 0o777)

    def run(case, files):
        root = tmp_path_factory.mktemp(case)
        if case != "missing":
            (root / "submission").mkdir()
        for name, nb in files.items():
            target = root / "submission" / name
            target.write_bytes(nb) if isinstance(nb, bytes) else nbformat.write(nb, target)
        env = dict(os.environ, AUTOGRADER_ROOT=str(root), SWKV_PYTHON=sys.executable, OMP_NUM_THREADS="1")
        t0 = time.perf_counter()
        proc = subprocess.run([str(source / "run_autograder")], env=env, cwd=root, capture_output=True, text=True,
                              timeout=600)
        took = time.perf_counter() - t0
        assert proc.returncode == 0, proc.stderr[-2000:]
        return case, (json.loads((root / "results" / "results.json").read_text()), took)

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
    assert config == {"exercises": ["02", "03"], "timeout": 8, "memory": "2G", "cpu": 120}
    with zipfile.ZipFile(autograder) as z, zipfile.ZipFile(z.open(wheels[0])) as wheel:
        inside = wheel.namelist()
    assert "swkv_teach/grading/grade.py" in inside and any(n.startswith("swkv_teach/data/") for n in inside)


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
    ("malformed", "These files are not valid notebooks, so they were not graded: 02_sliding_window_mask.ipynb"),
    ("loop", "longer than 8 s"),
    ("dead", "kernel died"),
    ("missing", "No .ipynb file in your submission"),
])
def test_a_broken_submission_scores_zero_with_an_explanation(results, case, words):
    result = results[case][0]
    assert result["score"] == 0
    assert words.lower() in json.dumps(result, ensure_ascii=False).lower(), result
