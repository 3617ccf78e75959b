"""Notebooks from plain-text sources: one header for all, stable ids, execution with stored outputs.

Every lesson and solution is written as a jupytext *percent* file beside its notebook
(``notebooks/03_ring_buffer.py`` -> ``notebooks/03_ring_buffer.ipynb``): ``# %%`` starts a code
cell, ``# %% [markdown]`` a markdown cell whose lines are ``# ``-commented. A teacher edits the
``.py`` file in any editor (or in JupyterLab, which opens it as a notebook when jupytext is
installed) and runs ``python tools/build.py NAME``. :func:`assemble` then

* puts the generated header first: an "Open in Colab" badge and a set-up cell that installs the
  package *only* on Colab (keeping Colab's own torch). The repository address comes from one
  place, pyproject's ``[project.urls] Repository``, so a fork changes one line and rebuilds;
* gives every cell a stable id (a rebuild that changes nothing leaves the diff empty);
* asks Colab for a GPU runtime when the source's header says ``accelerator: GPU``.

:func:`execute` runs the notebook top to bottom in a fresh kernel and keeps the outputs, so nbval
has something to compare; widget state is not stored (ipywidgets 8 state breaks ipywidgets 7
frontends such as Colab's, and the widgets are redrawn when the cell runs anyway).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient
from repo import colab_url, repo_url  # noqa: F401  (repo_url: tests and build.py read it from here)

ROOT = Path(__file__).resolve().parent.parent
HEADER_TAG = "swkv-header"
FOLDERS = ("notebooks", "solutions")


def md(source: str, **meta):
    return nbformat.v4.new_markdown_cell(source.strip("\n"), metadata=meta)


def code(source: str, **meta):
    return nbformat.v4.new_code_cell(source.strip("\n"), metadata=meta)


SETUP = '''\
# Set-up. On Google Colab: install the course library into this runtime. What it needs (torch, ipywidgets,
# matplotlib, ...) is preinstalled there, so Colab's own stack is kept. Silent when all is well.
import importlib, importlib.util, sys
if importlib.util.find_spec("swkv_teach") is None:
    if "google.colab" in sys.modules:
        import subprocess
        _pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "swkv-teach @ git+{url}"],
                              capture_output=True, text=True)
        if _pip.returncode != 0:
            print(_pip.stderr[-1500:])
            print("Installing the course library failed (above). Check that the runtime is connected, then "
                  "Runtime > Restart session and run this cell again.")
        importlib.invalidate_caches()
    else:
        print("The course library is not installed in this kernel. In a terminal, in the course folder, run "
              "`make lab` (or `pip install -e .` with this kernel's Python), then restart the kernel.")
try:
    import swkv_teach
except ImportError as e:
    print(f"swkv_teach could not be imported ({{e}}). On Colab: Runtime > Restart session, then run this cell again.")'''


def header_cells(rel_path: str) -> list:
    """The badge and the set-up cell, tagged so tests and the build can find them."""
    badge = md(
        f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(rel_path)})",
        tags=[HEADER_TAG],
    )
    return [badge, code(SETUP.format(url=repo_url()), tags=[HEADER_TAG])]


def source_of(ipynb: Path) -> Path:
    """The percent-format source beside a notebook."""
    return ipynb.with_suffix(".py")


def sources(filters: list[str] | None = None) -> list[Path]:
    """Every notebook source (``notebooks/NN_*.py``, ``solutions/NN_*.py``) whose name contains a filter."""
    found = sorted(p for f in FOLDERS for p in (ROOT / f).glob("[0-9][0-9]_*.py"))
    if filters:
        found = [p for p in found if any(f in str(p.relative_to(ROOT)) for f in filters)]
    return found


def is_header(cell) -> bool:
    return HEADER_TAG in cell.metadata.get("tags", [])


def assemble(src: Path):
    """The notebook ``src`` describes, header prepended, ids and metadata set, not executed."""
    rel = str(src.with_suffix(".ipynb").relative_to(ROOT))
    text = jupytext.read(src, fmt="py:percent")
    nb = nbformat.v4.new_notebook()
    # a header synced back by jupytext's pairing is dropped: the build writes the current one
    nb.cells = header_cells(rel) + [c for c in text.cells if not is_header(c)]
    for i, cell in enumerate(nb.cells):
        cell.id = hashlib.sha1(f"{rel}:{i}".encode()).hexdigest()[:8]
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "colab": {"provenance": []},
    }
    if text.metadata.get("accelerator") == "GPU":
        nb.metadata["accelerator"] = "GPU"
        nb.metadata["colab"]["gpuType"] = "T4"
    return nb


def execute(nb, folder: Path, timeout: int = 120):
    """Run in a fresh kernel with cwd ``folder``; drop volatile metadata so re-runs diff cleanly."""
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    return nb


def differences(src: Path) -> list[str]:
    """How the stored notebook differs from what its source builds (cells, ids, metadata), outputs aside."""
    path = src.with_suffix(".ipynb")
    if not path.is_file():
        return [f"{path.relative_to(ROOT)} does not exist"]
    want, got = assemble(src), nbformat.read(path, as_version=4)
    found = []
    if len(want.cells) != len(got.cells):
        found.append(f"{len(got.cells)} cells stored, the source makes {len(want.cells)}")
    for n, (w, g) in enumerate(zip(want.cells, got.cells)):
        for key in ("cell_type", "source", "id"):
            if w.get(key) != g.get(key):
                found.append(f"cell {n}: {key} differs")
                break
        else:
            if dict(w.metadata) != dict(g.metadata):
                found.append(f"cell {n}: metadata differs")
    # language_info is filled in by the kernel that ran it; the rest is the build's
    for key in ("kernelspec", "colab", "accelerator", "widgets"):
        if got.metadata.get(key) != want.metadata.get(key):
            found.append(f"notebook metadata {key!r} differs")
    return found
