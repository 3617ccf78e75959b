"""Lesson 2 in a real browser: JupyterLab + headless Chromium run the notebook and move the explorer's slider.

Catches what Python-side tests cannot: the widget failing to render ("Error
displaying widget", "Model not found"), a picture that never reaches the
page, a slider that does not redraw. Screenshots go to test-artifacts/e2e/.
Needs Debian's chromium at /usr/bin/chromium (never downloads a browser);
skips without it unless SWKV_REQUIRE_E2E=1.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from lab_helpers import CHROMIUM, CHROMIUM_ARGS, copy_notebook, jupyter_lab, skip_or_fail

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "02_watching_eviction.ipynb"
ARTIFACTS = ROOT / "test-artifacts" / "e2e"
WIDGET_ERRORS = ("Error displaying widget", "Model not found")
IMG = ".widget-output img"  # the explorer's picture; scoped so a widget that fails to render fails the test

KERNEL_IDLE = """() => {
    const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return !!k && k.status === 'idle';
}"""
ALL_RAN = """() => {
    const w = window.jupyterapp.shell.currentWidget;
    const k = w.sessionContext.session && w.sessionContext.session.kernel;
    if (!k || k.status !== 'idle') return false;
    return w.content.widgets.every(c => c.model.type !== 'code' || c.model.executionCount !== null);
}"""


def settled_src(page, timeout: float = 30.0, previous: str | None = None) -> str:
    """The first explorer image's src once the kernel is idle and it has stopped changing.

    Each key press is one redraw in the kernel; comparing before the last one
    lands would compare an in-between picture. Returns early only on a src
    different from ``previous`` (when given).
    """
    deadline, last, since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < deadline:
        src = page.eval_on_selector(IMG, "img => img.src") if page.query_selector(IMG) else None
        if src != last:
            last, since = src, time.monotonic()
        elif src and src != previous and time.monotonic() - since > 1.5 and page.evaluate(KERNEL_IDLE):
            return src
        time.sleep(0.2)
    return last


def test_lesson_2_explorer_renders_and_redraws_in_jupyterlab(tmp_path):
    if not os.path.exists(CHROMIUM):
        skip_or_fail(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip_or_fail("the playwright package is not installed (pip install -e '.[test]')")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    served = tmp_path / "served"
    copy_notebook(NOTEBOOK, served)

    with jupyter_lab(served, tmp_path) as (base, token), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/lab/tree/{NOTEBOOK.name}?token={token}", timeout=60_000)
            page.wait_for_function(KERNEL_IDLE, timeout=60_000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for_function(ALL_RAN, timeout=90_000, polling=500)
            page.wait_for_selector(IMG, timeout=30_000)
            before = settled_src(page)
            assert before and before.startswith("data:image/png"), f"no picture in the explorer's output: {before!r}"
            page.query_selector(IMG).scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "explorer_before.png"))

            handle = page.query_selector(".widget-hslider .noUi-handle")  # the first explorer's step slider
            assert handle is not None, "no ipywidgets slider on the page"
            handle.focus()
            for _ in range(3):
                page.keyboard.press("ArrowRight")
            page.wait_for_timeout(500)  # let the comm messages reach the kernel before asking if it is idle
            after = settled_src(page, previous=before)
            page.query_selector(IMG).scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "explorer_after.png"))

            text = page.inner_text("body")
            for error in WIDGET_ERRORS:
                assert error not in text, f"the page shows {error!r}"
            assert after != before, "moving the step slider did not change the explorer's picture"
        finally:
            browser.close()
