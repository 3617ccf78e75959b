"""`swkv-teach grade`: an *official* check that runs past --timeout is that exercise's failure, not a cell's timeout.

Regression (issue 24): a learner's function that loops forever only when the check
calls it made the official check cell time out, and the row read "timeout: cell 3 of
2 ran longer than ...": the wrong status, and a cell the learner's notebook does not
have. The learner's own cells all finished, so the row is "failed", the exercise
scores 0, and the reason and the feedback say the check ran past the limit.
"""

from __future__ import annotations

import csv

import nbformat
import pytest

from swkv_teach.grading import EXERCISES
from swkv_teach.grading.grade import main

pytestmark = pytest.mark.slow
TIMEOUT = 30  # seconds per cell: the learner's two cells take a few (an import), the check loops forever
MASK = next(e for e in EXERCISES.values() if e.check == "check_sliding_window_mask")  # its number may change


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    d = tmp_path_factory.mktemp("submissions")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import swkv_teach.grading  # warm: the official check's import is then instant"),
        nbformat.v4.new_code_cell("def sliding_window_mask(seq_len, window_size):\n    while True:\n        pass",
                                  metadata={"swkv": {"exercise": MASK.id}}),
    ]
    nbformat.write(nb, d / "loops_in_the_check.ipynb")
    out = tmp_path_factory.mktemp("out")
    rc = main([str(d), "--out", str(out), "--timeout", str(TIMEOUT), "--jobs", "1"])
    rows = list(csv.DictReader((out / "gradebook.csv").open()))
    feedback = (out / "feedback").glob("*.txt")
    return rc, rows, "\n".join(p.read_text() for p in feedback)


def test_the_row_is_failed_with_zero_points_not_a_cell_timeout(graded):
    rc, rows, _ = graded
    assert rc == 0 and len(rows) == 1
    row = rows[0]
    assert row["status"] == "failed", row
    assert row[f"ex{MASK.id}"] == "0" and row["total"] == "0", row


def test_the_reason_names_the_exercise_and_the_limit_not_a_cell_beyond_the_notebook(graded):
    row = graded[1][0]
    assert f"exercise {MASK.id} failed" in row["reason"], row
    assert f"ran longer than {TIMEOUT} s" in row["reason"], row
    assert "cell 3" not in row["reason"] and "of 2" not in row["reason"], "the notebook has two cells"


def test_the_feedback_says_the_check_ran_past_the_limit(graded):
    text = graded[2]
    assert f"[{MASK.id}] check_sliding_window_mask(sliding_window_mask): failed, 0/{MASK.points} points" in text, text
    assert f"the check ran longer than {TIMEOUT} s" in text, text
