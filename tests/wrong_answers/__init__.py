"""The catalogue of wrong answers: each a small class or function whose docstring names its bug.

``@wrong(check, *words)`` registers it: ``check`` is the name of the
``swkv_teach.grading`` function that must reject it, ``words`` must all appear
(case-insensitive) in the ExerciseFailed message, so each rejection points at
the bug rather than merely failing. ``needs_accelerator`` marks the few bugs
only a GPU can expose (a buffer created on the CPU).
"""

from __future__ import annotations

import importlib.util

CATALOGUE: list = []


def wrong(check: str, *words: str, needs_accelerator: bool = False):
    def register(obj):
        obj.check = check
        obj.words = words
        obj.needs_accelerator = needs_accelerator
        CATALOGUE.append(obj)
        return obj

    return register


def load() -> list:
    """Every registered wrong answer (importing the modules registers them)."""
    from tests.wrong_answers import (chunk, decode, h2o, int8, lru, masks, paged, prefix, prefix_unseen,  # noqa: F401
                                     ring, sinks, sliding, speculative)

    if importlib.util.find_spec("triton") is not None:  # exercise 12 answers are @triton.jit functions
        from tests.wrong_answers import split_kv, split_kv_unseen  # noqa: F401
    if importlib.util.find_spec("transformers") is not None:  # exercise 11's answers subclass transformers' classes
        from tests.wrong_answers import hf_layer  # noqa: F401
    return CATALOGUE
