"""device(): cuda, then mps, then cpu; $SWKV_DEVICE overrides and fails loudly when it cannot be honoured."""

import pytest
import torch

from swkv_teach.device import ENV_VAR, available_devices, device


def test_default_is_an_available_device(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    d = device()
    assert d in available_devices()
    if torch.cuda.is_available():
        assert d.type == "cuda"


def test_env_forces_cpu(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "cpu")
    assert device() == torch.device("cpu")


def test_env_naming_a_missing_device_is_an_error(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setenv(ENV_VAR, "cuda")
    with pytest.raises(RuntimeError, match="SWKV_DEVICE='cuda'.*no such device"):
        device()


def test_env_naming_nonsense_is_an_error(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "gpu please")
    with pytest.raises(RuntimeError, match="not a torch device"):
        device()
