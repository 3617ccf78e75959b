"""`swkv-teach grade`: every submission gets a row and a reason, hostile ones included; none is modified."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import nbformat
import pytest

from swkv_teach.grading.grade import find_exercises, main
from tests.test_exercises_nbval import spliced

ROOT = Path(__file__).resolve().parent.parent
MASK = "02_sliding_window_mask.ipynb"
pytestmark = pytest.mark.slow


def with_cell(nb, index, source):
    nb = nbformat.from_dict(nb)
    nb.cells.insert(index, nbformat.v4.new_code_cell(source))
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    d = tmp_path_factory.mktemp("submissions")
    good = spliced(MASK)
    check = next(n for n, c in enumerate(good.cells) if c.metadata.get("swkv", {}).get("role") == "check")
    nbformat.write(good, d / "alice_02_sliding_window_mask.ipynb")
    nbformat.write(with_cell(good, 3, "while True:\n    pass"), d / "loop.ipynb")
    nbformat.write(with_cell(good, 3, "import os\nos._exit(1)"), d / "crash.ipynb")
    nbformat.write(with_cell(good, check, "raise ValueError('oops')"), d / "raises.ipynb")
    deleted = nbformat.from_dict(good)
    del deleted.cells[check]
    nbformat.write(deleted, d / "deleted_check_02_sliding_window_mask.ipynb")
    reordered = nbformat.from_dict(good)
    reordered.cells.insert(2, reordered.cells.pop(check))  # the check before the answer
    nbformat.write(reordered, d / "reordered.ipynb")
    (d / "truncated.ipynb").write_bytes((d / "loop.ipynb").read_bytes()[:400])
    (d / "stub.ipynb").write_bytes((ROOT / "exercises" / MASK).read_bytes())
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in d.iterdir()}
    out = tmp_path_factory.mktemp("out")
    rc = main([str(d), "--out", str(out), "--timeout", "10", "--jobs", "2"])
    rows = {Path(r["notebook"]).name: r for r in csv.DictReader((out / "gradebook.csv").open())}
    return rc, rows, out, d, before


def test_exit_zero_and_one_row_per_notebook(graded):
    rc, rows, out, d, before = graded
    assert rc == 0
    assert set(rows) == set(before)
    assert len(list((out / "feedback").glob("*.txt"))) == len(before)


def test_submissions_are_never_modified(graded):
    _, _, _, d, before = graded
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in d.iterdir()} == before


def test_right_answers_score_full_points(graded):
    rows = graded[1]
    for name in ("alice_02_sliding_window_mask.ipynb", "reordered.ipynb", "deleted_check_02_sliding_window_mask.ipynb"):
        assert rows[name]["ex02"] == "2" and rows[name]["total"] == "2", rows[name]
    assert rows["alice_02_sliding_window_mask.ipynb"]["status"] == "ok"


def test_hostile_notebooks_get_a_reason(graded):
    rows = graded[1]
    assert rows["loop.ipynb"]["status"] == "timeout" and "10 s" in rows["loop.ipynb"]["reason"]
    assert rows["loop.ipynb"]["ex02"] == "2", "an interrupted loop does not cost the later checks"
    assert rows["crash.ipynb"]["status"] == "kernel died" and rows["crash.ipynb"]["total"] == "0"
    assert rows["truncated.ipynb"]["status"] == "unreadable"
    assert rows["raises.ipynb"]["status"] == "errors" and "ValueError: oops" in rows["raises.ipynb"]["reason"]
    assert rows["stub.ipynb"]["ex02"] == "0" and "not implemented" in rows["stub.ipynb"]["reason"]


def test_feedback_carries_the_checks_message(graded):
    out = graded[2]
    text = (out / "feedback").glob("*stub.ipynb.txt")
    body = next(text).read_text()
    assert "0/2" in body and "not implemented yet" in body


def test_exercises_are_found_by_metadata_check_call_or_file_name():
    nb = nbformat.v4.new_notebook()
    assert find_exercises(nb, "x.ipynb") == []
    assert find_exercises(nb, "bob_04_lru_cache.ipynb") == ["04"]
    nb.cells.append(nbformat.v4.new_code_cell("check_sink_cache(SinkCache)"))
    nb.cells.append(nbformat.v4.new_markdown_cell("", metadata={"swkv": {"exercise": "01"}}))
    assert find_exercises(nb, "x.ipynb") == ["01", "05"]
