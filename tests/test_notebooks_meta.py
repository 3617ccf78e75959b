"""What every stored notebook must be, checked from its JSON alone (no kernel is started).

* notebooks/ (lessons) and solutions/ are stored *executed*: nbval reruns them and compares outputs.
* exercises/ is stored *clean*: learners start from empty outputs.
* Every notebook starts with the header :func:`tools.nbtools.header_cells` generates *now*, so the
  Colab badge and the set-up cell follow pyproject's ``Repository`` line. After changing that line
  (a fork, a rename), rebuild with ``python tools/build.py``.
* Every lesson and solution is in step with its plain-text source (``NN_name.py`` beside it).
* Outputs stay small, lesson links to exercises resolve, and notebooks/README.md lists every lesson.

How the outputs themselves are compared is nbval's job (``make test``).
"""

from __future__ import annotations

import base64
import fnmatch
import functools
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import nbtools  # noqa: E402  (tools/ is not a package)

REBUILD = "run `python tools/build.py` to regenerate the notebooks from their .py sources"
MAX_TEXT_BYTES = 20_000  # one output's text: a lesson prints numbers, never whole tensors
MAX_IMAGE_BYTES = 200_000  # one decoded image: a figure at dpi ~90 is 20-60 KB
EXECUTED = ("notebooks", "solutions")
CLEAN = ("exercises",)


def _notebooks(*folders: str) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for f in folders for p in (ROOT / f).glob("*.ipynb"))


ALL = _notebooks(*EXECUTED, *CLEAN)
LESSONS = _notebooks("notebooks")


@functools.lru_cache(maxsize=None)
def _read(rel: str):
    # read once per session; the tests only look
    return nbformat.read(ROOT / rel, as_version=4)


def _code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def test_there_are_lessons_to_check():
    """Guards the parametrised tests below from passing vacuously (an empty glob checks nothing)."""
    assert LESSONS, f"no notebooks found in {ROOT / 'notebooks'}; {REBUILD}"


@pytest.mark.parametrize("rel", ALL)
def test_valid_nbformat_with_python3_kernel(rel):
    nb = _read(rel)
    nbformat.validate(nb)
    name = nb.metadata.get("kernelspec", {}).get("name")
    assert name == "python3", f"{rel}: kernelspec name should be 'python3'; got {name!r}. {REBUILD}"


@pytest.mark.parametrize("rel", ALL)
def test_starts_with_the_current_generated_header(rel):
    """Badge + Colab-only set-up cell, exactly as nbtools would write them today for this path."""
    cells = _read(rel).cells
    expected = nbtools.header_cells(rel)
    assert len(cells) >= 2, f"{rel}: has {len(cells)} cells, expected the 2 header cells first. {REBUILD}"
    for n, (got, want) in enumerate(zip(cells[:2], expected)):
        assert got.cell_type == want.cell_type, (
            f"{rel}: cell {n} should be a {want.cell_type} header cell; got {got.cell_type}. {REBUILD}"
        )
        assert got.source == want.source, (
            f"{rel}: header cell {n} is out of date (pyproject's Repository line or nbtools changed).\n"
            f"expected:\n{want.source}\ngot:\n{got.source}\n{REBUILD}"
        )
        assert nbtools.HEADER_TAG in got.metadata.get("tags", []), (
            f"{rel}: header cell {n} lacks the {nbtools.HEADER_TAG!r} tag. {REBUILD}"
        )


@pytest.mark.parametrize("rel", _notebooks(*EXECUTED))
def test_every_lesson_and_solution_has_its_source_and_is_in_step(rel):
    """The .ipynb is what ``tools/build.py`` makes of the .py beside it: an edit to either is not lost."""
    src = nbtools.source_of(ROOT / rel)
    assert src.is_file(), f"{rel}: no plain-text source {src.relative_to(ROOT)} beside it"
    diffs = nbtools.differences(src)
    assert not diffs, f"{rel} is out of step with {src.relative_to(ROOT)}: {diffs[:5]}. {REBUILD}"


def test_every_source_has_its_notebook():
    orphans = [str(s.relative_to(ROOT)) for s in nbtools.sources() if not s.with_suffix(".ipynb").is_file()]
    assert not orphans, f"sources never built: {orphans}. {REBUILD}"


