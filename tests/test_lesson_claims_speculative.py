"""Lesson 13 (speculative decoding on a ring): the claims its prose makes, held to its stored run and to the sources.

Read as a learner reads it: the stored notebook's markdown and outputs (nothing is executed here). Where the prose
cites transformers by line, the line is read from the installed transformers 5.25.0 (skipped under another
version); where it says something about its own measurements, the stored outputs must show it.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSON = ROOT / "notebooks" / "13_speculative_decoding.ipynb"


def _cells():
    return nbformat.read(LESSON, as_version=4).cells[2:]  # the generated header left out


def _markdown() -> str:
    return " ".join("\n".join(c.source for c in _cells() if c.cell_type == "markdown").split())


def _outputs(compared_only: bool = True) -> str:
    out = []
    for c in _cells():
        if c.cell_type != "code" or (compared_only and "NBVAL_IGNORE_OUTPUT" in c.source):
            continue
        for o in c.get("outputs", []):
            text = o.get("text") or o.get("data", {}).get("text/plain", "")
            out.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(out)


# ----------------------------------------------------------------------------- the exercise before the answer
def test_exercise_14_is_linked_before_the_lesson_shows_or_runs_the_acceptance_rule():
    """The learner writes accept(...) and verify(...) in exercise 14: the lesson sends them there before any cell
    that imports, shows or runs the library's rule (accept_sampled, accept_greedy, verify, speculative_generate)."""
    link = "../exercises/14_speculative_verify.ipynb"
    cells = _cells()
    first_link = next(n for n, c in enumerate(cells) if c.cell_type == "markdown" and "Your turn" in c.source
                      and link in c.source)
    answer = re.compile(r"\b(accept_sampled|accept_greedy|speculative_generate|getsource)\b|\bverify\(")
    first_answer = next(n for n, c in enumerate(cells) if c.cell_type == "code" and answer.search(c.source))
    assert first_link < first_answer, (first_link, first_answer)
    header = cells[0].source
    assert f"[exercise 14]({link})" in header, "the header gives exercise 14's time with a link to it"


def test_the_lesson_ends_by_leading_to_the_drill_and_lesson_12_leads_here():
    text = _markdown()
    assert "[interview drill](14_interview_drill.ipynb)" in text[-400:]
    lesson12 = nbformat.read(ROOT / "notebooks" / "12_prefix_caching.ipynb", as_version=4)
    lesson12 = " ".join("\n".join(c.source for c in lesson12.cells if c.cell_type == "markdown").split())
    assert "then [lesson 13](13_speculative_decoding.ipynb)" in lesson12[-400:]


# ----------------------------------------------------------------------------- its own measurements
def _alpha_rows() -> dict[tuple[str, str, int], tuple[float, float, float, float, float]]:
    """(workload, drafter, k) -> (alpha, low, high, tokens per verify, E), from the compared table."""
    rows = {}
    row = re.compile(r"^(fresh code|quoted back)\s+(prompt lookup|early exit \(1 of 3 layers\))\s+(\d+)\s+"
                     r"([\d.]+) "
                     r"\[([\d.]+), ([\d.]+)\]\s+([\d.]+)\s+([\d.]+)$", re.MULTILINE)
    for w, d, k, *numbers in row.findall(_outputs()):
        rows[(w, d, int(k))] = tuple(float(x) for x in numbers)
    return rows


def test_every_speculative_run_gave_plain_greedy_tokens():
    assert re.search(r"96 speculative runs, each equal to plain greedy decoding: True", _outputs())


def test_the_acceptance_table_holds_what_the_prose_reads_from_it():
    rows = _alpha_rows()
    assert len(rows) == 12, rows
    text = _markdown()
    assert "Prompt lookup's $\\alpha$ is higher than early exit's** at every $k$, on both workloads" in text
    for (w, d, k), (alpha, low, high, per_verify, E) in rows.items():
        assert low <= alpha <= high
        if d == "prompt lookup":
            assert alpha > rows[(w, "early exit (1 of 3 layers)", k)][0], (w, k)
            assert per_verify < E, (w, k)  # "fall short of E for prompt lookup"
    assert "does not raise prompt lookup's $\\alpha$ here" in text
    for k in (2, 4, 8):
        quoted, fresh = rows[("quoted back", "prompt lookup", k)], rows[("fresh code", "prompt lookup", k)]
        assert quoted[0] <= fresh[2], f"k={k}: quoting raised lookup's alpha beyond fresh code's interval"


