"""Speculative greedy decoding against plain ring decoding on the shipped checkpoint (issue 39).

    python -m swkv_teach.bench.speculative          # the section alone: a table on stdout, one thread
    swkv-teach bench                                # the whole suite, this section included

For each workload (a prompt of code; a passage quoted once and begun again, which prompt lookup
can copy), in one process: tokens/s of plain greedy ``generate`` on the ring, and of speculative
greedy decoding with prompt lookup and with the checkpoint's first layers as the draft (early exit),
at ``k`` = 2, 4, 8. The runs take turns repeat by repeat (a warm-up round first, not counted), so
load from elsewhere falls on all of them; ``speedup`` is the median over repeats of plain's time /
the speculative run's time *in the same round*. Times are this process's CPU time
(``time.process_time``, one thread): on a shared machine a busy neighbour stretches wall time by
several times, and unevenly between runs.

Beside each measured speed-up, the one Leviathan et al. 2023 (§3.3, Theorem 3.8) predict::

    expected = (1 - α^(k+1)) / ((1 - α) (c k + 1))        α: acceptance rate, c: draft cost

whose ``+ 1`` is the verify, counted as one target step; ``expected_with_verify`` puts the measured
``verify_cost`` (a verify of ``k + 1`` tokens / one plain step, medians) there instead, which on a
CPU is more than 1. ``c`` is measured: the early-exit draft's one-token step (on its own ring with
``k`` lookahead slots, as it drafts) / the target's plain step; prompt lookup's search of the context
/ (``k`` target steps), so that ``c k`` is its drafting cost per round. The formulas leave out the
rest of a round (accepting, rolling back, Python), which the measured figure pays.

``α`` = accepted / examined drafts (every accepted draft and the one rejection that ends a round), with
two 95 % intervals: Wilson's over the examined drafts (``alpha_interval``), which treats each as an
independent trial, and a percentile bootstrap over rounds (``alpha_interval_rounds``, rounds resampled
with replacement, 2,000 times, seed 0), which keeps a round's drafts together, as they are not
independent (a copied run of text accepts all of them). Both are intervals for this prompt's α, not
for another text's. Every speculative run, timed or not, is checked to emit plain decoding's tokens.

Section (:func:`section`, ``--json``'s ``speculative``): ``config`` and ``rows``, one per (workload,
drafter, k) after each workload's plain row: ``workload``, ``drafter``, ``k`` (0: plain),
``tokens_per_s`` {median, min, max, samples}, ``speedup``, ``alpha``, ``alpha_interval``,
``alpha_interval_rounds``, ``accepted``, ``examined``, ``drafted``, ``rounds``, ``tokens_per_round``,
``c``, ``verify_cost``, ``expected``, ``expected_with_verify``, ``same_tokens`` (the figures a plain
row has no use for are None). Targets (:mod:`swkv_teach.bench.goals`): the best prompt-lookup
speed-up on the repetitive workload >= 1.3 (judged in a full run), and every run's tokens plain
decoding's (judged in any run).
"""

from __future__ import annotations

import math
import random
import statistics
import time

import torch

from swkv_teach.bench.goals import REPETITIVE, judge
from swkv_teach.bench.measure import Summary
from swkv_teach.caches import RingBufferKVCache
from swkv_teach.model import LayerCaches
from swkv_teach.pretrained import load_pretrained
from swkv_teach.speculative import Drafter, PromptLookup, early_exit, speculative_generate

__all__ = ["FULL", "QUICK", "WORKLOADS", "bootstrap_rounds", "expected_speedup", "section", "speculative_rows",
           "table", "target_values", "wilson"]

