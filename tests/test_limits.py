"""Resource caps for grading kernels: sizes parsed as teachers write them, caps set on a real process."""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys

import pytest

from swkv_teach.grading.limits import Limits, hit_memory_limit, mapped_bytes, parse_size, preload
from tests import cap_probe


@pytest.mark.parametrize("text, expected", [("2G", 2 * 2**30), ("512M", 512 * 2**20), ("1.5G", 3 * 2**29),
                                            ("4GiB", 4 * 2**30), ("2g", 2 * 2**30), (1000, 1000)])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "two gigs", "-1G", "0", 0, "2X"])
def test_bad_sizes_name_the_argument(bad):
    with pytest.raises(ValueError, match="memory must be"):
        parse_size(bad)


def test_bad_cpu_is_refused():
    with pytest.raises(ValueError, match="cpu must be > 0"):
        Limits("1G", 0)


LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prlimit and /proc are Linux-only")


def capped_child(memory: str, cpu: int, setup: str = ""):
    """A Python that runs ``setup``, waits, is capped by ``Limits(memory, cpu)``, then probes its room.

    Returns (the Limits, what the child mapped just before the cap, the child's probe line parsed).
    """
    child = subprocess.Popen([sys.executable, "-c", f"{setup}\nimport sys; print('ready', flush=True)\n"
                              "sys.stdin.readline()\n" + cap_probe.SOURCE],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        before = mapped_bytes(child.pid)
        limits = Limits(memory, cpu)
        assert not limits.memory_capped
        assert limits.apply(child.pid) is None and limits.memory_capped
        out, _ = child.communicate("go\n", timeout=120)
    finally:
        child.kill()
    return limits, before, cap_probe.room_seen(out)


@LINUX
def test_what_a_process_maps_is_read_from_proc():
    here = mapped_bytes(os.getpid())
    big = mmap.mmap(-1, 256 * 2**20)  # address space, not RAM: never touched
    try:
        assert mapped_bytes(os.getpid()) - here >= 256 * 2**20
    finally:
        big.close()
    assert mapped_bytes(2**22 + 12345) is None, "no such process"


@LINUX
def test_memory_is_room_beyond_what_the_process_maps_when_capped():
    limits, before, seen = capped_child("512M", 30)
    assert limits.baseline == before, "the cap is counted from what the process mapped when it was capped"
    assert seen["as"][0] == before + 512 * 2**20
    cap_probe.assert_room(seen, 512 * 2**20, 30, kernel=False)
    assert "512 MiB of memory for the notebook's own code" in limits.describe()


@LINUX
def test_the_room_is_the_same_after_torch_and_every_check_are_loaded():
    """Issue 35: a fixed cap left a CUDA build of torch (which maps ~2.5 GiB more than the CPU build) almost no
    room, or none. The cap now starts from what the kernel maps once preload() ran, under any build."""
    limits, before, seen = capped_child(
        "512M", 60, "from swkv_teach.grading.limits import preload; from swkv_teach.grading import EXERCISES\n"
                    "preload(sorted(EXERCISES))")
    assert before > 400 * 2**20, f"torch and the checks are loaded before the cap ({before / 2**20:.0f} MiB mapped)"
    cap_probe.assert_room(seen, 512 * 2**20, 60, kernel=False)


def test_preload_refuses_nothing_it_does_not_know_and_names_what_failed(monkeypatch):
    preload(["01", "no-such-exercise"])  # torch and the checks only
    monkeypatch.setitem(sys.modules, "swkv_teach.grading", None)  # as if the package could not be imported
    with pytest.raises(ImportError):
        preload(["01"])


def test_which_cap_a_dead_kernel_hit():
    limits = Limits("2G", 60)
    assert limits.death(-signal.SIGXCPU).startswith("cpu limit: the kernel used its 60 s of CPU time")
    assert limits.death(-signal.SIGKILL).startswith("killed:")
    assert limits.death(1) is None and limits.death(None) is None and limits.death(-signal.SIGSEGV) is None


def test_memory_errors_are_recognised_from_python_and_torch():
    assert hit_memory_limit("MemoryError")
    assert hit_memory_limit("RuntimeError: [enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")
    # an import mapping a shared library past the cap (what `import torch` said under a CUDA build and a 2 GiB cap)
    assert hit_memory_limit("ImportError: /x/torch/lib/libtorch_cpu.so: failed to map segment from shared object")
    assert not hit_memory_limit("ExerciseFailed: wrong mask")
