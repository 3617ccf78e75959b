"""Serving throughput: continuous batching against the number of concurrent requests, beside one by one.

:func:`serving_throughput` serves one fixed queue of requests (different prompt lengths,
different numbers of new tokens) on the shipped decoder:

* **one by one**: ``Decoder.generate`` on each request in turn (ring cache, batch 1);
* **continuous batching** with at most ``c`` requests per decode forward, for each ``c`` in
  ``concurrency`` (:class:`~swkv_teach.serving.Scheduler`, one shared block pool).

Each figure is new tokens / wall seconds for the whole queue, prefills included; the
median of ``repeats`` runs taken in turn. ``same_as_solo`` says whether every request's
tokens equal its one-by-one generation. The run at the largest ``c`` also gives its
``trace``: per scheduler step, blocks in use, requests running and waiting (the pool
occupancy figure of lesson 7).

Two rows of issue 28 (vLLM v1's scheduling and prefix caching), in the same result:

* ``budget``: the same queue at concurrency 16 with one token budget per step (prefill chunks
  and decode rows in one forward, :class:`~swkv_teach.serving.Scheduler` ``token_budget``)
  against the reserved scheduler, repeats interleaved, medians; target >= 0.95x.
* ``chat``: the chat workload of :mod:`swkv_teach.serving.workload` (8 conversations sharing a
  ~200-character system prompt, 3 turns, each turn the previous prompt + its reply + a new line,
  served turn by turn) with prefix caching and without, in both modes: prompt tokens computed,
  their ratio (target <= 0.40), tokens/s, and whether every output is the same.
"""

from __future__ import annotations

import statistics
import time

import torch

from swkv_teach.bench.measure import Summary

__all__ = ["budget_throughput", "chat_prefix_caching", "default_requests", "serving_throughput"]

TOKEN_BUDGET = 256  # tokens per step in the budget rows: a few prompts' worth on the shipped model

SNIPPETS = [
    'def f(x):\n    return',
    'import os\nimport sys\n',
    'class Stack:\n    def __init__(self):\n        self.items = []\n',
    'for i in range(10):\n    if i % 2:\n',
    'while True:\n    line = input()\n',
    '# read the file\nwith open(path) as f:\n',
    'try:\n    value = int(text)\nexcept ValueError:\n',
    'x = [n * n for n in range(',
    "if __name__ == '__main__':\n",
    'def parse(args):\n    """Parse the command line."""\n',
    'return {key: value for key, value in',
    '    def __repr__(self):\n        return f"',
    'print(',
    'assert len(items) ==',
    '@property\ndef name(self):\n',
    'lambda a, b:',
]


def default_requests(tokenizer, count: int = 16, seed: int = 0) -> list[dict]:
    """``count`` requests from code snippets: prompts of 5 to ~130 characters, 16 to 96 new tokens (seeded)."""
    g = torch.Generator().manual_seed(seed)
    requests = []
    for i in range(count):
        text = SNIPPETS[i % len(SNIPPETS)] * (1 + int(torch.randint(0, 3, (1,), generator=g)))
        new = int(torch.randint(16, 97, (1,), generator=g))
        requests.append({"prompt": tokenizer.encode(text), "max_new_tokens": new})
    return requests


