"""Turning measurements into what a reader checks: the environment, the targets, a plain-text table."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

import torch

from swkv_teach.bench.goals import TARGETS, judge

__all__ = ["TARGETS", "environment", "table", "targets"]


def environment(device: torch.device) -> dict:
    try:
        transformers_version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        transformers_version = None
    env = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers_version,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }
    return env


def targets(
    updates: list[dict], decode: list[dict], judged: bool = True, cache_decode: list[dict] | None = None,
    serving: dict | None = None, speculative: dict | None = None,
) -> dict:
    """Each target's measured value and whether it holds.

    ``met`` is None where its rows were not measured, and for a "default"-scope
    target when ``judged`` is False (a run on other windows, or ``--quick``).
    """
    by = {(r["window"], r["cache"]): r for r in updates}
    windows = sorted({r["window"] for r in updates})
    lo, hi = windows[0], windows[-1]
    us = lambda W, name: by[(W, name)]["us"]["median"] if (W, name) in by else None  # noqa: E731
    value = {}
    if len(windows) > 1:
        growth = us(hi, "floor") - us(lo, "floor")
        value["ring_flat_in_window"] = (us(hi, "ring") - growth) / us(lo, "ring")
    else:
        value["ring_flat_in_window"] = None
    value["ring_vs_floor"] = us(hi, "ring") / us(hi, "floor")
    hf = us(hi, "hf_dynamic_sliding")
    value["hf_dynamic_vs_ring"] = None if hf is None else hf / us(hi, "ring")
    rings = [r for r in updates if r["cache"] == "ring"]
    value["ring_bytes_per_step"] = max(r["bytes_per_step"] for r in rings)
    value["ring_held_is_formula"] = float(all(r["bytes_held"] == r["bytes_formula"] for r in rings))
    ours = [r for r in decode if r["impl"] == "swkv_ring"]
    value["decode_vs_hf"] = min(r["ratio_to_hf"] for r in ours) if ours else None
    value["decode_ring_vs_naive"] = min(r["ratio_to_naive"] for r in ours) if ours else None
    value["decode_same_tokens"] = float(all(r["same_tokens"] for r in decode)) if decode else None
    flat = [r["memory"]["flat"] for r in decode if r.get("memory") and r["memory"]["flat"] is not None]
    value["decode_memory_flat"] = float(all(flat)) if flat else None
    for kind in ("paged", "int8"):  # rows of bench.decode.cache_decode_rows
        ratios = [r["ratio_to_ring_best"] for r in cache_decode or () if r["cache"] == kind]
        value[f"{kind}_decode_vs_ring"] = min(ratios) if ratios else None
    largest = {kind: max((r for r in cache_decode or () if r["cache"] == kind), key=lambda r: r["window"], default=None)
               for kind in ("aot", "compiled")}
    value["aot_decode_vs_ring"] = largest["aot"]["ratio_to_ring"] if largest["aot"] else None
    value["compiled_outside_attention"] = (
        largest["compiled"].get("ratio_outside_attention") if largest["compiled"] else None)
    chat, budget = (serving or {}).get("chat"), (serving or {}).get("budget")
    value["chat_prefill_with_caching"] = max(chat["ratio"].values()) if chat else None
    value["budget_vs_reserved"] = budget["ratio"] if budget else None
    # imported here, not at the top: `python -m swkv_teach.bench.speculative` must find the module not yet imported
    from swkv_teach.bench.speculative import target_values

    value.update(target_values((speculative or {}).get("rows") or []))
    return {name: judge(name, value[name], judged) for name in TARGETS}


def _bytes(n: float) -> str:
    # whole KiB, not MiB: the naive cache's extra token (W + 1 held) must stay visible
    return f"{n:.0f} B" if abs(n) < 1024 else f"{n / 1024:,.0f} KiB"


def table(result: dict) -> str:
    """The run as plain text: update rows per window, decode rows, targets, notes."""
    env, cfg = result["env"], result["config"]
    lines = [
        f"swkv_teach bench  device={env['device']}  dtype={cfg['dtype']}  B={cfg['batch']} H={cfg['heads']} "
        f"D={cfg['head_dim']}  threads={env['threads']}  torch {env['torch']}  transformers {env['transformers']}",
        "µs per one-token update once the window is full: median (min–max) over repeats; ×ring = median / ring's;",
        "% step = update / (update + SDPA read of the window); held = bytes the cache keeps; alloc = bytes per step",
        "",
        f"{'W':>5}  {'cache':<32}{'µs':>9}  {'min–max':<17}{'×ring':>8}{'% step':>8}{'held':>11}{'alloc/step':>12}",
    ]
    attention = {r["window"]: r for r in result["attention"]}
    for W in cfg["windows"]:
        for r in (r for r in result["updates"] if r["window"] == W):
            us = r["us"]
            lines.append(
                f"{W:>5}  {r['label']:<32}{us['median']:>9.2f}  {us['min']:>7.2f}–{us['max']:<9.2f}"
                f"{r['ratio_to_ring']:>8.2f}{100 * r['share_of_step']:>7.0f}%{_bytes(r['bytes_held']):>11}"
                f"{_bytes(r['bytes_per_step']):>12}"
            )
        a = attention[W]["us"]
        lines.append(f"{W:>5}  {attention[W]['label']:<32}{a['median']:>9.2f}  "
                     f"{a['min']:>7.2f}–{a['max']:<9.2f}")
        lines.append("")
    if result["decode"]:
        lines.append("decode, tiny Mistral (2 layers, dim 64), same weights, prompt of W tokens then greedy steps;")
        lines.append("×HF, ×naive = median tokens/s / theirs at the same window")
        lines.append(f"{'W':>5}  {'implementation':<20}{'tokens/s':>10}  {'min–max':<19}{'×HF':>6}{'×naive':>8}"
                     "  same tokens as HF")
        for r in result["decode"]:
            t = r["tokens_per_s"]
            lines.append(f"{r['window']:>5}  {r['impl']:<20}{t['median']:>10.0f}  {t['min']:>8.0f}–{t['max']:<10.0f}"
                         f"{r['ratio_to_hf']:>6.2f}{r['ratio_to_naive']:>8.2f}  {'yes' if r['same_tokens'] else 'NO'}")
        lines.append("")
        runs = [r for r in result["decode"] if r.get("memory")]
        if runs:
            lines.append("long decode runs: tokens/s over the run; memory_allocated after each step, first / last "
                         "(min–max), flat = never moved")
            lines.append(f"{'W':>5}  {'implementation':<20}{'steps':>7}{'tokens/s':>10}  {'allocated':<34}flat  "
                         "same tokens")
            for r in runs:
                m, a = r["memory"], r["memory"]["allocated"]
                mem = "not counted (no CUDA)" if a is None else (
                    f"{_bytes(a['first'])} / {_bytes(a['last'])} ({_bytes(a['min'])}–{_bytes(a['max'])})")
                flat = {True: "yes", False: "NO", None: "--"}[m["flat"]]
                lines.append(f"{r['window']:>5}  {r['impl']:<20}{m['steps']:>7}{m['tokens_per_s']:>10.0f}  {mem:<34}"
                             f"{flat:<6}{'yes' if m['same_tokens'] else 'NO'}")
            lines.append("")
    if result.get("cache_decode"):
        lines.append("decode per cache kind, random Mistral-shaped Decoder (hidden 128, 2 layers, 4/2 heads, "
                     "head_dim 32),")
        lines.append("prompt of W tokens then greedy steps, one thread; ×ring = median tokens/s / the ring's, "
                     "best = fastest repeat / the ring's (judged; aot: ×ring judged; compiled: outside attention)")
        lines.append("compiled = the ring's one-token step under torch.compile, aot = the same step compiled ahead of "
                     "time (AOTInductor); compilation excluded (the warm-up round)")
        lines.append(f"{'W':>5}  {'cache':<10}{'tokens/s':>10}  {'min–max':<19}{'×ring':>7}{'best':>7}"
                     "  same tokens as ring")
        for r in result["cache_decode"]:
            t = r["tokens_per_s"]
            same = {True: "yes", False: "no (int8 is lossy)" if r["cache"] == "int8" else "NO", None: "--"}
            lines.append(f"{r['window']:>5}  {r['cache']:<10}{t['median']:>10.0f}  {t['min']:>8.0f}–{t['max']:<10.0f}"
                         f"{r['ratio_to_ring']:>7.2f}{r['ratio_to_ring_best']:>7.2f}  "
                         f"{same[r['same_tokens_as_ring']]}")
        split = [r for r in result["cache_decode"] if r.get("attention_us") is not None]
        if split:
            lines.append("compiled steps outside attention: the attention kernels alone (one SDPA call per layer on "
                         "the step's shapes, timed in the same rounds), which every path runs unchanged")
            for r in split:
                ring = next(x for x in result["cache_decode"] if x["window"] == r["window"] and x["cache"] == "ring")
                eager_us, compiled_us = (1e6 / x["tokens_per_s"]["median"] for x in (ring, r))
                outside = r["ratio_outside_attention"]
                lines.append(f"{r['window']:>5}  {r['cache']:<10}{compiled_us:5.0f} µs a token, eager ring "
                             f"{eager_us:5.0f}, attention {r['attention_us']:4.0f}: outside attention "
                             + ("--" if outside is None else f"{outside:.2f}×"))
        lines.append("")
    if result.get("serving"):
        from swkv_teach.bench.serving import table as serving_table

        # the budget's speed target is judged only in a full run (a timing); the chat's is a count, judged in any
        lines.append(serving_table(result["serving"], judged=cfg.get("targets_judged", True)))
        lines.append("")
    if result.get("speculative"):
        from swkv_teach.bench.speculative import table as speculative_table

        lines.append(speculative_table(result["speculative"], judged=cfg.get("targets_judged", True)))
        lines.append("")
    if cfg.get("targets_judged", True):
        lines.append("targets (ratios from this run)")
    else:
        lines.append("targets (ratios from this run; those set for a full run on the default windows are "
                     "reported, not judged: --)")
    for name, t in result["targets"].items():
        v = "not measured" if t["value"] is None else f"{t['value']:.4g}"  # 1.298 must not read as 1.3 when missed
        mark = {True: "ok  ", False: "MISS", None: "--  "}[t["met"]]
        lines.append(f"  {mark} {name:<27}{v:>10} (target {t['target']})  {t['what']}")
    if result.get("hf_cache"):
        from swkv_teach.bench.hf_cache import table as hf_cache_table

        section = result["hf_cache"]
        lines += ["", f"HF generate, tiny Mistral {section['config']}: µs per greedy step, median over repeats",
                  hf_cache_table(section["rows"])]
        for name, t in section["targets"].items():
            mark = {True: "ok  ", False: "MISS", None: "--  "}[t["met"]]
            lines.append(f"  {mark} {name:<22}{t['value']:>14.3g} (target {t['target']})  {t['what']}")
    if result.get("hf_batching"):
        from swkv_teach.bench.hf_batching import section_table

        lines += ["", "the course's scheduler against transformers' continuous batching (bench/hf_batching.py)",
                  section_table(result["hf_batching"])]
    for note in result["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)