@pytest.mark.parametrize("rel", _notebooks(*EXECUTED))
def test_lessons_and_solutions_are_stored_executed_in_order(rel):
    counts = [c.execution_count for c in _code_cells(_read(rel))]
    assert counts == list(range(1, len(counts) + 1)), (
        f"{rel}: execution counts should be 1..{len(counts)} (run top to bottom once, then saved); "
        f"got {counts}. {REBUILD}"
    )


@pytest.mark.parametrize("rel", _notebooks(*CLEAN))
def test_exercises_are_stored_without_outputs(rel):
    dirty = [n for n, c in enumerate(_read(rel).cells)
             if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert not dirty, (
        f"{rel}: code cells {dirty} carry outputs or execution counts; learners must start clean. "
        "Regenerate with `swkv-teach make-exercises`."
    )


def _output_sizes(output) -> list[tuple[str, int]]:
    """(mime type, bytes) of each payload in one output; images are measured decoded."""
    if output.output_type == "stream":
        return [("stream", len(output.text.encode()))]
    if output.output_type == "error":
        return [("error", len("\n".join(output.traceback).encode()))]
    sizes = []
    for mime, data in output.get("data", {}).items():
        text = data if isinstance(data, str) else "".join(data) if isinstance(data, list) else str(data)
        if mime.startswith("image/") and mime != "image/svg+xml":
            sizes.append((mime, len(base64.b64decode(text))))
        else:
            sizes.append((mime, len(text.encode())))
    return sizes


@pytest.mark.parametrize("rel", _notebooks(*EXECUTED))
def test_no_output_is_huge(rel):
    too_big = []
    for n, cell in enumerate(_read(rel).cells):
        for output in cell.get("outputs", []):
            for mime, size in _output_sizes(output):
                limit = MAX_IMAGE_BYTES if mime.startswith("image/") else MAX_TEXT_BYTES
                if size > limit:
                    too_big.append(f"cell {n}: {mime} of {size:,} bytes (limit {limit:,})")
    assert not too_big, f"{rel}: outputs too large (print less, lower the figure's dpi):\n  " + "\n  ".join(too_big)


def test_output_size_check_can_fail():
    """The size check measures what it should: a 25 KB print and a 250 KB image both count as huge."""
    text = nbformat.v4.new_output("stream", name="stdout", text="x" * 25_000)
    image = nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(b"\0" * 250_000).decode()})
    assert _output_sizes(text) == [("stream", 25_000)]
    assert _output_sizes(image) == [("image/png", 250_000)]


EXERCISE_MENTION = re.compile(r"exercises/[\w.-]+\.ipynb")
EXERCISE_LINK = re.compile(r"\]\((\.\./exercises/[\w.-]+\.ipynb)\)")


@pytest.mark.parametrize("rel", LESSONS)
def test_exercise_links_resolve(rel):
    """Every exercises/*.ipynb a lesson mentions is a relative link to a file that exists.

    Exercises are generated from solutions/ (``swkv-teach make-exercises``); a lesson pointing at
    one that is not there yet fails here until it is.
    """
    text = "\n".join(c.source for c in _read(rel).cells if c.cell_type == "markdown")
    linked = EXERCISE_LINK.findall(text)
    mentioned = set(EXERCISE_MENTION.findall(text))
    unlinked = sorted(m for m in mentioned if not any(target.endswith(m) for target in linked))
    assert not unlinked, f"{rel}: mentions {unlinked} without a relative link like [..](../{unlinked[0]})"
    missing = sorted({t for t in linked if not (ROOT / "notebooks" / t).resolve().is_file()})
    assert not missing, (
        f"{rel}: links to exercises that do not exist: {missing}. "
        "Generate them with `swkv-teach make-exercises` (from solutions/), or fix the link."
    )


README = ROOT / "notebooks" / "README.md"
README_LINK = re.compile(r"\]\(([\w.-]+\.ipynb)\)")


# ----------------------------------------------------------------------------- the repository URL
CONFIG_AND_CODE = ("*.toml", "*.cfg", "*.ini", "*.yml", "*.yaml", "*.py", "*.sh", "Makefile")
SKIP_DIRS = {".venv", ".git", "build", "dist", ".pytest_cache", ".hypothesis", "node_modules", "test-artifacts"}


