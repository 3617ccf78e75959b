"""Build the course website into build/site/ from the stored, executed notebooks (nothing is executed).

    python site/build_site.py                 # stage the pages into build/site-src/, then run Sphinx
    python site/build_site.py --requirements  # print pyproject's `site` extra (what `make site` installs)

Staging copies the course's files, never edits them:

* the home page (``index.md``) is written for learners by site/landing.py: what the course is, the path as a
  table made from the lessons' headers (times, exercises), where to start, the teachers' route; README.md is
  staged as ``readme.md``, the repository's front page, among the reference pages;
* every lesson ``notebooks/*.ipynb`` and every exercise statement ``exercises/*.ipynb``, in path order, found
  by globbing (a new lesson appears without an edit here); ``solutions/`` is never read;
* ``notebooks/README.md`` (the lessons' index) and ``docs/*.md`` (cheat sheet, glossary, references).

On the way, each notebook's "Open in Colab" header cell becomes a bar with the same Colab target (made from
pyproject's ``[project.urls] Repository``, as tools/nbtools.py makes the badge) beside a link to download the
``.ipynb``; the set-up cell, which only matters in a kernel, is dropped; a widget's output, which needs a kernel
(the notebooks store no widget state), becomes a note saying so. Links that work in a clone but not on a website
are rewritten: a link to a page of the site stays relative, a folder of lessons or exercises goes to its index
page, any other file or folder of the repository goes to GitHub.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from repo import repo_url  # noqa: E402  (one place for the address: tools/repo.py)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import Lesson, exercise_homes, lessons, plain, title_of  # noqa: E402
from landing import landing_page  # noqa: E402

CONF_DIR = ROOT / "site"
STAGE = ROOT / "build" / "site-src"
OUT = ROOT / "build" / "site"
DOCTREES = ROOT / "build" / "site-doctrees"
WARNINGS = ROOT / "build" / "site-warnings.txt"
SCORER = ROOT / "build" / "site-scorer.js"  # site/search_scorer.js with the pages' words (conf.py hands it to Sphinx)

HEADER_TAG = "swkv-header"  # tools/nbtools.py tags the badge and set-up cells with it
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")
# a folder of the course that has a page on the site
FOLDER_PAGES = {"notebooks": "notebooks/README.md", "exercises": "exercises/index.md"}


def site_repo_url() -> str:
    """The repository the site links to (GitHub buttons, Colab, files): pyproject's address, or, in a Pages workflow,
    the repository that publishes the site (SWKV_SITE_REPOSITORY, which .github/workflows/pages.yml sets from
    github.repository). Upstream and a fork that changed pyproject's line get the same address either way; a fork
    that kept the upstream line links to itself, not upstream."""
    published_from = os.environ.get("SWKV_SITE_REPOSITORY", "").strip().rstrip("/")
    return published_from or repo_url()


def colab_url(rel_path: str) -> str:
    """Where the page's "Open in Colab" button points (as tools/repo.py's colab_url, for the site's repository)."""
    gh = site_repo_url().replace("https://github.com/", "")
    return f"https://colab.research.google.com/github/{gh}/blob/main/{rel_path}"


def pyproject() -> str:
    return (ROOT / "pyproject.toml").read_text()


def site_requirements() -> list[str]:
    """pyproject's ``site`` extra, so `make site` installs only what the build needs (no torch)."""
    m = re.search(r"^site\s*=\s*\[([^\]]*)\]", pyproject(), re.M)
    if not m:
        raise SystemExit("pyproject.toml has no `site` extra")
    return re.findall(r'"([^"]+)"', m.group(1))


def course_pages() -> dict[str, list[str]]:
    """Repository-relative paths of what the site shows, each list in path order."""
    def rel(paths) -> list[str]:
        return [p.relative_to(ROOT).as_posix() for p in sorted(paths)]

    return {
        "lessons": rel((ROOT / "notebooks").glob("*.ipynb")),
        "exercises": rel((ROOT / "exercises").glob("*.ipynb")),
        "docs": rel((ROOT / "docs").glob("*.md")),
    }


