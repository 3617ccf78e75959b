"""A multi-turn chat workload: where prefix caching pays.

``conversations`` chats share one system prompt (about 200 characters). Each turn's prompt is
the previous turn's prompt, the reply the model gave to it, and a new user line, so every
turn repeats everything before it: a server without prefix caching computes the system
prompt once per request and each conversation's history once per turn; with it, only the
new line (and the partial block before it) is computed. Turns are served one after another
(a turn's prompts need the previous replies); the conversations of one turn run together.

Used by ``bench/serving.py`` (:func:`swkv_teach.bench.serving.chat_prefix_caching`) and by the
prefix-caching lesson.
"""

from __future__ import annotations

import time

import torch

__all__ = ["SYSTEM_PROMPT", "USER_LINES", "chat_lines", "serve_chat"]

SYSTEM_PROMPT = (
    "# You are a careful Python assistant. Answer with short, correct code.\n"
    "# Use the standard library only, name things plainly, and write a\n"
    "# docstring for every function. Keep each line under 80 characters.\n"
)

USER_LINES = [
    "def read_lines(path):\n", "class Counter:\n", "def mean(values):\n", "import json\n",
    "def is_prime(n):\n", "for name in names:\n", "def parse(text):\n", "with open(path) as f:\n",
    "def merge(a, b):\n", "class Stack:\n", "def fib(n):\n", "try:\n", "def flatten(items):\n",
    "while queue:\n", "def to_snake(name):\n", "if __name__ == '__main__':\n",
]


def chat_lines(conversations: int = 8, turns: int = 3, seed: int = 0) -> list[list[str]]:
    """``lines[c][t]``: the user line of conversation ``c`` at turn ``t`` (seeded draw from :data:`USER_LINES`)."""
    g = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, len(USER_LINES), (conversations, turns), generator=g).tolist()
    return [[USER_LINES[i] for i in row] for row in pick]


def serve_chat(scheduler, tokenizer, conversations: int = 8, turns: int = 3, max_new_tokens: int = 24,
               seed: int = 0, system_prompt: str = SYSTEM_PROMPT) -> dict:
    """Serve the chat on ``scheduler`` turn by turn (the same scheduler throughout: its cache persists).

    Turn 0's prompt is ``system_prompt + line``; turn ``t``'s is turn ``t - 1``'s prompt, its reply
    (``max_new_tokens`` greedy tokens) and the next line.

    Returns:
        ``{"requests": [[{prompt, max_new_tokens}] per conversation] per turn, "outputs": the same shape
        (prompt + reply ids), "new_tokens", "prompt_tokens", "seconds"}`` (``seconds`` is the wall time of
        the scheduler's runs, not of building prompts).
    """
    lines = chat_lines(conversations, turns, seed)
    history = [tokenizer.encode(system_prompt) for _ in range(conversations)]
    requests, outputs, seconds = [], [], 0.0
    for t in range(turns):
        turn = [{"prompt": history[c] + tokenizer.encode(lines[c][t]), "max_new_tokens": max_new_tokens}
                for c in range(conversations)]
        ids = [scheduler.submit(**r) for r in turn]
        start = time.perf_counter()
        done = scheduler.run()
        seconds += time.perf_counter() - start
        history = [done[i] for i in ids]
        requests.append(turn)
        outputs.append(history)
    return {"requests": requests, "outputs": outputs, "seconds": seconds,
            "new_tokens": conversations * turns * max_new_tokens,
            "prompt_tokens": sum(len(r["prompt"]) for turn in requests for r in turn)}
