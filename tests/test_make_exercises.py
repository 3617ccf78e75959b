"""make-exercises: exercises/ is generated from solutions/, stays in sync, and never eats a learner's work."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat

from swkv_teach.grading.exercises import BEGIN, END, STUB, fill_in, main, solution_regions, strip_solutions

ROOT = Path(__file__).resolve().parent.parent


def test_exercises_folder_is_in_sync_with_solutions():
    """Fails when someone edited solutions/ and forgot `swkv-teach make-exercises` (or `make exercises`)."""
    assert main(["--solutions", str(ROOT / "solutions"), "--exercises", str(ROOT / "exercises"), "--check"]) == 0


def test_stubs_keep_indentation_and_strip_answers():
    src = f"class A:\n    def f(self):\n        {BEGIN}\n        return 42\n        {END}\n"
    out = strip_solutions(src, "09")
    assert "return 42" not in out
    assert f"        {STUB}\n        raise NotImplementedError(\"exercise 09:" in out
    assert fill_in(out, solution_regions(src)) == src.replace(f"        {BEGIN}\n", "").replace(f"        {END}\n", "")


def test_generated_notebooks_have_no_answers_no_outputs_and_keep_check_metadata():
    for path in sorted((ROOT / "exercises").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), path
        assert not any(BEGIN in c.source for c in code), path
        assert any(STUB in c.source for c in code), path
        checks = [c for c in code if c.metadata.get("swkv", {}).get("role") == "check"]
        assert len(checks) == 1 and "check_" in checks[0].source, path
        assert f"exercises/{path.name}" in nb.cells[0].source, "the Colab badge points at the exercise"


def _copy(tmp_path):
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    args = ["--solutions", str(tmp_path / "solutions"), "--exercises", str(tmp_path / "exercises")]
    assert main(args) == 0
    return args


def test_refuses_to_overwrite_a_learners_work_and_force_keeps_a_backup(tmp_path, capsys):
    args = _copy(tmp_path)
    target = tmp_path / "exercises" / "02_sliding_window_cache.ipynb"
    mine = target.read_bytes().replace(b"# YOUR CODE HERE", b"# my work")
    target.write_bytes(mine)
    assert main(args) == 1
    assert "02_sliding_window_cache.ipynb" in capsys.readouterr().err
    assert target.read_bytes() == mine, "refusal writes nothing"
    assert main(args + ["--force"]) == 0
    backups = list(target.parent.glob("02_sliding_window_cache.ipynb.bak-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == mine
    assert target.read_bytes() != mine and main(args + ["--check"]) == 0


def test_regenerating_unchanged_files_is_allowed_and_check_spots_stale_exercises(tmp_path):
    args = _copy(tmp_path)
    assert main(args) == 0, "files as last generated may be rewritten"
    manifest = json.loads((tmp_path / "exercises" / ".generated.json").read_text())
    assert set(manifest["files"]) == {p.name for p in (tmp_path / "solutions").glob("*.ipynb")}
    sol = tmp_path / "solutions" / "01_sliding_window_mask.ipynb"
    nb = nbformat.read(sol, as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("a new remark"))
    nbformat.write(nb, sol)
    assert main(args + ["--check"]) == 1
    assert main(args) == 0, "a generated file nobody edited is updated without --force"
    assert main(args + ["--check"]) == 0
