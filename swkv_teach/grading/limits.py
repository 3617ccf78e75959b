"""Resource caps for a grading kernel: address space and CPU time, so one submission fails alone.

``swkv-teach grade`` and the Gradescope ``run_autograder`` start a fresh kernel per notebook
and cap it with ``setrlimit`` limits set from the grader (``prlimit(2)``, Linux) right after
the kernel starts and before any of the notebook's cells run:

- ``RLIMIT_AS`` (``--memory``, default 4 GiB): an allocation past the cap fails inside the
  kernel (``MemoryError``, torch's "can't allocate memory") instead of swapping the machine
  to a halt or waking the OOM killer, which might pick the grader itself. A kernel with torch
  loaded and the checks run maps about 0.6 GiB, so a cap under 1 GiB breaks right answers.
- ``RLIMIT_CPU`` (``--cpu``, default 600 s): a kernel spinning in C code, where an interrupt
  from the per-cell wall-clock timeout cannot reach, is stopped by the kernel's own OS
  (SIGXCPU, then SIGKILL 5 s later).

On a machine where torch sees a CUDA GPU the address-space cap is not set (CUDA maps far more
virtual memory than it uses, so any cap breaks it); the feedback says so, and grading with
``CUDA_VISIBLE_DEVICES=`` runs the kernels on the CPU, capped.

Limits are inherited by processes the kernel forks, each with its own budget; a fork bomb is
not stopped by these (``RLIMIT_NPROC`` counts per user and is ignored for root), nor is disk
use or the network: run graders in a container (Gradescope does) for that.
"""

from __future__ import annotations

import os
import re
import signal

__all__ = ["Limits", "MEMORY_ERRORS", "hit_memory_limit", "parse_size"]

# what an allocation failing under RLIMIT_AS looks like from Python, NumPy and torch
MEMORY_ERRORS = ("MemoryError", "can't allocate memory", "Cannot allocate memory", "std::bad_alloc",
                 "Unable to allocate", "out of memory")

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str | int) -> int:
    """Bytes from ``"2G"``, ``"512M"``, ``"1.5G"`` or an int (binary units: G = GiB)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise ValueError(f"memory must be > 0 bytes; got {text}")
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.I)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"memory must be a size like 2G, 512M or 1.5G; got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _gib(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"


class Limits:
    """The caps for one kernel; ``None`` leaves a resource uncapped."""

    def __init__(self, memory: str | int | None = "4G", cpu: float | None = 600):
        self.memory = parse_size(memory) if memory is not None else None
        if cpu is not None and not cpu > 0:
            raise ValueError(f"cpu must be > 0 seconds; got {cpu}")
        self.cpu = int(cpu) if cpu is not None else None
        self.memory_capped = False  # set by apply(): only then is a MemoryError this cap's doing

    def describe(self) -> str:
        parts = []
        if self.memory:
            parts.append(f"{_gib(self.memory)} of memory (address space)")
        if self.cpu:
            parts.append(f"{self.cpu} s of CPU time")
        return " and ".join(parts) or "no caps"

    def apply(self, pid: int) -> str | None:
        """Cap process ``pid``; returns None, or why a cap could not be set."""
        try:
            import resource

            prlimit = resource.prlimit
        except (ImportError, AttributeError):
            return "memory and CPU caps need Linux (prlimit); this kernel ran uncapped"
        note = None
        try:
            if self.memory and _cuda_visible():
                note = ("no memory cap: a CUDA GPU is visible and CUDA maps more address space than any cap "
                        "(grade with CUDA_VISIBLE_DEVICES= to cap memory on the CPU)")
            elif self.memory:
                prlimit(pid, resource.RLIMIT_AS, (self.memory, self.memory))
                self.memory_capped = True
            if self.cpu:
                prlimit(pid, resource.RLIMIT_CPU, (self.cpu, self.cpu + 5))
        except (OSError, ValueError) as e:
            return f"could not cap the kernel ({e}); it ran uncapped"
        return note

    def death(self, returncode: int | None) -> str | None:
        """Which cap a kernel that died with ``returncode`` hit, when its signal says so."""
        if returncode is None or returncode >= 0:
            return None
        sig = -returncode
        if self.cpu and sig == signal.SIGXCPU:
            return f"cpu limit: the kernel used its {self.cpu} s of CPU time and was stopped"
        if self.cpu and sig == signal.SIGKILL:
            return (f"killed: the kernel was killed (SIGKILL), by its {self.cpu} s CPU cap or by the system's "
                    "out-of-memory killer")
        return None


def _cuda_visible() -> bool:
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def hit_memory_limit(error_text: str) -> bool:
    """Whether a cell's error reads like an allocation refused by the address-space cap."""
    return any(s.lower() in error_text.lower() for s in MEMORY_ERRORS)
