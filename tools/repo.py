"""The repository address, written once in pyproject.toml (``[project.urls] Repository``), and the Colab target
every notebook's badge links. Dependency-free: the notebook build (nbtools.py) and the website build
(site/build_site.py, which installs only the site extra) both read it from here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def repo_url() -> str:
    """The repository address written once in pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'^Repository\s*=\s*"([^"]+)"', text, re.M)
    if not m:
        raise RuntimeError("pyproject.toml has no [project.urls] Repository line")
    return m.group(1).rstrip("/")


def colab_url(rel_path: str) -> str:
    """Where a notebook's "Open in Colab" badge points: ``rel_path`` (e.g. ``notebooks/03_ring_buffer.ipynb``) on main."""
    gh = repo_url().replace("https://github.com/", "")
    return f"https://colab.research.google.com/github/{gh}/blob/main/{rel_path}"