def staged_name(repo_path: str) -> str:
    return "readme.md" if repo_path == "README.md" else repo_path


class Linker:
    """Rewrites the relative links of one staged file (see the module docstring)."""

    def __init__(self, pages: set[str]):
        self.pages = pages  # staged paths of every page
        self.assets: set[str] = set()  # pictures copied beside the pages that show them

    @staticmethod
    def label(text: str, full: str) -> str:
        """A link labelled with a file path (`exercises/03_ring_buffer.ipynb`) opens a web page here: label it with
        the page's title instead."""
        bare = text.strip("[`").rstrip("]`")
        if not re.fullmatch(r"[\w./-]+\.(ipynb|md)", bare):
            return text
        if full == "README.md":
            return "[the README"
        return "[" + (title_of(full) if (ROOT / full).is_file() else bare)

    def rewrite(self, text: str, repo_path: str) -> str:
        here = posixpath.dirname(repo_path)
        staged_here = posixpath.dirname(staged_name(repo_path))

        def fix(m: re.Match) -> str:
            target = m.group(2)
            if re.match(r"[a-z][a-z0-9+.-]*:|#|/", target):  # absolute URL, mailto:, anchor, site-absolute
                return m.group(0)
            path, _, frag = target.partition("#")
            frag = f"#{frag}" if frag else ""
            full = posixpath.normpath(posixpath.join(here, path))
            if full.startswith(".."):
                return m.group(0)
            on_disk = ROOT / full
            if on_disk.is_dir() or path.endswith("/"):
                page = FOLDER_PAGES.get(full)
                if page in self.pages:
                    new = posixpath.relpath(page, staged_here or ".") + frag
                    if re.fullmatch(r"\[`?[\w./-]+/?`?", m.group(1)[:-2]):  # a folder's path as the label
                        return f"[{'the lessons' if full == 'notebooks' else 'the exercises'}](" + new + m.group(3)
                else:
                    new = f"{site_repo_url()}/tree/main/{full}"
            elif staged_name(full) in self.pages:
                new = posixpath.relpath(staged_name(full), staged_here or ".") + frag
                if not m.group(1).startswith("!"):
                    return self.label(m.group(1)[:-2], full) + "](" + new + m.group(3)
            elif on_disk.is_file() and m.group(1).startswith("!"):
                new = target  # a picture beside the page: staged with it
                copy_if_changed(on_disk, STAGE / full)
                self.assets.add(full)
            elif on_disk.is_file():
                new = f"{site_repo_url()}/blob/main/{full}{frag}"
            else:
                return m.group(0)  # missing: Sphinx warns, the site test reports it
            return m.group(1) + new + m.group(3)

        return LINK.sub(fix, text)


def launch_bar(rel_path: str) -> str:
    """Raw HTML for the top of a notebook page: Colab (badge shipped in _static) and the .ipynb itself."""
    depth = rel_path.count("/")
    static = "../" * depth + "_static"
    name = posixpath.basename(rel_path)
    return (
        '<div class="swkv-launch">\n'
        f'<a class="swkv-colab" href="{colab_url(rel_path)}">'
        f'<img src="{static}/colab-badge.svg" alt="Open In Colab" width="117" height="20"></a>\n'
        f'<a class="swkv-download" href="{name}" download title="{name}">Download .ipynb</a>\n'
        "</div>"
    )


def widget_note(plain: str) -> str:
    kind = plain.split("(", 1)[0].strip() or "widget"
    return (
        '<div class="swkv-widget-note" role="note"><p><strong>Interactive widget'
        f"{': ' + kind if re.fullmatch(r'[A-Za-z_][A-Za-z0-9_.]*', kind) else ''}.</strong> "
        "It needs a running Python kernel, so this page cannot show it: open the notebook in Colab "
        "(the badge at the top of the page) or run it locally with <code>make lab</code>.</p></div>"
    )


SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*(\[])")


