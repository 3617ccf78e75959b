"""CI's third pass runs the torch-dependent tests on Colab's own stack: this holds that pass to Colab's versions.

``.ci/run`` installs torch, transformers and NumPy at the versions in ``tests/colab_preinstalled.txt`` (Colab's
published ``pip freeze``) and sets ``SWKV_COLAB_STACK=1``; were the file refreshed, or pip to pick something
else, these fail instead of the pass quietly testing another stack. Outside that pass they are skipped.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

FREEZE = Path(__file__).resolve().parent / "colab_preinstalled.txt"
pytestmark = pytest.mark.skipif(os.environ.get("SWKV_COLAB_STACK") != "1",
                                reason="only in CI's Colab pass (SWKV_COLAB_STACK=1)")


def colab_version(name: str) -> str:
    """Colab's version of ``name``, without a local tag (``torch==2.11.0+cpu`` -> ``2.11.0``)."""
    for line in FREEZE.read_text().splitlines():
        m = re.fullmatch(rf"{re.escape(name)}==([^+\s]+)(\+\S+)?", line.strip(), re.I)
        if m:
            return m.group(1)
    raise AssertionError(f"{name} is not pinned in {FREEZE.name}")


@pytest.mark.parametrize("name", ["torch", "transformers", "numpy"])
def test_the_pass_runs_colabs_version(name):
    module = pytest.importorskip(name)
    assert module.__version__.split("+")[0] == colab_version(name), (name, module.__version__)


def test_the_package_floor_is_the_oldest_torch_tested_here():
    """pyproject's torch floor is Colab's torch, the oldest CI runs the course under (issue 35)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((FREEZE.parent.parent / "pyproject.toml").read_text())["project"]
    torch_req = next(d for d in project["dependencies"] if re.match(r"torch\b", d)).replace(" ", "")
    floor = re.fullmatch(r"torch>=(\d+)\.(\d+)(\.0)?", torch_req)
    assert floor, torch_req
    assert floor.group(1, 2) == tuple(colab_version("torch").split(".")[:2]), (torch_req, colab_version("torch"))
