"""Authoring notebooks from Python: one header for all, execution with stored outputs.

Every notebook (lesson or solution) is written by a small builder script in
``tools/`` that lists its cells and calls :func:`build`, which

* puts the generated header first: an "Open in Colab" badge and a set-up
  cell that installs the package *only* on Colab (without touching Colab's
  torch). The repository address comes from one place, pyproject's
  ``[project.urls] Repository``, so a fork changes one line and reruns
  ``python tools/build_all.py``;
* runs the notebook top to bottom in a fresh kernel (cwd = its folder) and
  stores the outputs, so nbval has something to compare;
* asks Colab for a GPU runtime where ``gpu=True``.

Usage in a builder::

    from nbtools import build, code, md
    build("notebooks/01_six_steps.ipynb", [md("# ..."), code("import torch")], gpu=False)
"""

from __future__ import annotations

import hashlib
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
HEADER_TAG = "swkv-header"


def repo_url() -> str:
    """The repository address written once in pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'^Repository\s*=\s*"([^"]+)"', text, re.M)
    if not m:
        raise RuntimeError("pyproject.toml has no [project.urls] Repository line")
    return m.group(1).rstrip("/")


def colab_url(rel_path: str) -> str:
    gh = repo_url().replace("https://github.com/", "")
    return f"https://colab.research.google.com/github/{gh}/blob/main/{rel_path}"


def md(source: str, **meta):
    return nbformat.v4.new_markdown_cell(source.strip("\n"), metadata=meta)


def code(source: str, **meta):
    return nbformat.v4.new_code_cell(source.strip("\n"), metadata=meta)


def header_cells(rel_path: str) -> list:
    """The badge and the Colab-only set-up cell, tagged so tests can find and check them."""
    badge = md(
        f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(rel_path)})",
        tags=[HEADER_TAG],
    )
    setup = code(
        "# Set-up: on Google Colab only, install the course library (Colab's torch is kept).\n"
        "# On your own machine `make lab` has installed it already, and this cell does nothing.\n"
        "import sys\n"
        'if "google.colab" in sys.modules:\n'
        f'    !pip install -q "swkv-teach @ git+{repo_url()}"',
        tags=[HEADER_TAG],
    )
    return [badge, setup]


def new_notebook(rel_path: str, cells: list, gpu: bool = False):
    nb = nbformat.v4.new_notebook()
    nb.cells = header_cells(rel_path) + list(cells)
    for i, cell in enumerate(nb.cells):
        # stable ids: a rebuild that changes nothing leaves the file's diff empty
        cell.id = hashlib.sha1(f"{rel_path}:{i}".encode()).hexdigest()[:8]
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "colab": {"provenance": []},
    }
    if gpu:
        nb.metadata["accelerator"] = "GPU"
        nb.metadata["colab"]["gpuType"] = "T4"
    return nb


def execute(nb, folder: Path, timeout: int = 120):
    """Run in a fresh kernel with cwd ``folder``; drop volatile metadata so re-runs diff cleanly."""
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    return nb


def build(rel_path: str, cells: list, gpu: bool = False, run: bool = True, timeout: int = 120) -> Path:
    """Write ``ROOT/rel_path`` from ``cells`` (header prepended), executed unless ``run=False``."""
    path = ROOT / rel_path
    path.parent.mkdir(parents=True, exist_ok=True)
    nb = new_notebook(rel_path, cells, gpu=gpu)
    if run:
        t0 = time.perf_counter()
        execute(nb, path.parent, timeout=timeout)
        print(f"{rel_path}: executed in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    nbformat.write(nb, path)
    return path
