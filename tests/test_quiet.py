"""The course's compiles print nothing of torch's own that a learner cannot act on (issue 35).

Under PyPI's CUDA build of torch, on a machine with a CUDA toolkit and no GPU, importing
``torch.utils.cpp_extension`` (which inductor does to compile C++) logs "No CUDA runtime is found". The CPU
build never reaches that line, so the test makes the CPU build look like a CUDA build without a GPU for one
subprocess: the warning then shows on a plain import, and not through the course's quiet import.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import logging, torch
from swkv_teach._quiet import import_cpp_extension_quietly
torch.cuda._is_compiled = lambda: True      # what a CUDA build says ...
torch.cuda.is_available = lambda: False     # ... on a machine without a GPU
torch.version.cuda = torch.version.cuda or "13.0"
{how}
import torch.utils.cpp_extension as ext
assert ext.CUDA_HOME, "the module looked for the toolkit"
logging.getLogger("torch.utils.cpp_extension").warning("later warnings still show")
"""


def run(how: str, tmp_path) -> str:
    env = {"CUDA_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(how=how)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_plain_import_logs_the_missing_cuda_runtime(tmp_path):
    assert "No CUDA runtime is found" in run("", tmp_path), "the probe must reproduce the warning"


def test_the_courses_import_is_quiet_and_leaves_the_logger_as_it_was(tmp_path):
    err = run("import_cpp_extension_quietly()", tmp_path)
    assert "No CUDA runtime is found" not in err, err
    assert "later warnings still show" in err, "only the import was quieted"


@pytest.mark.slow
def test_compiling_the_ring_prints_nothing_on_stderr():
    """Whatever torch this runs under (CI runs it under the CPU wheel and PyPI's CUDA build)."""
    code = ("import torch\nfrom swkv_teach.pretrained import load_pretrained\n"
            "model, _ = load_pretrained()\n"
            "out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, compile=True)\n"
            "print(out.shape)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.strip() == "", done.stderr[-3000:]
