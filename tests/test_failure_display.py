"""What a learner sees when a check fails, in a real kernel (issue 18).

A failed check used to show a ~55-line traceback through ``swkv_teach/grading`` before the ❌
message. IPython asks an exception for ``_render_traceback_()`` before formatting one (IPython 7.34.0,
``IPython/core/interactiveshell.py`` line 2099, the version Colab runs; IPython 9, line 2276), and
ipykernel sends the list it returns as the error output's ``traceback``. These tests run cells in a
fresh kernel with nbclient, as Jupyter and Colab do, and read that output.
"""

from __future__ import annotations

import re

import nbformat
import pytest
from nbclient import NotebookClient

from swkv_teach.grading._report import TRACEBACK_ENV

pytestmark = pytest.mark.slow

ANSI = re.compile(r"\x1b\[[0-9;]*m")
GRADER_FRAMES = ("swkv_teach/grading", "Traceback (most recent call last)", 'File "', "site-packages")

CELLS = [
    "import torch\nfrom swkv_teach.grading import check_sliding_window_mask",
    # Mistral's reference mask, W + 1 keys: a wrong answer the check names
    "def sliding_window_mask(seq_len, window_size):\n"
    "    i, j = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]\n"
    "    return (j <= i) & (j >= i - window_size)",
    "check_sliding_window_mask(sliding_window_mask)",
    # an answer that raises two calls deep in the learner's own code
    "def helper(n):\n    raise IndexError('boom in helper')\n\n"
    "def broken(seq_len, window_size):\n    return helper(seq_len)",
    "check_sliding_window_mask(broken)",
    f"%env {TRACEBACK_ENV}=1",
    "check_sliding_window_mask(broken)",
    "check_sliding_window_mask(sliding_window_mask)",
]


@pytest.fixture(scope="module")
def errors(tmp_path_factory):
    """{cell index: (ename, evalue, the traceback text the frontend shows, ANSI codes removed)}."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in CELLS])
    mp = pytest.MonkeyPatch()
    mp.delenv(TRACEBACK_ENV, raising=False)  # the kernel inherits the environment
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(tmp_path_factory.mktemp("kernel"))}}).execute()
    finally:
        mp.undo()
    found = {}
    for n, cell in enumerate(nb.cells):
        for out in cell.outputs:
            if out.output_type == "error":
                found[n] = (out.ename, out.evalue, ANSI.sub("", "\n".join(out.traceback)))
    print("\n\n".join(f"cell {n}: {e[0]}\n{e[2]}" for n, e in found.items()))
    return found


def test_a_wrong_answer_shows_the_message_and_the_hint_only(errors):
    ename, evalue, shown = errors[2]
    assert ename == "ExerciseFailed"
    assert shown.startswith("❌") and "hint:" in shown, shown
    assert shown == evalue, "the message itself, nothing before or after it"
    assert not any(frame in shown for frame in GRADER_FRAMES), shown


def test_an_answer_that_raises_shows_its_error_and_how_to_see_the_full_traceback(errors):
    ename, _, shown = errors[4]
    assert ename == "ExerciseFailed" and shown.startswith("❌"), shown
    assert "raised IndexError: boom in helper" in shown and "hint:" in shown, shown
    assert f"%env {TRACEBACK_ENV}=1" in shown.splitlines()[-1], "the last line says how to see where it raised"
    assert not any(frame in shown for frame in GRADER_FRAMES), shown


def test_with_the_env_var_the_full_traceback_is_back_with_the_learners_own_error(errors):
    ename, _, shown = errors[6]
    assert ename == "ExerciseFailed"
    assert "swkv_teach/grading" in shown, "the grader's frames, for whoever debugs the check"
    assert "raise IndexError('boom in helper')" in shown, "the learner's line that raised, in its own frame"
    assert "During handling of the above exception" in shown, "the chain the check hid is shown"
    _, _, again = errors[7]
    assert "swkv_teach/grading" in again, "and for a plain wrong answer too"


def test_only_the_failing_cells_raised(errors):
    assert sorted(errors) == [2, 4, 6, 7]
