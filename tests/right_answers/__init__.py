"""The catalogue of right answers: each written in a different style a learner might choose.

``@right(check)`` registers a class or function that ``swkv_teach.grading.<check>`` must accept
(one ✅ line, no exception). The styles are the ones issue 10 lists: deque or list re-stacking,
torch.roll, a shift-left buffer, a time-major buffer returned transposed, one shared (2, B, H, W, D)
buffer, a linked-list or dict-subclass LRU, sinks newest first, separate sink and window tensors,
token-by-token or layer-major decode, @torch.inference_mode().
"""

from __future__ import annotations

import importlib.util

RIGHT: list = []


def right(check: str):
    def register(obj):
        obj.check = check
        RIGHT.append(obj)
        return obj

    return register


def load() -> list:
    """Every registered right answer (importing the modules registers them)."""
    from tests.right_answers import caches, decode, lru, masks, prefix, prefix_unseen, speculative  # noqa: F401

    if importlib.util.find_spec("triton") is not None:  # exercise 12 answers are @triton.jit functions
        from tests.right_answers import split_kv, split_kv_unseen  # noqa: F401

    if importlib.util.find_spec("transformers") is not None:  # exercise 11's answers subclass transformers' classes
        from tests.right_answers import hf_layer  # noqa: F401
    return RIGHT
