"""Shared fixtures: every device test runs on the CPU, and also on CUDA/MPS when present.

``SWKV_DEVICE=cuda`` (``make gpu-check``) narrows the run to that device alone.
"""

from __future__ import annotations

import os

import pytest
import torch

from swkv_teach.device import ENV_VAR, available_devices, device as pick_device


def _test_devices() -> list[str]:
    if os.environ.get(ENV_VAR):
        return [str(pick_device())]
    return [str(d) for d in available_devices()]


@pytest.fixture(params=_test_devices())
def device(request) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