def figure_words(before: str, after: str) -> dict:
    """myst-nb's metadata for a figure cell: the caption is the sentence the lesson writes under the figure (the
    next markdown cell's first sentence, unless that cell opens a section or an aside); the alt text is the last
    paragraph above it, which says what is drawn."""
    meta: dict = {}
    text = after.strip()
    if text and not text.startswith(("#", ">", "|", "<", "-", "*  ", "1.")):
        meta["figure"] = {"caption": SENTENCE_END.split(plain(text.split("\n\n")[0]), maxsplit=1)[0]}
    above = plain(before.strip().split("\n\n")[-1]) if before.strip() else ""
    alt = above if above and not above.startswith("#") else meta.get("figure", {}).get("caption", "")
    if alt:
        meta["image"] = {"alt": alt[:300]}
    return meta


def stage_notebook(repo_path: str, linker: Linker, ties: str = "") -> str:
    """``ties``: markdown set under the page's title (the lesson <-> exercise links)."""
    nb = json.loads((ROOT / repo_path).read_text())
    cells = []
    last_markdown = ""
    for i, cell in enumerate(nb["cells"]):
        tags = cell.get("metadata", {}).get("tags", [])
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if HEADER_TAG in tags:
            if cell["cell_type"] == "markdown":  # the badge: replaced by the launch bar
                cells.append({**cell, "source": launch_bar(repo_path)})
            continue  # the set-up cell installs the library on Colab: nothing to read on a static page
        if cell["cell_type"] == "markdown":
            last_markdown = source
            # the page is the website, where no kernel runs
            source = source.replace("No live kernel (reading this on GitHub)?", "No live kernel (as on this website)?")
            source = linker.rewrite(source, repo_path)
            if ties and re.match(r"#\s", source.lstrip()):  # right under the page's title
                title, _, rest = source.lstrip().partition("\n")
                source, ties = f"{title}\n\n{ties}\n{rest}", ""
            cell = {**cell, "source": source}
        elif cell["cell_type"] == "code":
            # nbval's markers are for the test suite, not the reader
            kept = [line for line in source.split("\n") if not line.lstrip().startswith("# NBVAL_")]
            outputs = []
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                if WIDGET_MIME in data:
                    plain = data.get("text/plain", "")
                    plain = "".join(plain) if isinstance(plain, list) else plain
                    out = {**out, "data": {"text/html": widget_note(plain)}}
                outputs.append(out)
            cell = {**cell, "source": "\n".join(kept), "outputs": outputs}
            if any(k.startswith("image/") for out in outputs for k in out.get("data", {})):
                after = next(("".join(c["source"]) for c in nb["cells"][i + 1:] if c["cell_type"] == "markdown"), "")
                words = figure_words(last_markdown, after)
                if words:
                    cell["metadata"] = {**cell.get("metadata", {}), "mystnb": words}
        cells.append(cell)
    if not any(HEADER_TAG in c.get("metadata", {}).get("tags", []) for c in nb["cells"]):
        cells.insert(0, {"cell_type": "markdown", "id": "swkv-launch", "metadata": {}, "source": launch_bar(repo_path)})
    nb["cells"] = cells
    nb.get("metadata", {}).pop("widgets", None)
    return json.dumps(nb, indent=1, ensure_ascii=False)


def toctree(caption: str, entries: list[str]) -> str:
    lines = "\n".join(entries)
    return f"\n```{{toctree}}\n:hidden:\n:caption: {caption}\n\n{lines}\n```\n"


def doc(path: str) -> str:
    return posixpath.splitext(staged_name(path))[0]


def _words(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def search_words(staged: str) -> dict[str, str]:
    """What the search ranks a page by (site/search_scorer.js): its title, its headings, its text, as words."""
    text = staged_text(staged)
    # link targets and HTML tags are not prose (a tag: `<div ...>` on one line; code's `a < b > c` stays)
    text = re.sub(r"</?[a-zA-Z][^<>\n]*>", " ", re.sub(r"\]\([^)\s]*\)", "]", text))
    title = re.search(r"^#\s+(.+)$", text, re.M)
    headings = [h for h in re.findall(r"^#{2,6}\s+(.+)$", text, re.M)]
    return {"t": _words(title.group(1)) if title else "", "h": "\n".join(map(_words, headings)), "b": _words(text)}


def staged_text(staged: str) -> str:
    if staged.endswith(".ipynb"):
        nb = json.loads((STAGE / staged).read_text())
        return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in nb["cells"])
    return (STAGE / staged).read_text()


