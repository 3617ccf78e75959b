"""How grading kernels are started: over IPC where the platform allows, and capped from their first line.

Two pieces, shared by the routes that run student code:

- :func:`ipc_config`: kernel-manager settings that put the kernel's five ZeroMQ channels on Unix
  sockets in a private folder instead of TCP ports on localhost. ipykernel (7.x) warns "Kernel is
  running over TCP without encryption" on stderr for every kernel started over TCP without CurveZMQ
  keys (``ipykernel/kernelapp.py``, ``init_sockets``); a class of six graded over TCP printed it 60
  times. Over IPC nothing listens on a port and nothing is printed. Windows has no IPC transport
  in jupyter_client, so there the settings are empty and kernels use TCP as before.
- ``python -m swkv_teach.grading.kernel --memory 4G --cpu 600 -f CONNECTION_FILE``: a kernel
  launcher for a kernelspec (``kernel.json``'s ``argv``). It loads torch and every exercise's checks
  (:func:`~swkv_teach.grading.limits.preload`), caps its own process with
  :class:`~swkv_teach.grading.limits.Limits` (the caps ``swkv-teach grade`` sets: ``--memory`` is the
  room left for the notebook's code), then runs ipykernel in the same process, so the kernel runs capped
  before its first cell and the student's ``import torch`` is already paid for.
  The nbgrader export uses it (nbgrader starts its kernels itself; see :mod:`.export_nbgrader`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

__all__ = ["KERNEL_NAME", "ipc_config", "main", "write_kernelspec"]

KERNEL_NAME = "swkv-capped"


def ipc_config(folder: str | os.PathLike) -> dict:
    """``KernelManager`` settings for IPC transport, its sockets ``folder/kernel-N``; ``{}`` where IPC is unavailable.

    ``folder`` should be private to the grader and short: a Unix socket's path is limited to about 100 bytes.
    """
    if os.name != "posix":
        return {}
    return {"transport": "ipc", "ip": os.path.join(os.fspath(folder), "kernel")}


def write_kernelspec(parent: Path, memory: str | None, cpu: float | None, display_name: str = "") -> Path:
    """Write ``parent/kernels/swkv-capped/kernel.json``: this launcher with the caps, as a kernelspec.

    ``"python"`` as the first word is replaced by jupyter_client with the interpreter that starts the
    kernel (``KernelManager.format_kernel_cmd``), the one nbgrader runs in, which has swkv_teach.
    """
    from swkv_teach.grading.limits import KERNEL_ENV

    argv = ["python", "-m", "swkv_teach.grading.kernel"]
    argv += ["--memory", str(memory) if memory else "none", "--cpu", f"{cpu:g}" if cpu else "none"]
    argv += ["-f", "{connection_file}"]
    spec = {"argv": argv, "display_name": display_name or "Python 3 (swkv-teach grading, capped)",
            "language": "python", "metadata": {"debugger": False}, "env": dict(KERNEL_ENV)}
    folder = parent / "kernels" / KERNEL_NAME
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")
    return folder


def main(argv: list[str] | None = None) -> int:
    from swkv_teach.grading.limits import Limits, preload

    ap = argparse.ArgumentParser(prog="python -m swkv_teach.grading.kernel",
                                 description="Start an IPython kernel with memory and CPU caps (a kernelspec's argv).")
    ap.add_argument("--memory", default="4G", help="room for the notebook's code (address space), e.g. 2G; none: no cap")
    ap.add_argument("--cpu", default="600", help="CPU seconds; none: no cap")
    args, kernel_args = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    none = ("", "none", "0")
    limits = Limits(None if args.memory.lower() in none else args.memory,
                    None if args.cpu.lower() in none else float(args.cpu))
    from swkv_teach.grading import EXERCISES

    try:
        preload(sorted(EXERCISES))
    except Exception as e:  # the grader's environment, not the student: say so in the kernel's log, cap anyway
        print(f"swkv-teach kernel: could not load torch and the checks ({type(e).__name__}: {e})", file=sys.stderr)
    # What ipykernel_launcher does (IPKernelApp.launch_instance), in this process, so the modules loaded above
    # stay, with the cap set between its two halves: once the kernel's sockets, threads and shell exist
    # (initialize), they are not charged to the notebook's room; before any cell can run (start).
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(kernel_args)
    note = limits.apply(os.getpid())
    if note:
        print(f"swkv-teach kernel: {note}", file=sys.stderr)
    app.start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
