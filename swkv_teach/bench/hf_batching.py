"""The course's scheduler against transformers' own continuous batching, on the same chat workload (issue 39).

    python -m swkv_teach.bench.hf_batching            # the table; --json PATH for every figure
    swkv-teach bench --hf-batching                    # the same, as a section of the suite

The shipped checkpoint (:func:`~swkv_teach.pretrained.load_pretrained`, sliding window W = 64) serves the chat
of :mod:`swkv_teach.serving.workload` (conversations sharing a system prompt, served turn by turn, each turn's
prompt the previous one + its reply + a new line) four ways, fp32, on the CPU, one thread:

* ``course``: :class:`~swkv_teach.serving.Scheduler` with a token budget (vLLM v1's mode: decode rows and prompt
  chunks in one forward), then the same with ``prefix_caching=True``;
* ``hf``: the same weights in Hugging Face's ``MistralForCausalLM`` (:func:`swkv_teach.hf.to_hf`) behind
  ``ContinuousBatchingManager`` (:mod:`.hf_server`), the same token budget (``max_batch_tokens``), block size
  (``page_size``; ``block_size`` in 5.15) and requests per forward, ``allow_block_sharing`` off, then on. Its
  attention is ``"sdpa"`` (the other one it takes on a CPU, ``"paged|eager"``, is slower here;
  ``continuous_api.py`` line 782 accepts those two and flash).

Each server is built before its clock starts (the course's block pool; HF's manager, its cache and its
generation thread), then the whole chat is timed: wall seconds and the process's CPU seconds (every thread:
HF works in its background thread while the caller waits on a queue). Repeats are taken in turn; medians, and
the ratio to the course as the median of each repeat's ratio (the two runs of a repeat see the same load).

:func:`section` (``swkv-teach bench --hf-batching``) runs it twice: on the shipped window checkpoint, and on the
full-attention one (``load_pretrained(name="full")``, W = 256) for one turn, every sequence within 256 tokens,
with HF's model given no sliding window at all: the same model there, and the case where HF shares blocks.

Counted, not timed: **prompt tokens computed** (course: :meth:`Scheduler.stats`; transformers keeps no such count
in 5.15 or 5.25, so :class:`~swkv_teach.bench.hf_server.HFServer` counts the query tokens of every forward and
the hits ``PagedAttentionCache.search_prefix_match`` returns: computed = forward tokens - one decode token per new
token after a request's first); **forwards**; **model seconds** (the embedding's input to the LM head's output,
the same span on both sides; the rest of the wall is scheduling, batch building, sampling and hand-offs; the
course builds its attention plan inside that span, HF its indices and mask outside it, timed as **prepare s**);
for HF the **attention scores** its one SDPA call per layer computes (``q x k`` of the forward's dense mask) beside
the block-diagonal part, the rows' own (``sum(q_b x k_b)``), which a varlen kernel would compute.

**Greedy tokens** are checked request by request against ``Decoder.generate`` on the same prompt (batch 1, ring
cache), and each server's replies against the course's; the first position where a reply differs is kept.

What transformers does here, read in its source (5.25 unless said; paths under ``generation/continuous_batching/``):

* on a CPU every step takes the varlen path: the decode fast path (a block table read by flash's
  ``flash_attn_with_kvcache``) needs flash attention on CUDA or XPU (``initialization.py`` lines 146-152) and
  block tables in every layer type, which sliding layers lack (``cache_allocators/sliding_attention.py`` line 29;
  ``continuous_api.py`` lines 1191-1193). SDPA and ``paged|eager`` need a mask (``utils.py`` line 89): one dense
  additive mask over the whole packed batch, rebuilt each step (``input_outputs.py`` lines 433-443,
  ``build_attention_mask``, ``utils.py`` line 115), so every query of a step is scored against every key of the
  step, the other rows' included, where the course's paged attention reads each row's own blocks;
* each step builds every request's cache read and write indices token by token in Python
  (``SlidingAttentionCacheAllocator._token_indices_to_physical_indices``, ``sliding_attention.py`` line 81: up to
  ``W - 1`` reads a request a step), then gathers the cached keys with ``index_select`` and writes the new ones
  in with ``masked_scatter_`` (its ``update``);
* a sliding-window layer never shares blocks: ``supports_block_sharing = False`` (``sliding_attention.py`` line
  28), so ``use_prefix_sharing`` is False whatever ``allow_block_sharing`` says (``cache.py`` lines 215-217; 5.15:
  ``cache.py`` line 290, full-attention models only);
* 5.15 misplaces the ring: a prompt longer than ``W`` has its last ``W`` keys written from slot 0
  (``cache_manager.py`` line 529 starts at ``past_length % W`` = 0, not at ``(past_length + padding) % W``), and a
  decode step at ``p >= W`` reads ``W - 1`` slots from ``p % W`` (line 508), the slot of position ``p - W``, one
  outside the window, leaving the newest out. 5.25 starts at ``(past_length + padding_length) % W`` and
  ``(past_length + 1) % W`` (``sliding_attention.py`` lines 121 and 104), the fix of huggingface/transformers#47708.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from swkv_teach._validate import check_positive_int
from swkv_teach.bench.hf_server import HFServer
from swkv_teach.bench.measure import ForwardClock, Summary
from swkv_teach.bench.serving import TOKEN_BUDGET

__all__ = ["COUNTERPART", "HFServer", "SECTION", "SERVERS", "compare", "hf_batching_missing", "main", "section",
           "section_table", "table"]

SERVERS = ("course", "course+prefix", "hf", "hf+sharing")
COUNTERPART = {"hf": "course", "hf+sharing": "course+prefix"}  # the course's server doing the same thing


def hf_batching_missing() -> str | None:
    """Why HF's continuous batching cannot be measured here (None when it can)."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed: HF continuous batching rows skipped"
    import transformers

    if getattr(transformers, "ContinuousBatchingConfig", None) is None:
        return (f"transformers {transformers.__version__} has no ContinuousBatchingConfig: HF continuous batching "
                f"rows skipped")
    return None


