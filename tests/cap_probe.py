"""A student's cell that reports the caps its kernel runs under, for the grading routes' tests.

It prints one line, ``caps AS=(soft, hard) CPU=(soft, hard) left=S arenas=N mapped=BYTES fits=BOOL over=BOOL``: the
address-space and CPU limits, the CPU seconds left under the soft limit, ``MALLOC_ARENA_MAX``, what the kernel maps as the cell runs (``VmSize``), and whether a mapping
128 MiB under the room left (cap − mapped) succeeds and one 128 MiB over it is refused. Mappings are
anonymous and never touched, so no RAM is used. :func:`room_seen` reads the line back.
"""

from __future__ import annotations

import ast
import re

MARK = "# probe: the caps this kernel runs under"
SLACK = 128 * 2**20

SOURCE = f"""{MARK}
import mmap, resource
_as, _cpu = resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_CPU)
_used = resource.getrusage(resource.RUSAGE_SELF)
_cpu_left = _cpu[0] - (_used.ru_utime + _used.ru_stime)
_mapped = next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmSize:'))
def _maps(n):
    try:
        mmap.mmap(-1, n).close()
        return True
    except (OSError, OverflowError, ValueError):
        return False
_room = _as[0] - _mapped
_line = f'caps AS={{_as}} CPU={{_cpu}} left={{_cpu_left:.1f}} arenas={{__import__("os").environ.get("MALLOC_ARENA_MAX")}} mapped={{_mapped}} fits={{_maps(_room - {SLACK})}} over={{_maps(_room + {SLACK})}}'
print(_line)
"""
# The same, raising its line: routes that show a student only the cells that raised (Gradescope's output).
RAISING = SOURCE + "raise RuntimeError(_line)\n"


def room_seen(text: str) -> dict:
    """``{"as": (soft, hard), "cpu": (soft, hard), "mapped": int, "room": int, "fits": bool, "over": bool}``."""
    m = re.search(r"caps AS=(\(.*?\)) CPU=(\(.*?\)) left=([\d.-]+) arenas=(\w+) mapped=(\d+) fits=(\w+) over=(\w+)", text)
    assert m, f"no probe line in: {text[-2000:]}"
    caps, cpu = ast.literal_eval(m.group(1)), ast.literal_eval(m.group(2))
    mapped = int(m.group(5))
    return {"as": caps, "cpu": cpu, "cpu_left": float(m.group(3)), "arenas": m.group(4), "mapped": mapped,
            "room": caps[0] - mapped, "fits": m.group(6) == "True", "over": m.group(7) == "True"}


def assert_room(seen: dict, memory: int, cpu: int, kernel: bool = True) -> None:
    """The kernel had ``memory`` bytes of room beyond what it mapped when capped, and ``cpu`` seconds."""
    if kernel:  # grading kernels start with glibc's arenas bounded (limits.KERNEL_ENV)
        assert seen["arenas"] == "2", seen
    # --cpu counts from the cap too: the soft limit is what loading used plus cpu; the hard one 5 s above it
    assert seen["cpu"][1] == seen["cpu"][0] + 5 and cpu - 15 <= seen["cpu_left"] <= cpu + 1, seen
    assert seen["as"][0] == seen["as"][1], seen
    # The cap was set once torch and the checks were loaded; the probe, a student's first cell, runs a
    # little later (a few MiB of IPython's own), so the room it sees is at most --memory and close to it.
    assert memory - 96 * 2**20 <= seen["room"] <= memory, (seen["room"] / 2**20, memory / 2**20)
    assert seen["fits"] and not seen["over"], seen
