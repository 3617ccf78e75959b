"""Grading with nbval: `pytest --nbval-lax exercises/NN.ipynb` passes exactly when the answers are right.

Every notebook runs in its own kernel, so all of them are built in tmp_path and run by two pytest
processes side by side (one per core); the tests below read the outcome per notebook.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from swkv_teach.grading.exercises import fill_in, solution_regions

ROOT = Path(__file__).resolve().parent.parent
NAMES = sorted(p.name for p in (ROOT / "exercises").glob("*.ipynb"))
WRONG_MASK = "    i, j = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]\n    return j <= i"

pytestmark = pytest.mark.slow


def spliced(name: str, answers: dict | None = None):
    """The exercise with the solution's regions (or ``answers[cell index]``) put back into its stubs."""
    ex = nbformat.read(ROOT / "exercises" / name, as_version=4)
    sol = nbformat.read(ROOT / "solutions" / name, as_version=4)
    for n, (ce, cs) in enumerate(zip(ex.cells, sol.cells)):
        if ce.cell_type == "code" and "# YOUR CODE HERE" in ce.source:
            ce.source = fill_in(ce.source, (answers or {}).get(n) or solution_regions(cs.source))
    return ex


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """{notebook file name: 'passed' | 'failed'} from real `pytest --nbval-lax` runs."""
    d = tmp_path_factory.mktemp("nbval")
    for name in NAMES:
        (d / f"stub_{name}").write_bytes((ROOT / "exercises" / name).read_bytes())
        nbformat.write(spliced(name), d / f"filled_{name}")
    ex = nbformat.read(ROOT / "exercises" / "01_sliding_window_mask.ipynb", as_version=4)
    answer = next(n for n, c in enumerate(ex.cells) if c.metadata.get("swkv", {}).get("role") == "answer")
    wrong = spliced("01_sliding_window_mask.ipynb", {answer: [WRONG_MASK]})
    nbformat.write(wrong, d / "wrong_02_sliding_window_mask.ipynb")
    files = sorted(p.name for p in d.glob("*.ipynb"))
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--nbval-lax", "--rootdir", str(d), "-q", "-rA"]
    procs = [subprocess.Popen(cmd + files[i::2], cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    out = "".join(p.communicate(timeout=900)[0] for p in procs)
    result = {f: "passed" for f in files}
    for f in re.findall(r"^FAILED (\S+?\.ipynb)::", out, re.M):
        result[f] = "failed"
    assert any(re.search(rf"^PASSED {re.escape(f)}::", out, re.M) for f in files), out[-3000:]
    return result


@pytest.mark.parametrize("name", NAMES)
def test_an_unfilled_exercise_fails(outcomes, name):
    assert outcomes[f"stub_{name}"] == "failed"


@pytest.mark.parametrize("name", NAMES)
def test_an_exercise_with_the_solution_spliced_in_passes(outcomes, name):
    assert outcomes[f"filled_{name}"] == "passed"


def test_an_exercise_with_a_wrong_answer_fails(outcomes):
    assert outcomes["wrong_02_sliding_window_mask.ipynb"] == "failed"
