"""Speculative greedy decoding against plain ring decoding on the shipped checkpoint (issue 39; lesson 13).

    python -m swkv_teach.bench.speculative          # the section alone: a table on stdout, one thread
    swkv-teach bench                                # the whole suite, this section included

The workloads (:func:`workloads`, lesson 13's too): ``prompts`` independent prompts of held-out Python
(the standard-library files the model never trained on, :func:`~swkv_teach.evaluate.heldout_segments`),
as they are (**fresh code**), and **quoted back** (each followed by a comment and its own first 48
characters again: a repetition prompt lookup can copy from). For each, in one process: plain greedy
``generate`` on the ring, then speculative greedy decoding with prompt lookup and with the checkpoint's
first layer as the draft (early exit), at ``k`` = 2, 4, 8, on the same prompt in turn (a warm-up pass
over the first prompt first, not counted), so load from elsewhere falls on all of them. Times are this
process's CPU time (``time.process_time``, one thread): on a shared machine a busy neighbour stretches
wall time by several times, and unevenly between runs.

A prompt is the unit: drafts inside one text are accepted in runs, not independently, and a slow second
slows every step in it. So ``alpha`` = Σ accepted / Σ examined drafts (every accepted draft and the one
rejection that ends a round) and ``speedup`` = Σ plain seconds / Σ speculative seconds, each with a 95 %
interval from resampling whole prompts (:func:`~swkv_teach.evaluate.ratio_interval`, the lesson's).

Beside each measured speed-up, the one Leviathan et al. 2023 (§3.3, Theorem 3.8) predict::

    expected = (1 - α^(k+1)) / ((1 - α) (c k + 1))        α: acceptance rate, c: draft cost

whose ``+ 1`` is the verify, counted as one target step; ``expected_with_verify`` puts the measured
``verify_cost`` (a verify of ``k + 1`` tokens / one plain step, medians) there instead, which on a
CPU is more than 1. ``c`` is measured: the early-exit draft's one-token step (on its own ring with
``k`` lookahead slots, as it drafts) / the target's plain step; prompt lookup's search of the context
/ (``k`` target steps), so that ``c k`` is its drafting cost per round. The formulas leave out the
rest of a round (accepting, rolling back, Python), which the measured figure pays.

Section (:func:`section`, ``--json``'s ``speculative``): ``config`` and ``rows``, one per (workload,
drafter, k) after each workload's plain row: ``workload``, ``drafter``, ``k`` (0: plain),
``tokens_per_s`` {median, min, max, samples: one per prompt}, ``speedup``, ``speedup_interval``,
``alpha``, ``alpha_interval``, ``accepted``, ``examined``, ``drafted``, ``rounds``, ``tokens_per_round``,
``c``, ``verify_cost``, ``expected``, ``expected_with_verify``, ``same_tokens`` (the figures a plain row
has no use for are None). Targets (:mod:`swkv_teach.bench.goals`): the best prompt-lookup speed-up on the
quoted-back workload >= 1.3 (judged in a full run), and every run's tokens plain decoding's (judged in
any run).
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from swkv_teach.bench.goals import REPETITIVE, judge
from swkv_teach.bench.measure import Summary
from swkv_teach.caches import RingBufferKVCache
from swkv_teach.evaluate import heldout_segments, ratio_interval
from swkv_teach.model import LayerCaches
from swkv_teach.pretrained import load_pretrained
from swkv_teach.speculative import PromptLookup, early_exit, speculative_generate

__all__ = ["FRESH", "FULL", "QUICK", "REPETITIVE", "expected_speedup", "section", "speculative_rows", "table",
           "target_values", "workloads"]

FRESH = "fresh code"
QUOTE = "\n# the same lines, quoted again:\n"
FULL = dict(ks=(2, 4, 8), new_tokens=96, prompts=8)
QUICK = dict(ks=(2,), new_tokens=16, prompts=2)
PLAIN = "none (plain ring)"
LOOKUP = "prompt lookup"


def workloads(tokenizer, prompts: int = FULL["prompts"], length: int = 128, quote: int = 48) -> dict:
    """``{"fresh code": [ids, ...], "quoted back": [ids, ...]}``: ``prompts`` prompts of ``length`` tokens each.

    Fresh: consecutive pieces of the held-out text (never trained on, no two sharing a character).
    Quoted back: each piece, then :data:`QUOTE` and its own first ``quote`` tokens again.
    """
    fresh = [s[:length].tolist() for s in heldout_segments(tokenizer, length=length, max_segments=prompts)]
    return {FRESH: fresh, REPETITIVE: [p + tokenizer.encode(QUOTE) + p[:quote] for p in fresh]}


# --------------------------------------------------------------------------- the formula
def expected_speedup(alpha: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Leviathan et al. 2023, Theorem 3.8: ``(1 - α^(k+1)) / ((1 - α)(c k + 1))`` (``α = 1``: ``(k + 1)/(c k + 1)``).

    ``verify_cost``: what one verify of ``k + 1`` tokens costs in target steps, 1 in the theorem; the
    measured one gives ``(1 - α^(k+1)) / ((1 - α)(c k + verify_cost))``.
    """
    tokens_per_round = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens_per_round / (c * k + verify_cost)


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
def speculative_rows(ks=FULL["ks"], new_tokens: int = FULL["new_tokens"], prompts: int = FULL["prompts"],
                     exit_layers: int = 1, threads: int | None = 1, model=None, tokenizer=None) -> list[dict]:
    """One row per (workload, drafter, k), after each workload's plain row; see the module docstring.

    ``model``, ``tokenizer``: the shipped window checkpoint's (``load_pretrained()``) when not given.
    """
    if prompts < 2:
        raise ValueError(f"prompts must be >= 2 (the intervals resample whole prompts); got {prompts!r}")
    if model is None or tokenizer is None:
        model, tokenizer = load_pretrained()
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        rows = []
        for workload, ids in workloads(tokenizer, prompts).items():
            rows += _workload_rows(model, workload, [torch.tensor([p]) for p in ids], ks, new_tokens, exit_layers)
        return rows
    finally:
        torch.set_num_threads(old_threads)


