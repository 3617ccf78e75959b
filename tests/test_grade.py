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
MASK = "01_sliding_window_mask.ipynb"
pytestmark = pytest.mark.slow


def with_cell(nb, index, source):
    nb = nbformat.from_dict(nb)
    nb.cells.insert(index, nbformat.v4.new_code_cell(source))
    return nb


def role_cell(nb, role):
    return next(c for c in nb.cells if c.metadata.get("swkv", {}).get("role") == role)


def wrong(name=MASK):
    """A wrong answer: W + 1 keys, Mistral's reference; its own check cell raises the verdict."""
    nb = spliced(name)
    role_cell(nb, "answer").source = role_cell(nb, "answer").source.replace("j > i - window_size", "j >= i - window_size")
    return nb


def faked_wrong(name=MASK):
    """The wrong answer whose check cell was replaced by a fake success line."""
    nb = wrong(name)
    role_cell(nb, "check").source = "print('✅ check_sliding_window_mask: all cases passed')"
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
    nbformat.write(faked_wrong(), d / "fake_check.ipynb")
    nbformat.write(wrong(), d / "wrong.ipynb")
    nbformat.write(with_cell(wrong(), 3, "raise ValueError('oops')"), d / "wrong_and_raises.ipynb")
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
        assert rows[name]["ex01"] == "2" and rows[name]["total"] == "2", rows[name]
    assert rows["alice_02_sliding_window_mask.ipynb"]["status"] == "ok"


def test_hostile_notebooks_get_a_reason(graded):
    rows = graded[1]
    assert rows["loop.ipynb"]["status"] == "timeout" and "10 s" in rows["loop.ipynb"]["reason"]
    assert rows["loop.ipynb"]["ex01"] == "2", "an interrupted loop does not cost the later checks"
    assert rows["crash.ipynb"]["status"] == "kernel died" and rows["crash.ipynb"]["total"] == "0"
    assert rows["truncated.ipynb"]["status"] == "unreadable"
    assert rows["raises.ipynb"]["status"] == "errors" and "ValueError: oops" in rows["raises.ipynb"]["reason"]
    assert rows["stub.ipynb"]["ex01"] == "0" and "not implemented" in rows["stub.ipynb"]["reason"]


def test_a_failed_official_check_is_status_failed_even_behind_a_fake_success_line(graded):
    rows = graded[1]
    fake, honest = rows["fake_check.ipynb"], rows["stub.ipynb"]
    assert fake["ex01"] == "0" and fake["total"] == "0", fake
    assert fake["status"] == "failed", "the official check failed; the fake ✅ must not make the row look ok"
    assert "exercise 01 failed" in fake["reason"], fake
    assert honest["status"] == "failed", "an honest wrong notebook gets the same status"
    assert rows["raises.ipynb"]["status"] == "errors", "a right answer beside a raising cell is still 'errors'"


def test_the_reason_gives_the_verdict_once_and_names_other_cells_that_raised(graded):
    rows = graded[1]
    alone, beside = rows["wrong.ipynb"], rows["wrong_and_raises.ipynb"]
    assert alone["status"] == beside["status"] == "failed"
    assert alone["reason"].startswith("exercise 01 failed: "), alone
    verdict = alone["reason"].removeprefix("exercise 01 failed: ")
    # the learner's own check cell raised the same verdict: it is not repeated as "a cell raised"
    assert "raised" not in alone["reason"] and alone["reason"].count(verdict) == 1, alone
    assert beside["reason"].count(verdict) == 1, beside
    assert beside["reason"].endswith("; 1 other cell raised, first: cell 4: ValueError: oops"), beside


def test_reasons_and_status_lines_are_cut_at_a_word_and_feedback_ends_with_a_newline(graded):
    rows, out = graded[1], graded[2]
    for row in rows.values():
        reason = row["reason"]
        assert len(reason) <= 600, row
        if reason.endswith("…"):
            assert reason[-2] in " .;:)" or reason[:-1].split()[-1].isalnum(), reason
    for f in (out / "feedback").glob("*.txt"):
        body = f.read_text()
        assert body.endswith("\n") and not body.endswith("\n\n"), f.name
        status = next(ln for ln in body.splitlines() if ln.startswith("Status:"))
        assert status.endswith(")"), status