def _walk(patterns: tuple[str, ...]) -> list[Path]:
    """Files under ROOT matching any pattern, pruning virtualenvs, caches and build output as we go."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        found += [Path(folder, f) for f in files if any(fnmatch.fnmatch(f, p) for p in patterns)]
    return sorted(found)


def _config_and_code_files() -> list[Path]:
    return sorted(set(_walk(CONFIG_AND_CODE)) | {p for p in (ROOT / ".ci").glob("*") if p.is_file()})


def test_repository_url_is_configured_once_in_pyproject():
    """A fork changes one line: pyproject's ``[project.urls] Repository``. No other config or code repeats it."""
    url = nbtools.repo_url()
    assert url.startswith("https://github.com/"), f"Repository should be a GitHub https URL (Colab opens it); got {url}"
    owner_repo = url.removeprefix("https://github.com/")
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert pyproject.count(owner_repo) == 1, f"pyproject.toml should name {owner_repo} once; got {pyproject.count(owner_repo)}"
    elsewhere = [str(p.relative_to(ROOT)) for p in _config_and_code_files()
                 if p.name != "pyproject.toml" and owner_repo in p.read_text(errors="replace")]
    assert not elsewhere, (
        f"{owner_repo} is written into {elsewhere}; read it from pyproject instead (tools/nbtools.repo_url())"
    )


COLAB_LINK = re.compile(r"colab\.research\.google\.com/github/([^/\s)]+/[^/\s)]+)/")


def test_every_colab_badge_uses_the_configured_repository():
    """Badges in notebooks and in markdown files all open the repository pyproject names."""
    owner_repo = nbtools.repo_url().removeprefix("https://github.com/")
    sources = {rel: "\n".join(c.source for c in _read(rel).cells) for rel in ALL}
    sources.update({str(p.relative_to(ROOT)): p.read_text() for p in _walk(("*.md",))})
    wrong = {rel: found for rel, text in sources.items()
             if (found := sorted(set(COLAB_LINK.findall(text)) - {owner_repo}))}
    assert not wrong, f"Colab links to a repository other than {owner_repo}: {wrong}. {REBUILD}"
    badges = [rel for rel in ALL if COLAB_LINK.search(_read(rel).cells[0].source)]
    assert badges == ALL, f"notebooks without a Colab badge first: {sorted(set(ALL) - set(badges))}. {REBUILD}"


