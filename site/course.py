"""What the website says about the course, read from the course's own files, never retyped.

* each lesson's title, minutes and exercises (with their time ranges) from its opening cell's **Time:** line
  (the line tests/test_notebooks_meta.py holds equal to notebooks/README.md's table), and its one-line summary
  from that table's "What you learn" column;
* for each exercise, the lesson and the section where the course reaches it: the first section of the lesson,
  after its opening cell, whose text links the exercise (each lesson links its exercises where it reaches them);
* each page's title (its first heading), so a link can be labelled with it instead of a file path.

Dependency-free (the site build installs only Sphinx and its extensions).
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADER_TAG = "swkv-header"
TIME = re.compile(r"\*\*Time:\*\* about (\d+) min")
# "25–45 for [exercise 03](../exercises/03_ring_buffer.ipynb)"; the drill: "55–95 to answer"
EXERCISE_TIME = re.compile(r"(\d+)–(\d+) for \[[^\]]*\]\(\.\./(exercises/\d\d_\w+\.ipynb)\)")
ANSWER_TIME = re.compile(r"(\d+)–(\d+) to answer")
EXERCISE_LINK = re.compile(r"\]\(\.\./(exercises/\d\d_\w+\.ipynb)(?:#[^)]*)?\)")
HEADING = re.compile(r"^(#{1,3})\s+(.+?)\s*$", re.M)


def cells(repo_path: str) -> list[dict]:
    nb = json.loads((ROOT / repo_path).read_text())
    return [{**c, "source": "".join(c["source"]) if isinstance(c["source"], list) else c["source"]}
            for c in nb["cells"]]


def plain(markdown: str) -> str:
    """A heading or sentence as text: links keep their label, code and emphasis lose their marks."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", markdown)
    text = re.sub(r"`|\*\*?|(?<!\w)_|_(?!\w)", "", text)  # code and emphasis marks; snake_case names stay
    return " ".join(text.split())


def slug(heading: str) -> str:
    """The anchor MyST gives a heading (myst_heading_anchors), by MyST's own rule: GitHub's slug
    (``myst_parser.slugs.github_slugify``) of the heading's text and code only (``compute_unique_slug`` in
    ``myst_parser/mdit_to_docutils/base.py``), so math and markup are left out: "2. Writing into slot
    $p \\bmod W$" is ``2-writing-into-slot-``."""
    from markdown_it import MarkdownIt
    from mdit_py_plugins.dollarmath import dollarmath_plugin
    from myst_parser.slugs import github_slugify

    inline = MarkdownIt("commonmark").use(dollarmath_plugin).parse("# " + heading)[1]
    return github_slugify("".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline")))


def title_of(repo_path: str) -> str:
    """A page's first heading, as text (a notebook's first markdown heading, a markdown file's first line)."""
    if repo_path.endswith(".ipynb"):
        for cell in cells(repo_path):
            m = HEADING.search(cell["source"]) if cell["cell_type"] == "markdown" else None
            if m and m.group(1) == "#":
                return plain(m.group(2))
    else:
        m = re.search(r"^#\s+(.+)$", (ROOT / repo_path).read_text(), re.M)
        if m:
            return plain(m.group(1))
    return posixpath.basename(repo_path)


@dataclass
class Lesson:
    path: str  # notebooks/03_ring_buffer.ipynb
    number: int
    title: str
    minutes: int
    exercises: list[tuple[str, int, int]]  # (exercises/03_ring_buffer.ipynb, 25, 45), in the header's order
    answer: tuple[int, int] | None  # the drill: minutes to answer its questions aloud
    summary: str  # notebooks/README.md's "What you learn"
    reaches: dict[str, tuple[str, str]] = field(default_factory=dict)  # exercise -> (section title, anchor)


def _summaries() -> dict[str, str]:
    index = ROOT / "notebooks" / "README.md"
    found = {}
    for line in index.read_text().splitlines() if index.is_file() else []:
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.search(r"\]\((\d\d_\w+\.ipynb)\)", line)
        if m and len(cols) >= 4:
            found[m.group(1)] = plain(cols[3])
    return found


def lessons() -> list[Lesson]:
    summaries = _summaries()
    found = []
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        rel = path.relative_to(ROOT).as_posix()
        body = [c for c in cells(rel) if HEADER_TAG not in c.get("metadata", {}).get("tags", [])]
        opening = next((c["source"] for c in body if c["cell_type"] == "markdown"), "")
        time = TIME.search(opening)
        answer = ANSWER_TIME.search(opening)
        lesson = Lesson(
            path=rel, number=int(path.name[:2]), title=title_of(rel), minutes=int(time.group(1)) if time else 0,
            exercises=[(ex, int(lo), int(hi)) for lo, hi, ex in EXERCISE_TIME.findall(opening)],
            answer=(int(answer.group(1)), int(answer.group(2))) if answer else None,
            summary=summaries.get(path.name, ""))
        section = None  # the last heading above, (title, anchor); None: the lesson's top
        for cell in body[1:]:
            if cell["cell_type"] != "markdown":
                continue
            text = cell["source"]
            for m in HEADING.finditer(text):
                if len(m.group(1)) > 1:
                    section = (plain(m.group(2)), slug(m.group(2)))
            for ex in EXERCISE_LINK.findall(text):
                lesson.reaches.setdefault(ex, section or (lesson.title, ""))
        for ex, _, _ in lesson.exercises:
            lesson.reaches.setdefault(ex, (lesson.title, ""))
        found.append(lesson)
    return found


def exercise_homes(all_lessons: list[Lesson]) -> dict[str, tuple[Lesson, str, str]]:
    """Each exercise -> (the lesson that sets it in its header, the section title, its anchor). An exercise no
    header names goes to the first lesson that links it."""
    homes: dict[str, tuple[Lesson, str, str]] = {}
    for lesson in all_lessons:
        for ex, _, _ in lesson.exercises:
            homes.setdefault(ex, (lesson, *lesson.reaches[ex]))
    for lesson in all_lessons:
        for ex, (title, anchor) in lesson.reaches.items():
            homes.setdefault(ex, (lesson, title, anchor))
    return homes
