"""Which device the course runs on: cuda, then mps, then cpu; ``SWKV_DEVICE`` overrides.

``SWKV_DEVICE=cuda make test`` (what ``make gpu-check`` does) forces the GPU and
fails loudly when there is none, instead of quietly testing the CPU again.
"""

from __future__ import annotations

import os

import torch

ENV_VAR = "SWKV_DEVICE"


def _available(name: str) -> bool:
    kind = torch.device(name).type
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "mps":
        return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()
    return kind == "cpu"


def device() -> torch.device:
    """The best available ``torch.device``, or the one ``$SWKV_DEVICE`` names (e.g. ``cpu``, ``cuda:0``).

    Raises RuntimeError when ``$SWKV_DEVICE`` names a device this machine lacks.
    """
    forced = os.environ.get(ENV_VAR, "").strip()
    if forced:
        try:
            ok = _available(forced)
        except RuntimeError as e:
            raise RuntimeError(f"${ENV_VAR}={forced!r} is not a torch device name ({e})") from None
        if not ok:
            raise RuntimeError(f"${ENV_VAR}={forced!r} but no such device is available on this machine")
        return torch.device(forced)
    for name in ("cuda", "mps"):
        if _available(name):
            return torch.device(name)
    return torch.device("cpu")


def available_devices() -> list[torch.device]:
    """cpu, plus every accelerator present (what the test suite parametrises over)."""
    found = [torch.device("cpu")]
    found += [torch.device(n) for n in ("cuda", "mps") if _available(n)]
    return found