def _first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (the shorter one's length if one is a prefix); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _agreement(out: dict, reference: dict) -> dict:
    """Request by request (``out["requests"][turn][conversation]``), whether ``out``'s reply equals ``reference``'s.

    ``agree``: same prompt and same reply; ``prompts_differ``: requests whose prompts already differ (a reply of an
    earlier turn did); ``first_divergence``: the earliest position in a reply (0 = its first new token) where two
    replies to the same prompt differ, None if none does.
    """
    agree = prompts_differ = 0
    first = None
    for turn_o, turn_r, turn_q in zip(out["outputs"], reference["outputs"], out["requests"]):
        for o, r, q in zip(turn_o, turn_r, turn_q):
            n = len(q["prompt"])
            if r[:n] != q["prompt"]:
                prompts_differ += 1
                continue
            d = _first_difference(o[n:], r[n:])
            if d is None:
                agree += 1
            else:
                first = d if first is None else min(first, d)
    return {"agree": agree, "requests": sum(map(len, out["requests"])), "prompts_differ": prompts_differ,
            "first_divergence": first}


def _solo(decoder, out: dict) -> dict:
    """``Decoder.generate`` (batch 1, ring cache, greedy) on every prompt ``out`` served, in its shape."""
    outputs = [[decoder.generate(torch.tensor([r["prompt"]]), r["max_new_tokens"])[0].tolist() for r in turn]
               for turn in out["requests"]]
    return {"outputs": outputs, "requests": out["requests"]}


def _longest(tokenizer, conversations: int, turns: int, max_new_tokens: int) -> int:
    """Tokens in the longest conversation's last sequence (its prompt and reply), before serving it."""
    from swkv_teach.serving.workload import SYSTEM_PROMPT, chat_lines

    base = len(tokenizer.encode(SYSTEM_PROMPT)) + turns * max_new_tokens
    return max(base + sum(len(tokenizer.encode(line)) for line in lines) for lines in chat_lines(conversations, turns))


def compare(decoder=None, tokenizer=None, conversations: int = 8, turns: int = 3, max_new_tokens: int = 24,
            repeats: int = 3, block_size: int = 16, num_blocks: int = 256, token_budget: int = TOKEN_BUDGET,
            max_running: int = 16, attn_implementation: str = "sdpa", threads: int | None = 1,
            servers=SERVERS, checkpoint: str = "window", hf_sliding_window: bool = True) -> dict:
    """Serve the chat on each of ``servers`` (:data:`SERVERS`), ``repeats`` times in turn (module docstring).

    Args:
        decoder, tokenizer: default ``load_pretrained(name=checkpoint)``.
        conversations, turns, max_new_tokens: the chat (:func:`~swkv_teach.serving.serve_chat`).
        block_size, num_blocks, token_budget, max_running: both servers' pool, budget per forward, rows per forward.
        attn_implementation: HF's (``"sdpa"`` or ``"paged|eager"``: what its continuous batching accepts besides
            flash, ``continuous_api.py`` line 782).
        threads: torch's intra-op threads, in this thread and in HF's (None: leave them).
        hf_sliding_window: False gives HF's model no sliding window (full causal attention), so its block sharing
            can act (module docstring); allowed only when every sequence of the chat fits the decoder's window,
            where the two models are the same.
    Returns:
        ``{"rows": [{server, tokens_per_s, cpu_tokens_per_s ({median, min, max, samples}: new tokens per wall
        second, per process CPU second), ratio_to_course (median over repeats of the course's CPU seconds / this
        server's, the two taken back to back), ratio_to_counterpart (the same against the course's server doing
        what this one does, :data:`COUNTERPART`: HF rows only), wall_s, cpu_s, model_s (and prepare_s for HF:
        medians), seconds (the samples of each), new_tokens, prompt_tokens, prompt_tokens_computed,
        prefix_hit_tokens, forwards, forward_tokens, threads, agree_with_generate, same_as_course ({agree, requests,
        prompts_differ, first_divergence}; None without a course row), and for HF block_sharing_used,
        default_threads, scores_dense, scores_rows}], "env" (torch, transformers, threads, load_average {before,
        after}: os.getloadavg(), cpu_count), "config", "notes"}``.
        Without transformers (or without its continuous batching) the HF rows are left out and a note says why.
    """
    from swkv_teach.pretrained import load_pretrained
    from swkv_teach.serving import Scheduler, serve_chat

    servers = list(servers)
    if not servers or any(s not in SERVERS for s in servers) or len(set(servers)) < len(servers):
        raise ValueError(f"servers must be distinct names from {SERVERS}; got {servers!r}")
    for name, value in (("conversations", conversations), ("turns", turns), ("max_new_tokens", max_new_tokens),
                        ("repeats", repeats)):
        check_positive_int(name, value)
    if attn_implementation not in ("sdpa", "paged|eager"):
        raise ValueError(f"attn_implementation must be 'sdpa' or 'paged|eager' (what transformers' continuous "
                         f"batching runs on a CPU); got {attn_implementation!r}")
    if decoder is None or tokenizer is None:
        loaded, tok = load_pretrained(name=checkpoint)
        decoder, tokenizer = decoder or loaded, tokenizer or tok
    workload = dict(conversations=conversations, turns=turns, max_new_tokens=max_new_tokens)
    W = decoder.config.window_size
    if not hf_sliding_window and (longest := _longest(tokenizer, **workload)) > W:
        raise ValueError(f"hf_sliding_window=False needs every sequence within the decoder's window ({W} tokens), "
                         f"where full attention and the window are the same model; the longest conversation "
                         f"reaches {longest} tokens: fewer turns or new tokens, or a decoder with a wider window")
    notes, model = [], None
    if any(s.startswith("hf") for s in servers) and (why := hf_batching_missing()):
        notes.append(why)
        servers = [s for s in servers if not s.startswith("hf")]
    if any(s.startswith("hf") for s in servers):
        from swkv_teach.hf import to_hf

        model = to_hf(decoder, attn_implementation, sliding_window=hf_sliding_window)

    def build(server):
        if server.startswith("course"):
            return Scheduler(decoder, num_blocks, block_size, max_running=max_running, token_budget=token_budget,
                             prefix_caching=server == "course+prefix")
        return HFServer(model, server == "hf+sharing", block_size, num_blocks, token_budget, max_running,
                        max_new_tokens, threads)

    load = {"before": os.getloadavg()}  # 1, 5, 15 minutes: how busy the machine was
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    samples = {s: {"wall": [], "cpu": [], "model": [], **({} if s.startswith("course") else {"prepare": []})}
               for s in servers}
    outputs, counts = {}, {}
    try:
        for _ in range(repeats):
            for server in servers:
                s = build(server)  # the pool, HF's cache and thread: before the clock
                course = server.startswith("course")
                clock = ForwardClock().watch(decoder.embed, decoder.lm_head) if course else s.clock
                try:
                    wall, cpu = time.perf_counter(), time.process_time()
                    out = serve_chat(s, tokenizer, **workload)
                    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                    st = s.stats()
                finally:
                    (clock if course else s).close()
                for key, value in (("wall", wall), ("cpu", cpu), ("model", clock.model_s)):
                    samples[server][key].append(value)
                outputs[server] = out
                if course:
                    counts[server] = {"prompt_tokens_computed": st["prefill_tokens_computed"],
                                      "prefix_hit_tokens": st["prefix_hit_tokens"], "forwards": len(s.trace),
                                      "forward_tokens": clock.tokens, "threads": sorted(clock.threads)}
                else:
                    counts[server] = {k: st[k] for k in (
                        "prompt_tokens_computed", "prefix_hit_tokens", "forwards", "forward_tokens", "threads",
                        "default_threads", "block_sharing_used", "scores_dense", "scores_rows")}
                    samples[server]["prepare"].append(st["prepare_s"])
        load["after"] = os.getloadavg()
        solo = {s: _solo(decoder, outputs[s]) for s in servers}
    finally:
        torch.set_num_threads(previous)
    rows = []
    for server in servers:
        out, smp = outputs[server], samples[server]
        cpu_tps = [out["new_tokens"] / c for c in smp["cpu"]]
        row = {"server": server,
               "tokens_per_s": Summary.of(out["new_tokens"] / w for w in smp["wall"]).as_dict(),
               "cpu_tokens_per_s": Summary.of(cpu_tps).as_dict(),
               **{f"{k}_s": statistics.median(v) for k, v in smp.items()}, "seconds": smp,
               "new_tokens": out["new_tokens"], "prompt_tokens": out["prompt_tokens"], **counts[server],
               "agree_with_generate": _agreement(out, solo[server]), "same_as_course": None, "ratio_to_course": None,
               "ratio_to_counterpart": None}
        # each repeat's runs are taken back to back: their ratio sees the same load (bench/serving.py's rule)
        for key, other in (("ratio_to_course", "course"), ("ratio_to_counterpart", COUNTERPART.get(server))):
            if other in samples:
                row[key] = statistics.median(b / c for b, c in zip(samples[other]["cpu"], smp["cpu"]))
        if "course" in outputs:
            row["same_as_course"] = _agreement(out, outputs["course"])
        rows.append(row)
    try:
        import transformers

        version = transformers.__version__
    except ImportError:
        version = None
    return {"rows": rows, "notes": notes,
            "env": {"torch": torch.__version__, "transformers": version, "threads": threads,
                    "load_average": load, "cpu_count": os.cpu_count()},
            "config": {**workload, "repeats": repeats, "block_size": block_size, "num_blocks": num_blocks,
                       "token_budget": token_budget, "max_running": max_running, "window_size": W,
                       "checkpoint": checkpoint, "hf_sliding_window": hf_sliding_window,
                       "attn_implementation": attn_implementation}}


# the bench's section: the shipped window checkpoint (HF's block sharing cannot act), and the full-attention one
# with HF's model given no sliding window (its block sharing acts; one turn keeps every sequence within W = 256)
SECTION = {"window": dict(checkpoint="window"),
           "full": dict(checkpoint="full", turns=1, hf_sliding_window=False)}
QUICK = dict(conversations=2, turns=2, max_new_tokens=8, repeats=1)


def section(quick: bool = False) -> dict:
    """``swkv-teach bench --hf-batching``: :func:`compare` on each of :data:`SECTION` (``quick``: :data:`QUICK`)."""
    return {name: compare(**{**(QUICK if quick else {}), **kwargs}) for name, kwargs in SECTION.items()}


def section_table(result: dict) -> str:
    return "\n\n".join(table(r) for r in result.values())


def table(result: dict) -> str:
    """The comparison as plain text: a row per server, then what the counts say about why."""
    cfg, env = result["config"], result["env"]
    lines = [f"chat served four ways: {cfg['conversations']} conversations x {cfg['turns']} turns, "
             f"{cfg['max_new_tokens']} greedy tokens each, checkpoint {cfg['checkpoint']!r} (W = {cfg['window_size']})"
             f"{'' if cfg['hf_sliding_window'] else ', HF without a sliding window'}, fp32, "
             f"threads {env['threads']}, token budget {cfg['token_budget']}, blocks of {cfg['block_size']}, "
             f"<= {cfg['max_running']} requests a forward; transformers {env['transformers']} "
             f"({cfg['attn_implementation']}); medians of {cfg['repeats']}; load average "
             f"{env['load_average']['before'][0]:.2f} -> {env['load_average']['after'][0]:.2f} on "
             f"{env['cpu_count']} CPUs",
             f"{'server':<14}{'tok/s':>7}{'tok/cpu-s':>10}{'x course':>9}{'computed':>10}{'of':>6}{'hits':>6}"
             f"{'fwds':>6}{'model s':>8}{'other s':>8}  {'= generate':<11}{'= course':<10}"]
    rows = {r["server"]: r for r in result["rows"]}

    def agreement(a):
        if a is None:
            return "--"
        text = f"{a['agree']}/{a['requests']}"
        return text + (f" @{a['first_divergence']}" if a["first_divergence"] is not None else "")

    for name, r in rows.items():
        ratio = "--" if r["ratio_to_course"] is None else f"{r['ratio_to_course']:.2f}"
        lines.append(f"{name:<14}{r['tokens_per_s']['median']:>7.0f}{r['cpu_tokens_per_s']['median']:>10.0f}"
                     f"{ratio:>9}{r['prompt_tokens_computed']:>10}{r['prompt_tokens']:>6}{r['prefix_hit_tokens']:>6}"
                     f"{r['forwards']:>6}{r['model_s']:>8.2f}{r['wall_s'] - r['model_s']:>8.2f}  "
                     f"{agreement(r['agree_with_generate']):<11}{agreement(r['same_as_course']):<10}")
    lines.append("x course: CPU-time tokens/s over the course's, median of the repeats' ratios (steadier than wall "
                 "on a shared machine); computed: "
                 "prompt tokens through the model; model s: embedding in to LM head out, other s: the rest of "
                 "the wall; = generate: replies equal to Decoder.generate on the same prompt (@ first differing "
                 "position)")
    for name in ("hf", "hf+sharing"):
        r = rows.get(name)
        if r is None:
            continue
        why = []
        if (ratio := r["ratio_to_counterpart"]) is not None:
            ahead, behind = (COUNTERPART[name], name) if ratio < 1 else (name, COUNTERPART[name])
            why.append(f"{ahead} ahead of {behind} by {max(ratio, 1 / ratio):.2f}x (CPU time)")
        if name == "hf+sharing" and not r["block_sharing_used"]:
            why.append("block sharing asked for, not used (a sliding-window layer never shares blocks)")
        why.append(f"building each batch in Python (prepare_next_batch + update_batch) {r['prepare_s']:.2f} s, "
                   f"{1e3 * r['prepare_s'] / max(r['forwards'], 1):.2f} ms a forward")
        if r["scores_dense"]:
            waste = r["scores_dense"] / max(r["scores_rows"], 1)
            why.append(f"{cfg['attn_implementation']} over one dense mask per forward: {r['scores_dense']:,} scores "
                       f"for {r['scores_rows']:,} in the rows' own blocks ({waste:.1f}x)")
        lines.append(f"{name}: " + "; ".join(why))
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m swkv_teach.bench.hf_batching", description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads, here and in HF's thread")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "paged|eager"], help="HF's attention implementation")
    p.add_argument("--checkpoint", default="window", choices=["window", "full"])
    p.add_argument("--hf-full-attention", action="store_true",
                   help="HF's model without a sliding window, so its block sharing can act (every sequence must "
                        "fit the decoder's window: e.g. --checkpoint full --turns 1)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write every figure here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for name in ("conversations", "turns", "new_tokens", "repeats", "threads"):
        if getattr(args, name) < 1:
            print(f"hf_batching: --{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}", file=sys.stderr)
            return 2
    try:
        result = compare(conversations=args.conversations, turns=args.turns, max_new_tokens=args.new_tokens,
                         repeats=args.repeats, threads=args.threads, attn_implementation=args.attn,
                         checkpoint=args.checkpoint, hf_sliding_window=not args.hf_full_attention)
    except ValueError as e:
        print(f"hf_batching: {e}", file=sys.stderr)
        return 2
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
