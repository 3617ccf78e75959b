"""Hugging Face integration rows: ``model.generate`` with ``hf_cache(model, kind)`` against HF's own caches.

One tiny random Mistral-shaped model (no download), greedy decoding of ``new_tokens`` tokens after a prompt
of ``W`` tokens, batch 1, in one process. The time of each decode step is read from a ``streamer`` that
``generate`` calls once per new token, and the median step is kept (the prompt's forward is not a step).
Implementations, each run in turn ``repeats`` times (interleaved, so a busy machine slows all alike):

* ``dynamic``: transformers' default ``DynamicCache`` (its sliding layers ``cat`` W - 1 keys and slice, every step);
* ``static``: ``cache_implementation="static"`` (its sliding layers ``roll`` the W-slot buffer, every step);
* ``ring`` / ``naive`` / ``int8``: :func:`swkv_teach.hf.hf_cache` with that kind.

:func:`compiled_rows` compares transformers' compiled ``generate`` with its static cache and with
:func:`swkv_teach.hf_cache.hf_compileable_cache` (issue 29).

Rows give the median step µs (median over repeats of each repeat's median), tokens/s, the ratio of each
to ``ring`` (``dynamic / ring`` > 1: the ring is faster; also of the least disturbed repeats), whether the
greedy tokens equal ``dynamic``'s, and the bytes each sliding layer holds after the run. Timings are never
asserted in tests: the targets (:data:`TARGETS`) are judged in a full bench run only.
"""

from __future__ import annotations

import statistics
import time

import torch

from swkv_teach.bench.measure import bytes_held

__all__ = ["COMPILED_IMPLS", "IMPLS", "SHAPE", "TARGETS", "compiled_rows", "hf_cache_rows", "section", "table",
           "tiny_mistral"]

IMPLS = ("dynamic", "static", "ring", "naive", "int8")
# the shape: Mistral-like, hidden 128, 2 layers, 4 query / 2 kv heads, head_dim 32
SHAPE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, vocab_size=256)


def tiny_mistral(window: int, seed: int = 0, **shape):
    """A random ``MistralForCausalLM`` (fp32, eval, SDPA) of :data:`SHAPE`, ``sliding_window=window``; no download."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.MistralConfig(**{**SHAPE, **shape}, sliding_window=window,
                                        max_position_embeddings=1 << 16, attn_implementation="sdpa",
                                        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return transformers.MistralForCausalLM(config).eval()


class _StepClock:
    """A ``generate`` streamer: ``put`` is called with the prompt, then once per new token."""

    def __init__(self):
        self.stamps = []

    def put(self, value):
        self.stamps.append(time.perf_counter())

    def end(self):
        pass

    def steps_us(self) -> list[float]:
        # stamps[0]: after the prompt is handed over; stamps[1]: after the prefill's token; then one per step
        return [(b - a) * 1e6 for a, b in zip(self.stamps[1:], self.stamps[2:])]


def _sliding_bytes(cache) -> list[int]:
    """Bytes of every tensor storage each sliding layer keeps alive (views counted once, at their storage's size)."""
    from swkv_teach.hf_cache import WindowLayer

    out = []
    for layer in cache.layers:
        if not getattr(layer, "is_sliding", False):
            continue
        roots = [vars(layer)] + ([vars(layer.cache)] if isinstance(layer, WindowLayer) else [])
        tensors, todo = [], list(roots)
        while todo:
            x = todo.pop()
            if isinstance(x, torch.Tensor):
                tensors.append(x)
            elif isinstance(x, dict):
                todo += list(x.values())
            elif isinstance(x, (list, tuple)):
                todo += list(x)
            elif hasattr(x, "__dict__") and type(x).__module__.startswith("swkv_teach.caches"):
                todo.append(vars(x))
        out.append(bytes_held(tensors))
    return out


def _generate(model, impl: str, prompt: torch.Tensor, new_tokens: int):
    from swkv_teach.hf_cache import cache_kwarg, hf_cache

    clock = _StepClock()
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, streamer=clock,
                  return_dict_in_generate=True)
    if impl == "static":
        kwargs["cache_implementation"] = "static"
    elif impl != "dynamic":
        kwargs[cache_kwarg(model)] = hf_cache(model, impl)
    with torch.inference_mode():
        out = model.generate(prompt, **kwargs)
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    return out.sequences, statistics.median(clock.steps_us()), cache


