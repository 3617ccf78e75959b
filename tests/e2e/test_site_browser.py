"""The course website (`make site`) in a real browser, and what it must never contain.

Builds the site once per session (site/build_site.py: about 15 s, no kernel starts), serves build/site/ on
127.0.0.1 and drives Debian's Chromium at /usr/bin/chromium with Playwright, as the explorer test does:

- every page loads with no failed request, no request leaving the machine and no console error; every image on
  it has loaded (the Colab badge is shipped with the site);
- every internal link (href and src, with its #fragment) resolves to a built file;
- search finds the right lessons; the sidebar and the next links list lessons and exercises in path order;
- no solution code: the lines between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` in solutions/*.py occur
  in no built file (except lines the course publishes anyway: in a lesson, or in the exercise's statement);
- each lesson shows its stored figures and printed outputs; widgets show a note saying they need a kernel;
- each notebook page links Colab (the notebook's own badge target) and its stored .ipynb;
- at phone width (390 px) no lesson scrolls sideways; wide code and tables scroll inside their box;
- the home page is a landing page for learners (start here, the path with each lesson's time and exercises from
  the lessons' headers, the teachers' route), and the README a reference page; a 404 page links home; no genindex;
- formulas are typeset by the MathJax shipped with the site, with every outside request blocked;
- every code cell has a copy button that copies it, and no code is cut without a scrollbar at 1280 and 390 px;
- search ranks the page that teaches a word first (a fixed set of queries and their expected pages), with snippets
  of prose, not the theme's text;
- the drill: short question titles in the page's contents, answers in closed boxes, heading sizes in order;
- each exercise page links the lesson section that reaches it, and the lesson links back; no link is labelled with
  a file path; figures carry alt text and captions.

The browser tests are marked e2e. Screenshots (home, math, lesson 3, the drill and a search, at 1280 and 390 px
where it matters) go to test-artifacts/site/.
Skips without chromium or the site extra (pip install -e '.[site]') unless SWKV_REQUIRE_E2E=1.
"""

from __future__ import annotations

import functools
import html
import importlib.util
import json
import re
import subprocess
import sys
import threading
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest
from lab_helpers import launched_chromium, skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "build" / "site"
WARNINGS = ROOT / "build" / "site-warnings.txt"
ARTIFACTS = ROOT / "test-artifacts" / "site"
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
NOTEBOOKS = LESSONS + EXERCISES
PHONE = {"width": 390, "height": 844}
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
SITE_DIR = ROOT / "site"


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def page_of(nb: Path) -> str:
    return rel(nb.with_suffix(".html"))


def lesson(number: str) -> Path:
    found = [p for p in LESSONS if p.name.startswith(f"{number}_")]
    assert len(found) == 1, f"expected one lesson numbered {number} in notebooks/, found {found}"
    return found[0]