def serving_throughput(
    decoder=None, requests=None, concurrency=(1, 2, 4, 8, 16), block_size: int = 16, num_blocks: int | None = None,
    repeats: int = 3, threads: int | None = 1, count: int = 16, v1: bool = True,
) -> dict:
    """Tokens/s of the same queue served one by one and with continuous batching at each concurrency.

    Args:
        decoder: default ``load_pretrained()[0]``; requests: default :func:`default_requests` (``count`` of them).
        concurrency: the ``max_running`` values to try.
        num_blocks: the pool (default: room for every request at once, so only ``max_running`` limits).
        repeats: runs per figure (median reported, with min and max).
        threads: torch's intra-op threads during the run (restored after; None leaves them).
        v1: also measure :func:`budget_throughput` (at the largest concurrency) and :func:`chat_prefix_caching`.
    Returns:
        ``{"one_by_one": {tokens_per_s, new_tokens}, "rows": [{concurrency, tokens_per_s, ratio_to_one_by_one,
        steps, same_as_solo, peak_used_blocks}], "trace": [...], "config": {...}}`` (tokens_per_s as
        {median, min, max, samples}), with ``budget`` and ``chat`` when ``v1``.
    """
    from swkv_teach.pretrained import load_pretrained
    from swkv_teach.serving import Scheduler

    shipped = decoder is None  # the chat rows need the shipped tokenizer, so the shipped decoder
    if decoder is None or requests is None:
        loaded, tokenizer = load_pretrained()
        decoder = loaded if decoder is None else decoder
        requests = default_requests(tokenizer, count) if requests is None else requests
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        new_tokens = sum(r["max_new_tokens"] for r in requests)
        sizing = Scheduler(decoder, 1, block_size)
        blocks = num_blocks or sum(sizing.blocks_needed(len(r["prompt"]), r["max_new_tokens"]) for r in requests)
        samples = {"one_by_one": [], **{c: [] for c in concurrency}}
        solo, served, traces = {}, {}, {}
        for _ in range(repeats):
            start = time.perf_counter()
            for i, r in enumerate(requests):
                solo[i] = decoder.generate(torch.tensor([r["prompt"]]), r["max_new_tokens"])[0].tolist()
            samples["one_by_one"].append(new_tokens / (time.perf_counter() - start))
            for c in concurrency:
                scheduler = Scheduler(decoder, blocks, block_size, max_running=c)
                for r in requests:
                    scheduler.submit(**r)
                start = time.perf_counter()
                served[c] = scheduler.run()
                samples[c].append(new_tokens / (time.perf_counter() - start))
                traces[c] = scheduler.trace
        extra = {}
        if v1:
            extra["budget"] = budget_throughput(decoder, requests, max(concurrency), block_size=block_size,
                                                num_blocks=blocks, repeats=max(2 * repeats + 1, 3), threads=None)
            if shipped:
                extra["chat"] = chat_prefix_caching(decoder, tokenizer, block_size=block_size, threads=None)
    finally:
        torch.set_num_threads(previous)
    base = Summary.of(samples["one_by_one"])
    rows = []
    for c in concurrency:
        tps = Summary.of(samples[c])
        rows.append({"concurrency": c, "tokens_per_s": tps.as_dict(), "ratio_to_one_by_one": tps.median / base.median,
                     "steps": len(traces[c]), "same_as_solo": all(served[c][i] == solo[i] for i in solo),
                     "peak_used_blocks": max(t["used_blocks"] for t in traces[c])})
    return {"one_by_one": {"tokens_per_s": base.as_dict(), "new_tokens": new_tokens}, "rows": rows, **extra,
            "trace": traces[max(concurrency)],
            "config": {"requests": len(requests), "block_size": block_size, "num_blocks": blocks,
                       "repeats": repeats, "threads": threads, "window_size": decoder.config.window_size}}


def budget_throughput(decoder, requests, concurrency: int = 16, token_budget: int = TOKEN_BUDGET,
                      block_size: int = 16, num_blocks: int | None = None, repeats: int = 5,
                      threads: int | None = 1) -> dict:
    """Tokens/s of one queue with a token budget (mixed batches) against the reserved scheduler, interleaved.

    Each repeat runs the reserved scheduler, then the budget one, on fresh schedulers; tokens/s are
    medians over repeats; ``ratio`` is the median over repeats of budget / reserved (target >= 0.95),
    ``ratio_of_medians`` the other way of putting it. ``same_tokens``: every request's output is the
    same in both.
    """
    from swkv_teach.serving import Scheduler

    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        new_tokens = sum(r["max_new_tokens"] for r in requests)
        sizing = Scheduler(decoder, 1, block_size, token_budget=token_budget)
        need = [sizing.blocks_needed(len(r["prompt"]), r["max_new_tokens"]) for r in requests]
        blocks = max(num_blocks or sum(need), max(need))
        samples, outputs, steps = {"reserved": [], "budget": []}, {}, {}
        for _ in range(repeats):
            for name, budget in (("reserved", None), ("budget", token_budget)):
                s = Scheduler(decoder, blocks, block_size, max_running=concurrency, token_budget=budget)
                for r in requests:
                    s.submit(**r)
                start = time.perf_counter()
                outputs[name] = s.run()
                samples[name].append(new_tokens / (time.perf_counter() - start))
                steps[name] = len(s.trace)
    finally:
        torch.set_num_threads(previous)
    reserved, budget = Summary.of(samples["reserved"]), Summary.of(samples["budget"])
    # each repeat's two runs are taken back to back, so their ratio sees the same load; the median of those
    # ratios is steadier on a shared machine than the ratio of the two medians (both are reported)
    paired = sorted(b / r for b, r in zip(samples["budget"], samples["reserved"]))
    ratio = statistics.median(paired)
    return {"concurrency": concurrency, "token_budget": token_budget, "reserved": reserved.as_dict(),
            "budget": budget.as_dict(), "ratio": ratio, "ratio_of_medians": budget.median / reserved.median,
            "steps": steps, "same_tokens": outputs["reserved"] == outputs["budget"], "target": ">= 0.95",
            "met": ratio >= 0.95}


