"""Check for exercise 06: decoding through per-layer caches, built from the decoder's parts.

The learner writes ``fn(model, input_ids, caches) -> logits`` for the ``c``
new tokens ``(B, c)`` with ``model.embed``, each layer's ``attn_norm``,
``attn.qkv``, ``cache.update``, ``attn.attend``, ``mlp_norm``, ``mlp``, then
``model.norm`` and ``model.lm_head``. The expected logits are the decoder's
own oracle, :meth:`Decoder.forward` on the whole sequence (sliding-window mask,
no cache), on a tiny random decoder: one token at a time (window 3, long past
the point where the cache is full) and a prompt chunk followed by single tokens
(window 5, so the chunk's queries need the window's mask).

When logits differ, two wrong variants are computed from the library to name
the bug: RoPE positions from ``len(cache)`` (via ``Decoder.step`` over caches
whose ``seen`` reports ``len``) and attention without the window
(``forward`` with a huge window).
"""

from __future__ import annotations

import torch

from swkv_teach.device import device as pick_device
from swkv_teach.grading._report import call, fail, passed, show

VOCAB = 32
SCENARIOS = (  # window, chunk sizes (their sum is the sequence length)
    (3, (1,) * 10),
    (5, (6, 1, 1, 3, 1, 1, 1)),
)
ATOL, RTOL = 1e-4, 1e-3


class _Forbidden(RuntimeError):
    pass


def _forbid(name: str):
    def refuse(*args, **kwargs):
        raise _Forbidden(f"model.{name}() is the library's finished answer: build the step from the parts "
                         "(embed, layers' attn/mlp, norm, lm_head) instead.")

    return refuse


class _LenAsSeen:
    """A cache whose ``seen`` is ``len(cache)``: the classic RoPE bug, reproduced with the library's own step."""

    def __init__(self, inner):
        self.inner = inner

    def update(self, k, v):
        return self.inner.update(k, v)

    @property
    def positions(self):
        return self.inner.positions

    @property
    def seen(self):
        return len(self.inner)


def _model(W: int, dev):
    from swkv_teach.model import Decoder, DecoderConfig

    cfg = DecoderConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, hidden_dim=64,
                        window_size=W)
    with torch.random.fork_rng(devices=[]):  # leave the learner's RNG stream alone
        torch.manual_seed(1234 + W)
        model = Decoder(cfg)
        ids = torch.randint(0, VOCAB, (2, sum(dict(SCENARIOS)[W])))
    return model.to(dev).eval(), ids.to(dev)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=ATOL, rtol=RTOL)


def _variants(model, ids, chunks, upto: int) -> dict:
    """Logits of the usual wrong answers for chunks 0..upto, for the diagnosis."""
    from swkv_teach.model import Decoder

    out = {}
    with torch.no_grad():
        caches = [_LenAsSeen(c) for c in model.new_caches("ring")]
        start, parts = 0, []
        for c in chunks[: upto + 1]:
            parts.append(Decoder.step(model, ids[:, start : start + c], caches))
            start += c
        out["len"] = parts[-1]
        out["nowindow"] = Decoder.forward(model, ids[:, :start], window_size=10**6)[:, start - chunks[upto] :]
        out["alone"] = Decoder.forward(model, ids[:, start - chunks[upto] : start])
    return out


def _hint(got: torch.Tensor, variants: dict, first_bad: int, W: int) -> str:
    if _close(got, variants["len"]):
        return ("your logits are what RoPE positions from len(cache) give: once the window is full, len(cache) "
                "stops at W while positions keep growing. Take positions from cache.seen (read before the update).")
    if _close(got, variants["nowindow"]):
        return ("your queries attend to keys outside the window: pass q_positions and cache.positions to "
                "attn.attend and let it mask with the window (i - W < j <= i).")
    if _close(got, variants["alone"]):
        return ("each call is computed as if it were the start of the sequence: positions must start at "
                "caches[0].seen, and keys must go through cache.update so earlier tokens are seen.")
    if first_bad < W:
        return ("already wrong before the window is full: check the order: embed; per layer h = x; "
                "q, k, v = attn.qkv(attn_norm(x), positions); k, v = cache.update(k, v); "
                "x = x + attn.attend(q, k, v, positions, cache.positions); x = x + mlp(mlp_norm(x)); "
                "then lm_head(norm(x)).")
    return ("right at first, wrong later: are the positions absolute (from cache.seen, before update) for both "
            "RoPE and the mask?")


def check_cached_decode(fn) -> None:
    """Exercise 06: ``fn(model, input_ids, caches)`` must give ``model.forward``'s logits, chunk by chunk."""
    dev = pick_device()
    name = getattr(fn, "__name__", "your function")
    total = 0
    for W, chunks in SCENARIOS:
        model, ids = _model(W, dev)
        with torch.no_grad():
            expected = model(ids)  # (B, T, vocab): the oracle
        for attr in ("step", "score", "generate"):
            setattr(model, attr, _forbid(attr))
        caches = model.new_caches("ring")
        start = 0
        for n, c in enumerate(chunks):
            case = (f"{name}(model, input_ids[:, {start}:{start + c}], caches) on a tiny decoder with window_size={W} "
                    f"(call {n + 1}: {c} new token{'s' if c > 1 else ''} at positions {start}..{start + c - 1})")
            with torch.no_grad():
                got = call(case, f"{name}()", fn, model, ids[:, start : start + c], caches)
            exp = expected[:, start : start + c]
            if not isinstance(got, torch.Tensor):
                raise fail(case, f"returned {show(got)} ({type(got).__name__}); expected logits, a tensor of shape "
                           f"{tuple(exp.shape)} (batch, new tokens, vocab).", hint="return lm_head(norm(x)).")
            if tuple(got.shape) != tuple(exp.shape):
                raise fail(case, f"returned shape {tuple(got.shape)}; expected {tuple(exp.shape)} "
                           "(batch, new tokens, vocab): one row of logits per new token.",
                           hint="keep every new token's row; do not take [:, -1] or squeeze.")
            if got.device != exp.device:
                raise fail(case, f"returned logits on {got.device}; the model and input_ids are on {exp.device}.")
            err = (got.float() - exp.float()).abs().amax(dim=(0, 2))  # (c,)
            if not _close(got, exp):
                over = torch.nonzero(err > ATOL + RTOL * exp.float().abs().amax()).flatten()
                bad = int(over[0]) if len(over) else 0
                v = _variants(model, ids, chunks, n)
                raise fail(case, f"your logits differ from model.forward's at position {start + bad} "
                           f"(max abs difference {float(err[bad]):.3g}); positions before it matched.",
                           hint=_hint(got, v, start + bad, W))
            start += c
            total += c
    passed(f"{name} reproduces model.forward through ring caches, one token at a time and in chunks "
           f"(windows 3 and 5, {total} positions).")


__all__ = ["check_cached_decode"]