def _run_setup_cell(python: str) -> str:
    import subprocess

    source = nbtools.header_cells("notebooks/00_why_cache.ipynb")[1].source
    done = subprocess.run([python, "-c", source], capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_setup_cell_is_silent_where_the_library_is_installed():
    assert _run_setup_cell(sys.executable) == ""


def test_setup_cell_says_what_to_do_where_it_is_not(tmp_path):
    """Outside Colab, a kernel without the library is told the command to run, not left with an ImportError."""
    import venv

    venv.create(tmp_path / "bare", with_pip=False)
    out = _run_setup_cell(str(tmp_path / "bare" / "bin" / "python"))
    assert "not installed in this kernel" in out and "make lab" in out


def test_every_exercise_is_linked_from_a_lesson():
    """A learner meets each exercise from the lesson that prepares it, never stranded in exercises/."""
    linked = set()
    for rel in LESSONS:
        text = "\n".join(c.source for c in _read(rel).cells if c.cell_type == "markdown")
        linked |= {Path(t).name for t in EXERCISE_LINK.findall(text)}
    exercises = {Path(rel).name for rel in _notebooks("exercises")}
    assert exercises, "no exercises found"
    assert not exercises - linked, f"exercises no lesson links to: {sorted(exercises - linked)}"


def test_exercises_are_numbered_in_the_order_the_lessons_reach_them():
    """Issue 19: a learner following the lessons meets exercise 01 first, then 02, and so on (it once went
    02, 01, 03, 07, 06, ...). Reads each lesson's text in order, the header's time line included."""
    met = []
    for rel in LESSONS:
        text = "\n".join(c.source for c in _read(rel).cells if c.cell_type == "markdown")
        for m in EXERCISE_LINK.finditer(text):
            name = Path(m.group(1)).name
            if name not in met:
                met.append(name)
    assert met, "no lesson links an exercise"
    assert met == sorted(met), f"exercises in the order a learner meets them: {met}"
    assert [n[:2] for n in met] == [f"{i:02d}" for i in range(1, len(met) + 1)], met


# ----------------------------------------------------------------------------- the path and known errors
# Issue 19: each of these pins a sentence a reviewer found wrong (or a path out of order), so that the
# error cannot come back unnoticed. They read the stored notebooks' text, as a learner does.
NUMBERED = re.compile(r"^(\d\d)_")


def _lesson_text(stem: str, kinds=("markdown",)) -> str:
    rel = next((r for r in LESSONS if Path(r).stem.startswith(stem)), None)
    assert rel is not None, f"no lesson notebooks/{stem}*.ipynb"
    return "\n".join(c.source for c in _read(rel).cells if c.cell_type in kinds)


def test_the_interview_drill_is_the_last_lesson():
    """The drill asks about every lesson, so it comes after all of them, also when lessons are added."""
    numbers = {Path(rel).stem: int(NUMBERED.match(Path(rel).name).group(1)) for rel in LESSONS
               if NUMBERED.match(Path(rel).name)}
    drill = [stem for stem in numbers if "interview_drill" in stem]
    assert drill, f"no interview drill among {sorted(numbers)}"
    last = max(numbers.values())
    assert numbers[drill[0]] == last, f"{drill[0]} is number {numbers[drill[0]]}; the last lesson is number {last}"


def test_every_lesson_header_gives_its_time():
    for rel in LESSONS:
        first = next(c.source for c in _read(rel).cells[2:] if c.cell_type == "markdown")
        assert re.search(r"\*\*Time:\*\*[^\n]*\d+ min", first), f"{rel}: the opening cell gives no **Time:** in minutes"


def test_exercise_02_is_linked_before_step_4_shows_the_slice():
    """Lesson 1 sends the learner to exercise 02 before it prints the eviction slice (no transcription)."""
    text = _lesson_text("01_", kinds=("markdown", "code"))
    link = text.find("exercises/02_sliding_window_cache.ipynb")
    slice_ = text.find("[:, :, -")
    assert link != -1 and slice_ != -1, "lesson 1 should link exercise 02 and show the slice [:, :, -W:]"
    assert link < slice_, "lesson 1 shows the slice [:, :, -W:] before it links exercise 02"


def test_drill_q13_receptive_field_is_32_times_4095():
    """Regression: Q13 said L x (W - 1) = 32 x 4096 for Mistral 7B; W - 1 is 4095 (lesson 0 has it right)."""
    text = _lesson_text("14_interview_drill")
    q13 = text[text.find("### Q13"):text.find("### Q14")]
    assert q13.strip(), "the drill has no Q13 before a Q14 any more; update this test"
    assert not re.search(r"32 (×|x|\\times) 4096", q13), "Q13 multiplies by W, not W - 1"
    assert "32 \\times 4095" in q13


MISTRAL_PAPER = re.compile(r"arXiv:2310\.06825|positions between i\s*[−-]\s*W and i")
FIGURE_1 = "at most W tokens from the previous layer (here, W = 3)"


def test_wherever_the_mistral_paper_is_quoted_both_of_its_readings_are():
    """The paper contradicts itself: §2 reads as W + 1 keys, Figure 1's caption says at most W (and, like §2, a
    reach of k × W after k layers, which only W + 1 keys give)."""
    texts = {rel: "\n".join(c.source for c in _read(rel).cells if c.cell_type == "markdown") for rel in LESSONS}
    texts["docs/references.md"] = (ROOT / "docs" / "references.md").read_text()
    quoting = {rel for rel, text in texts.items() if "positions between i" in text}
    assert quoting, "no lesson quotes the paper's §2 wording any more; update this test"
    missing = sorted(rel for rel in quoting if FIGURE_1 not in " ".join(texts[rel].replace("#", " ").split()))
    assert not missing, f"these quote §2's 'between i − W and i' without Figure 1's '{FIGURE_1}': {missing}"
    # issue 27: the caption is not one-sided either: it also moves information "by up to k × W tokens"
    one_sided = sorted(rel for rel in quoting if "k × W" not in texts[rel])
    assert not one_sided, f"these quote Figure 1's 'at most W' but not its 'k × W' reach (the W + 1 reading): {one_sided}"


def test_no_lesson_calls_a_loop_of_batch_1_steps_continuous_batching():
    """Regression: lesson 7 called its loop of batch-1 steps "continuous batching" (one forward per request)."""
    text = " ".join(_lesson_text("07_serving").replace("#", " ").split())
    assert not re.search(r"what engines call continuous batching", text)
    assert "step-by-step scheduling" in text


def test_vllm_kv_cache_groups_are_not_one_per_attention_type():
    """Regression: vLLM v1 splits layers into groups of equal size (kv_cache_utils.py), not sliding vs global."""
    text = " ".join(_lesson_text("07_serving").replace("#", " ").split())
    assert "one group for its sliding layers and one for its global layers" not in text
    assert "_get_kv_cache_groups_uniform_page_size" in text and "3 kv_cache_groups" in text


def test_which_tokens_to_keep_does_not_say_the_window_wins_or_ties():
    """Regression: its own table has the attention-read LRU ahead of the window at B = 8, 16, 32."""
    for rel, text in [("notebooks/08_which_tokens_to_keep", _lesson_text("08_which")),
                      ("notebooks/README.md", README.read_text())]:
        assert "wins or ties" not in text, f"{rel} still says the window wins or ties"


def test_measuring_quotes_no_decode_gap_of_its_own():
    """Regression: lesson 6 called the ring-naive gap per decoded token 'within noise', then 'about 12 % faster in
    every run' beside a stored run of 0.98-1.08 (issue 27). The gap is this run's: printed, never in the prose."""
    text = " ".join(_lesson_text("06_measuring").split())
    assert "within noise" not in text and "in every run we made" not in text and "12 %" not in text
    code = _lesson_text("06_measuring", kinds=("code",))
    assert "naive / ring:" in code, "the cell comparing ring and naive per token should print the gap"


def test_the_blog_post_is_named_by_its_title():
    title = "Hands-On Build Guide: Sliding-Window Attention KV Cache with LRU Eviction"
    assert title in " ".join(_lesson_text("05_eviction").replace("#", " ").split())
    assert title in (ROOT / "docs" / "references.md").read_text()


def test_saving_a_lessons_source_in_jupyterlab_leaves_its_stored_notebook_alone(tmp_path):
    """Regression (newcomer trial): the sources declared `formats: ipynb,py:percent`, so opening
    `notebooks/07_serving_memory.py` in JupyterLab (jupytext is in the lab extra) and pressing save rewrote the
    stored .ipynb without its badge, set-up cell and kernelspec. Sources are now unpaired: the build makes the .ipynb."""
    import hashlib
    import shutil

    from jupytext import TextFileContentsManager

    sources = sorted(p for f in EXECUTED for p in (ROOT / f).glob("*.py"))
    assert sources, "no lesson or solution sources found"
    paired = [str(p.relative_to(ROOT)) for p in sources if "formats:" in p.read_text().split("# ---", 2)[1]]
    assert not paired, f"sources paired with their notebooks (remove the `formats:` line): {paired}"
    for ext in ("py", "ipynb"):
        shutil.copy(ROOT / f"notebooks/07_serving_memory.{ext}", tmp_path / f"lesson.{ext}")
    before = hashlib.sha256((tmp_path / "lesson.ipynb").read_bytes()).hexdigest()
    cm = TextFileContentsManager(root_dir=str(tmp_path))
    cm.save(cm.get("lesson.py"), "lesson.py")
    assert hashlib.sha256((tmp_path / "lesson.ipynb").read_bytes()).hexdigest() == before


# ----------------------------------------------------------------------------- concepts in path order
# Issue 27: lesson 4 called `Decoder.step_paged` with a block table and lesson 6 read a `BlockPool` the way a
# kernel does, before lesson 7 taught paging; lesson 0 named GQA three lessons before explaining it. Each row:
# a concept, the lesson that teaches it, a phrase that lesson's prose must contain (the definition), and
# markers of a use (identifiers in code cells, or words in prose) that no earlier lesson may show.
CONCEPTS = {
    "paging: a block pool and block tables": (
        "07_", "block table",
        {"code": [r"\bBlockPool\b", r"\bPagedKVCache\b", r"\bblock_table\b", r"\bstep_paged\b",
                  r"\bpaged_attention\b", r"\bScheduler\b"]}),
    "grouped-query attention (GQA)": (
        "00_", "grouped-query attention",
        {"code": [r"\bn_kv_heads\b", r"\benable_gqa\b", r"\bkv_heads\b"], "markdown": [r"\bGQA\b"]}),
    "rotary position embeddings (RoPE)": (
        "03_", "rotary positions",
        {"code": [r"\bapply_rotary\b", r"\brotary\(", r"\brope_theta\b"], "markdown": [r"\bRoPE\b"]}),
    "int8 keys and values": ("07_", "Quantisation", {"code": [r"\bInt8RingBufferKVCache\b", r"\bint8\b"]}),
    "attention-scored eviction (H2O, TOVA)": ("08_", "H2O", {"code": [r"\bH2O\w*\b", r"\bTOVA\w*\b"]}),
}


def _concept_violations(texts: dict[str, dict[str, str]]) -> list[str]:
    """Uses of a concept before its teaching lesson. ``texts``: lesson stem -> {"code": ..., "markdown": ...},
    in path order. Also a teaching lesson that lacks its definition phrase."""
    stems = list(texts)
    problems = []
    for concept, (teacher, definition, markers) in CONCEPTS.items():
        at = next((n for n, stem in enumerate(stems) if stem.startswith(teacher)), None)
        if at is None:
            problems.append(f"{concept}: no lesson {teacher}* to teach it")
            continue
        own = texts[stems[at]]
        prose = " ".join(own["markdown"].replace("*", "").split()).lower()
        if definition.lower() not in prose:
            problems.append(f"{concept}: {stems[at]} should define it (its prose lacks {definition!r})")
        else:
            # the opening cell (time, goals, outline) announces what the lesson teaches; the body must
            # define the concept before it names it
            prose = " ".join(own.get("body", own["markdown"]).replace("*", "").split()).lower()
            first = min((m.start() for pattern in markers.get("markdown", []) if (m := re.search(pattern, prose,
                         re.IGNORECASE))), default=len(prose))
            if first < prose.find(definition.lower()):
                problems.append(f"{concept}: {stems[at]} names it before it defines it ({definition!r})")
        for stem in stems[:at]:
            for kind, patterns in markers.items():
                for pattern in patterns:
                    if m := re.search(pattern, texts[stem][kind]):
                        problems.append(f"{concept} is taught in {stems[at]} but {stem} uses it first "
                                        f"({kind} {m.group(0)!r})")
    return problems


def _lesson_texts_in_path_order() -> dict[str, dict[str, str]]:
    """Lesson stem -> its code, its prose, and its prose after the opening cell ("body"), header cells left out."""
    texts = {}
    for rel in LESSONS:
        cells = _read(rel).cells[2:]
        texts[Path(rel).stem] = {kind: "\n".join(c.source for c in cells if c.cell_type == kind)
                                 for kind in ("code", "markdown")}
        texts[Path(rel).stem]["body"] = "\n".join(c.source for c in cells[1:] if c.cell_type == "markdown")
    return texts


def test_every_concept_is_taught_before_a_lesson_uses_it():
    problems = _concept_violations(_lesson_texts_in_path_order())
    assert not problems, "concepts used before they are taught:\n  " + "\n  ".join(problems)


def test_the_concept_check_catches_a_use_before_the_teaching_lesson():
    """The check fails on what the third edition did: a block table in lesson 4's code, GQA unexplained."""
    texts = {"00_why": {"code": "", "markdown": "8 KV heads of 128 for GQA"},
             "03_ring": {"code": "", "markdown": "rotary positions (RoPE)"},
             "04_decoding": {"code": "model.step_paged(ids, start, kv, table)", "markdown": ""},
             "07_serving": {"code": "", "markdown": "a block table; Quantisation"},
             "08_which": {"code": "", "markdown": "H2O"}}
    problems = _concept_violations(texts)
    assert any("04_decoding uses it first" in p and "step_paged" in p for p in problems), problems
    assert any("00_why should define it" in p for p in problems), problems
    texts["00_why"]["markdown"] += " (grouped-query attention)"
    assert any("00_why names it before it defines it" in p for p in problems + _concept_violations(texts))
    texts["00_why"]["markdown"] = "8 KV heads (grouped-query attention: 4 query heads per KV head) for GQA"
    texts["04_decoding"]["code"] = ""
    assert _concept_violations(texts) == []


# ----------------------------------------------------------------------------- prose that cannot drift
# Issue 27: twice a lesson's prose quoted a number its stored run did not show ("about 12 % faster in every
# run" beside a printed 0.98-1.08). The rule, checked here for every lesson before the drill (00-13):
#
# * a number with the unit of a measurement in a lesson's prose (a time in µs, ms or s, a ratio `1.5x`, a
#   share in %, a loss in nats) must be printed, with the same unit and to the prose's precision, by one of
#   that lesson's code cells whose output nbval compares (a cell without ``# NBVAL_IGNORE_OUTPUT``). Byte
#   counts are left out: in this course they are arithmetic from a config, printed and compared exactly. nbval holds that output to a fresh run, and this test holds the prose
#   to that output, so prose and run cannot drift apart without a test failing;
# * a measurement that changes from run to run (a timing) cannot be printed by a compared cell, so it cannot
#   be quoted in prose at all: the cell prints the sentence itself, built from the run's values;
# * numbers that are not measurements (a data sheet's bandwidth, a paper's figure, a confidence level)
#   are listed in NOT_MEASURED with the reason.
MEASURE = re.compile(r"(?<![\w.,])(\d{1,3}(?:[ ,]\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"  # 1 000, 20,500, 0.93
                     r"(?:\s?(µs|ms|s|nats)|\s?(%)(?!\s*[\d`(])|(×|x))(?![\w])")  # 5x is a ratio, 2 × 16 a product
NOT_MEASURED = {
    ("00_", "1000 x"): "arithmetic: a step without a cache costs about t times a cached one, at t = 1k",
    ("00_", "5 x"): "arithmetic from the printed floors (45 ms full against 9.4 ms windowed)",
    ("00_", "24000 x"): "arithmetic: the same at t = 32k",
    ("00_", "15 %"): "arithmetic: 4·W·d against 2P for Mistral 7B's sizes",
    ("07_", "1.5 x"): "vLLM's rule for grouping layers, not a result",
    ("06_", "10 %"): "a going-further question's threshold, not a result",
    ("08_", "95 %"): "the confidence level of the intervals, not a result",
    ("09_", "95 %"): "the confidence level of the intervals, not a result",
    ("13_", "95 %"): "the confidence level of the intervals, not a result",
}
PROSE_CHECKED = [rel for rel in LESSONS if NUMBERED.match(Path(rel).name)
                 and "interview_drill" not in rel]


def _measures(text: str) -> set[str]:
    """``{"0.93 x", "12 %", ...}``: each number with its unit, normalised (× is x, thousands' commas dropped)."""
    return {f"{re.sub('[ ,]', '', num)} {'x' if ''.join(units) == '×' else ''.join(units)}"
            for num, *units in MEASURE.findall(text)}


def _shown(claim: str, printed: set[str]) -> bool:
    """Whether a prose claim ("3 ms", "0.02 nats") is a printed value of the same unit, rounded as the prose has it."""
    num, unit = claim.split(" ")
    places = len(num.split(".")[1]) if "." in num else 0
    for p in printed:
        pnum, punit = p.split(" ")
        if punit == unit and round(float(pnum), places) == float(num):
            return True
    return False


def _unquoted_claims(cells, stem: str) -> list[str]:
    prose = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    printed = set()
    for c in cells:
        if c.cell_type == "code" and "NBVAL_IGNORE_OUTPUT" not in c.source:
            for output in c.get("outputs", []):
                text = output.get("text") or output.get("data", {}).get("text/plain", "")
                printed |= _measures("".join(text) if isinstance(text, list) else text)
    return sorted(m for m in _measures(prose) if not _shown(m, printed)
                  and not any(stem.startswith(s) and m == q for (s, q) in NOT_MEASURED))


@pytest.mark.parametrize("rel", PROSE_CHECKED)
def test_numbers_quoted_in_prose_are_printed_by_a_compared_cell(rel):
    missing = _unquoted_claims(_read(rel).cells[2:], Path(rel).stem)
    assert not missing, (
        f"{rel}: its prose quotes {missing}, which no code cell without NBVAL_IGNORE_OUTPUT prints. Print the "
        "sentence from the run's values instead (see the comment above NOT_MEASURED), or, for a number that is "
        "not a measurement, list it in NOT_MEASURED with the reason."
    )


def test_the_prose_check_catches_a_quoted_timing():
    """A timing quoted in prose and printed only by an ignored cell is caught; printed by a compared cell, not."""
    prose = nbformat.v4.new_markdown_cell("the ring's step was about 12 % faster (0.93x the naive's)")
    ignored = nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint(...)",
                                        outputs=[nbformat.v4.new_output("stream", text="12 % and 0.93x\n")])
    assert _unquoted_claims([prose, ignored], "06_x") == ["0.93 x", "12 %"]
    compared = nbformat.v4.new_code_cell("print(...)", outputs=[nbformat.v4.new_output("stream", text="12 %, 0.93×")])
    assert _unquoted_claims([prose, compared], "06_x") == []


