"""Decode speed: swkv_teach's Decoder against Hugging Face's MistralForCausalLM, same weights.

A tiny random ``MistralConfig`` is built here (nothing is downloaded), the
Decoder copies its weights with ``Decoder.from_hf``, and both decode greedily
after a prompt of ``W`` tokens, so every timed step runs with a full window.
Both sides are manual loops (one token in, argmax out) so neither pays for
``generate``'s bookkeeping; Hugging Face uses its own cache
(``DynamicCache(config=...)``, i.e. ``DynamicSlidingWindowLayer``).
Hugging Face's attention implementation is recorded per row (``sdpa`` by default).
"""

from __future__ import annotations

import importlib.util
import inspect
from typing import Callable

import torch

from swkv_teach.bench.measure import Summary, synchronize, time_us_interleaved

TINY = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
)


def unavailable() -> str | None:
    """Why the decode comparison cannot run here, or None when it can."""
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed (pip install 'swkv-teach[hf]')"
    if importlib.util.find_spec("swkv_teach.hf") is None:
        return "swkv_teach.hf (Decoder.from_hf) is not available yet"
    return None


def _models(W: int, dtype: torch.dtype, device: torch.device):
    from transformers import MistralConfig, MistralForCausalLM

    from swkv_teach.model import Decoder

    torch.manual_seed(0)
    config = MistralConfig(**TINY, sliding_window=W, max_position_embeddings=1 << 20)
    hf = MistralForCausalLM(config).to(device=device, dtype=dtype).eval()
    ours = Decoder.from_hf(hf).to(device=device, dtype=dtype).eval()
    return config, hf, ours


def _loops(W: int, hf, ours, config, prompt: torch.Tensor) -> dict[str, tuple[Callable[[], object], list]]:
    """Per implementation: a ``step()`` that decodes one greedy token, and the list of tokens it produced."""
    from transformers import DynamicCache

    loops = {}
    for kind in ("ring", "naive"):
        caches = ours.new_caches(kind, window_size=W)
        state = {"next": ours.step(prompt, caches)[:, -1:].argmax(-1), "tokens": []}

        def step(caches=caches, state=state):
            state["next"] = ours.step(state["next"], caches)[:, -1].argmax(-1, keepdim=True)
            state["tokens"].append(state["next"])

        loops[f"swkv_{kind}"] = (step, state["tokens"])

    cache = DynamicCache(config=config)
    # transformers 5.x names the argument ``cache``; 4.x called it ``past_key_values``
    arg = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    out = hf(input_ids=prompt, use_cache=True, **{arg: cache})
    hf_state = {"next": out.logits[:, -1:].argmax(-1), "tokens": []}

    def hf_step():
        logits = hf(input_ids=hf_state["next"], use_cache=True, **{arg: cache}).logits
        hf_state["next"] = logits[:, -1].argmax(-1, keepdim=True)
        hf_state["tokens"].append(hf_state["next"])

    loops["hf_mistral"] = (hf_step, hf_state["tokens"])
    return loops


def decode_rows(
    W: int, dtype: torch.dtype, device: torch.device, steps: int, repeats: int, batch: int = 1
) -> list[dict]:
    """Tokens per second of each implementation at window ``W`` (prompt of ``W`` tokens, then ``steps`` per repeat).

    ``same_tokens`` says whether the implementation's greedy tokens matched Hugging Face's on every
    timed step (they should: same weights, same window rule; float noise may flip a near-tie).
    """
    config, hf, ours = _models(W, dtype, device)
    g = torch.Generator().manual_seed(W)
    prompt = torch.randint(0, config.vocab_size, (batch, W), generator=g).to(device)
    rows = []
    with torch.inference_mode():
        loops = _loops(W, hf, ours, config, prompt)
        for step, _ in loops.values():
            step()  # warm-up: first single-token step
        synchronize(device)
        times = time_us_interleaved({name: (step, steps) for name, (step, _) in loops.items()}, device, repeats)
        hf_tokens = torch.cat(loops["hf_mistral"][1], dim=1)
        for name, (_, tokens) in loops.items():
            us = times[name]
            tps = Summary(1e6 / us.median, 1e6 / us.max, 1e6 / us.min, [1e6 / s for s in us.samples])
            rows.append({
                "window": W, "impl": name, "us_per_token": us.as_dict(), "tokens_per_s": tps.as_dict(),
                "same_tokens": bool(torch.equal(torch.cat(tokens, dim=1), hf_tokens)),
                "steps": steps, "prompt_tokens": W,
                "attn_implementation": getattr(config, "_attn_implementation", None),
            })
    hf_tps = next(r["tokens_per_s"]["median"] for r in rows if r["impl"] == "hf_mistral")
    for r in rows:
        r["ratio_to_hf"] = r["tokens_per_s"]["median"] / hf_tps
    return rows
