"""MathJax shipped with the website, so formulas are typeset with no network (a downloaded copy of the site, the
browser test with every outside request blocked).

The renderer comes from a package registry, pinned with the rest of the site's build (pyproject's `site` extra):
the sphinx-mathjax-offline wheel bundles MathJax 3's files. Its own Sphinx hook copies all 24 MB of them (every
combined bundle and the speech engine); this copies what `tex-chtml.js` loads: the component itself, the TeX
extensions its autoload fetches on demand (\\boldsymbol, \\cancel, ...), the CommonHTML output with its fonts,
and the menu and accessibility pieces it may ask for.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

MATHJAX_PATH = "mathjax/tex-chtml.js"  # relative to _static/ (Sphinx's mathjax_path)
NEEDED = ["tex-chtml.js", "input", "output/chtml", "ui", "a11y", "adaptors"]


def mathjax_source() -> Path:
    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("sphinx-mathjax-offline is not installed: it ships MathJax with the site "
                           "(pip install $(python site/build_site.py --requirements))")
    return Path(next(iter(spec.submodule_search_locations))) / "static" / "mathjax"


def ship_mathjax(app, exc) -> None:
    if exc is not None or app.builder.format != "html":
        return
    src, dest = mathjax_source(), Path(app.outdir) / "_static" / "mathjax"
    for part in NEEDED:
        if (src / part).is_dir():
            shutil.copytree(src / part, dest / part, dirs_exist_ok=True)
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / part, dest / part)
