"""Resource caps for a grading kernel: room for the student's code, and CPU time, so one submission fails alone.

``swkv-teach grade``, the Gradescope ``run_autograder`` and the nbgrader kernel start a fresh kernel per
notebook, load what grading needs (:func:`preload`: torch, the checks, Triton or transformers where an
exercise's check uses them), then cap it with ``setrlimit`` limits (``prlimit(2)``, Linux) before any of
the notebook's cells run:

- ``RLIMIT_AS`` (``--memory``, default 4 GiB): the cap is what the kernel maps at that moment **plus**
  ``--memory``, so ``--memory`` is the room left for the student's own code, the same under every torch
  build. Measured here (Python 3.11, no GPU, ``MALLOC_ARENA_MAX=2`` as :data:`KERNEL_ENV` sets it): a bare
  kernel maps 0.21 GiB; with torch and the checks loaded 0.80 GiB under torch 2.13's CPU wheel and 3.29 GiB
  under PyPI's CUDA build (torch 2.14.1+cu130); with transformers and Triton too (exercises 11 and 12) 1.11
  and 3.60 GiB. A fixed cap of 2 GiB left the CPU build about 1 GiB for the student and broke
  ``import torch`` itself under the CUDA build ("failed to map segment from shared object"). An allocation past the cap fails inside the kernel
  (``MemoryError``, torch's "can't allocate memory") instead of swapping the machine to a halt or waking
  the OOM killer, which might pick the grader itself.
- ``RLIMIT_CPU`` (``--cpu``, default 600 s, counted from the cap like ``--memory``): a kernel spinning
  in C code, where an interrupt from the per-cell wall-clock timeout cannot reach, is stopped by the
  kernel's own OS (SIGXCPU, then SIGKILL 5 s later).

On a machine where torch sees a CUDA GPU the address-space cap is not set (CUDA maps far more
virtual memory than it uses, so any cap breaks it); the feedback says so, and grading with
``CUDA_VISIBLE_DEVICES=`` runs the kernels on the CPU, capped.

Limits are inherited by processes the kernel forks, each with its own budget; a fork bomb is
not stopped by these (``RLIMIT_NPROC`` counts per user and is ignored for root), nor is disk
use or the network: run graders in a container (Gradescope does) for that.
"""

from __future__ import annotations

import math
import os
import re
import signal

__all__ = ["KERNEL_ENV", "Limits", "MEMORY_ERRORS", "PRELOAD", "hit_memory_limit", "cpu_seconds", "mapped_bytes", "parse_size",
           "preload"]

# What an allocation failing under RLIMIT_AS looks like from Python, NumPy and torch, and from the dynamic
# loader when an import maps a shared library past the cap (glibc's dl-map-segments: "failed to map segment
# from shared object"; dlopen's "cannot map zero-fill pages", "cannot create shared object descriptor").
MEMORY_ERRORS = ("MemoryError", "can't allocate memory", "Cannot allocate memory", "std::bad_alloc",
                 "Unable to allocate", "out of memory", "failed to map segment", "cannot map zero-fill pages",
                 "cannot create shared object descriptor", "mmap failed")

# Modules an exercise's check imports only when it runs, beyond torch and swkv_teach.grading (which every
# check needs): loaded before the cap, so they are not charged to the student's --memory.
PRELOAD = {"11": ("transformers", "transformers.cache_utils", "transformers.models.mistral.modeling_mistral",
                  "swkv_teach.hf_cache"),
           "12": ("triton", "triton.language", "swkv_teach.kernels.decode")}
_OPTIONAL = {"transformers", "triton"}

# The environment a grading kernel starts with. glibc gives each thread that allocates an arena of its own,
# reserving 64 MiB of address space each (up to 8 per core): ipykernel's threads and torch's workers would eat
# the room --memory promises, more on a machine with more cores. Two arenas keep the room the same everywhere.
KERNEL_ENV = {"MALLOC_ARENA_MAX": "2"}

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
    """The caps for one kernel; ``None`` leaves a resource uncapped.

    ``memory`` is the room for the student's code: :meth:`apply` caps the address space at what the
    kernel maps when it is called plus ``memory`` (call it once :func:`preload` has run in the kernel).
    """

    def __init__(self, memory: str | int | None = "4G", cpu: float | None = 600):
        self.memory = parse_size(memory) if memory is not None else None
        if cpu is not None and not cpu > 0:
            raise ValueError(f"cpu must be > 0 seconds; got {cpu}")
        self.cpu = int(cpu) if cpu is not None else None
        self.memory_capped = False  # set by apply(): only then is a MemoryError this cap's doing
        self.baseline: int | None = None  # what the kernel mapped when capped (bytes), set by apply()

    def describe(self) -> str:
        parts = []
        if self.memory:
            loaded = f", on top of the {_gib(self.baseline)} the kernel maps" if self.baseline else ""
            parts.append(f"{_gib(self.memory)} of memory for the notebook's own code (address space{loaded})")
        if self.cpu:
            parts.append(f"{self.cpu} s of CPU time")
        return " and ".join(parts) or "no caps"

    def apply(self, pid: int) -> str | None:
        """Cap process ``pid``: address space at its current mapping + ``memory``; returns None, or why not."""
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
                baseline = mapped_bytes(pid)
                if baseline is None:
                    return f"could not read what process {pid} maps (/proc/{pid}/status); it ran uncapped"
                cap = baseline + self.memory
                prlimit(pid, resource.RLIMIT_AS, (cap, cap))
                self.baseline, self.memory_capped = baseline, True
            if self.cpu:
                # RLIMIT_CPU counts from the process's start: add what loading torch and the checks used.
                used = math.ceil(cpu_seconds(pid) or 0)
                prlimit(pid, resource.RLIMIT_CPU, (used + self.cpu, used + self.cpu + 5))
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


def mapped_bytes(pid: int) -> int | None:
    """Bytes of address space process ``pid`` maps now (``VmSize``, what ``RLIMIT_AS`` counts); None off Linux."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used, from ``/proc/PID/stat``; None off Linux."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def preload(exercises=()) -> None:
    """Import what grading ``exercises`` needs and start torch's thread pools, in the kernel, before the cap.

    torch, swkv_teach (which sets ``TRITON_INTERPRET`` before anything imports Triton) and every check;
    then the modules in :data:`PRELOAD` for the given exercise ids (a missing optional package is left to
    the check, which says how to install it). A small parallel op starts torch's worker threads, whose
    stacks are address space too. Raises what an import raises: a kernel that cannot load torch is the
    grader's problem, reported as such, never a student's.
    """
    import importlib

    import torch

    import swkv_teach  # noqa: F401
    import swkv_teach.grading  # noqa: F401

    for ex in exercises:
        for name in PRELOAD.get(str(ex), ()):
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as e:
                if (e.name or "").split(".")[0] in _OPTIONAL:
                    break  # not installed: the check itself says how to install it
                raise
    torch.ones(1 << 20).add_(1).sum()
    torch.ones(64, 64) @ torch.ones(64, 64)


def hit_memory_limit(error_text: str) -> bool:
    """Whether a cell's error reads like an allocation refused by the address-space cap."""
    return any(s.lower() in error_text.lower() for s in MEMORY_ERRORS)
