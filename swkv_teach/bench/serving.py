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
"""

from __future__ import annotations

import time

import torch

from swkv_teach.bench.measure import Summary

__all__ = ["default_requests", "serving_throughput"]

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
    repeats: int = 3, threads: int | None = 1, count: int = 16,
) -> dict:
    """Tokens/s of the same queue served one by one and with continuous batching at each concurrency.

    Args:
        decoder: default ``load_pretrained()[0]``; requests: default :func:`default_requests` (``count`` of them).
        concurrency: the ``max_running`` values to try.
        num_blocks: the pool (default: room for every request at once, so only ``max_running`` limits).
        repeats: runs per figure (median reported, with min and max).
        threads: torch's intra-op threads during the run (restored after; None leaves them).
    Returns:
        ``{"one_by_one": {tokens_per_s, new_tokens}, "rows": [{concurrency, tokens_per_s, ratio_to_one_by_one,
        steps, same_as_solo, peak_used_blocks}], "trace": [...], "config": {...}}`` (tokens_per_s as
        {median, min, max, samples}).
    """
    from swkv_teach.pretrained import load_pretrained
    from swkv_teach.serving import Scheduler

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
    finally:
        torch.set_num_threads(previous)
    base = Summary.of(samples["one_by_one"])
    rows = []
    for c in concurrency:
        tps = Summary.of(samples[c])
        rows.append({"concurrency": c, "tokens_per_s": tps.as_dict(), "ratio_to_one_by_one": tps.median / base.median,
                     "steps": len(traces[c]), "same_as_solo": all(served[c][i] == solo[i] for i in solo),
                     "peak_used_blocks": max(t["used_blocks"] for t in traces[c])})
    return {"one_by_one": {"tokens_per_s": base.as_dict(), "new_tokens": new_tokens}, "rows": rows,
            "trace": traces[max(concurrency)],
            "config": {"requests": len(requests), "block_size": block_size, "num_blocks": blocks,
                       "repeats": repeats, "threads": threads, "window_size": decoder.config.window_size}}


def table(result: dict) -> str:
    """The measurement as plain text."""
    base = result["one_by_one"]["tokens_per_s"]["median"]
    cfg = result["config"]
    lines = [f"serving {cfg['requests']} requests ({result['one_by_one']['new_tokens']} new tokens), pool of "
             f"{cfg['num_blocks']} blocks of {cfg['block_size']}, window {cfg['window_size']}, "
             f"threads {cfg['threads']}",
             f"{'':>14}{'tokens/s':>10}  {'min–max':<17}{'×one by one':>12}{'steps':>7}{'peak blocks':>13}"
             "  same as solo",
             f"{'one by one':>14}{base:>10.0f}  {result['one_by_one']['tokens_per_s']['min']:>7.0f}–"
             f"{result['one_by_one']['tokens_per_s']['max']:<9.0f}{1:>12.2f}"]
    for r in result["rows"]:
        t = r["tokens_per_s"]
        lines.append(f"{'batch ≤ %d' % r['concurrency']:>14}{t['median']:>10.0f}  {t['min']:>7.0f}–{t['max']:<9.0f}"
                     f"{r['ratio_to_one_by_one']:>12.2f}{r['steps']:>7}{r['peak_used_blocks']:>13}  "
                     f"{'yes' if r['same_as_solo'] else 'NO'}")
    return "\n".join(lines)
