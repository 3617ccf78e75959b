"""The measurement suite: how much one decode step's cache update costs, per cache, per window.

    python -m swkv_teach.bench                 # windows 64 256 1024 4096, table on stdout
    swkv-teach bench --quick --json out.json   # a few seconds; every figure in JSON

For each window ``W``, in one process, once the window is full:

* µs per one-token update for the floor (two ``copy_`` into ready slots),
  the ring buffer, the sinks cache, the naive cat-and-slice cache, and
  transformers' dynamic and static sliding-window layers (when installed);
* the SDPA read of one query over ``W`` keys, so the update's share of a
  step shows;
* bytes each cache holds and bytes it allocates per step;
* decode tokens/s of :class:`~swkv_teach.model.Decoder` (ring and naive caches)
  against ``MistralForCausalLM`` with its own cache, same tiny random weights;
  on CUDA also a run of ``10·W`` more steps each (not with ``--quick``),
  ``torch.cuda.memory_allocated`` read after every step (flat or not);
* decode tokens/s of the Decoder with the ring, paged and int8 caches at W = 64 and 1024
  (:func:`~swkv_teach.bench.decode.cache_decode_rows`, one thread, no transformers needed);
* serving throughput: one queue of requests one by one and with continuous batching at
  1, 2, 4, 8, 16 concurrent requests (:mod:`swkv_teach.bench.serving`);
* speculative greedy decoding against plain ring decoding on the shipped checkpoint, prompt lookup
  and early exit at k = 2, 4, 8, with acceptance rates, their intervals and the expected speed-up
  (:mod:`swkv_teach.bench.speculative`).
* with ``--hf-batching`` (off by default: about a minute): the chat workload through the course's scheduler
  and through transformers' own continuous batching, prefix caching / block sharing off and on
  (:mod:`swkv_teach.bench.hf_batching`).

Medians with min–max over ``--repeats``; ratios are to the ring buffer
(updates) or to Hugging Face and to the naive cache (decode). How each figure
is taken: :mod:`swkv_teach.bench.measure`. Timings on a shared machine are
noisy: compare ratios within one run, not figures across runs (``--threads 1``
steadies a busy CPU). The speed targets were set for a full run on the default
windows: ``--quick`` or other windows report them without judging (``--``);
the targets that hold at any window (bytes, same tokens, flat memory) are
judged in every run.

``--json PATH`` (and :func:`run`) gives one dict:

* ``env``: python, torch, transformers (None if absent), device, device_name, threads, cpu_count, platform;
* ``config``: windows, batch, heads, head_dim, dtype, steps, repeats, decode_steps, decode_repeats, quick, num_sinks,
  targets_judged, memory_steps (None: the default, ``10·W`` on CUDA in a full run);
* ``updates``: a row per (window, cache) with ``us`` {median, min, max, samples} per update,
  ``ratio_to_ring``, ``share_of_step`` (update / (update + SDPA read)), ``bytes_held``,
  ``bytes_per_step``, ``bytes_formula`` (ring and sinks: ``2·B·H·slots·D·itemsize``, else None),
  ``calls_per_repeat``, ``label`` and, for caches, ``class``;
* ``attention``: a row per window, ``us`` of the SDPA read;
* ``decode``: a row per (window, impl) with ``tokens_per_s`` and ``us_per_token`` {median, min, max,
  samples}, ``ratio_to_hf``, ``ratio_to_naive``, ``same_tokens`` (greedy tokens equal Hugging Face's)
  and, on CUDA, ``memory`` {steps, tokens_per_s, allocated {first, last, min, max}, flat, same_tokens};
* ``cache_decode``: a row per (window, cache) with ``tokens_per_s``, ``ratio_to_ring``, ``same_tokens_as_ring``,
  ``warmup_s``; caches ``"compiled"`` and ``"aot"`` are the ring's step under torch.compile and compiled ahead of
  time by AOTInductor, with ``attention_us`` and ``ratio_outside_attention`` (``--quick``: its largest window only);
* ``hf_batching``: None unless asked for; else ``{"window": ..., "full": ...}``, each
  :func:`swkv_teach.bench.hf_batching.compare`'s dict;
* ``serving``: ``one_by_one``, ``rows`` per concurrency (``tokens_per_s``, ``ratio_to_one_by_one``, ``steps``,
  ``same_as_solo``, ``peak_used_blocks``), ``trace`` (per step: blocks used, running, waiting), ``config``;
* ``speculative``: ``config`` and ``rows`` per (workload, drafter, k) (``tokens_per_s``, ``speedup``, ``alpha`` and
  its intervals, ``expected``, ``expected_with_verify``, ``c``, ``verify_cost``, ``same_tokens``, ...: the fields of
  :mod:`swkv_teach.bench.speculative`);
* ``targets``: per target, ``value``, ``target``, ``met`` (None when not measured or not judged),
  ``scope`` ("default": judged only in a full run on the default windows; "any"), ``judged``, ``what``;
* ``notes``: what was skipped and why.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from swkv_teach.bench import decode as decode_mod
from swkv_teach.bench import hf_cache as hf_cache_mod
from swkv_teach.bench.measure import bytes_allocated_per_call, bytes_held, calls_per_repeat, time_us_interleaved
from swkv_teach.bench.report import environment, table, targets
from swkv_teach.bench.updates import NUM_SINKS, attention_read, subjects
from swkv_teach.device import device as default_device

__all__ = ["main", "run"]

# decode: many short repeats, taken in turn, so the ratios of whole steps (a few % apart at small W,
# where the cache update is a small part of a step) are judged on load every implementation shared
FULL = dict(windows=[64, 256, 1024, 4096], steps=20, repeats=7, repeat_s=0.05, decode_steps=16, decode_repeats=21)
QUICK = dict(windows=[8, 32], steps=5, repeats=3, repeat_s=0.002, decode_steps=4, decode_repeats=3)


def _hf_missing() -> str | None:
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed: Hugging Face rows skipped"
    return None


def _progress(total: int, enabled: bool):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is a dependency, but a bare environment should still run
        return None
    return tqdm(total=total, desc="bench", file=sys.stderr, disable=not enabled, leave=False)


def run(
    windows=None, batch: int = 1, heads: int = 8, head_dim: int = 64, dtype: str = "float32", device=None,
    steps: int | None = None, repeats: int | None = None, quick: bool = False, decode: bool = True,
    hf: bool = True, progress: bool = True, threads: int | None = None, memory_steps: int | None = None,
    hf_batching: bool = False,
) -> dict:
    """Measure everything; return the result dict that ``--json`` writes (see the module docstring).

    ``steps``: at least this many calls per timed repeat (fast calls get more, so a repeat lasts
    ~50 ms, 2 ms with ``quick``); decode times 21 repeats of 16 tokens (3 of 4 with ``quick``; ``steps``
    and ``repeats`` when given).
    ``threads``: torch's intra-op threads for the run (restored after); on a busy machine 1 is steadier.
    ``memory_steps``: the long decode run's length (default ``10·W`` on CUDA without ``quick``; none
    elsewhere).
    ``hf_batching``: also the course's scheduler against transformers' continuous batching (needs ``hf``; CPU).
    """
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run(windows, batch, heads, head_dim, dtype, device, steps, repeats, quick, decode, hf, progress,
                    memory_steps, hf_batching)
    finally:
        torch.set_num_threads(previous_threads)


def _run(windows, batch, heads, head_dim, dtype, device, steps, repeats, quick, decode, hf, progress,
         memory_steps, hf_batching=False) -> dict:
    preset = dict(QUICK if quick else FULL)
    windows = list(dict.fromkeys(windows or preset["windows"]))  # each window once, in the order given
    steps = steps or preset["steps"]
    repeats = repeats or preset["repeats"]
    decode_steps = preset["decode_steps"] if steps == preset["steps"] else max(2, steps)
    decode_repeats = preset["decode_repeats"] if repeats == preset["repeats"] else repeats
    dev = default_device() if device in (None, "auto") else torch.device(device)
    torch_dtype = getattr(torch, dtype)
    notes = []
    if hf and (missing := _hf_missing()):
        notes.append(missing)
        hf = False
    if hf_batching:
        from swkv_teach.bench.hf_batching import hf_batching_missing

        if not hf:
            notes.append("HF continuous batching rows skipped: "
                         + (_hf_missing() or "the Hugging Face rows are off (--no-hf)"))
            hf_batching = False
        elif why := hf_batching_missing():
            notes.append(why)
            hf_batching = False
    wants_decode = decode  # the per-cache decode and serving rows need no transformers
    if decode and (why := decode_mod.unavailable()):
        notes.append(f"decode comparison skipped: {why}")
        decode = False
    bar = _progress(len(windows) * (1 + decode), progress)

    updates, attention, decode_rows = [], [], []
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for W in windows:
            k = torch.randn(batch, heads, 1, head_dim, generator=g).to(dev, torch_dtype)
            v = torch.randn(batch, heads, 1, head_dim, generator=g).to(dev, torch_dtype)
            read = attention_read(W, k)
            todo = [*subjects(W, k, v, hf), read]
            calls = {}
            for subject in todo:
                subject.fill()
                for _ in range(subject.warmup):
                    subject.step()
                calls[subject.name] = (subject.step, calls_per_repeat(subject.step, dev, steps, preset["repeat_s"]))
            if bar is not None:
                bar.set_postfix_str(f"W={W} updates")
            times = time_us_interleaved(calls, dev, repeats)
            for subject in todo:
                row = {"window": W, "cache": subject.name, "label": subject.label,
                       "us": times[subject.name].as_dict(), "calls_per_repeat": calls[subject.name][1], **subject.meta}
                if subject is read:
                    attention.append(row)
                else:
                    row["bytes_per_step"] = bytes_allocated_per_call(subject.step, dev)
                    row["bytes_held"] = bytes_held(subject.held())
                    updates.append(row)
            if bar is not None:
                bar.update()
            itemsize = torch.empty((), dtype=torch_dtype).element_size()
            ring_us = next(r["us"]["median"] for r in updates if r["window"] == W and r["cache"] == "ring")
            read_us = attention[-1]["us"]["median"]
            for r in (r for r in updates if r["window"] == W):
                r["ratio_to_ring"] = r["us"]["median"] / ring_us
                r["share_of_step"] = r["us"]["median"] / (r["us"]["median"] + read_us)
                slots = {"ring": W, "sinks": W + NUM_SINKS}.get(r["cache"])
                r["bytes_formula"] = None if slots is None else 2 * batch * heads * slots * head_dim * itemsize
            if decode:
                if bar is not None:
                    bar.set_postfix_str(f"W={W} decode")
                # the long run with memory readings: 10·W steps on CUDA in a full run (quick skips it)
                long_run = memory_steps if memory_steps is not None else (
                    10 * W if dev.type == "cuda" and not quick else None)
                decode_rows += decode_mod.decode_rows(W, torch_dtype, dev, decode_steps, decode_repeats, batch,
                                                      long_run)
                if bar is not None:
                    bar.update()
    if bar is not None:
        bar.close()
    # the speed targets were set for a full run on the default windows; elsewhere they are reported, not judged
    judged = not quick and sorted(windows) == sorted(FULL["windows"])
    # issue 21: ring, paged and int8 decode on their own model (W = 64 and 1024, one thread), and the compiled ring
    # (issue 29); serving throughput
    cache_decode = serving = speculative = None
    if wants_decode:
        cache_decode = decode_mod.cache_decode_rows(
            **(dict(windows=(8, 32), new_tokens=16, repeats=2, compiled_windows=(32,)) if quick else {}), device=dev,
            kinds=decode_mod.BENCH_DECODE_KINDS)
        from swkv_teach.bench.serving import serving_throughput

        serving = serving_throughput(**(dict(concurrency=(1, 4), repeats=1, count=4) if quick else {}))
        # issue 39: the shipped checkpoint, one thread, its own settings (bench.speculative.FULL / QUICK)
        from swkv_teach.bench import speculative as speculative_mod  # here: `python -m` runs it as __main__ too

        speculative = speculative_mod.section(quick)
    batching = None
    if hf_batching:  # the course's scheduler against transformers' continuous batching, on the chat
        from swkv_teach.bench.hf_batching import section as hf_batching_section

        batching = hf_batching_section(quick)
    return {
        "env": environment(dev),
        "config": {"windows": windows, "batch": batch, "heads": heads, "head_dim": head_dim, "dtype": dtype,
                   "steps": steps, "repeats": repeats, "decode_steps": decode_steps,
                   "decode_repeats": decode_repeats, "quick": quick,
                   "num_sinks": NUM_SINKS, "targets_judged": judged, "memory_steps": memory_steps},
        "updates": updates,
        "attention": attention,
        "decode": decode_rows,
        "targets": targets(updates, decode_rows, judged, cache_decode, serving, speculative),
        "cache_decode": cache_decode,
        "serving": serving,
        "speculative": speculative,
        # HF generate with hf_cache vs HF's own caches (swkv_teach.bench.hf_cache; CPU, fp32, its own shape)
        "hf_cache": hf_cache_mod.section(quick, judged) if hf and decode else None,
        "hf_batching": batching,
        "notes": notes,
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swkv-teach bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=int, nargs="+", help=f"window sizes (default {FULL['windows']})")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16", "float64"])
    p.add_argument("--device", default="auto", help="auto (swkv_teach.device()), cpu, cuda, cuda:1, mps")
    p.add_argument("--steps", type=int, help=f"at least this many calls per repeat (default {FULL['steps']})")
    p.add_argument("--repeats", type=int, help=f"timed repeats per figure (default {FULL['repeats']})")
    p.add_argument("--quick", action="store_true", help="small windows, few steps: a few seconds")
    # One thread by default: the targets are stated for one thread, and several threads on a small or busy
    # machine fight each other (a --quick run at 2 threads on a loaded 2-core box gave 16 ms decode steps)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, the targets' setting)")
    p.add_argument("--no-decode", action="store_true", help="skip the Decoder vs Hugging Face decode comparison")
    p.add_argument("--memory-steps", type=int, metavar="N",
                   help="long decode run of N steps per window and implementation, memory read after each "
                        "(default: 10·W on CUDA, none with --quick or on other devices)")
    p.add_argument("--no-hf", action="store_true", help="skip every Hugging Face row")
    p.add_argument("--hf-batching", action="store_true",
                   help="also serve the chat through transformers' continuous batching beside the course's "
                        "scheduler (about a minute; needs transformers)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar on stderr")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write every figure and the environment here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for name in ("batch", "heads", "head_dim", "steps", "repeats", "threads", "memory_steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"swkv-teach bench: --{name.replace('_', '-')} must be >= 1; got {value}", file=sys.stderr)
            return 2
    if args.windows and min(args.windows) < 1:
        print(f"swkv-teach bench: --windows must all be >= 1; got {args.windows}", file=sys.stderr)
        return 2
    result = run(
        windows=args.windows, batch=args.batch, heads=args.heads, head_dim=args.head_dim, dtype=args.dtype,
        device=args.device, steps=args.steps, repeats=args.repeats, quick=args.quick,
        decode=not (args.no_decode or args.no_hf), hf=not args.no_hf, progress=not args.no_progress,
        threads=args.threads, memory_steps=args.memory_steps, hf_batching=args.hf_batching,
    )
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")
    return 0
