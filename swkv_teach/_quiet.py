"""Torch's own log lines that a learner cannot act on, kept out of the lessons' stderr.

Inductor compiles C++ through ``torch.utils.cpp_extension``, which on import looks for a CUDA toolkit and,
under a CUDA build of torch on a machine with the toolkit (``nvcc`` on the path) but no GPU, logs
``No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'`` at WARNING (torch 2.14
``torch/utils/cpp_extension.py``, ``_find_cuda_home``, called when the module is imported). A CPU compile
needs neither; the line reached JupyterLab as a pink block and failed two lessons under strict nbval.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["import_cpp_extension_quietly"]


def import_cpp_extension_quietly() -> None:
    """Import ``torch.utils.cpp_extension`` (once) with its logger at ERROR, then put the level back.

    Only the import is quieted: anything the module logs later (a failed build) still shows.
    """
    name = "torch.utils.cpp_extension"
    if name in sys.modules:
        return
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import torch.utils.cpp_extension  # noqa: F401
    finally:
        logger.setLevel(level)
