"""Lesson 2 in real browsers: run the notebook, move the explorer's step slider, see the picture change.

Two frontends, the two widget generations the course meets:

- JupyterLab 4 with ipywidgets 8 (``make lab``);
- the classic Notebook 6.5 with ipywidgets 7.7.1 / widgetsnbextension 3.6.10,
  Colab's pins, which many JupyterHub classes still run (its sliders are
  jQuery UI; it cannot create an ``ipywidgets.Output``, which is why the
  explorer draws into a ``widgets.Image``).

Catches what Python-side tests cannot: the widget failing to render ("Error
displaying widget", "Model not found", "Cannot find model module"), a picture
that never reaches the page, a slider that does not redraw. Screenshots go to
test-artifacts/e2e/. Needs Debian's chromium at /usr/bin/chromium (never
downloads a browser); skips without it unless SWKV_REQUIRE_E2E=1.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from lab_helpers import (classic_notebook, classic_python, copy_notebook, jupyter_lab, launched_chromium,
                         skip_or_fail)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "02_watching_eviction.ipynb"
ARTIFACTS = ROOT / "test-artifacts" / "e2e"
WIDGET_ERRORS = ("Error displaying widget", "Model not found", "Cannot find model module")
IMG = "img.widget-image"  # the explorer's picture (an ipywidgets Image, in both generations)

LAB = dict(
    idle="""() => {
        const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
        const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
        return !!k && k.status === 'idle';
    }""",
    # the widget renderer is in the notebook's rendermime: a widget output arriving now will be drawn
    widgets_ready="""() => {
        const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
        return !!(w && w.content && w.content.rendermime.mimeTypes.includes('application/vnd.jupyter.widget-view+json'));
    }""",
    run_all="() => window.jupyterapp.commands.execute('notebook:run-all-cells')",
    all_ran="""() => {
        const w = window.jupyterapp.shell.currentWidget;
        const k = w.sessionContext.session && w.sessionContext.session.kernel;
        if (!k || k.status !== 'idle') return false;
        return w.content.widgets.every(c => c.model.type !== 'code' || c.model.executionCount !== null);
    }""",
    outputs="""() => window.jupyterapp.shell.currentWidget.content.widgets.filter(c => c.model.type === 'code')
        .map(c => c.outputArea.node.innerText)""",
    handle=".widget-hslider .noUi-handle",  # ipywidgets 8 sliders are noUiSlider
)
CLASSIC = dict(
    idle="""() => !!(window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel)
        && document.querySelector('#kernel_indicator_icon.kernel_idle_icon') !== null""",
    # widgetsnbextension registers its renderer on the OutputArea only once its nbextension has loaded, which can
    # be after the kernel is idle (seen on a loaded machine): a widget output that arrives before is silently
    # dropped and the picture never comes. A learner is never that fast; the test must wait for it.
    widgets_ready="""() => !!(window.require && require.defined && require.defined('notebook/js/outputarea')
        && require('notebook/js/outputarea').OutputArea.prototype.mime_types().includes('application/vnd.jupyter.widget-view+json'))""",
    run_all="() => Jupyter.notebook.execute_all_cells()",
    all_ran="""() => document.querySelector('#kernel_indicator_icon.kernel_idle_icon') !== null
        && Jupyter.notebook.get_cells().every(c => c.cell_type !== 'code'
             || (typeof c.input_prompt_number === 'number'))""",
    outputs="""() => Jupyter.notebook.get_cells().filter(c => c.cell_type === 'code')
        .map(c => c.output_area.element.text())""",
    handle=".widget-hslider .ui-slider-handle",  # ipywidgets 7 sliders are jQuery UI
)


def settled_src(page, idle: str, timeout: float = 30.0, previous: str | None = None) -> str | None:
    """The first explorer image's src once the kernel is idle and it has stopped changing.

    Each key press is one redraw in the kernel; comparing before the last one
    lands would compare an in-between picture. Returns early only on a src
    different from ``previous`` (when given) whose picture has loaded.
    """
    deadline, last, since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < deadline:
        src = page.eval_on_selector(IMG, "img => img.complete && img.naturalWidth > 0 ? img.src : null") \
            if page.query_selector(IMG) else None
        if src != last:
            last, since = src, time.monotonic()
        elif src and src != previous and time.monotonic() - since > 1.5 and page.evaluate(idle):
            return src
        time.sleep(0.2)
    return last


def show_picture(page) -> None:
    """Scroll the explorer's picture into view and let it paint before a screenshot (JupyterLab renders the cells
    it scrolls to afresh: a shot taken at once showed an empty notebook)."""
    picture = page.locator(IMG).first
    picture.scroll_into_view_if_needed()
    picture.wait_for(state="visible", timeout=10_000)
    page.wait_for_timeout(500)


def drive_explorer(page, url: str, frontend: dict, name: str) -> None:
    console = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"[:300]) if m.type in ("error", "warning") else None)
    page.goto(url, timeout=60_000)
    page.wait_for_function(frontend["idle"], timeout=60_000)
    try:
        page.wait_for_function(frontend["widgets_ready"], timeout=60_000, polling=200)
    except Exception as e:
        page.screenshot(path=str(ARTIFACTS / f"{name}_no_widgets.png"), full_page=True)
        pytest.fail(f"the frontend never registered a renderer for ipywidgets' output ({type(e).__name__}): "
                    "the widgets extension is missing, disabled or failed to load")
    # Run all, twice at most. Right after the page loads, the classic Notebook's widget manager restores widget state
    # from the kernel (widgetsnbextension 3.6: `_loadFromKernel`, a "jupyter.widget.control" comm that ipywidgets
    # 7.7.1 closes, then one comm per model) and then re-renders every cell with a widget output; a widget displayed
    # while that runs can end up with an empty output area, no error (seen under load, with the console warning
    # "Control comm was closed too early"). That restore happens once per page load, so a second run cannot meet it;
    # a widget that never renders fails both runs.
    for attempt in (1, 2):
        page.evaluate(frontend["run_all"])
        page.wait_for_function(frontend["all_ran"], timeout=120_000, polling=500)
        try:
            # generous: on a loaded 2-core machine the widget manager's first render has taken over 30 s
            page.wait_for_selector(IMG, timeout=90_000)
            break
        except Exception as e:
            page.screenshot(path=str(ARTIFACTS / f"{name}_no_picture_{attempt}.png"), full_page=True)
            outputs = page.evaluate(frontend["outputs"])[:4]
            if attempt == 2:
                pytest.fail(f"the explorer's picture never appeared, in two runs of every cell ({type(e).__name__}); "
                            f"the first code cells' outputs read: {[o[:300] for o in outputs]}; browser console: "
                            f"{console[-15:]}")
            print(f"{name}: no picture after the first run (outputs {[o[:80] for o in outputs]}); running again")
    before = settled_src(page, frontend["idle"])
    assert before, "the explorer's picture never loaded"
    show_picture(page)
    page.screenshot(path=str(ARTIFACTS / f"{name}_before.png"))

    handle = page.query_selector(frontend["handle"])  # the first explorer's step slider
    assert handle is not None, "no ipywidgets slider on the page: the explorer's controls did not render"
    handle.focus()
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    page.wait_for_timeout(500)  # let the comm messages reach the kernel before asking if it is idle
    after = settled_src(page, frontend["idle"], previous=before)
    show_picture(page)
    page.screenshot(path=str(ARTIFACTS / f"{name}_after.png"))

    text = page.inner_text("body")
    for error in WIDGET_ERRORS:
        assert error not in text, f"the page shows {error!r}"
    assert after != before, "moving the step slider did not change the explorer's picture"


@pytest.fixture
def chromium():
    with launched_chromium(ARTIFACTS) as browser:
        yield browser


def test_lesson_2_explorer_renders_and_redraws_in_jupyterlab(tmp_path, chromium):
    served = tmp_path / "served"
    copy_notebook(NOTEBOOK, served)
    with jupyter_lab(served, tmp_path) as (base, token):
        page = chromium.new_page(viewport={"width": 1400, "height": 1000})
        drive_explorer(page, f"{base}/lab/tree/{NOTEBOOK.name}?token={token}", LAB, "explorer_lab")


def test_lesson_2_explorer_renders_and_redraws_in_classic_notebook_with_colabs_ipywidgets_7(tmp_path, chromium):
    try:
        python = classic_python(ROOT)
    except Exception as e:  # no network for pip, no venv module
        skip_or_fail(f"could not set up .venv-classic with Colab's widget pins: {e}")
    served = tmp_path / "served"
    copy_notebook(NOTEBOOK, served)
    with classic_notebook(served, tmp_path, python) as (base, token):
        page = chromium.new_page(viewport={"width": 1400, "height": 1000})
        drive_explorer(page, f"{base}/notebooks/{NOTEBOOK.name}?token={token}", CLASSIC, "explorer_classic")


CLASSIC_PYTHON_SIDE = """
import ipywidgets, io
from PIL import Image
from swkv_teach.widgets import EvictionExplorer
assert ipywidgets.__version__ == "7.7.1", ipywidgets.__version__
e = EvictionExplorer(window_size=4, steps=12, policy="ring")
def tree(w):
    yield w
    for c in getattr(w, "children", ()):
        yield from tree(c)
assert not [w for w in tree(e) if isinstance(w, ipywidgets.Output)]
first = e.image.value
e.play.value = 9  # through the Python-side link, as the Play button does
assert e.step == 9 and e.image.value != first and Image.open(io.BytesIO(e.image.value)).format == "PNG"
e.policy_dropdown.value = "lru"; e.access_text.value = "0"
assert 0 in e.cached_positions
print("ok", ipywidgets.__version__)
"""


def test_explorer_python_side_under_colabs_ipywidgets_7():
    """The same explorer, driven from Python with ipywidgets 7.7.1 (no browser needed)."""
    import subprocess

    try:
        python = classic_python(ROOT)
    except Exception as e:
        skip_or_fail(f"could not set up .venv-classic with Colab's widget pins: {e}")
    run = subprocess.run([str(python), "-c", CLASSIC_PYTHON_SIDE], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, MPLBACKEND="agg"))
    assert run.returncode == 0 and "ok 7.7.1" in run.stdout, run.stderr[-2000:]
