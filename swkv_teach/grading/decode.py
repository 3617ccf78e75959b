"""Check for exercise 05: decoding through per-layer caches, built from the decoder's parts.

The learner writes ``fn(model, input_ids, caches) -> logits`` for the ``c``
new tokens ``(B, c)`` with ``model.embed``, each layer's ``attn_norm``,
``attn.qkv``, ``cache.update``, ``attn.attend``, ``mlp_norm``, ``mlp``, then
``model.norm`` and ``model.lm_head``. The expected logits are the decoder's
own oracle, :meth:`Decoder.forward` on the whole sequence (sliding-window mask,
no cache): one token at a time (window 3, 14 tokens) and prompt chunks between
single tokens (window 5, chunks longer than the window).

The graded decoder is tiny and random, but not gentle: every RMSNorm weight is
drawn from [0.5, 2] (so a norm dropped, shared or swapped changes the answer)
and the query and key projections are scaled up 8x (so attention is sharp and
a position error moves it). Each usual bug then misses by well over 10x the
tolerance (``tests/test_grading.py`` measures it).

Right logits are not enough. While the learner's code runs, ``Decoder.step``,
``score``, ``generate`` and ``forward`` are refused on the model and on its
class (``type(model).forward(model, ids)`` too; put back afterwards, even on
error); every cache must take, through ``update``, the keys and values a layer's
``qkv`` made in that call (not zeros fed to look cached); and the
``k_positions`` given to ``attend`` must name, in order, the keys ``update``
returned (a wrapped ring returns them in slot order, so sorting them or
``torch.arange(end - n, end)`` is wrong even when single-token logits match).

To name a bug, the check watches the learner's calls (:mod:`._decode_spy`):
which positions went to ``qkv`` in each layer, whether ``cache.positions`` was
read before ``update``, how many keys ``update`` got, what ``attend`` was given
and which norms ran. The most specific finding wins; otherwise it says which
layer's input first differs from the oracle's.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from swkv_teach.device import device as pick_device
from swkv_teach.grading._decode_spy import Spy, diagnose, first_difference, foreign_keys, keys_misnamed
from swkv_teach.grading._report import ExerciseFailed, call, fail, passed, rehint, show

VOCAB = 32
SCENARIOS = (  # window, chunk sizes (their sum is the sequence length)
    (3, (1,) * 14),
    (5, (6, 1, 1, 3, 1, 1, 1, 7, 1, 1)),
)
ATOL, RTOL = 1e-4, 1e-3
SHARP = 8.0  # query/key projections scaled up: sharp attention


class _Forbidden(RuntimeError):
    """Raised by model.step/score/generate during the check."""


FORBIDDEN = ("step", "score", "generate", "forward")


def _forbid(name: str):
    def refuse(*args, **kwargs):
        if name == "forward":
            raise _Forbidden("model(...) (model.forward, however called: type(model).forward too) reruns the whole "
                             "sequence without a cache, the library's oracle: build the step from the parts (embed, "
                             "layers' attn/mlp, norm, lm_head) through the caches instead.")
        raise _Forbidden(f"model.{name}() (however called: type(model).{name} too) is the library's finished answer: "
                         "build the step from the parts (embed, layers' attn/mlp, norm, lm_head) instead.")

    return refuse


@contextmanager
def _refused(model):
    """model.step/score/generate/forward refused on the instance and on its class while the learner runs."""
    cls, saved = type(model), {}
    for attr in FORBIDDEN:
        saved[attr] = cls.__dict__.get(attr, _MISSING)
        setattr(cls, attr, _forbid(attr))
    try:
        yield
    finally:
        for attr, orig in saved.items():
            if orig is _MISSING:
                delattr(cls, attr)
            else:
                setattr(cls, attr, orig)


_MISSING = object()


def make_model(W: int, dev):
    """The graded decoder for window ``W`` and its token ids (seeded; the learner's RNG stream is left alone)."""
    from swkv_teach.model import Decoder, DecoderConfig

    cfg = DecoderConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, hidden_dim=64,
                        window_size=W)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234 + W)
        model = Decoder(cfg)
        with torch.no_grad():
            qk_rows = (cfg.n_heads + cfg.n_kv_heads) * cfg.head_dim
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.uniform_(0.5, 2.0)
                elif name.endswith("qkv_proj.weight"):  # fused: query rows, then key rows, then value rows
                    p[:qk_rows].mul_(SHARP)
                elif name.endswith(("q_proj.weight", "k_proj.weight")):
                    p.mul_(SHARP)
        ids = torch.randint(0, VOCAB, (2, sum(dict(SCENARIOS)[W])))
    return model.to(dev).eval(), ids.to(dev)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=ATOL, rtol=RTOL)


def _check_output(case: str, got, exp: torch.Tensor) -> None:
    if not isinstance(got, torch.Tensor):
        raise fail(case, f"returned {show(got)} ({type(got).__name__}); expected logits, a tensor of shape "
                   f"{tuple(exp.shape)} (batch, new tokens, vocab).", hint="return lm_head(norm(x)).")
    if tuple(got.shape) != tuple(exp.shape):
        raise fail(case, f"returned shape {tuple(got.shape)}; expected {tuple(exp.shape)} "
                   "(batch, new tokens, vocab): one row of logits per new token.",
                   hint="keep every new token's row; do not take [:, -1] or squeeze.")
    if got.device != exp.device:
        raise fail(case, f"returned logits on {got.device}; the model and input_ids are on {exp.device}.")