def test_feedback_carries_the_checks_message(graded):
    out = graded[2]
    text = (out / "feedback").glob("*stub.ipynb.txt")
    body = next(text).read_text()
    assert "0/2" in body and "not implemented yet" in body


def test_clip_cuts_at_a_sentence_or_word_boundary_with_an_ellipsis():
    from swkv_teach.grading.grade import _first_line, clip

    assert clip("short enough", 240) == "short enough"
    words = "the mask lets query 7 see key 2, which a window of 5 would exclude; " * 3 + "then this would change"
    cut = clip(words, 100)
    assert len(cut) <= 100 and cut.endswith("…"), cut
    assert words.startswith(cut[:-1].rstrip(" …")), "a prefix of the text, nothing invented"
    assert cut[:-1].rstrip(" .;:,") in words and words[len(cut[:-1].rstrip()):][:1] in " ;", cut
    one_word = clip("x" * 300, 50)
    assert len(one_word) <= 50 and one_word.endswith("…")
    long = "❌ case W=5\n" + "slot 3 holds key 1 where key 6 was expected and this " * 10 + "would change"
    first = _first_line(long)
    assert len(first) <= 240 and first.endswith("…") and not first.endswith("chang…"), first
    assert first.startswith("case W=5: slot 3 holds key 1")


def test_exercises_are_found_by_metadata_check_call_or_file_name():
    nb = nbformat.v4.new_notebook()
    assert find_exercises(nb, "x.ipynb") == []
    assert find_exercises(nb, "bob_06_lru_cache.ipynb") == ["06"]
    nb.cells.append(nbformat.v4.new_code_cell("check_sink_cache(SinkCache)"))
    nb.cells.append(nbformat.v4.new_markdown_cell("", metadata={"swkv": {"exercise": "02"}}))
    assert find_exercises(nb, "x.ipynb") == ["02", "07"]


# ------------------------------------------------------------------ a class: one folder per student
RING = "03_ring_buffer.ipynb"
HOG = "hog = []\nwhile True:\n    hog.append(bytearray(64 * 2**20))  # 64 MiB at a time, never freed"


def check_index(nb):
    return next(n for n, c in enumerate(nb.cells) if c.metadata.get("swkv", {}).get("role") == "check")


@pytest.fixture(scope="module")
def classroom(tmp_path_factory):
    subs = tmp_path_factory.mktemp("class")
    good = spliced(MASK)
    edited = nbformat.from_dict(good)
    edited.cells[check_index(edited)].source = "print('trust me')"  # the official check still runs
    notebooks = {
        "alice": {MASK: good, RING: spliced(RING)},
        "bob": {MASK: nbformat.read(ROOT / "exercises" / MASK, as_version=4)},
        "carol": {MASK: edited},
        "dave": {MASK: with_cell(good, check_index(good) + 1, HOG)},
        "erin": {MASK: faked_wrong()},
    }
    for student, files in notebooks.items():
        (subs / student).mkdir()
        for name, nb in files.items():
            nbformat.write(nb, subs / student / name)
    out = tmp_path_factory.mktemp("class-out")
    rc = main([str(subs), "--out", str(out), "--timeout", "20", "--jobs", "2", "--memory", "512M",
               "--released", str(ROOT / "exercises")])
    assert rc == 0
    students = {r["student"]: r for r in csv.DictReader((out / "students.csv").open())}
    book = {Path(r["notebook"]).parent.name: r for r in csv.DictReader((out / "gradebook.csv").open())
            if Path(r["notebook"]).name == MASK}
    return students, book


def test_students_csv_has_a_row_per_student_with_points_total_and_max(classroom):
    students = classroom[0]
    assert sorted(students) == ["alice", "bob", "carol", "dave", "erin"]
    assert (students["alice"]["ex01"], students["alice"]["ex03"], students["alice"]["total"]) == ("2", "3", "5")
    assert {s["max"] for s in students.values()} == {"5"}, "every row has the class's maximum"
    assert students["bob"]["total"] == "0" and students["bob"]["ex03"] == ""
    assert "01_sliding_window_mask.ipynb: ok" in students["alice"]["statuses"]
    assert "03_ring_buffer.ipynb: ok" in students["alice"]["statuses"]