def hf_cache_rows(window: int = 1024, new_tokens: int = 256, repeats: int = 5, impls=IMPLS, seed: int = 0,
                  **shape) -> list[dict]:
    """One row per implementation (see the module docstring); prompt of ``window`` tokens, batch 1, CPU fp32."""
    model = tiny_mistral(window, seed, **shape)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (1, window), generator=g)
    medians = {impl: [] for impl in impls}
    tokens, held = {}, {}
    for _ in range(repeats):
        for impl in impls:
            seq, us, cache = _generate(model, impl, prompt, new_tokens)
            medians[impl].append(us)
            tokens[impl] = seq
            held[impl] = _sliding_bytes(cache) if cache is not None else None
    ring_us = statistics.median(medians["ring"]) if "ring" in medians else None
    ring_best = min(medians["ring"]) if "ring" in medians else None
    rows = []
    for impl in impls:
        us = statistics.median(medians[impl])
        rows.append({
            "impl": impl, "window": window, "new_tokens": new_tokens, "repeats": repeats,
            "us_per_step": {"median": us, "min": min(medians[impl]), "max": max(medians[impl]),
                            "samples": medians[impl]},
            "tokens_per_s": 1e6 / us,
            "ratio_to_ring": us / ring_us if ring_us else None,
            # the least disturbed repeat of each: steadier than the median on a busy machine
            "ratio_to_ring_best": min(medians[impl]) / ring_best if ring_best else None,
            "same_tokens_as_dynamic": bool(torch.equal(tokens[impl], tokens["dynamic"])) if "dynamic" in tokens
            else None,
            "sliding_bytes_held": held[impl],
        })
    return rows


COMPILED_IMPLS = ("static", "ring")


def compiled_rows(window: int = 1024, new_tokens: int = 64, repeats: int = 5, seed: int = 0, **shape) -> list[dict]:
    """transformers' *compiled* ``generate`` (``CompileConfig(fullgraph=True, mode="default")``, allowed on a CPU)
    with its static cache (``cache_implementation="static"``: the roll) and with
    :func:`~swkv_teach.hf_cache.hf_compileable_cache` (the one-slot write), interleaved; a first untimed round
    compiles both. Rows: ``impl``, median step µs, ``ratio_to_ring`` (static / ring: > 1, the ring is
    faster), ``same_tokens_as_static``. Not part of ``swkv-teach bench`` (two compilations of the model's
    forward, a minute or more on a busy CPU): ``python -m swkv_teach.bench.hf_cache --compiled``.
    """
    from transformers import CompileConfig

    from swkv_teach.hf_cache import cache_kwarg, hf_compileable_cache

    model = tiny_mistral(window, seed, **shape)
    prompt = torch.randint(0, model.config.vocab_size, (1, window), generator=torch.Generator().manual_seed(seed))
    config = CompileConfig(fullgraph=True, mode="default")
    config._compile_all_devices = True  # transformers compiles generate on CUDA-like devices only, unless told
    medians = {impl: [] for impl in COMPILED_IMPLS}
    tokens = {}
    for r in range(repeats + 1):
        for impl in COMPILED_IMPLS:
            clock = _StepClock()
            kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, streamer=clock,
                          compile_config=config)
            if impl == "static":
                kwargs["cache_implementation"] = "static"
            else:
                kwargs[cache_kwarg(model)] = hf_compileable_cache(model)
            with torch.inference_mode():
                tokens[impl] = model.generate(prompt, **kwargs)
            if r:  # round 0 compiles
                medians[impl].append(statistics.median(clock.steps_us()))
    ring_us = statistics.median(medians["ring"])
    return [{"impl": impl, "window": window, "new_tokens": new_tokens, "repeats": repeats, "compiled": True,
             "us_per_step": {"median": statistics.median(medians[impl]), "min": min(medians[impl]),
                             "max": max(medians[impl]), "samples": medians[impl]},
             "ratio_to_ring": statistics.median(medians[impl]) / ring_us,
             "same_tokens_as_static": bool(torch.equal(tokens[impl], tokens["static"]))} for impl in COMPILED_IMPLS]