@torch.no_grad()
def _workload_rows(model, workload: str, prompts: list[torch.Tensor], ks, new_tokens: int,
                   exit_layers: int) -> list[dict]:
    first = prompts[0]
    step_s = _step_s(model, first)
    layers = model.config.n_layers
    exit_name = f"early exit ({exit_layers} of {layers} layer{'s' if layers > 1 else ''})"
    drafters = {(LOOKUP, k): PromptLookup(k) for k in ks}
    drafters |= {(exit_name, k): early_exit(model, exit_layers, k) for k in ks}
    # drafting cost in target steps: prompt lookup's one search per round spread over k, the draft model's step
    context = model.generate(first, new_tokens)[0, : first.shape[1] + new_tokens // 2].tolist()  # halfway through
    cost = {(LOOKUP, k): _median_s(lambda k=k: PromptLookup(k).propose(context, k), 64) / (k * step_s) for k in ks}
    cost |= {(exit_name, k): _step_s(drafters[exit_name, k].model, first, lookahead=k) / step_s for k in ks}
    verify_cost = {k: _verify_s(model, first, k) / step_s for k in ks}

    runs = {None: lambda ids: (model.generate(ids, new_tokens), None)}
    runs |= {key: (lambda ids, d=d: speculative_generate(model, ids, new_tokens, d)) for key, d in drafters.items()}
    for run in runs.values():  # warm-up, not counted
        run(first)
    times = {key: [] for key in runs}
    counts = {key: [] for key in drafters}
    same = dict.fromkeys(drafters, True)
    for ids in prompts:  # plain first (dict order), then every drafter on the same prompt: paired times
        for key, run in runs.items():
            t = time.process_time()
            out, stats = run(ids)
            times[key].append(time.process_time() - t)
            if key is None:
                plain = out
            else:
                counts[key].append(stats)
                same[key] = same[key] and bool(torch.equal(out, plain))

    rows = [{"workload": workload, "drafter": PLAIN, "k": 0, **_none(),
             "tokens_per_s": Summary.of(new_tokens / t for t in times[None]).as_dict(), "speedup": 1.0,
             "rounds": len(prompts) * (new_tokens - 1), "tokens_per_round": new_tokens / (new_tokens - 1),
             "same_tokens": True}]
    for (name, k), per_prompt in counts.items():
        accepted, examined = [st.accepted for st in per_prompt], [st.examined for st in per_prompt]
        rounds = sum(st.rounds for st in per_prompt)
        alpha = sum(accepted) / sum(examined) if sum(examined) else float("nan")
        # prompts whose drafter proposed nothing examined nothing: they say nothing of α
        ruled = [(a, e) for a, e in zip(accepted, examined) if e]
        alpha_iv = ratio_interval(*zip(*ruled)) if len(ruled) > 1 else None
        speed = ratio_interval(times[None], times[name, k])
        c = cost[name, k]
        rows.append({
            "workload": workload, "drafter": name, "k": k,
            "tokens_per_s": Summary.of(new_tokens / t for t in times[name, k]).as_dict(),
            "speedup": speed.mean, "speedup_interval": (speed.low, speed.high),
            "alpha": alpha, "alpha_interval": None if alpha_iv is None else (alpha_iv.low, alpha_iv.high),
            "accepted": sum(accepted), "examined": sum(examined), "drafted": sum(st.drafted for st in per_prompt),
            "rounds": rounds, "tokens_per_round": len(prompts) * new_tokens / rounds if rounds else None, "c": c,
            "verify_cost": verify_cost[k],
            "expected": None if math.isnan(alpha) else expected_speedup(alpha, k, c),
            "expected_with_verify": None if math.isnan(alpha) else expected_speedup(alpha, k, c, verify_cost[k]),
            "same_tokens": same[name, k]})
    return rows


def _none() -> dict:
    return dict.fromkeys(("speedup_interval", "alpha", "alpha_interval", "accepted", "examined", "drafted", "c",
                          "verify_cost", "expected", "expected_with_verify"))


def section(quick: bool = False, threads: int | None = 1) -> dict:
    """The bench's ``speculative`` section: ``config`` and ``rows`` (:func:`speculative_rows`)."""
    config = dict(QUICK if quick else FULL)
    rows = speculative_rows(**config, threads=threads)
    return {"config": {**config, "ks": list(config["ks"]), "exit_layers": 1, "threads": threads,
                       "checkpoint": "window", "timer": "process_time", "workloads": [FRESH, REPETITIVE]},
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
    lines = [f"speculative greedy decoding vs plain ring, shipped checkpoint, {cfg.get('prompts', '?')} prompts x "
             f"{cfg['new_tokens']} new tokens, CPU time, threads {cfg['threads']}",
             "α = accepted / examined drafts; ×plain = plain time / speculative time; [95 %]: prompts resampled; "
             "formula = Leviathan et al. Thm 3.8 (verify = 1 step),",
             "w/ verify = the same with the measured verify cost; c = drafting cost per draft in target steps",
             f"{'workload':<12}{'drafter':<28}{'k':>2}{'tok/cpu-s':>10}{'×plain':>7}  {'[95 %]':<11}{'α':>5}  "
             f"{'[95 %]':<11}{'formula':>8}{'w/ verify':>10}{'c':>6}{'verify':>7}{'tok/round':>10}  same"]
    f = lambda x, spec: "--" if x is None else format(x, spec)  # noqa: E731
    span = lambda iv: "--" if iv is None else f"{iv[0]:.2f}–{iv[1]:.2f}"  # noqa: E731
    for r in result["rows"]:
        lines.append(f"{r['workload']:<12}{r['drafter']:<28}{r['k']:>2}{r['tokens_per_s']['median']:>10.0f}"
                     f"{r['speedup']:>7.2f}  {span(r['speedup_interval']):<11}{f(r['alpha'], '.2f'):>5}  "
                     f"{span(r['alpha_interval']):<11}{f(r['expected'], '.2f'):>8}"
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