def chat_prefix_caching(decoder=None, tokenizer=None, conversations: int = 8, turns: int = 3,
                        max_new_tokens: int = 24, block_size: int = 16, num_blocks: int = 256,
                        token_budget: int = TOKEN_BUDGET, threads: int | None = 1) -> dict:
    """The chat workload with prefix caching off and on, in the reserved mode and with a token budget.

    Returns ``{"rows": [{mode, prefix_caching, prompt_tokens, prefill_tokens_computed, prefix_hit_tokens,
    tokens_per_s, seconds}], "ratio": {mode: computed with / computed without}, "same_tokens", "target",
    "met"}``; the pool (``num_blocks``) holds every turn's blocks, so nothing is evicted between turns.
    """
    from swkv_teach.pretrained import load_pretrained
    from swkv_teach.serving import Scheduler, serve_chat

    if decoder is None or tokenizer is None:
        loaded, tok = load_pretrained()
        decoder, tokenizer = decoder or loaded, tokenizer or tok
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        rows, outputs = [], []
        for mode, budget in (("reserved", None), ("budget", token_budget)):
            for caching in (False, True):
                s = Scheduler(decoder, num_blocks, block_size, max_running=16, token_budget=budget,
                              prefix_caching=caching)
                out = serve_chat(s, tokenizer, conversations, turns, max_new_tokens)
                st = s.stats()
                outputs.append(out["outputs"])
                rows.append({"mode": mode, "prefix_caching": caching, "prompt_tokens": out["prompt_tokens"],
                             "prefill_tokens_computed": st["prefill_tokens_computed"],
                             "prefix_hit_tokens": st["prefix_hit_tokens"], "seconds": out["seconds"],
                             "tokens_per_s": out["new_tokens"] / out["seconds"]})
    finally:
        torch.set_num_threads(previous)
    by = {(r["mode"], r["prefix_caching"]): r["prefill_tokens_computed"] for r in rows}
    ratio = {mode: by[(mode, True)] / by[(mode, False)] for mode in ("reserved", "budget")}
    return {"rows": rows, "ratio": ratio, "same_tokens": all(o == outputs[0] for o in outputs),
            "target": "<= 0.40", "met": max(ratio.values()) <= 0.40,
            "config": {"conversations": conversations, "turns": turns, "max_new_tokens": max_new_tokens,
                       "block_size": block_size, "num_blocks": num_blocks, "token_budget": token_budget}}


def table(result: dict, judged: bool = True) -> str:
    """The measurement as plain text; ``judged=False`` (a --quick run): the budget's speed target is reported, not
    judged (the chat's is a count, judged in any run)."""
    base = result["one_by_one"]["tokens_per_s"]["median"]
    cfg = result["config"]
    lines = [f"serving {cfg['requests']} requests ({result['one_by_one']['new_tokens']} new tokens), pool of "
             f"{cfg['num_blocks']} blocks of {cfg['block_size']}, window {cfg['window_size']}, "
             f"threads {cfg['threads']}",
             f"{'':>13}{'tokens/s':>10}  {'min–max':<17}{'×one by one':>12}{'steps':>7}{'peak blocks':>13}"
             "  same as solo",
             f"{'one by one':>13}{base:>10.0f}  {result['one_by_one']['tokens_per_s']['min']:>7.0f}–"
             f"{result['one_by_one']['tokens_per_s']['max']:<9.0f}{1:>12.2f}"]
    for r in result["rows"]:
        t = r["tokens_per_s"]
        lines.append(f"{'batch ≤ %d' % r['concurrency']:>13}{t['median']:>10.0f}  {t['min']:>7.0f}–{t['max']:<9.0f}"
                     f"{r['ratio_to_one_by_one']:>12.2f}{r['steps']:>7}{r['peak_used_blocks']:>13}  "
                     f"{'yes' if r['same_as_solo'] else 'NO'}")
    if result.get("budget"):
        b = result["budget"]
        lines.append(f"token budget {b['token_budget']} (mixed prefill + decode, one forward a step) vs reserved, "
                     f"batch <= {b['concurrency']}: {b['budget']['median']:.0f} vs {b['reserved']['median']:.0f} "
                     f"tokens/s = {b['ratio']:.2f}x (target {b['target']}: "
                     f"{('met' if b['met'] else 'MISSED') if judged else 'reported, not judged'}), "
                     f"same tokens: {'yes' if b['same_tokens'] else 'NO'}")
    if result.get("chat"):
        c = result["chat"]
        lines.append(f"chat, {c['config']['conversations']} conversations x {c['config']['turns']} turns: "
                     f"prompt tokens computed with prefix caching / without")
        for r in c["rows"]:
            lines.append(f"{r['mode']:>14}{' + prefix cache' if r['prefix_caching'] else '':<16}"
                         f"{r['prefill_tokens_computed']:>6} of {r['prompt_tokens']} computed, "
                         f"{r['tokens_per_s']:>6.0f} tokens/s")
        lines.append(f"{'':>14}ratio " + ", ".join(f"{m} {v:.2f}" for m, v in c["ratio"].items())
                     + f" (target {c['target']}: {'met' if c['met'] else 'MISSED'}), "
                     f"same tokens: {'yes' if c['same_tokens'] else 'NO'}")
    return "\n".join(lines)
