"""Compiled or interpreted: read from ``TRITON_INTERPRET``, which :mod:`swkv_teach.kernels` sets on a machine
without a GPU before anything imports Triton. A module of its own so the kernels (decode.py) can ask without
importing the package that imports them."""

from __future__ import annotations

import os


def interpreted() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET`` set), False when it compiles."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")