def test_the_sampling_check_passes_with_the_ratio_test_and_catches_the_rule_without_it():
    out = _outputs()
    found = dict((label.strip(), float(p)) for label, p in
                 re.findall(r"^(.{27}): chi-square\s+[\d.]+, p-value ([\d.]+)", out, re.MULTILINE))
    assert found["ratio test, sampled drafts"] > 0.01 and found["ratio test, one-hot drafts"] > 0.01, found
    assert found["every draft kept (no test)"] < 1e-3, found


def test_no_timing_is_quoted_in_prose():
    """The verify's cost and the speed-ups change from run to run (another change may make the verify cheaper):
    the cells print their own sentences; the prose gives no ratio of its own (the '×' of a formula aside)."""
    text = _markdown()
    assert not re.search(r"\d\.\d+\s?×", text), re.findall(r".{40}\d\.\d+\s?×.{10}", text)
    ignored = [c.source for c in _cells() if c.cell_type == "code" and "process_time" in c.source
               and "print" in c.source and "speculative_generate" not in c.source]
    assert ignored and all("NBVAL_IGNORE_OUTPUT" in c for c in ignored)


# ----------------------------------------------------------------------------- transformers, by line
transformers = pytest.importorskip("transformers", reason="transformers not installed")
FIVE_25 = pytest.mark.skipif(transformers.__version__ != "5.25.0", reason="the lesson cites transformers 5.25.0")


def _line_of(obj) -> int:
    return inspect.getsourcelines(obj)[1]


def _source_lines(module) -> list[str]:
    return inspect.getsource(module).splitlines()


@FIVE_25
def test_the_cache_utils_lines_the_lesson_cites_are_where_it_says():
    from transformers import cache_utils
    from transformers.cache_utils import DynamicSlidingWindowLayer, StaticSlidingWindowLayer

    text = _markdown()
    lines = _source_lines(cache_utils)
    assert _line_of(DynamicSlidingWindowLayer.activate_past_recording) == 211 and "line 211" in text
    assert "torch.cat" in lines[242 - 1] and "torch.cat" in lines[243 - 1] and "lines 242–243" in text
    assert "if not self.record_past" not in lines[250 - 1] and "num_visible" in lines[258 - 1]
    assert "lines 250–259" in text
    assert "tokens_to_remove == 0" in lines[300 - 1] and "-self.sliding_window + 1 - tokens_to_remove" in lines[306 - 1]
    assert "cumulative_length - tokens_to_remove" in lines[308 - 1] and "lines 303–308" in text
    assert "max_cache_len <= sliding_window" in lines[545 - 1] and "line 545" in text
    assert "only correct as long as we never went beyond the window" in lines[652 - 1] and "line 652" in text
    assert _line_of(StaticSlidingWindowLayer.is_croppable.fget) == 661 and "lines 661–667" in text


@FIVE_25
def test_the_generation_lines_the_lesson_cites_are_where_it_says():
    from transformers.generation import candidate_generator, utils

    text = _markdown()
    gen = _source_lines(utils)
    assert "activate_past_recording" in gen[4002 - 1] and "line 4002" in text
    assert "cache.crop(-number_of_tokens_to_crop)" in gen[4187 - 1] and "line 4187" in text
    assert "requires a cache that can be cropped" in " ".join(gen[4103 - 1:4106]) and "lines 4103–4106" in text
    cand = _source_lines(candidate_generator)
    assert cand[1033 - 1].startswith("class PromptLookupCandidateGenerator") and "line 1033" in text
    assert "for ngram_size in range" in cand[1096 - 1] and "first valid candidates" in cand[1110 - 1]
    assert cand[1178 - 1].startswith("class EarlyExitCandidateGenerator") and "line 1178" in text
    assert "layerskip-llama3.2-1B" in cand[1182 - 1] and "line 1182" in text
    assert "num_hidden_layers = self.assistant_early_exit" in cand[1228 - 1] and "lines 1224–1230" in text


def test_the_lesson_shows_the_dynamic_layer_copying_and_the_static_one_refusing():
    out = _outputs()
    assert "9 states after the verify of 4, a new tensor: True" in out
    assert "after crop(-2): 5 states, positions [11, 12, 13, 14, 15], 16 tokens seen" in out
    assert "is_croppable: False" in out
