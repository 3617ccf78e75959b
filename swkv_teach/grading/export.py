"""``swkv-teach export PLATFORM ...``: the exercises for the platforms classes already grade on.

    swkv-teach export nbgrader DIR [--assignment NAME]   an nbgrader course folder (JupyterHub)
    swkv-teach export gradescope DIR                     DIR/autograder.zip (Colab + Gradescope)

    Both take --memory (default 4G) and --cpu (default 600 s): the caps on each kernel that runs
    student code, as for `swkv-teach grade`. Both work from an installed package, outside the course
    checkout (nbgrader then needs --solutions PATH).

Exports translate; they never re-implement a check (see :mod:`.export_nbgrader`, :mod:`.export_gradescope`).
"""

from __future__ import annotations

import importlib
import sys

PLATFORMS = {
    "nbgrader": "swkv_teach.grading.export_nbgrader",
    "gradescope": "swkv_teach.grading.export_gradescope",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in PLATFORMS:
        helping = bool(argv) and argv[0] in ("-h", "--help")
        usage = "usage: swkv-teach export PLATFORM OUT [OPTIONS]\n\n" + "\n\n".join(__doc__.strip().split("\n\n")[1:3])
        if argv and not helping:
            usage += f"\n\nswkv-teach export: unknown platform {argv[0]!r} (nbgrader or gradescope)"
        print(usage, file=sys.stdout if helping else sys.stderr)
        return 0 if helping else 2
    return importlib.import_module(PLATFORMS[argv[0]]).main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
