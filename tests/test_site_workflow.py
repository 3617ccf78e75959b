"""The website's build and deploy settings (.github/workflows/pages.yml, pyproject's `site` extra, site/build_site.py).

Deploy only what passed: the Pages workflow builds the site, runs its browser test, and only then uploads it; only
the deploy job may publish (pages, id-token); the site's dependencies are pinned to the set that test passed with,
in one place (pyproject's `site` extra, which `make site` installs through build_site.py --requirements); the site
links to the repository that publishes it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "pages.yml"


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def test_the_browser_test_runs_before_the_site_is_uploaded():
    build = _workflow()["jobs"]["build"]
    steps = [s.get("run", "") or s.get("uses", "") for s in build["steps"]]
    make = next(i for i, s in enumerate(steps) if "make site" in s)
    test = next(i for i, s in enumerate(steps) if "tests/e2e/test_site_browser.py" in s)
    upload = next(i for i, s in enumerate(steps) if s.startswith("actions/upload-pages-artifact"))
    assert make < test < upload, f"build, then test, then upload; steps are {steps}"
    assert "chromium" in " ".join(steps), "the workflow installs Chromium for the browser test"
    assert build.get("env", {}).get("SWKV_REQUIRE_E2E") == "1", "the browser test must fail, not skip, without Chromium"
    assert _workflow()["jobs"]["deploy"]["needs"] == "build"


def test_only_the_deploy_job_may_publish():
    wf = _workflow()
    granted = {"pages", "id-token"}
    assert not granted & set(wf.get("permissions", {})), f"workflow-wide permissions: {wf.get('permissions')}"
    assert not granted & set(wf["jobs"]["build"].get("permissions", {})), "the build job may publish"
    assert wf["jobs"]["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}


def test_the_site_links_to_the_repository_that_publishes_it():
    env = _workflow()["jobs"]["build"]["env"]
    assert env.get("SWKV_SITE_REPOSITORY") == "${{ github.server_url }}/${{ github.repository }}"
    code = ("import sys; sys.path.insert(0, 'site'); import build_site as b; "
            "print(b.site_repo_url()); print(b.colab_url('notebooks/03_ring_buffer.ipynb'))")
    fork = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={"SWKV_SITE_REPOSITORY": "https://github.com/a-fork/swkv-teach", "PATH": ""})
    assert fork.stdout.split() == ["https://github.com/a-fork/swkv-teach",
                                   "https://colab.research.google.com/github/a-fork/swkv-teach/blob/main/"
                                   "notebooks/03_ring_buffer.ipynb"]
    here = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={"PATH": ""})
    pyproject = re.search(r'^Repository\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert here.stdout.split()[0] == pyproject


def test_site_dependencies_are_pinned_in_one_place():
    printed = subprocess.run([sys.executable, "site/build_site.py", "--requirements"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    extra = re.search(r"^site\s*=\s*\[([^\]]*)\]", (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert printed == re.findall(r'"([^"]+)"', extra), "make site installs what pyproject's site extra lists"
    unpinned = [r for r in printed if not re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", r)]
    assert not unpinned, f"site dependencies not pinned to a tested version: {unpinned}"
    for needed in ("sphinx", "myst-nb", "sphinx-book-theme", "sphinx-copybutton", "sphinx-mathjax-offline"):
        assert any(r.startswith(needed + "==") for r in printed), f"{needed} is not in the site extra"
    makefile = (ROOT / "Makefile").read_text()
    assert "site/build_site.py --requirements" in makefile, "make site no longer installs the site extra"


def test_the_404_page_resolves_its_links_from_the_site_root_wherever_it_is_served():
    """GitHub Pages serves 404.html at the missing address itself (/<repo>/notebooks/gone.html)."""
    code = ("import sys; sys.path.insert(0, 'site'); import build_site as b; page = '<html><head><meta></head>'; "
            "once = b.based_404(page, '/swkv-teach'); print(repr(once)); print(repr(b.based_404(once, '/other'))); "
            "print(repr(b.based_404(once, None)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    based, moved, cleared = [eval(line) for line in out.splitlines()]
    assert based == '<html><head>\n  <base href="/swkv-teach/"><meta></head>'
    assert moved.count("<base") == 1 and '<base href="/other/">' in moved, "a second build must not stack <base> tags"
    assert cleared == "<html><head><meta></head>", "a build for local reading (or the test) has no <base>"
    steps = _workflow()["jobs"]["build"]["steps"]
    test = next(s for s in steps if "tests/e2e/test_site_browser.py" in s.get("run", ""))
    based_build = next(s for s in steps if s.get("env", {}).get("SWKV_SITE_BASE_PATH"))
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert based_build["env"]["SWKV_SITE_BASE_PATH"] == "${{ steps.pages.outputs.base_path }}"
    order = [steps.index(next(s for s in steps if s.get("id") == "pages")), steps.index(test),
             steps.index(based_build), steps.index(upload)]
    assert order == sorted(order), "configure-pages, the browser test, the based build, then the upload"
