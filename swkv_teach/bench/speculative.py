"""Speculative greedy decoding against plain ring decoding on the shipped checkpoint (issue 39).

    python -m swkv_teach.bench.speculative          # a table on stdout, one thread

For each workload (a prompt of code; a passage quoted once and begun again, which prompt lookup
can copy), in one process: tokens/s of plain greedy ``generate`` on the ring, then of speculative
greedy decoding with prompt lookup and with the checkpoint's first layers as the draft (early exit),
at ``k`` = 2, 4, 8; the acceptance rate ``α`` (accepted / examined drafts), the measured speed-up
(ratio to plain, same run) and the one Leviathan et al. 2023 (§3.3, Theorem 3.8) predict for a
verify that costs one target step::

    speed-up = (1 - α^(k+1)) / ((1 - α) (c k + 1))      c = draft step time / target step time

``c`` is measured here (one-token steps, medians); prompt lookup's is taken as 0 (it runs no model).
Times are this process's CPU time (``time.process_time``, one thread), not wall time: on a shared
machine a busy neighbour stretches wall time by several times, and unevenly between runs.
On a CPU a verify of ``k + 1`` tokens costs more than one step (``verify_cost``, measured too), which
the formula does not count. Every speculative run is checked to emit plain decoding's tokens.
"""

from __future__ import annotations

import statistics
import time

import torch

from swkv_teach.pretrained import load_pretrained
from swkv_teach.speculative import PromptLookup, early_exit, speculative_generate

__all__ = ["WORKLOADS", "expected_speedup", "speculative_rows"]

_PASSAGE = (
    "def _slot_positions(self, seen):\n"
    "    S, P = self.num_sinks, self._period\n"
    "    slot = self._slot_index[: min(seen, self.capacity)]\n"
    "    p = slot + P * torch.div((seen - 1) - slot, P, rounding_mode=\"floor\")\n"
    "    return torch.where(slot < S, slot, p) if S else p\n"
)
WORKLOADS = {
    "code": "class Counter(dict):\n    def __init__(self, iterable=None, /, **kwds):\n        super().__init__()\n",
    "quoted passage": _PASSAGE + "\n# the same function, quoted again:\n" + _PASSAGE[:60],
}


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Leviathan et al. 2023, Theorem 3.8: ``(1 - α^(k+1)) / ((1 - α)(c k + 1))`` (``α = 1``: ``(k + 1)/(c k + 1)``)."""
    tokens_per_round = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens_per_round / (c * k + 1)


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return statistics.median(times)


@torch.no_grad()
def _step_s(model, prompt: torch.Tensor, steps: int = 64) -> float:
    """Median seconds of one one-token step of ``model`` on a ring past the window (what ``c`` compares)."""
    caches = model.new_caches("ring")
    model.step(prompt, caches)
    ids = torch.tensor([[1]])
    times = []
    for _ in range(steps):
        t = time.process_time()
        model.step(ids, caches)
        times.append(time.process_time() - t)
    return statistics.median(times)


@torch.no_grad()
def _verify_s(model, prompt: torch.Tensor, k: int, steps: int = 32) -> float:
    from swkv_teach.caches import RingBufferKVCache
    from swkv_teach.model import LayerCaches

    W = model.config.window_size
    caches = LayerCaches([RingBufferKVCache(W, lookahead=k) for _ in model.layers], W)
    model.step(prompt, caches)
    ids = torch.ones(1, k + 1, dtype=torch.long)
    times = []
    for _ in range(steps):
        t = time.process_time()
        model.step(ids, caches)
        times.append(time.process_time() - t)
        for cache in caches:
            cache.rollback(k)
    return statistics.median(times)


def speculative_rows(ks=(2, 4, 8), new_tokens: int = 200, repeats: int = 3, exit_layers: int = 1,
                     threads: int | None = 1) -> list[dict]:
    """One row per (workload, drafter, k), plus each workload's plain row; see the module docstring."""
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        model, tok = load_pretrained()
        rows = []
        for workload, text in WORKLOADS.items():
            prompt = torch.tensor([tok.encode(text)])
            plain = model.generate(prompt, new_tokens)
            plain_s = _median_s(lambda: model.generate(prompt, new_tokens), repeats)
            step_s = _step_s(model, prompt)
            rows.append({"workload": workload, "drafter": "none (plain ring)", "k": 0, "tokens_per_s": new_tokens / plain_s,
                         "speedup": 1.0, "alpha": None, "expected": None, "c": None, "verify_cost": 1.0,
                         "same_tokens": True, "rounds": new_tokens - 1})
            draft_step_s = _step_s(early_exit(model, exit_layers, 1).model, prompt)
            for k in ks:
                verify_cost = _verify_s(model, prompt, k) / step_s
                for name, make, c in (("prompt lookup", lambda: PromptLookup(k), 0.0),
                                      (f"early exit ({exit_layers} of {model.config.n_layers} layers)",
                                       lambda: early_exit(model, exit_layers, k), draft_step_s / step_s)):
                    out, stats = speculative_generate(model, prompt, new_tokens, make())
                    spec_s = _median_s(lambda: speculative_generate(model, prompt, new_tokens, make()), repeats)
                    alpha = stats.acceptance_rate
                    rows.append({"workload": workload, "drafter": name, "k": k, "tokens_per_s": new_tokens / spec_s,
                                 "speedup": plain_s / spec_s, "alpha": alpha, "expected": expected_speedup(alpha, k, c),
                                 "c": c, "verify_cost": verify_cost, "same_tokens": bool(torch.equal(out, plain)),
                                 "rounds": stats.rounds})
        return rows
    finally:
        torch.set_num_threads(old_threads)


def format_rows(rows: list[dict]) -> str:
    head = f"{'workload':15s} {'drafter':30s} {'k':>2s} {'tok/cpu-s':>9s} {'×plain':>7s} {'α':>5s} {'formula':>7s} " \
           f"{'c':>5s} {'verify':>6s} {'rounds':>6s} same"
    lines = [head]
    for r in rows:
        f = lambda x, spec: "--" if x is None else format(x, spec)  # noqa: E731
        lines.append(f"{r['workload']:15s} {r['drafter']:30s} {r['k']:>2d} {r['tokens_per_s']:9.0f} {r['speedup']:7.2f} "
                     f"{f(r['alpha'], '5.2f'):>5s} {f(r['expected'], '7.2f'):>7s} {f(r['c'], '5.2f'):>5s} "
                     f"{r['verify_cost']:6.2f} {r['rounds']:6d} {r['same_tokens']}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_rows(speculative_rows()))
