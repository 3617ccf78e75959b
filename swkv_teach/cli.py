"""``swkv-teach``: one console script, a subcommand per tool.

    swkv-teach make-exercises   write exercises/ from solutions/
    swkv-teach grade PATH...    grade submitted notebooks into a CSV gradebook
    swkv-teach export ...       an nbgrader course folder, or a Gradescope autograder
    swkv-teach bench            measure the caches (same as python -m swkv_teach.bench)
    swkv-teach train            train the shipped checkpoint (same as python -m swkv_teach.train)

Each subcommand's module has its own ``main(argv)``; imports happen only for
the one asked for, so ``swkv-teach grade`` never pays for the decoder.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "make-exercises": ("swkv_teach.grading.exercises", "write exercises/ from solutions/"),
    "grade": ("swkv_teach.grading.grade", "grade notebooks into a CSV gradebook"),
    "export": ("swkv_teach.grading.export", "export for nbgrader or Gradescope"),
    "bench": ("swkv_teach.bench", "benchmark the caches"),
    "train": ("swkv_teach.train", "train the shipped checkpoint"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = [f"  {name:<16}{help_}" for name, (_, help_) in COMMANDS.items()]
        print("usage: swkv-teach COMMAND [ARGS]\n\ncommands:\n" + "\n".join(lines))
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nswkv-teach: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