_PASSAGE = (
    "def _slot_positions(self, seen):\n"
    "    S, P = self.num_sinks, self._period\n"
    "    slot = self._slot_index[: min(seen, self.capacity)]\n"
    "    p = slot + P * torch.div((seen - 1) - slot, P, rounding_mode=\"floor\")\n"
    "    return torch.where(slot < S, slot, p) if S else p\n"
)
WORKLOADS = {
    "code": "class Counter(dict):\n    def __init__(self, iterable=None, /, **kwds):\n        super().__init__()\n",
    REPETITIVE: _PASSAGE + "\n# the same function, quoted again:\n" + _PASSAGE[:60],
}
FULL = dict(ks=(2, 4, 8), new_tokens=200, repeats=5)
QUICK = dict(ks=(2,), new_tokens=16, repeats=1)
PLAIN = "none (plain ring)"
LOOKUP = "prompt lookup"


# --------------------------------------------------------------------------- the formula and the intervals
def expected_speedup(alpha: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Leviathan et al. 2023, Theorem 3.8: ``(1 - α^(k+1)) / ((1 - α)(c k + 1))`` (``α = 1``: ``(k + 1)/(c k + 1)``).

    ``verify_cost``: what one verify of ``k + 1`` tokens costs in target steps, 1 in the theorem; the
    measured one gives ``(1 - α^(k+1)) / ((1 - α)(c k + verify_cost))``.
    """
    tokens_per_round = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens_per_round / (c * k + verify_cost)


def wilson(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float] | None:
    """Wilson's score interval for a proportion (95 % with the default ``z``); None for no trials.

    ``(p + z²/2n ± z √(p(1 - p)/n + z²/4n²)) / (1 + z²/n)``, ``p = successes / trials``: unlike
    ``p ± z √(p(1 - p)/n)`` it stays inside [0, 1] and is not empty at ``p = 0`` or 1.
    """
    if trials == 0:
        return None
    n, p = trials, successes / trials
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def bootstrap_rounds(rounds: list[tuple[int, int]], level: float = 0.95, n_boot: int = 2000,
                     seed: int = 0) -> tuple[float, float] | None:
    """Percentile interval of ``Σ accepted / Σ examined`` over ``rounds`` ``[(accepted, examined), ...]`` resampled
    with replacement: a round's drafts stay together. None without a round that examined a draft."""
    rounds = [r for r in rounds if r[1]]
    if not rounds:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(n_boot):
        sample = rng.choices(rounds, k=len(rounds))
        ratios.append(sum(a for a, _ in sample) / sum(e for _, e in sample))
    ratios.sort()
    tail = (1 - level) / 2
    return ratios[int(tail * (n_boot - 1))], ratios[int(math.ceil((1 - tail) * (n_boot - 1)))]


class _Counted(Drafter):
    """A drafter that records each round's ``(accepted, examined)`` for the intervals (untimed runs only)."""

    def __init__(self, inner: Drafter):
        self.inner, self.k, self.rounds, self._m = inner, inner.k, [], 0

    def begin(self, target, prompt):
        self.rounds = []
        self.inner.begin(target, prompt)

    def propose(self, tokens, m, *args):
        drafts, q = self.inner.propose(tokens, m, *args)
        self._m = len(drafts)
        return drafts, q

    def accepted(self, a):
        self.inner.accepted(a)
        self.rounds.append((a, a + (a < self._m)))


# --------------------------------------------------------------------------- what one step, one verify, one search cost
def _median_s(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return statistics.median(times)


def _rings(model, lookahead: int) -> LayerCaches:
    W = model.config.window_size
    return LayerCaches([RingBufferKVCache(W, lookahead=lookahead) for _ in model.layers], W)


@torch.no_grad()
def _step_s(model, prompt: torch.Tensor, lookahead: int = 0, steps: int = 64) -> float:
    """Median seconds of one one-token step of ``model`` past the window, on rings with ``lookahead`` slots."""
    caches = _rings(model, lookahead)
    model.step(prompt, caches)
    ids = torch.tensor([[1]])
    return _median_s(lambda: model.step(ids, caches), steps)


@torch.no_grad()
def _verify_s(model, prompt: torch.Tensor, k: int, steps: int = 32) -> float:
    """Median seconds of one verify of ``k + 1`` tokens on rings with ``k`` lookahead slots (all of it rolled back)."""
    caches = _rings(model, k)
    model.step(prompt, caches)
    ids = torch.ones(1, k + 1, dtype=torch.long)

    def verify():
        model.step(ids, caches)
        for cache in caches:
            cache.rollback(k)

    return _median_s(verify, steps)


# --------------------------------------------------------------------------- the rows
def speculative_rows(ks=FULL["ks"], new_tokens: int = FULL["new_tokens"], repeats: int = FULL["repeats"],
                     exit_layers: int = 1, threads: int | None = 1) -> list[dict]:
    """One row per (workload, drafter, k), after each workload's plain row; see the module docstring."""
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        model, tok = load_pretrained()
        rows = []
        for workload, text in WORKLOADS.items():
            rows += _workload_rows(model, workload, torch.tensor([tok.encode(text)]), ks, new_tokens, repeats,
                                   exit_layers)
        return rows
    finally:
        torch.set_num_threads(old_threads)


def _workload_rows(model, workload: str, prompt: torch.Tensor, ks, new_tokens: int, repeats: int,
                   exit_layers: int) -> list[dict]:
    plain = model.generate(prompt, new_tokens)
    step_s = _step_s(model, prompt)
    exit_name = f"early exit ({exit_layers} of {model.config.n_layers} layers)"
    drafters = {(LOOKUP, k): PromptLookup(k) for k in ks}
    drafters |= {(exit_name, k): early_exit(model, exit_layers, k) for k in ks}
    # drafting cost in target steps: prompt lookup's one search per round spread over k, the draft model's step
    context = plain[0, : prompt.shape[1] + new_tokens // 2].tolist()  # the context halfway through
    cost = {(LOOKUP, k): _median_s(lambda k=k: PromptLookup(k).propose(context, k), 64) / (k * step_s) for k in ks}
    cost |= {(exit_name, k): _step_s(drafters[exit_name, k].model, prompt, lookahead=k) / step_s for k in ks}
    verify_cost = {k: _verify_s(model, prompt, k) / step_s for k in ks}

    counts, same = {}, {}
    for key, drafter in drafters.items():  # untimed: the counts, the intervals, the tokens
        counted = _Counted(drafter)
        out, stats = speculative_generate(model, prompt, new_tokens, counted)
        counts[key] = (stats, counted.rounds)
        same[key] = bool(torch.equal(out, plain))

    runs = {None: lambda: model.generate(prompt, new_tokens)}
    runs |= {key: (lambda d=d: speculative_generate(model, prompt, new_tokens, d)[0]) for key, d in drafters.items()}
    times = {key: [] for key in runs}
    for r in range(repeats + 1):  # round 0 warms up and is not counted
        for key, run in runs.items():
            t = time.process_time()
            out = run()
            elapsed = time.process_time() - t
            if r:
                times[key].append(elapsed)
            if key is not None:
                same[key] = same[key] and bool(torch.equal(out, plain))

    rows = [{"workload": workload, "drafter": PLAIN, "k": 0, **_none(),
             "tokens_per_s": Summary.of(new_tokens / t for t in times[None]).as_dict(), "speedup": 1.0,
             "rounds": new_tokens - 1, "tokens_per_round": new_tokens / (new_tokens - 1), "same_tokens": True}]
    for (name, k), _ in drafters.items():
        stats, rounds = counts[name, k]
        alpha = stats.acceptance_rate
        c = cost[name, k]
        rows.append({
            "workload": workload, "drafter": name, "k": k,
            "tokens_per_s": Summary.of(new_tokens / t for t in times[name, k]).as_dict(),
            "speedup": statistics.median(p / s for p, s in zip(times[None], times[name, k])),
            "alpha": alpha, "alpha_interval": wilson(stats.accepted, stats.examined),
            "alpha_interval_rounds": bootstrap_rounds(rounds), "accepted": stats.accepted,
            "examined": stats.examined, "drafted": stats.drafted, "rounds": stats.rounds,
            "tokens_per_round": new_tokens / stats.rounds if stats.rounds else None, "c": c,
            "verify_cost": verify_cost[k],
            "expected": None if math.isnan(alpha) else expected_speedup(alpha, k, c),
            "expected_with_verify": None if math.isnan(alpha) else expected_speedup(alpha, k, c, verify_cost[k]),
            "same_tokens": same[name, k]})
    return rows


def _none() -> dict:
    return dict.fromkeys(("alpha", "alpha_interval", "alpha_interval_rounds", "accepted", "examined", "drafted", "c",
                          "verify_cost", "expected", "expected_with_verify"))


def section(quick: bool = False, threads: int | None = 1) -> dict:
    """The bench's ``speculative`` section: ``config`` and ``rows`` (:func:`speculative_rows`)."""
    config = dict(QUICK if quick else FULL)
    rows = speculative_rows(**config, threads=threads)
    return {"config": {**config, "ks": list(config["ks"]), "exit_layers": 1, "threads": threads,
                       "checkpoint": "window", "timer": "process_time", "workloads": list(WORKLOADS)},
            "rows": rows}


def target_values(rows: list[dict]) -> dict:
    """The values of this section's targets (:mod:`swkv_teach.bench.goals`); None where no row measured them."""
    lookup = [r["speedup"] for r in rows if r["workload"] == REPETITIVE and r["drafter"] == LOOKUP]
    drafted = [r for r in rows if r["k"]]
    return {"speculative_lookup_repetitive": max(lookup) if lookup else None,
            "speculative_same_tokens": float(all(r["same_tokens"] for r in drafted)) if drafted else None}


# --------------------------------------------------------------------------- the table
def table(result: dict, judged: bool = True) -> str:
    """The section as plain text, its targets judged as the report judges them (``judged=False``: a --quick run)."""
    cfg = result["config"]
    lines = [f"speculative greedy decoding vs plain ring, shipped checkpoint, {cfg['new_tokens']} new tokens, "
             f"median of {cfg['repeats']} paired repeats, CPU time, threads {cfg['threads']}",
             "α = accepted / examined drafts [Wilson 95 %] [bootstrap over rounds 95 %]; ×plain = plain time / "
             "speculative time, same round; formula = Leviathan et al. Thm 3.8 (verify = 1 step),",
             "with verify = the same with the measured verify cost; c = drafting cost per draft in target steps",
             f"{'workload':<15}{'drafter':<29}{'k':>2}{'tok/cpu-s':>10}{'×plain':>7}{'α':>6}  {'Wilson':<11}  "
             f"{'rounds':<11}{'formula':>8}{'w/ verify':>10}{'c':>6}{'verify':>7}{'tok/round':>10}  same"]
    f = lambda x, spec: "--" if x is None else format(x, spec)  # noqa: E731
    span = lambda iv: "--" if iv is None else f"{iv[0]:.2f}–{iv[1]:.2f}"  # noqa: E731
    for r in result["rows"]:
        lines.append(f"{r['workload']:<15}{r['drafter']:<29}{r['k']:>2}{r['tokens_per_s']['median']:>10.0f}"
                     f"{r['speedup']:>7.2f}{f(r['alpha'], '.2f'):>6}  {span(r['alpha_interval']):<11}  "
                     f"{span(r['alpha_interval_rounds']):<11}{f(r['expected'], '.2f'):>8}"
                     f"{f(r['expected_with_verify'], '.2f'):>10}{f(r['c'], '.2f'):>6}{f(r['verify_cost'], '.2f'):>7}"
                     f"{f(r['tokens_per_round'], '.2f'):>10}  {'yes' if r['same_tokens'] else 'NO'}")
    for name, value in target_values(result["rows"]).items():
        t = judge(name, value, judged)
        mark = {True: "met", False: "NOT MET", None: "reported, not judged"}[t["met"]]
        v = "not measured" if value is None else f"{value:.3f}"  # 1.298 must not read as 1.3
        lines.append(f"target {name}: {v} (target {t['target']}: {mark})  {t['what']}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(section()))