# ----------------------------------------------------------------------------- links a website can serve
FOLDER_LINK = re.compile(r"\]\(((?:\.\./|\./)?[\w./-]*/)\)")


def test_no_lesson_links_a_folder():
    """Issue 31: lesson 8 linked `../exercises/`; JupyterLab opens a folder, a static website cannot. Link the file."""
    texts = {rel: "\n".join(c.source for c in _read(rel).cells if c.cell_type == "markdown") for rel in LESSONS}
    texts["notebooks/README.md"] = README.read_text()
    folders = {rel: found for rel, text in texts.items() if (found := FOLDER_LINK.findall(text))}
    assert not folders, f"links to folders (link the notebook or file itself): {folders}"
    assert FOLDER_LINK.findall("the [exercises](../exercises/) and [01](../exercises/01_x.ipynb)") == ["../exercises/"]


# ----------------------------------------------------------------------------- times
HEADER_TIME = re.compile(r"\*\*Time:\*\* about (\d+) min")
HEADER_EXERCISE = re.compile(r"(\d+)–(\d+) (?:for \[exercise|to answer)")
INDEX_ROW = re.compile(r"^\| *(\d+) *\| *\[[^\]]*\]\(([\w.-]+\.ipynb)\) *\| *([^|]*?) *\|", re.MULTILINE)
INDEX_TIME = re.compile(r"^(\d+) min(?: \+ (\d+)–(\d+))?$")
PLACEHOLDER = "see lesson"  # a row whose lesson another branch writes; the lead fills its time at the merge


