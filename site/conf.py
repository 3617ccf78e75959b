"""Sphinx configuration of the course website. Build it with `make site` (site/build_site.py stages the pages
into build/site-src/ and runs Sphinx with this folder as its configuration directory)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_site import site_repo_url  # noqa: E402
from offline_math import MATHJAX_PATH, ship_mathjax  # noqa: E402

project = "swkv-teach"
author = "the swkv-teach authors"
copyright = "the swkv-teach authors, MIT licence"
html_title = "swkv-teach: the sliding-window KV cache"

# githubpages: writes .nojekyll, so _static/ is served; copybutton: a copy button on every code cell
extensions = ["myst_nb", "sphinx.ext.githubpages", "sphinx.ext.mathjax", "sphinx_copybutton"]

# Math: `$...$` and `$$...$$` in the lessons, typeset by MathJax shipped with the site (site/offline_math.py copies
# it from the sphinx-mathjax-offline wheel into _static/), so a downloaded copy renders formulas with no network.
myst_enable_extensions = ["dollarmath", "amsmath"]
mathjax_path = MATHJAX_PATH
# the prompt and the output are not code to paste: copy only the cell's source (myst-nb's input cells)
copybutton_selector = "div.cell_input div.highlight pre, div.highlight-bash div.highlight pre, div.highlight-python div.highlight pre"
copybutton_exclude = ".linenos, .gp, .go"

# The notebooks are shown as stored (executed by tools/build.py); no kernel starts here.
nb_execution_mode = "off"
# myst-nb loads the widget manager from CDNs (require.js, @jupyter-widgets/html-manager) for a notebook that stores
# widget state (myst_nb/core/render.py, render_nb_finalise). Ours store none; should one ever, the offline site
# still fetches nothing from elsewhere. site/build_site.py turns each widget's output into a note instead.
nb_ipywidgets_js = {}
myst_heading_anchors = 3  # links such as cheatsheet.md#the-chunk-contract
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

html_theme = "sphinx_book_theme"
html_theme_options = {
    "repository_url": site_repo_url(),
    "repository_branch": "main",
    "use_repository_button": True,
    "use_download_button": False,  # each notebook page has its own "Download" link (the stored .ipynb)
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "show_toc_level": 2,
    # the book theme keeps search in its sidebar; newer pydata themes also put a search field in a top bar
    "navbar_persistent": [],
}
# Without a default mode the theme logs "Got invalid theme mode: . Resetting to auto." on every page.
html_context = {"default_mode": "light"}
html_static_path = ["_static"]
html_css_files = ["swkv.css"]
html_js_files = ["swkv.js"]  # figures open full size on a click
html_copy_source = False
html_use_index = False  # no index entries anywhere: an empty genindex.html would be published
html_show_sourcelink = False
html_last_updated_fmt = None
html_favicon = "_static/favicon.svg"  # without one the browser asks for /favicon.ico and logs a 404
# Search ranks pages by where the query's words stand (site/search_scorer.js, with the pages' words appended by
# site/build_site.py, which writes build/site-scorer.js before Sphinx runs).
html_search_scorer = str(Path(__file__).resolve().parent.parent / "build" / "site-scorer.js")


def setup(app):
    app.connect("build-finished", ship_mathjax)