def test_students_csv_says_failed_where_the_gradebook_does(classroom):
    students, book = classroom
    assert book["erin"]["status"] == "failed" and students["erin"]["statuses"] == f"{MASK}: failed"
    assert book["bob"]["status"] == "failed" and students["bob"]["statuses"] == f"{MASK}: failed"
    assert students["erin"]["total"] == "0"
    assert "check cell of exercise 01 was changed or deleted" in students["erin"]["changed"]


def test_an_edited_check_cell_is_flagged_but_the_official_check_decides(classroom):
    carol = classroom[0]["carol"]
    assert carol["ex01"] == "2", "the official check passed on carol's right answer"
    assert "check cell of exercise 01 was changed or deleted" in carol["changed"]
    assert classroom[0]["alice"]["changed"] == "" and classroom[0]["bob"]["changed"] == ""


def test_a_notebook_allocating_without_end_hits_the_memory_cap_alone(classroom):
    students, book = classroom
    assert book["dave"]["status"] == "memory limit", book["dave"]
    assert "512 MiB of memory for the notebook's own code" in book["dave"]["reason"], book["dave"]
    assert "memory limit" in students["dave"]["statuses"]
    assert students["alice"]["total"] == "5", "the others are graded as usual"


def test_changes_compares_code_outside_the_answer_regions():
    from swkv_teach.grading.students import changes

    release = nbformat.read(ROOT / "exercises" / MASK, as_version=4)
    good = spliced(MASK)
    assert changes(good, release) == []
    assert changes(with_cell(good, 3, "x = 1"), release) == [], "an added cell is allowed"
    bare = nbformat.from_dict(good)  # the whole answer cell is the learner's: def line, docstring, hints
    role_cell(bare, "answer").source = ("def sliding_window_mask(n, w):\n    i = torch.arange(n)[:, None]\n"
                                        "    j = torch.arange(n)[None, :]\n    return (j <= i) & (j > i - w)")
    assert changes(bare, release) == []
    edited_check = nbformat.from_dict(good)
    role_cell(edited_check, "check").source = "print('✅ passed')"
    assert changes(edited_check, release) == ["the check cell of exercise 01 was changed or deleted"]
    no_check = nbformat.from_dict(good)
    no_check.cells.remove(role_cell(no_check, "check"))
    assert changes(no_check, release) == ["the check cell of exercise 01 was changed or deleted"]
    no_imports = nbformat.from_dict(good)
    del no_imports.cells[3]  # import torch, the check function ...
    found = changes(no_imports, release)
    assert len(found) == 1 and "released code cell" in found[0] and "was changed or deleted" in found[0]
    edited_setup = nbformat.from_dict(good)
    edited_setup.cells[3].source += "\nx = 1"
    assert len(changes(edited_setup, release)) == 1


def test_a_solved_notebook_without_the_stub_docstring_is_not_flagged_in_students_csv(tmp_path):
    from swkv_teach.grading.students import write_students

    nb = spliced(RING)
    answer = role_cell(nb, "answer")
    answer.source = "\n".join(ln for ln in answer.source.split("\n") if '"""' not in ln)  # one-line docstrings gone
    answer.source = answer.source.replace(") -> None:", "):")
    (tmp_path / "subs" / "fay").mkdir(parents=True)
    nbformat.write(nb, tmp_path / "subs" / "fay" / RING)
    row = {"notebook": "x", "exercises": {"03": 3}, "status": "ok", "reason": "all checks passed", "feedback": []}
    target = write_students([row], [tmp_path / "subs" / "fay" / RING], [tmp_path / "subs"], ROOT / "exercises", tmp_path)
    assert next(csv.DictReader(target.open()))["changed"] == ""


