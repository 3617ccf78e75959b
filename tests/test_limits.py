"""Resource caps for grading kernels: sizes parsed as teachers write them, caps set on a real process."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from swkv_teach.grading.limits import Limits, hit_memory_limit, parse_size


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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prlimit is Linux-only")
def test_the_caps_are_set_on_the_process_and_an_allocation_past_them_fails():
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdin.readline()\n"
                              "try:\n    bytearray(3 * 2**30)\nexcept MemoryError:\n    print('MemoryError')\n"
                              "import resource; print(resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_CPU))"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        limits = Limits("2G", 30)
        assert not limits.memory_capped
        assert limits.apply(child.pid) is None and limits.memory_capped
        out, _ = child.communicate("go\n", timeout=60)
    finally:
        child.kill()
    assert out.split("\n")[:2] == ["MemoryError", f"({2 * 2**30}, {2 * 2**30}) (30, 35)"]


def test_which_cap_a_dead_kernel_hit():
    limits = Limits("2G", 60)
    assert limits.death(-signal.SIGXCPU).startswith("cpu limit: the kernel used its 60 s of CPU time")
    assert limits.death(-signal.SIGKILL).startswith("killed:")
    assert limits.death(1) is None and limits.death(None) is None and limits.death(-signal.SIGSEGV) is None


def test_memory_errors_are_recognised_from_python_and_torch():
    assert hit_memory_limit("MemoryError")
    assert hit_memory_limit("RuntimeError: [enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")
    assert not hit_memory_limit("ExerciseFailed: wrong mask")