def write_scorer(pages: list[str], course: list[Lesson], homes: dict) -> None:
    """build/site-scorer.js: site/search_scorer.js, the pages' words, and the course's path (each lesson, then the
    exercises it sets) that orders near ties."""
    data = {doc(p): search_words(p) for p in pages if p != "404.md"}
    order = []
    for lesson in course:
        order.append(doc(lesson.path))
        order += [doc(ex) for ex in sorted(homes) if homes[ex][0].path == lesson.path]
    scorer = (CONF_DIR / "search_scorer.js").read_text()
    write_if_changed(SCORER, scorer + "\nScorer.pages = " + json.dumps(data, separators=(",", ":")) + ";\n"
                     + "Scorer.order = " + json.dumps(order) + ";\n")


def lesson_ties(lesson: Lesson) -> str:
    """Under a lesson's title: its exercises, each with the section that reaches it."""
    if not lesson.exercises:
        return ""
    items = []
    for ex, lo, hi in lesson.exercises:
        section, anchor = lesson.reaches[ex]
        where = f", in [{section}](#{anchor})" if anchor else ""
        items.append(f"- [{title_of(ex)}](../{ex}) ({lo}–{hi} min){where}")
    return ("```{admonition} Exercises in this lesson\n:class: swkv-ties tip\n"
            "Do each where the lesson reaches it: its last cells grade your answer.\n\n" + "\n".join(items) + "\n```\n")


def exercise_ties(ex: str, homes: dict) -> str:
    """Under an exercise's title: the lesson, and its section, where the course reaches it."""
    if ex not in homes:
        return ""
    lesson, section, anchor = homes[ex]
    target = f"../{lesson.path}" + (f"#{anchor}" if anchor else "")
    where = f", section [{section}]({target})" if anchor else ""
    return ("```{admonition} Where the course reaches it\n:class: swkv-ties tip\n"
            f"[{lesson.title}](../{lesson.path}){where}. Read the lesson up to there first: it teaches what this "
            "exercise asks.\n```\n")


def stage() -> list[str]:
    """Write build/site-src/; returns the staged paths of every page (unchanged files keep their mtime, so
    Sphinx rebuilds only what changed)."""
    found = course_pages()
    readme_lessons = ["notebooks/README.md"] if (ROOT / "notebooks" / "README.md").is_file() else []
    pages = ["index.md", *readme_lessons, *found["lessons"], "exercises/index.md", *found["exercises"], *found["docs"],
             "readme.md", "404.md"]
    linker = Linker(set(pages))
    written = set()

    def put(path: str, text: str) -> None:
        write_if_changed(STAGE / path, text)
        written.add(path)

    course = lessons()
    homes = exercise_homes(course)
    toc = [*(["All lessons <notebooks/README>"] if readme_lessons else []), *map(doc, found["lessons"])]
    home = landing_page(course, site_repo_url())
    home += toctree("Lessons", toc)
    home += toctree("Exercises", ["All exercises <exercises/index>", *map(doc, found["exercises"])])
    home += toctree("Reference", [*map(doc, found["docs"]), "The repository's README <readme>"])
    put("index.md", home)
    put("readme.md", linker.rewrite((ROOT / "README.md").read_text(), "README.md"))
    for path in readme_lessons + found["docs"]:
        put(path, linker.rewrite((ROOT / path).read_text(), path))
    by_path = {lesson.path: lesson for lesson in course}
    for path in found["lessons"]:
        put(path, stage_notebook(path, linker, lesson_ties(by_path[path]) if path in by_path else ""))
    for path in found["exercises"]:
        put(path, stage_notebook(path, linker, exercise_ties(path, homes)))
    listing = "\n".join(
        f"- [{title_of(p)}]({posixpath.basename(p)})"
        + (f", in [{homes[p][0].title}](../{homes[p][0].path})" if p in homes else "") for p in found["exercises"])
    put("exercises/index.md", (
        "# Exercises\n\nThe graded exercises, numbered in the order the lessons reach them. Each page shows the "
        "statement: open it in Colab, or download the notebook and work on it with `make lab`; its last cells "
        "check your answer (the README's [exercises and grading](../readme.md#exercises-and-grading) says how "
        "grading works).\n\n" + listing + "\n"))
    put("404.md", (
        "---\norphan: true\n---\n\n# Page not found\n\nThis page is not part of the course (it may have moved "
        "when a lesson was renumbered). Go to the [course's home page](index.md), the [list of lessons]"
        "(notebooks/README.md) or the [exercises](exercises/index.md), or search with the box on the left.\n"))
    write_scorer(pages, course, homes)
    for stale in [p for p in STAGE.rglob("*") if p.is_file()]:
        rel = stale.relative_to(STAGE).as_posix()
        if rel not in written and rel not in linker.assets:
            stale.unlink()
    return pages