@pytest.fixture(scope="session")
def site() -> Path:
    """build/site/, built once for the session from the stored notebooks."""
    missing = [m for m in ("sphinx", "myst_nb", "sphinx_book_theme", "sphinx_copybutton", "sphinx-mathjax-offline")
               if importlib.util.find_spec(m) is None]
    if missing:
        skip_or_fail(f"the site extra is not installed ({', '.join(missing)} missing: pip install -e '.[site]')")
    done = subprocess.run([sys.executable, "site/build_site.py"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"site/build_site.py failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert (SITE / "index.html").is_file()
    return SITE


def built_pages(site: Path) -> list[str]:
    """Every page; _static/ holds the themes' template fragments (webpack-macros.html), not pages."""
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html") if "_static" not in p.parts)


# ---------------------------------------------------------------- what the build holds, read from its files


def test_build_has_no_warnings(site):
    """A broken cross-reference, a missing picture or a page outside the table of contents is a Sphinx warning."""
    text = WARNINGS.read_text().strip() if WARNINGS.is_file() else ""
    assert not text, f"Sphinx warned while building the site:\n{text}"


def test_every_lesson_and_exercise_has_a_page(site):
    for nb in NOTEBOOKS:
        assert (site / page_of(nb)).is_file(), f"{rel(nb)} has no page {page_of(nb)}"
    assert not list(site.rglob("solutions*")), "a solutions page or folder was built"


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.refs, self.classes = set(), [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        for key in ("href", "src"):
            if a.get(key) and not (tag == "link" and a.get("rel") in ("preconnect", "dns-prefetch")):
                self.refs.append((tag, key, a[key], a.get("class", "")))


@functools.lru_cache(maxsize=None)
def parse(path: Path) -> _Refs:
    p = _Refs()
    p.feed(path.read_text())
    return p


def test_every_internal_link_resolves(site):
    """Every relative href/src of every page names a built file, and its #fragment an id on that page."""
    broken = []
    for page in built_pages(site):
        for tag, key, ref, _ in parse(site / page).refs:
            parts = urlsplit(ref)
            if parts.scheme or parts.netloc or ref.startswith(("mailto:", "javascript:", "data:")):
                continue
            target = (site / page).parent / unquote(parts.path) if parts.path else site / page
            target = target.resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file() or site.resolve() not in target.parents:
                broken.append(f"{page}: <{tag} {key}={ref!r}> -> no such file")
            elif parts.fragment and target.suffix == ".html" and parts.fragment not in parse(target).ids:
                broken.append(f"{page}: <{tag} {key}={ref!r}> -> no id {parts.fragment!r} there")
    assert not broken, f"{len(broken)} internal links do not resolve:\n" + "\n".join(broken[:40])


def _course_links_left_to_github(site) -> list[str]:
    """Links that point at a lesson, exercise or doc on GitHub instead of its page on the site."""
    left = []
    for page in built_pages(site):
        for _, _, ref, _ in parse(site / page).refs:
            if re.search(r"github\.com/.+/blob/main/(notebooks|exercises|docs)/[^/]+\.(ipynb|md)$", ref):
                left.append(f"{page}: {ref}")
    return left


def test_course_links_stay_on_the_site(site):
    assert not _course_links_left_to_github(site)


def test_each_notebook_page_links_colab_and_its_ipynb(site):
    """The Colab target is the notebook's own badge's (and tools/nbtools.py's); the download is the stored file. In a
    fork's Pages workflow (SWKV_SITE_REPOSITORY set, pyproject left upstream) the target is the fork's, same path."""
    sys.path.insert(0, str(ROOT / "tools"))
    sys.path.insert(0, str(SITE_DIR))
    try:
        from build_site import colab_url as site_colab_url
        from repo import colab_url  # what tools/nbtools.py writes into every badge (dependency-free)
    finally:
        sys.path.remove(str(ROOT / "tools"))
        sys.path.remove(str(SITE_DIR))
    for nb in NOTEBOOKS:
        page = site / page_of(nb)
        badge = "".join(json.loads(nb.read_text())["cells"][0]["source"])
        own = re.search(r"\]\((https://colab\.research\.google\.com/github/[^)]+)\)", badge)
        assert own, f"{rel(nb)}'s first cell has no Colab badge"
        links = {cls: ref for tag, key, ref, cls in parse(page).refs if tag == "a" and cls.startswith("swkv-")}
        assert own.group(1).endswith("/blob/main/" + rel(nb)) and links.get("swkv-colab") == site_colab_url(rel(nb))
        if site_colab_url(rel(nb)) != colab_url(rel(nb)):
            continue  # a fork's site: its own Colab target, checked above
        assert links.get("swkv-colab") == own.group(1) == colab_url(rel(nb)), (f"{page_of(nb)}: Colab link "
            f"{links.get('swkv-colab')!r}, badge {own.group(1)!r}, nbtools {colab_url(rel(nb))!r}")
        download = page.parent / links.get("swkv-download", "?")
        assert download.is_file() and download.read_bytes() == nb.read_bytes(), \
            f"{page_of(nb)}: 'Download' does not serve the stored {rel(nb)}"
        badges = [ref for tag, key, ref, _ in parse(page).refs if tag == "img" and ref.endswith("colab-badge.svg")]
        assert badges and not urlsplit(badges[0]).netloc, f"{page_of(nb)}: the Colab badge is not the shipped one"


def test_each_lesson_shows_its_stored_figures_and_printed_outputs(site):
    """Nothing is executed, so the page must carry what the stored notebook holds: each figure as an image, each
    printed output's lines."""
    for nb in LESSONS:
        outputs = [out for cell in json.loads(nb.read_text())["cells"] for out in cell.get("outputs", [])]
        figures = sum(any(k.startswith("image/") for k in out.get("data", {})) for out in outputs)
        page = (site / page_of(nb)).read_text()
        shown = len(re.findall(r'<img[^>]+src="\.\./_images/', page))
        assert shown == figures, f"{page_of(nb)}: {figures} figures stored, {shown} on the page"
        text = _readable_text(site / page_of(nb))
        for out in outputs:
            plain_only = set(out.get("data", {})) == {"text/plain"}  # else the page shows the richer form
            printed = "".join(out.get("text", "")) or ("".join(out["data"]["text/plain"]) if plain_only else "")
            lines = [" ".join(x.split()) for x in printed.splitlines() if x.strip() and "\x1b" not in x]
            missing = [x for x in lines[:3] if x not in text]
            assert not missing, f"{page_of(nb)}: printed output missing from the page: {missing}"


def test_widgets_show_a_note_not_an_empty_box(site):
    for nb in LESSONS:
        widgets = sum(WIDGET_MIME in out.get("data", {}) for cell in json.loads(nb.read_text())["cells"]
                      for out in cell.get("outputs", []))
        text = (site / page_of(nb)).read_text()
        assert text.count('class="swkv-widget-note"') == widgets, \
            f"{page_of(nb)}: {widgets} widget outputs stored, {text.count('swkv-widget-note')} notes on the page"
        assert WIDGET_MIME not in text, f"{page_of(nb)} still holds a widget view (an empty box without state)"


def _solution_lines() -> dict[str, str]:
    """Non-trivial lines between the solution markers, whitespace collapsed -> the file they come from."""
    found = {}
    for src in sorted((ROOT / "solutions").glob("*.py")):
        inside = False
        for line in src.read_text().splitlines():
            if "### BEGIN SOLUTION" in line:
                inside = True
            elif "### END SOLUTION" in line:
                inside = False
            elif inside and len(" ".join(line.split())) >= 16:
                found.setdefault(" ".join(line.split()), rel(src))
    return found


def _public_text() -> str:
    """What the course shows anyway: every lesson's cells and their printed outputs (lesson 11 prints the library's
    kernel functions after pointing to exercise 12, as lesson 1 builds exercise 02's answer after it), and every
    solution notebook's cells with their solution blocks cut out (the exercise statement and its given code),
    whitespace collapsed per line."""
    lesson_cells = [cell for nb in LESSONS for cell in json.loads(nb.read_text())["cells"]]
    printed = ["".join(out.get("text", "")) for cell in lesson_cells for out in cell.get("outputs", [])]
    cells = list(lesson_cells)
    for nb in sorted((ROOT / "solutions").glob("*.ipynb")):
        cells += json.loads(nb.read_text())["cells"]
    text = "\n".join(["".join(cell["source"]) for cell in cells] + printed)
    text = re.sub(r"### BEGIN SOLUTION.*?### END SOLUTION", "", text, flags=re.S)
    return "\n".join(" ".join(x.split()) for x in text.splitlines())


def _readable_text(path: Path) -> str:
    """A built file as a reader would see it, whitespace collapsed per line: pages without their tags (a
    highlighted line of code is split into <span>s), notebooks as their cells' sources."""
    raw = path.read_text(errors="replace")
    if path.suffix == ".ipynb":
        raw = "\n".join("".join(c["source"]) for c in json.loads(raw)["cells"])
    elif path.suffix == ".html":
        raw = html.unescape(re.sub(r"<[^>]+>", "", raw))
    return "\n".join(" ".join(x.split()) for x in raw.splitlines())


def test_no_solution_code_anywhere(site):
    public = _public_text()
    secret = {line: src for line, src in _solution_lines().items() if line not in public}
    assert len(secret) >= 50, f"only {len(secret)} solution lines to look for: did the markers change?"
    # the reader finds code on the pages: a lesson's code line and solution lines in a solution notebook
    probe = next(x for x in public.splitlines() if x.startswith("from swkv_teach"))
    assert any(probe in _readable_text(p) for p in site.rglob("*.html")), "the check cannot see code on a page"
    in_solutions = "\n".join(_readable_text(p) for p in (ROOT / "solutions").glob("*.ipynb"))
    assert sum(line in in_solutions for line in secret) >= 0.9 * len(secret), "the check cannot see solution code"
    leaks = []
    for path in sorted(p for p in site.rglob("*") if p.is_file() and p.suffix in (".html", ".ipynb", ".js", ".txt")):
        text = _readable_text(path)
        leaks += [f"{path.relative_to(site)}: {line!r} (from {src})" for line, src in secret.items() if line in text]
    assert not leaks, f"solution code on the site:\n" + "\n".join(leaks[:30])


def test_next_links_walk_the_course_in_path_order(site):
    """From the home page, 'next' visits every lesson and then every exercise, each in path order."""
    order, page = [], "index.html"
    for _ in range(200):
        order.append(page)
        nxt = [ref for tag, _, ref, cls in parse(site / page).refs if tag == "a" and "right-next" in cls]
        if not nxt:
            break
        page = urlsplit(urljoin(page, nxt[0])).path
    lessons = [p for p in order if p.startswith("notebooks/") and p != "notebooks/README.html"]
    exercises = [p for p in order if p.startswith("exercises/") and p != "exercises/index.html"]
    assert lessons == [page_of(nb) for nb in LESSONS]
    assert exercises == [page_of(nb) for nb in EXERCISES]
    assert order.index(lessons[-1]) < order.index(exercises[0]), "lessons first, then exercises"


# ---------------------------------------------------------------- in Chromium


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def chromium():
    with launched_chromium(ARTIFACTS) as browser:
        yield browser


class Watch:
    """A page whose failed requests, requests leaving the machine and console errors are recorded."""

    def __init__(self, browser, base: str, viewport: dict | None = None):
        self.base, self.problems = base, []
        self.context = browser.new_context(viewport=viewport or {"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.context.route("**/*", self._route)
        self.page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}"[:300])
                     if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"[:300]))
        self.page.on("requestfailed", self._failed)
        self.page.on("response", lambda r: self.problems.append(f"HTTP {r.status}: {r.url}")
                     if r.status >= 400 else None)

    def _failed(self, request):
        # Chromium fetches the favicon, and MathJax its fonts, after the page's load event and cancels them when
        # the next page is opened (a font that is missing still shows: its response is a 404, recorded above)
        late = request.url.endswith("favicon.svg") or "/_static/mathjax/output/chtml/fonts/" in request.url
        if late and "ERR_ABORTED" in (request.failure or ""):
            return
        self.problems.append(f"failed: {request.url} ({request.failure})")

    def _route(self, route):
        if route.request.url.startswith(self.base) or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:  # an offline site fetches nothing from elsewhere
            self.problems.append(f"left the machine: {route.request.url}")
            route.abort()

    def goto(self, path: str):
        self.problems.clear()
        self.page.goto(f"{self.base}/{path}", wait_until="load", timeout=30_000)
        return self.page

    def close(self):
        self.context.close()


IMAGES = """async () => Promise.all([...document.images].map(img => {
    img.loading = 'eager';
    return img.decode().then(() => [img.currentSrc, img.naturalWidth], () => [img.currentSrc, 0]);
}))"""


@pytest.mark.e2e
def test_every_page_loads_cleanly_with_its_images(site, server, chromium):
    w = Watch(chromium, server)
    bad = []
    try:
        for path in built_pages(site):
            page = w.goto(path)
            images = page.evaluate(IMAGES)
            page.wait_for_timeout(50)
            bad += [f"{path}: {p}" for p in w.problems]
            bad += [f"{path}: image did not load: {src}" for src, width in images if width == 0]
    finally:
        w.close()
    assert not bad, f"{len(bad)} problems:\n" + "\n".join(bad[:40])


@pytest.mark.e2e
def test_sidebar_lists_the_course_in_path_order(site, server, chromium):
    w = Watch(chromium, server)
    try:
        page = w.goto("index.html")
        page.screenshot(path=str(ARTIFACTS / "home.png"))
        hrefs = page.eval_on_selector_all("nav.bd-docs-nav a.reference.internal", "as => as.map(a => a.href)")
    finally:
        w.close()
    paths = [urlsplit(h).path.lstrip("/") for h in hrefs]
    assert [p for p in paths if re.match(r"notebooks/\d", p)] == [page_of(nb) for nb in LESSONS]
    assert [p for p in paths if re.match(r"exercises/\d", p)] == [page_of(nb) for nb in EXERCISES]
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert rel(doc.with_suffix(".html")) in paths, f"the sidebar has no {rel(doc)}"


def search(w: Watch, query: str, typed: bool = False) -> list[str]:
    """The pages search lists for ``query``, best first: typed into the sidebar's search box, or from the URL."""
    if typed:
        page = w.goto("index.html")
        page.click(".bd-sidebar-primary .search-button-field")
        box = page.locator("#pst-search-dialog input[type=search]")
        box.fill(query)
        box.press("Enter")
        page.wait_for_url("**/search.html?q=*", timeout=10_000)
    else:
        page = w.goto(f"search.html?q={query.replace(' ', '+')}")
    page.wait_for_selector("#search-results .search-summary, #search-results p", timeout=20_000)
    page.wait_for_function("() => !document.querySelector('#search-progress') || "
                           "!document.querySelector('#search-progress').textContent.includes('Preparing')")
    page.wait_for_timeout(300)
    hrefs = page.eval_on_selector_all("#search-results ul.search > li > a:first-of-type",
                                      "as => as.map(a => a.getAttribute('href'))")
    return [urlsplit(h).path for h in hrefs]


@pytest.mark.e2e
@pytest.mark.parametrize("query, number, within, typed", [
    ("ring buffer", "03", 10, True), ("torchrun", "10", 3, False), ("EvictionExplorer", "02", 3, False)])
def test_search_finds_the_lesson(site, server, chromium, query, number, within, typed):
    """Offline: Sphinx's index ships with the site (searchindex.js); nothing is asked of a server."""
    w = Watch(chromium, server)
    try:
        found = search(w, query, typed)
        problems = list(w.problems)
    finally:
        w.close()
    assert not problems, problems
    want = page_of(lesson(number))
    assert want in found[:within], f"search {query!r}: {want} not in the first {within} results {found[:within]}"


# Everything in the article ends inside the screen, or sits in a box of the article (a code block, a table, an
# output) that scrolls sideways and itself fits the screen.
WIDTHS = """() => {
    const vw = window.innerWidth;
    const article = document.querySelector('.bd-article') || document.querySelector('main') || document.body;
    const scrolls = e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
    const inScroller = e => {
        for (let a = e.parentElement; a && a !== article; a = a.parentElement)
            if (scrolls(a)) return a.getBoundingClientRect().right <= vw + 1;
        return false;
    };
    const out = [...article.querySelectorAll('*')].filter(e => {
        const r = e.getBoundingClientRect();
        return r.width > 0 && r.right > vw + 1 && !inScroller(e);
    });
    const scrolling = [...article.querySelectorAll('pre, table, .cell_output')]
        .filter(e => e.scrollWidth > e.clientWidth + 1 && scrolls(e)).length;
    return {doc: document.documentElement.scrollWidth, body: document.body.scrollWidth, view: vw, scrolling,
            out: out.slice(0, 8).map(e => `<${e.tagName.toLowerCase()} class="${e.className}"> `
                                         + e.textContent.trim().slice(0, 60))};
}"""


@pytest.mark.e2e
def test_phone_width_nothing_scrolls_the_page_sideways(site, server, chromium):
    """390 px wide: the page body fits; code and tables wider than the screen scroll inside their own box."""
    w = Watch(chromium, server, viewport=PHONE)
    bad, scrolling = [], 0
    try:
        for path in built_pages(site):
            page = w.goto(path)
            sizes = page.evaluate(WIDTHS)
            if max(sizes["doc"], sizes["body"]) > sizes["view"]:
                bad.append(f"{path}: the page is {max(sizes['doc'], sizes['body'])} px wide at {sizes['view']} px")
            bad += [f"{path}: sticks out of the screen, in no box that scrolls: {b}" for b in sizes["out"]]
            bad += [f"{path}: {p}" for p in w.problems]
            scrolling += sizes["scrolling"]
            if path == page_of(lesson("03")):
                page.screenshot(path=str(ARTIFACTS / "lesson03_phone.png"))
    finally:
        w.close()
    assert not bad, "\n".join(bad[:40])
    assert scrolling > 0, "no code block is wider than a phone: the check above saw nothing to scroll"


# ---------------------------------------------------------------- the second edition: a course, not a repository

WIDE = {"width": 1280, "height": 900}


def _course():
    sys.path.insert(0, str(SITE_DIR))
    try:
        import course
    finally:
        sys.path.remove(str(SITE_DIR))
    return course


def test_the_home_page_is_the_landing_page_not_the_readme(site):
    """A learner's home page: what the course is, where to start, the path with every lesson and its time (read
    from the lesson's own header), the teachers' route; the README is a reference page of its own."""
    page = (site / "index.html").read_text()
    text = _readable_text(site / "index.html")
    for section in ("What you will be able to do", "Start here", "The path", "For teachers"):
        assert re.search(rf"<h2>{section}<a", page), f"the home page has no section {section!r}"
    assert "make lab" in text and "make test" in text and "Colab" in text
    assert page.count('class="swkv-card"') == 3, "Start here: in the browser, on Colab, on your machine"
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", page.split('id="the-path"')[1], re.S)
    course = _course()
    lessons = course.lessons()
    assert len(lessons) == len(LESSONS)
    for lesson in lessons:
        row = next((r for r in rows if f'href="{page_of(ROOT / lesson.path)}"' in r), None)
        assert row, f"the path has no row linking {lesson.path}"
        header = re.search(r"\*\*Time:\*\* about (\d+) min", "".join(
            "".join(c["source"]) for c in json.loads((ROOT / lesson.path).read_text())["cells"][:4]))
        assert f">{header.group(1)}\u00a0min<" in row, f"{lesson.path}: header says {header.group(1)} min; row {row[:300]}"
        for ex, lo, hi in lesson.exercises:
            assert f'href="{page_of(ROOT / ex)}"' in row and f"{lo}–{hi}\u00a0min" in row, f"{lesson.path}: {ex} missing"
    assert "readme.html#for-teachers" in page, "the teachers' paragraph links the README's section for teachers"
    assert (site / "readme.html").is_file() and "Set up: two commands" in _readable_text(site / "readme.html")
    assert "Mutation testing" not in text, "the home page still carries the README's maintainer notes"


def test_no_empty_genindex_and_a_404_page_that_links_home(site):
    assert not (site / "genindex.html").exists(), "an empty genindex.html is published"
    assert all("genindex" not in ref for p in built_pages(site) for _, _, ref, _ in parse(site / p).refs)
    page = site / "404.html"
    assert page.is_file(), "no 404 page"
    hrefs = [ref for tag, _, ref, _ in parse(page).refs if tag == "a"]
    assert any(urlsplit(h).path.endswith("index.html") for h in hrefs), "the 404 page does not link home"


def test_exercises_and_lessons_link_each_other_by_title(site):
    """Each exercise page links the lesson (and section) where the course reaches it; that lesson links back. Link
    labels are page titles, never a repository path."""
    course = _course()
    lessons = course.lessons()
    homes = course.exercise_homes(lessons)
    assert set(homes) == {rel(e) for e in EXERCISES}, f"exercises no lesson reaches: {set(map(rel, EXERCISES)) - set(homes)}"
    for ex in EXERCISES:
        lesson, section, anchor = homes[rel(ex)]
        html_ = (site / page_of(ex)).read_text()
        tie = re.search(r'<div class="swkv-ties[^"]*">.*?</div>', html_, re.S)
        assert tie, f"{page_of(ex)}: no 'Where the course reaches it' box"
        target = "../" + page_of(ROOT / lesson.path)
        assert f'href="{target}"' in tie.group(0), f"{page_of(ex)} does not link {lesson.path}"
        if anchor:  # the fragment's id is checked by test_every_internal_link_resolves
            assert re.search(rf'href="{re.escape(target)}#[\w-]+"><span[^>]*>{re.escape(html.escape(section, quote=False))[:20]}',
                             tie.group(0).replace("’", "'")), f"{page_of(ex)}: no link to the section {section!r}"
        back = (site / page_of(ROOT / lesson.path)).read_text()
        if any(e == rel(ex) for e, _, _ in lesson.exercises):
            assert f'href="../{page_of(ex)}"' in back, f"{lesson.path} does not link back to {rel(ex)}"
    labelled_as_paths = []
    for page in built_pages(site):
        for m in re.finditer(r"<a [^>]*href=\"[^\"]+\"[^>]*>(.*?)</a>", (site / page).read_text(), re.S):
            label = html.unescape(re.sub(r"<[^>]+>", "", m.group(1))).strip()
            if re.fullmatch(r"(notebooks|exercises|docs)/[\w.-]+\.(ipynb|md)|README\.md", label):
                labelled_as_paths.append(f"{page}: {label}")
    assert not labelled_as_paths, "links labelled with a file path:\n" + "\n".join(labelled_as_paths[:20])


def test_figures_have_alt_text_and_captions(site):
    shown = bad = 0
    for nb in LESSONS:
        for m in re.finditer(r'<img[^>]+src="\.\./_images/[^"]+"[^>]*>', (site / page_of(nb)).read_text()):
            shown += 1
            alt = re.search(r'alt="([^"]*)"', m.group(0))
            if not alt or "_images" in alt.group(1) or re.search(r"\.(png|svg|jpg)$", alt.group(1)) \
                    or len(alt.group(1)) < 15:
                bad += 1
    assert shown > 20 and not bad, f"{bad} of {shown} figures have a file path or nothing as alt text"
    captions = [re.sub(r"<[^>]+>", "", c).strip() for nb in LESSONS
                for c in re.findall(r"<figcaption>(.*?)</figcaption>", (site / page_of(nb)).read_text(), re.S)]
    assert len(captions) >= shown // 3 and all(len(c) > 15 for c in captions), (
        f"{len(captions)} captions for {shown} figures (the sentence the lesson writes under a figure): {captions[:3]}")


@pytest.mark.e2e
@pytest.mark.parametrize("viewport", [WIDE, PHONE], ids=["1280", "390"])
def test_landing_page_shape(site, server, chromium, viewport):
    w = Watch(chromium, server, viewport=viewport)
    try:
        page = w.goto("index.html")
        page.screenshot(path=str(ARTIFACTS / f"home_{viewport['width']}.png"))
        shape = page.evaluate("""() => ({
            h1: document.querySelector('.bd-article h1').textContent,
            height: document.documentElement.scrollHeight,
            firstLesson: document.querySelector('.bd-article a[href^="notebooks/00_"]').getBoundingClientRect().top,
            cards: [...document.querySelectorAll('.swkv-card')].map(c => c.getBoundingClientRect().width)})""")
        problems = list(w.problems)
    finally:
        w.close()
    assert not problems, problems
    assert "swkv-teach" not in shape["h1"].lower(), f"the title is the package name: {shape['h1']!r}"
    limit = 9000 if viewport is WIDE else 16000
    assert shape["height"] < limit, f"the home page is {shape['height']} px tall (the README was 18,000)"
    assert shape["firstLesson"] < (1400 if viewport is WIDE else 3000), f"first lesson link at y={shape['firstLesson']}"
    assert len(shape["cards"]) == 3 and min(shape["cards"]) > 150


MATH = """() => {
    const article = document.querySelector('.bd-article');
    const rendered = article.querySelectorAll('mjx-container').length;
    const text = article.innerText;
    return {rendered, raw: (text.match(/\\\\frac|\\\\le\\b|\\$[^$\\s][^$]*\\$/g) || []).slice(0, 5),
            mathSpans: article.querySelectorAll('.math').length};
}"""


def _pages_with_math() -> list[str]:
    found = ["index.html"]  # the home page states the window rule and the floor on a step's time in TeX
    for nb in LESSONS:
        text = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "markdown")
        if re.search(r"\$\$|(?<![\\$])\$[^$\s][^$\n]*\$", text):
            found.append(page_of(nb))
    return found


@pytest.mark.e2e
def test_math_is_typeset_offline(site, server, chromium):
    """MathJax ships with the site: with every request leaving the machine blocked, formulas are typeset (MathJax's
    elements present) and no raw TeX ($...$, \\frac) is left in the text."""
    w = Watch(chromium, server)
    bad = []
    try:
        for path in _pages_with_math():
            page = w.goto(path)
            page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=20_000)
            page.evaluate("() => MathJax.startup.promise")
            got = page.evaluate(MATH)
            if got["rendered"] == 0 or got["raw"]:
                bad.append(f"{path}: {got}")
            bad += [f"{path}: {p}" for p in w.problems]
            if path == "index.html":
                page.locator("mjx-container").first.scroll_into_view_if_needed()
                page.screenshot(path=str(ARTIFACTS / "math_1280.png"))
    finally:
        w.close()
    assert not bad, "\n".join(bad)
    assert (site / "_static" / "mathjax" / "tex-chtml.js").is_file()


CODE = """() => {
    const cells = [...document.querySelectorAll('.bd-article div.highlight pre, .bd-article .cell_output pre')];
    const clipped = cells.filter(pre => {
        const style = getComputedStyle(pre);
        const wider = pre.scrollWidth > pre.clientWidth + 1;
        const scrolls = ['auto', 'scroll'].includes(style.overflowX);
        const wraps = ['pre-wrap', 'pre-line', 'break-spaces'].includes(style.whiteSpace);
        return wider && !scrolls && !wraps;
    }).map(pre => pre.textContent.slice(0, 60));
    const hidden = cells.filter(pre => {
        for (let a = pre.parentElement; a; a = a.parentElement) {
            const s = getComputedStyle(a);
            if (s.overflowX === 'hidden' || s.overflowX === 'clip')
                if (pre.getBoundingClientRect().right > a.getBoundingClientRect().right + 1) return true;
            if (a.classList.contains('bd-article')) break;
        }
        return false;
    }).map(pre => pre.textContent.slice(0, 60));
    const inputs = document.querySelectorAll('.bd-article div.cell_input div.highlight');
    const buttons = [...inputs].filter(h => h.querySelector('button.copybtn')).length;
    const scrolling = cells.filter(pre => pre.scrollWidth > pre.clientWidth + 1).length;
    return {clipped, hidden, inputs: inputs.length, buttons, scrolling};
}"""


@pytest.mark.e2e
@pytest.mark.parametrize("viewport", [WIDE, PHONE], ids=["1280", "390"])
def test_code_cells_scroll_and_copy(site, server, chromium, viewport):
    """Every code cell has a copy button; a line wider than the column scrolls inside its box (no code is cut at the
    edge, at 1280 px as at 390 px); long outputs scroll too."""
    w = Watch(chromium, server, viewport=viewport)
    bad, scrolling = [], 0
    try:
        for nb in NOTEBOOKS:
            page = w.goto(page_of(nb))
            got = page.evaluate(CODE)
            scrolling += got["scrolling"]
            if got["buttons"] != got["inputs"]:
                bad.append(f"{page_of(nb)}: {got['inputs'] - got['buttons']} of {got['inputs']} code cells lack a copy button")
            bad += [f"{page_of(nb)}: clipped without a scrollbar: {c!r}" for c in got["clipped"] + got["hidden"]]
            if nb == lesson("03") and viewport is WIDE:
                page.screenshot(path=str(ARTIFACTS / "lesson03_1280.png"))
    finally:
        w.close()
    assert not bad, "\n".join(bad[:30])
    assert scrolling > 0, "no code is wider than its column: the check saw nothing to scroll"


@pytest.mark.e2e
def test_the_copy_button_copies_the_code(site, server, chromium):
    w = Watch(chromium, server)
    try:
        w.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server)
        page = w.goto(page_of(lesson("03")))
        first = page.locator(".bd-article div.cell_input div.highlight").first
        first.hover()
        first.locator("button.copybtn").click()
        copied = page.evaluate("() => navigator.clipboard.readText()")
        shown = first.locator("pre").inner_text()
    finally:
        w.close()
    assert copied.strip() and copied.strip() == shown.strip()


# (query, the page that must come first, pages that must be in the top 3)
RANKS = [
    ("ring buffer", "notebooks/03_", []), ("prefix caching", "notebooks/12_", ["exercises/13_"]),
    ("attention sinks", "notebooks/05_", []), ("paged attention", "notebooks/07_", []),
    ("LRU", "notebooks/05_", []), ("Triton", "notebooks/11_", []), ("torchrun", "notebooks/10_", []),
    # a second set, the team's own
    ("rolling buffer", "notebooks/03_", []), ("chunk contract", "notebooks/03_", ["exercises/04_"]),
    ("H2O", "notebooks/08_", ["exercises/10_"]), ("block table", "notebooks/07_", ["exercises/08_"]),
    ("int8", "notebooks/07_", ["exercises/09_"]), ("transformers cache layer", "notebooks/09_", ["exercises/11_"]),
    ("left padding", "notebooks/04_", []), ("split-KV", "notebooks/11_", []), ("off-by-one", "notebooks/00_", []),
    ("free block queue", "notebooks/12_", []), ("heavy hitter", "notebooks/08_", []), ("promotion", "notebooks/05_", []),
    ("interview", "notebooks/14_", []), ("state_dict", "notebooks/10_", []), ("hash chain", "notebooks/12_", []),
    ("rotary", "notebooks/03_", []), ("TOVA", "notebooks/08_", []), ("flash_attn_with_kvcache", "notebooks/06_", []),
    ("continuous batching", "notebooks/07_", []), ("Redis", "notebooks/12_", []), ("persistence", "notebooks/10_", []),
    ("sliding window mask", "notebooks/00_", []), ("EvictionExplorer", "", ["notebooks/02_"]),
    ("online softmax", "notebooks/11_", []),
    # issue 39: the lesson before the drill, and its exercise
    ("speculative decoding", "notebooks/13_", ["exercises/14_"]), ("acceptance rule", "notebooks/13_", []),
]


@pytest.mark.e2e
@pytest.mark.parametrize("query, first, top3", RANKS, ids=[q for q, _, _ in RANKS])
def test_search_ranks_the_teaching_page_first(site, server, chromium, query, first, top3):
    w = Watch(chromium, server)
    try:
        found = search(w, query)
        snippets = w.page.eval_on_selector_all("#search-results ul.search > li p.context",
                                               "ps => ps.map(p => p.textContent)")
        problems = list(w.problems)
        if query == "ring buffer":
            w.page.screenshot(path=str(ARTIFACTS / "search_1280.png"))
    finally:
        w.close()
    assert not problems, problems
    pages = list(dict.fromkeys(found))  # a page's sections come with it
    assert pages and pages[0].startswith(first), f"search {query!r}: first {pages[:5]}, expected {first}*"
    for want in top3:
        assert any(p.startswith(want) for p in pages[:3]), f"search {query!r}: {want}* not in the top 3 {pages[:3]}"
    theme = [s for s in snippets if re.search(r"Light Dark|Contents|Skip to main|Ctrl\+K|Back to top", s)]
    assert snippets and not theme, f"search {query!r}: snippets show the theme's text: {theme[:2]}"


DRILL_LAYOUT = """() => {
    const size = sel => [...document.querySelectorAll(sel)].map(e => parseFloat(getComputedStyle(e).fontSize));
    const h3 = [...document.querySelectorAll('.bd-article h3')];
    const toc = [...document.querySelectorAll('.bd-toc a, #pst-page-toc-nav a, nav.page-toc a')].map(a => a.textContent.trim());
    const details = [...document.querySelectorAll('.bd-article details.swkv-answer')];
    const boxed = details.filter(d => { const s = getComputedStyle(d);
        return parseFloat(s.borderTopWidth) > 0 && parseFloat(s.borderLeftWidth) > 0; }).length;
    return {h1: size('.bd-article h1'), h2: size('.bd-article h2'), h3: size('.bd-article h3'),
            h3lines: h3.map(h => Math.round(h.getBoundingClientRect().height / parseFloat(getComputedStyle(h).lineHeight))),
            toc, details: details.length, boxed, open: details.filter(d => d.open).length};
}"""


@pytest.mark.e2e
@pytest.mark.parametrize("viewport", [WIDE, PHONE], ids=["1280", "390"])
def test_the_drill_reads_as_a_drill(site, server, chromium, viewport):
    """Short question titles (one or two lines), the contents listing them, answers folded in boxes, and heading
    sizes in order (h1 > h2 > h3) at every width."""
    w = Watch(chromium, server, viewport=viewport)
    try:
        page = w.goto(page_of(lesson("14")))
        got = page.evaluate(DRILL_LAYOUT)
        page.screenshot(path=str(ARTIFACTS / f"drill_{viewport['width']}.png"))
        page.locator("details.swkv-answer summary").first.click()
        page.locator("details.swkv-answer").first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / f"drill_open_{viewport['width']}.png"))
        problems = list(w.problems)
    finally:
        w.close()
    assert not problems, problems
    assert min(got["h1"]) > max(got["h2"]) > max(got["h3"]), f"heading sizes out of order: {got}"
    assert max(got["h3lines"]) <= (2 if viewport is WIDE else 3), f"a question's title runs {max(got['h3lines'])} lines"
    questions = [t for t in got["toc"] if re.match(r"Q\d+\.", t)]
    if viewport is WIDE:
        assert len(questions) >= 19, f"the page's contents list {len(questions)} questions: {got['toc'][:8]}"
        assert max(len(q) for q in questions) <= 70, "the contents show the full questions, not their titles"
    assert got["details"] >= 19 and got["boxed"] == got["details"] and got["open"] == 0