def _index_rows() -> dict[str, str]:
    """notebooks/README.md's lesson table: notebook file name -> its time cell."""
    return {name: time for _, name, time in INDEX_ROW.findall(README.read_text())}


def test_readme_lists_every_lesson():
    assert README.is_file(), f"{README.relative_to(ROOT)} is missing: it is the index of the lessons"
    rows = _index_rows()
    listed = set(README_LINK.findall(README.read_text()))
    present = {Path(rel).name for rel in LESSONS}
    assert not present - listed, f"notebooks/README.md does not link these lessons: {sorted(present - listed)}"
    missing = sorted(n for n in listed - present if rows.get(n) != PLACEHOLDER)
    assert not missing, f"notebooks/README.md links lessons that do not exist: {missing}"


@pytest.mark.parametrize("rel", LESSONS)
def test_header_time_equals_the_index(rel):
    """The lesson's **Time:** line and notebooks/README.md's row say the same minutes and exercise ranges."""
    first = next(c.source for c in _read(rel).cells[2:] if c.cell_type == "markdown")
    header = HEADER_TIME.search(first)
    assert header, f"{rel}: the opening cell should say '**Time:** about N minutes'"
    ranges = [tuple(map(int, r)) for r in HEADER_EXERCISE.findall(first)]
    row = _index_rows().get(Path(rel).name)
    assert row is not None, f"notebooks/README.md has no table row linking {Path(rel).name}"
    index = INDEX_TIME.match(row)
    assert index, f"notebooks/README.md: {Path(rel).name}'s time should read 'N min' or 'N min + a–b'; got {row!r}"
    assert int(index.group(1)) == int(header.group(1)), (
        f"{rel}: header says {header.group(1)} min, notebooks/README.md says {index.group(1)} min")
    lo, hi = sum(r[0] for r in ranges), sum(r[1] for r in ranges)
    got = (int(index.group(2)), int(index.group(3))) if index.group(2) else (0, 0)
    assert got == (lo, hi), f"{rel}: exercises in the header add up to {lo}–{hi} min; the index says {got[0]}–{got[1]}"