def write_if_changed(path: Path, text: str) -> None:
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def copy_if_changed(src: Path, dest: Path) -> None:
    if dest.is_file() and dest.read_bytes() == src.read_bytes():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)


def based_404(page: str, base_path: str | None) -> str:
    """GitHub Pages serves 404.html for any missing address, e.g. /<repo>/notebooks/gone.html: its relative links and
    styles would resolve from notebooks/. A <base> at the site's root (configure-pages' base_path, "/<repo>" or "")
    makes them resolve from where 404.html really is. None: no <base> (served locally, or tested)."""
    page = re.sub(r'\n  <base href="[^"]*">', "", page)
    if base_path is None:
        return page
    return page.replace("<head>", f'<head>\n  <base href="{base_path.rstrip("/")}/">', 1)


def build(jobs: str = "1") -> int:
    start = time.monotonic()
    pages = stage()
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(CONF_DIR), "-d", str(DOCTREES), "-q",
           "--keep-going", "-w", str(WARNINGS), "-j", jobs, str(STAGE), str(OUT)]
    rc = subprocess.run(cmd).returncode
    if rc:
        return rc
    found = course_pages()
    for path in found["lessons"] + found["exercises"]:  # the "Download .ipynb" links: the stored notebooks
        copy_if_changed(ROOT / path, OUT / path)
    if (OUT / "404.html").is_file():  # Sphinx rewrites a page only when it changed: set or clear the <base> here
        (OUT / "404.html").write_text(based_404((OUT / "404.html").read_text(), os.environ.get("SWKV_SITE_BASE_PATH")))
    if (OUT / "_sources").is_dir() and not any((OUT / "_sources").iterdir()):
        (OUT / "_sources").rmdir()  # html_copy_source is off; Sphinx makes the folder anyway
    warnings = WARNINGS.read_text().strip() if WARNINGS.is_file() else ""
    # name the course's file, not its staged copy (the line numbers of a notebook count its JSON lines)
    warnings = warnings.replace(f"{STAGE}/readme.md", "README.md").replace(f"{STAGE}/", "")
    WARNINGS.write_text(warnings + "\n" if warnings else "")
    print(f"site: {len(pages)} pages in {time.monotonic() - start:.0f} s -> {OUT.relative_to(ROOT)}/index.html"
          + (f"; Sphinx warned ({WARNINGS.relative_to(ROOT)}):\n{warnings}" if warnings else "; no warnings"))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requirements", action="store_true", help="print the site extra's requirements and exit")
    ap.add_argument("-j", "--jobs", default=os.environ.get("SITE_JOBS", "1"), help="Sphinx's parallel jobs")
    args = ap.parse_args(argv)
    if args.requirements:
        print("\n".join(site_requirements()))
        return 0
    return build(args.jobs)


if __name__ == "__main__":
    sys.exit(main())
