"""How a lesson reads on a page (issue 36): formulas typeset, code that fits, figures captioned.

Checked from the stored notebooks' JSON, for the lessons listed in FORMATTED, and (formulas only)
for the pages of docs/. The rules, precise enough to fail:

* **Formulas are LaTeX.** In markdown, outside ``$…$``, ``$$…$$`` and fenced code, a *formula* is
  - a code span whose names are all one letter (``W``, ``t``, ``P``: numbers aside) and which holds a
    binary operator (``+ - − * / < > = ≤ ≥ × · % ^``) or a power (``²``), e.g. ```i - W < j <= i```,
    ```W + 1```; a code span that names a Python identifier longer than one letter
    (```min(seen, W)```, ```p // block_size```) is code and stays a code span, unless it holds a
    sign no Python code writes (``× · ≈ Σ √ θ ≥ ≤``): ```batch · heads ≥ 0.8 · SMs``` is a formula
    whatever its names;
  - in plain prose, a math sign (``≤ ≥ ≠ ≈ · √ ² ³ ⌈ ⌉ ⌊ ⌋ ∑``), or a one-letter operand joined by
    ``+ - − = < > × /`` to a letter or number (``W + 1``, ``t = 5``, ``2 × 16``): those go in ``$…$``.
  A ratio's sign after a number (``7.7×``) is a unit, not a formula, and words in double quotes
  ("…" or “…”) are a source quoted as it is written.
* **Code fits the page:** no line of a code cell is longer than 88 characters.
* **Every figure has a caption:** the markdown cell right after a code cell that draws a figure
  starts (its first sentence) by saying what the figure shows; checked as: that cell exists and its
  first paragraph mentions the figure ("figure", "plot", "chart", "picture", "bars", "line", "the
  drawing", "each panel" …) before its first full stop.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
FORMATTED = [
    "00_why_cache", "01_six_steps", "02_watching_eviction", "03_ring_buffer",
    "04_decoding_with_the_cache", "05_eviction_policies", "06_measuring", "07_serving_memory",
    "08_which_tokens_to_keep", "09_inside_transformers", "10_demo_to_service", "11_fused_decode_kernel",
    "12_prefix_caching", "13_speculative_decoding", "14_interview_drill",
]
DOCS = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
MAX_CODE_LINE = 88

FENCE = re.compile(r"```.*?```", re.DOTALL)
DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.DOTALL)
INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\$)[^$\n]+?(?<!\\)\$")
QUOTED = re.compile(r'"[^"]{0,300}"|“[^”]{0,300}”')
LINK_TARGET = re.compile(r"\]\([^)]*\)|</?[A-Za-z][^<>]*>|https?://\S+")  # a link, an HTML tag, a URL
CODE_SPAN = re.compile(r"`([^`\n]+)`")
NUMBER = re.compile(r"(?<![A-Za-z_])\d+(?:\.\d+)?(?:e[-+]?\d+)?")
NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
BINARY = re.compile(r"[\w)\]]\s*(?:<=|>=|==|//|\*\*|[-+−*/<>=≤≥×·%^])\s*[\w(\[]")
POWER = re.compile(r"[²³√⌈⌊]")
MATH_ONLY = re.compile(r"[×·≈Σ∑√θ≥≤]")  # signs no Python code writes: a span holding one is a formula
MATH_SIGN = re.compile(r"[≤≥≠≈·√²³⌈⌉⌊⌋∑]")
OPERAND = r"(?:\b[A-Za-z]\b|\b\d+(?:\.\d+)?\b)"
PROSE_FORMULA = re.compile(
    rf"(?:\b[A-Za-z]\b\s*(?:[+=<>×/]|\s[-−]\s)\s*(?:{OPERAND}|\())"   # W + 1, t = 5, W - 1, W/2
    rf"|(?:{OPERAND}\s*(?:[+=<>×/]|\s[-−]\s)\s*\b[A-Za-z]\b(?![-'’]))"  # 2 × W, 64 = W
    rf"|(?:\b\d+(?:\.\d+)?\s*×\s*\d)"                                   # 2 × 16
)
PROSE_WORDS = {"a", "A", "I"}  # one-letter words of English, not variables (not in a formula by themselves)


def formulas_outside_latex(markdown: str) -> list[str]:
    """Every formula in ``markdown`` that is not typeset as LaTeX (rules in the module docstring)."""
    text = DISPLAY_MATH.sub(" ", FENCE.sub(" ", markdown))
    text = INLINE_MATH.sub(" ", text)
    text = LINK_TARGET.sub(" ", text)
    found = []
    for span in CODE_SPAN.findall(text):
        plain = NUMBER.sub("0", span)
        names = NAME.findall(plain)
        one_letter = all(len(n) == 1 for n in names)
        if MATH_ONLY.search(span) or (one_letter and (BINARY.search(plain) or POWER.search(plain))):
            found.append(f"`{span}`")
    prose = QUOTED.sub(" ", CODE_SPAN.sub(" ", text))
    for line in prose.splitlines():
        for m in MATH_SIGN.finditer(line):
            found.append(line[max(0, m.start() - 20): m.end() + 20].strip())
        for m in PROSE_FORMULA.finditer(line):
            words = set(re.findall(r"\b[A-Za-z]\b", m.group(0)))
            if words and words <= PROSE_WORDS:
                continue
            found.append(m.group(0).strip())
    return found


def _lesson(stem: str):
    return nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)


def _body(stem: str) -> list:
    return _lesson(stem).cells[2:]  # the generated header (badge, set-up cell) left out


@pytest.mark.parametrize("stem", FORMATTED)
def test_no_formula_outside_latex(stem):
    bad = {n: f for n, c in enumerate(_body(stem), 2) if c.cell_type == "markdown"
           and (f := formulas_outside_latex(c.source))}
    assert not bad, (f"notebooks/{stem}: formulas outside LaTeX (write them as $…$), by cell: {bad}")


@pytest.mark.parametrize("page", DOCS)
def test_no_formula_outside_latex_in_the_docs(page):
    text = (ROOT / "docs" / page).read_text()
    bad = formulas_outside_latex(text)
    assert not bad, f"docs/{page}: formulas outside LaTeX (write them as $…$): {bad}"


@pytest.mark.parametrize("stem", FORMATTED)
def test_code_lines_fit_the_page(stem):
    long = [f"cell {n}: {len(line)} chars: {line[:60]}…" for n, c in enumerate(_body(stem), 2)
            if c.cell_type == "code" for line in c.source.splitlines() if len(line) > MAX_CODE_LINE]
    assert not long, f"notebooks/{stem}: code lines over {MAX_CODE_LINE} characters:\n  " + "\n  ".join(long)


CAPTION_WORDS = re.compile(r"\b(figure|plot|plots|chart|picture|bars?|lines?|curves?|drawing|panels?|"
                           r"heat ?map|map|grid|axis|axes|band|bands|dots?|points?|squares?|rows? of "
                           r"boxes|cells? of the drawing|image|colou?rs?|widget)\b", re.IGNORECASE)


def _draws_a_figure(cell) -> bool:
    return any("image/png" in o.get("data", {}) or "image/svg+xml" in o.get("data", {})
               for o in cell.get("outputs", []))


def missing_captions(cells) -> list[str]:
    """Figures without a caption: the next cell is not markdown, or its first sentence does not
    speak of the figure."""
    missing = []
    for n, cell in enumerate(cells):
        if cell.cell_type != "code" or not _draws_a_figure(cell):
            continue
        after = cells[n + 1] if n + 1 < len(cells) else None
        if after is None or after.cell_type != "markdown":
            missing.append(f"cell {n + 2}: no markdown cell under the figure")
            continue
        text = re.sub(r"^#+ .*\n", "", after.source.strip())  # a heading is not a caption
        first = re.split(r"(?<=[.:!?])\s", text.strip(), maxsplit=1)[0]
        if not CAPTION_WORDS.search(first):
            missing.append(f"cell {n + 2}: the text under it does not open on the figure: {first[:80]!r}")
    return missing


@pytest.mark.parametrize("stem", FORMATTED)
def test_every_figure_has_a_caption_under_it(stem):
    missing = missing_captions(_body(stem))
    assert not missing, f"notebooks/{stem}: figures without a caption sentence:\n  " + "\n  ".join(missing)


# ----------------------------------------------------------------------------- the rules can fail
def test_the_formula_rule_catches_code_spans_and_prose_but_not_code():
    assert formulas_outside_latex("keys `i - W < j <= i` and `W + 1` and `(t+1)²`") == [
        "`i - W < j <= i`", "`W + 1`", "`(t+1)²`"]
    assert formulas_outside_latex("the mask of W + 1 keys, 2 × 16 bytes, i ≤ j") != []
    assert formulas_outside_latex("call `min(seen, W)` or `p // block_size` with `k=None`; 7.7× faster") == []
    assert formulas_outside_latex("when `batch · heads ≥ 0.8 · SMs`, `θ_base` or `n ≈`") == [
        "`batch · heads ≥ 0.8 · SMs`", "`θ_base`", "`n ≈`"]
    assert formulas_outside_latex("keys $i - W < j \\le i$ and $$W + 1$$, a one-token step") == []
    assert formulas_outside_latex("```\nx = W + 1\n```") == []
    assert formulas_outside_latex('the paper: "at most W tokens (here, W = 3)"') == []


def test_the_caption_rule_catches_a_figure_without_words_for_it():
    fig = nbformat.v4.new_code_cell("plot()", outputs=[nbformat.v4.new_output(
        "display_data", data={"image/png": "iVBORw0KGgo="})])
    good = nbformat.v4.new_markdown_cell("The figure shows the window sliding.")
    bad = nbformat.v4.new_markdown_cell("## 3. Next section\nNow something else.")
    assert missing_captions([fig, good]) == []
    assert len(missing_captions([fig, bad])) == 1
    assert len(missing_captions([fig])) == 1


@pytest.mark.parametrize("stem", FORMATTED)
def test_drawing_helpers_are_out_of_the_readers_way(stem):
    """A cell that defines a drawing helper (``def draw_…``) is tagged hide-input, so the lesson shows the
    idea and the figure, not the matplotlib behind it (the helpers of swkv_teach/plots*.py need no tag)."""
    shown = [n for n, c in enumerate(_body(stem), 2) if c.cell_type == "code"
             and re.search(r"^def draw_\w+\(", c.source, re.MULTILINE)
             and "hide-input" not in c.metadata.get("tags", [])]
    assert not shown, f"notebooks/{stem}: cells {shown} define a draw_ helper without the hide-input tag"


def long_printed_lines(cells) -> list[str]:
    """Printed lines wider than the page (a widget's text fallback, never shown, left out)."""
    long = []
    for n, cell in enumerate(cells, 2):
        for o in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = o.get("data", {})
            if any(k.startswith("application/vnd.jupyter.widget") for k in data):
                continue
            text = o.get("text") or data.get("text/plain", "")
            text = "".join(text) if isinstance(text, list) else text
            long += [f"cell {n}: {len(line)} chars: {line[:50]}…" for line in text.splitlines()
                     if len(line) > MAX_CODE_LINE]
    return long


@pytest.mark.parametrize("stem", FORMATTED)
def test_printed_lines_fit_the_page(stem):
    """A long printed line is wrapped by the code that prints it, not by the reader's scroll bar."""
    long = long_printed_lines(_body(stem))
    assert not long, f"notebooks/{stem}: printed lines over {MAX_CODE_LINE} characters:\n  " + "\n  ".join(long)


# A LaTeX command written in a Python string without an r prefix loses its backslash: "\times" is a tab and "imes",
# "\bmod" a backspace and "mod" (drill Q20 shipped so, issue 39). Such a character renders as a blank or nothing.
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f]")  # a tab too: no source here indents with one


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for folder in ("notebooks", "solutions")
                                        for p in (ROOT / folder).glob("[0-9][0-9]_*.*")
                                        if p.suffix in (".py", ".ipynb")) + [f"docs/{d}" for d in DOCS])
def test_no_control_character_where_a_latex_backslash_was_meant(path):
    text = (ROOT / path).read_text()
    if path.endswith(".ipynb"):
        text = "\n".join(c.source for c in nbformat.reads(text, as_version=4).cells)
    bad = [f"line {text.count(chr(10), 0, m.start()) + 1}: {text[max(0, m.start() - 20):m.end() + 10]!r}"
           for m in CONTROL.finditer(text)]
    assert not bad, f"{path}: control characters (a lost backslash of \\times, \\text, \\bmod...?): {bad}"
