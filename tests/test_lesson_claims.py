"""Issue 36: the errors an independent review found in lessons 0-8 and the READMEs, each pinned so it
cannot come back unnoticed. Like the prose-number check in test_notebooks_meta.py, these read the stored
notebooks (their prose, their code and their compared outputs) as a learner does; nothing is executed.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSONS_0_TO_8 = sorted(p.stem for p in (ROOT / "notebooks").glob("0[0-8]_*.ipynb"))


def _cells(stem_prefix: str):
    path = next((ROOT / "notebooks").glob(f"{stem_prefix}*.ipynb"), None)
    assert path is not None, f"no lesson notebooks/{stem_prefix}*.ipynb"
    return nbformat.read(path, as_version=4).cells[2:]


def _text(stem_prefix: str, kind: str = "markdown") -> str:
    """The lesson's cells of one kind, joined, markdown's '#' and line breaks folded to single spaces."""
    return " ".join("\n".join(c.source for c in _cells(stem_prefix) if c.cell_type == kind).split())


def _compared_output(stem_prefix: str) -> str:
    """Everything printed by the cells nbval compares (no NBVAL_IGNORE_OUTPUT)."""
    out = []
    for c in _cells(stem_prefix):
        if c.cell_type == "code" and "NBVAL_IGNORE_OUTPUT" not in c.source:
            for o in c.get("outputs", []):
                text = o.get("text") or o.get("data", {}).get("text/plain", "")
                out.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(out)


def test_the_lessons_checked_here_exist():
    assert len(LESSONS_0_TO_8) == 9, LESSONS_0_TO_8


# ----------------------------------------------------------------------------- error 1: RoPE in the kernel
@pytest.mark.parametrize("stem", LESSONS_0_TO_8)
def test_no_lesson_passes_shifted_rotary_tables_to_the_kernel_for_a_ring(stem):
    """Error 1: lesson 6 said in-kernel RoPE works for a ring with tables "shifted by seen − min(seen, W)
    rows". FlashAttention rotates only new k, v it is given (flash_attn_interface.py 1558-1559;
    flash_api.cpp 1462-1463 refuses cos/sin without k), and writes them at cache_seqlens = W, past a full
    ring."""
    text = _text(stem)
    assert not re.search(r"shifted by `?seen\s*[−-]\s*min", text), f"{stem} shifts rotary tables for a ring"
    assert not re.search(r"tables shifted", text), f"{stem} still offers shifted rotary tables"


def test_measuring_says_a_ring_applies_rope_outside_the_kernel_and_why():
    rows = [line for c in _cells("06_") if c.cell_type == "markdown" for line in c.source.splitlines()
            if line.startswith("| `rotary_cos`")]
    assert len(rows) == 1, "lesson 6's flash_attn_with_kvcache table should have one rotary_cos row"
    row = rows[0]
    assert "RoPE outside the kernel" in row, "lesson 6's rotary row should say: a ring applies RoPE outside"
    assert "Only applicable if k and v are passed in" in row and "1558–1559" in row
    assert "1462–1463" in row and "flash_api.cpp" in row, "cite flash_api.cpp's refusal of cos/sin without k"


@pytest.mark.parametrize("stem", ["06_", "07_"])
def test_paged_in_kernel_rope_counts_cache_seqlens_before_the_new_tokens(stem):
    """Error 1, paged half: with k, v passed (the only way to get in-kernel RoPE) cache_seqlens is the length
    BEFORE the new tokens (docstring 1555-1556; flash_api.cpp 1434-1435)."""
    text = _text(stem)
    assert re.search(r"\*?before\*? the new tokens", text), f"lesson {stem}: cache_seqlens with k passed"
    assert "1434–1435" in text and "1555–1556" in text


# ----------------------------------------------------------------------------- error 3: the token budget
def test_serving_memory_no_longer_says_a_prompt_needs_a_forward_of_its_own():
    """Error 3: lesson 7 said paged_attention takes one seqlen_q, so a prompt chunk needs its own forward."""
    text = _text("07_")
    assert "takes one `seqlen_q` for the whole batch" not in text
    assert "Why a prompt gets its own forward here" not in text


def test_serving_memory_teaches_the_token_budget_in_one_varlen_forward():
    text, code, out = _text("07_"), _text("07_", "code"), _compared_output("07_")
    opening = " ".join(_cells("07_")[0].source.split())
    assert "token budget" in opening and "preempt" in opening, "lesson 7's objectives name the token budget"
    assert "token_budget=" in code and "cu_seqlens_q" in text
    # one forward with a decode row and a prompt chunk side by side, as printed by a compared cell
    assert re.search(r"request \d+: 1 decode, request \d+: \d+ prompt", out), "no mixed forward printed"
    assert "was preempted" in out, "the forced preemption is not shown"
    same = re.findall(r"identical to generating(?: it)? alone: (.*)", out)
    assert len(same) >= 3 and all("False" not in s for s in same), same
    # vLLM v1's scheduler, cited by file and line
    for cite in ("vllm/v1/core/sched/scheduler.py", "718–727", "line 986", "1853–1897", "line 1066"):
        assert cite in text, f"lesson 7 should cite vLLM's scheduler ({cite})"
    assert "When promising the peak beats preempting" in text


@pytest.mark.parametrize("stem", LESSONS_0_TO_8)
def test_no_list_item_continues_on_a_line_markdown_reads_as_a_bullet(stem):
    """Error 3's last part: lesson 7 cell 27 wrapped "(`cache_seqlens` = its position\\n + 1);", and the
    continuation "+ 1);" rendered as a stray sub-bullet. A wrapped line must not start with +, - or *."""
    stray = [line for c in _cells(stem) if c.cell_type == "markdown" for line in c.source.splitlines()
             if re.match(r"^\s+(\+\s|-\s+\d)", line)]
    assert not stray, f"{stem}: continuation lines that render as bullets: {stray}"


# ----------------------------------------------------------------------------- errors 4 and 5: lesson 6
def test_recompute_timing_uses_this_threads_cpu_time_and_its_own_preemptions():
    """Error 4: the detector used RUSAGE_SELF (every thread of the kernel) and the prose quoted a run its own
    diagnosis called contaminated ("248x faster, 9 % of what the FLOPs predict")."""
    code, text = _text("06_", "code"), _text("06_")
    assert "time.thread_time_ns()" in code and "RUSAGE_THREAD" in code
    assert "RUSAGE_SELF)" not in code, "RUSAGE_SELF counts the kernel's heartbeat threads too"
    assert "248" not in text and "9 % of what" not in text
    assert "On a quiet machine, or a core of its own, the same forwards grow smoothly" not in text


def test_ring_and_naive_per_token_are_worded_from_the_printed_ratios():
    """Error 5: the prose said "within a few per cent", "only at the largest window", and "2.2 to 7.7x" from
    one cold outlier, beside a run that printed 1.12 at W = 256 and 1.04 at W = 1024."""
    text, code = _text("06_"), _text("06_", "code")
    for phrase in ("within a few per cent", "Only at the largest window", "2.2 to 7.7"):
        assert phrase not in text, f"lesson 6 still says {phrase!r}"
    assert 'print(" naive / ring:"' in code, "the decode cell should print naive / ring at every window"
    assert "windows[:1], repeats=1" in code, "the bench should be warmed up before the timed run"


# ----------------------------------------------------------------------------- error 14: run times
README = ROOT / "README.md"
INDEX = ROOT / "notebooks" / "README.md"
RUN_ROW = re.compile(r"^\| *\[?(\d+)\b[^|]*\| *(?:about )?(\d+(?:\.\d+)?) (s|min) *\|", re.MULTILINE)


def test_no_readme_says_every_lesson_runs_in_under_a_minute():
    """Error 14: lesson 8 stores "ran in 122 s"; 9, 10 and 12 are heavier."""
    for path in (README, INDEX):
        assert "under a minute" not in " ".join(path.read_text().split()), f"{path.name} says under a minute"


def test_the_index_lists_every_lessons_measured_run_time():
    text = INDEX.read_text()
    section = text[text.find("## Run times"):]
    assert section.startswith("## Run times"), "notebooks/README.md should have a '## Run times' section"
    assert "measured" in section.split("\n\n")[1], "the run-time section should say how the times were measured"
    rows = {int(n): float(v) * (60 if unit == "min" else 1) for n, v, unit in RUN_ROW.findall(section)}
    lessons = {int(p.name[:2]) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert lessons and set(rows) == lessons, f"run times for lessons {sorted(rows)}; lessons {sorted(lessons)}"
    assert rows[8] > 60, "lesson 8 alone runs for minutes; a run-time table that says otherwise is wrong"