# judged as ratios within one run, in a full run only ("default"), or at any size ("any"), as in report.TARGETS
TARGETS = {
    "hf_ring_vs_dynamic": ("HF generate µs/step with DynamicCache / with hf_cache ring", ">=", 1.04, "default"),
    "hf_ring_vs_static": ("HF generate µs/step with the static cache (roll) / with hf_cache ring", ">=", 1.18,
                          "default"),
    "hf_same_tokens": ("greedy tokens of hf_cache ring and naive equal DynamicCache's (1 = yes)", ">=", 1.0, "any"),
}
FULL = dict(window=1024, new_tokens=256, repeats=5)
QUICK = dict(window=16, new_tokens=8, repeats=1)


def section(quick: bool = False, judged: bool = True) -> dict:
    """The bench's ``hf_cache`` section: ``config``, ``rows`` (:func:`hf_cache_rows`) and ``targets``."""
    config = dict(QUICK if quick else FULL)
    rows = hf_cache_rows(**config)
    by = {r["impl"]: r for r in rows}
    value = {
        "hf_ring_vs_dynamic": by["dynamic"]["ratio_to_ring"],
        "hf_ring_vs_static": by["static"]["ratio_to_ring"],
        "hf_same_tokens": float(by["ring"]["same_tokens_as_dynamic"] and by["naive"]["same_tokens_as_dynamic"]),
    }
    targets = {}
    for name, (what, op, goal, scope) in TARGETS.items():
        v = value[name]
        judge = judged or scope == "any"
        met = (v <= goal if op == "<=" else v >= goal) if judge else None
        targets[name] = {"what": what, "value": v, "target": f"{op} {goal:g}", "met": met, "scope": scope,
                         "judged": judge}
    return {"config": {**config, **SHAPE, "batch": 1, "dtype": "float32"}, "rows": rows, "targets": targets}


def table(rows: list[dict]) -> str:
    """Plain-text table of :func:`hf_cache_rows`."""
    lines = [f"{'impl':8} {'µs/step':>9} {'tok/s':>8} {'x ring':>7} {'(best)':>7} {'same':>5}  "
             "bytes held per sliding layer"]
    for r in rows:
        ratio = "--" if r["ratio_to_ring"] is None else f"{r['ratio_to_ring']:.2f}"
        best = "--" if r["ratio_to_ring_best"] is None else f"{r['ratio_to_ring_best']:.2f}"
        lines.append(f"{r['impl']:8} {r['us_per_step']['median']:9.0f} {r['tokens_per_s']:8.0f} {ratio:>7} {best:>7} "
                     f"{str(r['same_tokens_as_dynamic']):>5}  {r['sliding_bytes_held']}")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compiled", action="store_true",
                   help="transformers' compiled generate: static cache against hf_compileable_cache")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if a.compiled:
        for r in compiled_rows(a.window, min(a.new_tokens, 64), a.repeats):
            print(f"{r['impl']:8} {r['us_per_step']['median']:9.0f} µs/step  x ring {r['ratio_to_ring']:.2f}  "
                  f"same tokens as static: {r['same_tokens_as_static']}")
    else:
        print(table(hf_cache_rows(a.window, a.new_tokens, a.repeats)))