def _through_caches(case: str, spy, c: int) -> None:
    """Every layer's cache took the ``c`` new keys in this call: a decode step runs through the caches."""
    for L, cache in enumerate(spy.caches):
        fed = sum(info["tokens"] for info in spy.kinds(L, "update"))
        if fed == 0:
            raise fail(case, f"cache {L} was never updated in this call: your step does not go through the caches.",
                       hint="without the caches a call either sees only its own tokens (right for the first call "
                       "alone) or reruns the whole prefix at O(T^2) cost. In every layer, k, v = cache.update(k, v) "
                       "over only the new tokens, attend over what it returns, positions from caches[0].seen.")


def _real_keys(case: str, spy, n_layers: int) -> None:
    """Each update got the keys and values its layer's qkv just made, and attend names them in their order."""
    found = foreign_keys(spy, n_layers) or keys_misnamed(spy, n_layers)
    if found:
        raise fail(case, "your logits are right here, but not for the right reason (found by watching your calls "
                   "to the model's parts and the caches):", hint=found)


def _integer_positions(case: str, spy, n_layers: int) -> None:
    """The positions given to ``attn.qkv`` are an integer tensor, as the statement's table asks.

    The library's RoPE happens to rotate float positions as it does integers, so the logits cannot show this; the
    rule holds because a float position is a rounded one past its dtype's exact range (float32: 2**24, bfloat16:
    256), and ``attend``'s window mask refuses float positions outright.
    """
    for L in range(n_layers):
        for info in spy.kinds(L, "qkv"):
            if not info["integer"]:
                raise fail(case, f"your logits are right here, but layer {L}'s attn.qkv was given positions of dtype "
                           f"{info['dtype']}; the table asks for a 1-D integer tensor.",
                           hint="float32 holds positions exactly only up to 2**24 (bfloat16 only to 256): past "
                           "there neighbouring tokens would be rotated alike, and attend's window mask refuses "
                           "float positions. Build them as integers: torch.arange(start, start + c, "
                           "device=input_ids.device), int64 (no dtype=torch.float, no .float()).")


def check_cached_decode(fn) -> None:
    """Exercise 05: ``fn(model, input_ids, caches)`` must give ``model.forward``'s logits, chunk by chunk."""
    dev = pick_device()
    name = getattr(fn, "__name__", "your function")
    total = 0
    for W, chunks in SCENARIOS:
        model, ids = make_model(W, dev)
        with torch.no_grad():
            expected = model(ids)  # (B, T, vocab): the oracle
            hidden = Spy.oracle_hidden(model, ids)
        for attr in FORBIDDEN:
            setattr(model, attr, _forbid(attr))
        spy = Spy(model)
        start = 0
        for n, c in enumerate(chunks):
            case = (f"{name}(model, input_ids[:, {start}:{start + c}], caches) on a tiny decoder with window_size={W} "
                    f"(call {n + 1}: {c} new token{'s' if c > 1 else ''} at positions {start}..{start + c - 1})")
            spy.begin(start, c)
            returned = False
            try:
                with torch.no_grad(), _refused(model):
                    got = call(case, f"{name}()", fn, model, ids[:, start : start + c], spy.caches)
                returned = True
                exp = expected[:, start : start + c]
                _check_output(case, got, exp)
                if not close(got, exp):
                    err = (got.float() - exp.float()).abs().amax(dim=(0, 2))  # (c,)
                    # the same per-element rule as close(): |got - exp| <= ATOL + RTOL * |exp|
                    off = ~torch.isclose(got.float(), exp.float(), atol=ATOL, rtol=RTOL)  # (B, c, vocab)
                    over = torch.nonzero(off.any(dim=2).any(dim=0)).flatten()
                    bad = int(over[0]) if len(over) else 0
                    raise fail(case, f"your logits differ from model.forward's at position {start + bad} "
                               f"(max abs difference {float(err[bad]):.3g}; each logit must be within "
                               f"{ATOL:g} + {RTOL:g} x |expected|)"
                               + ("; positions before it matched." if bad else "."),
                               hint=first_difference(spy, hidden), generic=True)
                _through_caches(case, spy, c)  # right logits, but were they computed through the caches?
                _real_keys(case, spy, len(model.layers))
                _integer_positions(case, spy, len(model.layers))
            except ExerciseFailed as e:
                if "raised _Forbidden" in str(e):
                    raise rehint(e, "the check refuses the library's finished answers and its oracle, on the model "
                                 "and on its class: x = model.embed(input_ids); per layer attn_norm, attn.qkv, "
                                 "cache.update, attn.attend, mlp_norm, mlp; then model.lm_head(model.norm(x))."
                                 ) from None
                if "build the step from the parts" in str(e) or "was never updated in this call" in str(e) or \
                        "not for the right reason" in str(e) or "logits are right here" in str(e):
                    raise  # already names the bug
                found = diagnose(spy, model, completed=returned)
                if found:
                    raise rehint(e, found, "(found by watching your calls to the model's parts and the caches)") \
                        from None
                raise
            finally:
                spy.end()
            start += c
            total += c
    passed(f"{name} reproduces model.forward through ring caches, one token at a time and in chunks longer than "
           f"the window (windows 3 and 5, {total} positions; random norm weights, sharp attention).")


__all__ = ["check_cached_decode", "make_model", "SCENARIOS"]