def test_released_defaults_to_the_packaged_exercises_then_asks_for_the_path(tmp_path, monkeypatch):
    from swkv_teach.grading import students

    (tmp_path / "exercises").mkdir()
    assert students.default_released(tmp_path) == tmp_path / "exercises", "./exercises when it exists"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    found = students.default_released(elsewhere)
    assert found is not None and found.resolve() == (ROOT / "exercises").resolve(), "the package's own exercises"
    monkeypatch.setattr(students, "__file__", str(tmp_path / "site" / "swkv_teach" / "grading" / "students.py"))
    assert students.default_released(elsewhere) is None
    (tmp_path / "subs" / "gus").mkdir(parents=True)
    nbformat.write(spliced(MASK), tmp_path / "subs" / "gus" / MASK)
    row = {"notebook": "x", "exercises": {"01": 2}, "status": "ok", "reason": "", "feedback": []}
    target = students.write_students([row], [tmp_path / "subs" / "gus" / MASK], [tmp_path / "subs"], None, tmp_path)
    assert next(csv.DictReader(target.open()))["changed"] == \
        f"{MASK}: not compared (pass --released PATH (the course's exercises/ folder))"


def test_a_kernel_spinning_past_its_cpu_time_is_stopped_and_the_row_says_so(tmp_path):
    """The wall-clock timeout is set far above the CPU cap, so only the CPU cap can end this loop."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("while True:\n    pass"),
                nbformat.v4.new_code_cell("check_sliding_window_mask(sliding_window_mask)")]
    nbformat.write(nb, tmp_path / "spin.ipynb")
    out = tmp_path / "out"
    assert main([str(tmp_path / "spin.ipynb"), "--out", str(out), "--timeout", "300", "--cpu", "6"]) == 0
    row = next(csv.DictReader((out / "gradebook.csv").open()))
    assert row["status"] == "cpu limit", row
    assert "6 s of CPU time" in row["reason"] and "cell 1 of 2" in row["reason"], row
    assert row["total"] == "0"


def test_grading_kernels_talk_over_ipc_and_print_no_tcp_warning(tmp_path, capfd):
    """Regression (issue 18): every graded notebook printed ipykernel's "Kernel is running over TCP without
    encryption" warning (60 times for a class of six). The first cell reports its own kernel's transport."""
    nb = spliced(MASK)
    nb.cells.insert(0, nbformat.v4.new_code_cell(
        "import json\nfrom ipykernel.connect import get_connection_info\n"
        "raise RuntimeError('transport ' + json.loads(get_connection_info())['transport'])"))
    nbformat.write(nb, tmp_path / MASK)
    out = tmp_path / "out"
    assert main([str(tmp_path / MASK), "--out", str(out), "--timeout", "60"]) == 0
    printed = capfd.readouterr()
    row = next(csv.DictReader((out / "gradebook.csv").open()))
    assert "RuntimeError: transport ipc" in row["reason"], row
    assert row["ex01"] == "2", "the probe cell does not stop the check"
    feedback = next((out / "feedback").glob("*.txt")).read_text()
    for text in (printed.out, printed.err, feedback):
        assert "without encryption" not in text, text[-1500:]


def test_a_kernel_that_cannot_load_torch_is_the_graders_error_not_the_students(tmp_path, monkeypatch):
    """Issue 35: under a 2 GiB cap a CUDA build's `import torch` failed ("failed to map segment from shared
    object") and right answers scored 0 as "failed". Whatever stops the kernel loading torch before the
    notebook runs is now the grader's own error, said as such, and no cell of the notebook is charged."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "torch.py").write_text("raise ImportError('libtorch_cpu.so: failed to map segment from shared object')\n")
    monkeypatch.setenv("PYTHONPATH", f"{fake}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    nbformat.write(spliced(MASK), tmp_path / MASK)
    out = tmp_path / "out"
    assert main([str(tmp_path / MASK), "--out", str(out), "--timeout", "60", "--memory", "512M"]) == 0
    row = next(csv.DictReader((out / "gradebook.csv").open()))
    assert row["status"] == "grader error", row
    assert "could not load torch and the checks" in row["reason"] and "failed to map segment" in row["reason"], row
    assert "grader's Python environment" in row["reason"], row
