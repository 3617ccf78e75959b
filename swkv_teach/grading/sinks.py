"""Check for exercise 07: ``SinkCache(num_sinks, window_size)``, the first ``num_sinks`` tokens forever plus
the last ``window_size``, in any order its ``positions`` describe.

Driven like the other cache checks (:mod:`._drive`: shapes, dtypes, zero tokens, tokens not contiguous, a
300-token bfloat16 run, live instances, memory, positions kept in an integer dtype);
compared as a set with the library's :class:`~swkv_teach.caches.SinkKVCache`, then token by token. To tell
an off-by-one in the sinks from a hard-coded number of them, the hint looks at what the cache still pins
after a dozen more updates, once the window has moved far past the sinks.
"""

from __future__ import annotations

import torch

from swkv_teach.caches import SinkKVCache
from swkv_teach.device import device as pick_device
from swkv_teach.grading._drive import (BF16, F16, F64, Judge, Run, Step, check_runs, interleave, labelled, pristine,
                                       rounded_positions, short)
from swkv_teach.grading._own import refuse_library
from swkv_teach.grading._report import call, fail, passed
from swkv_teach.grading._report import learner_name as _name
from swkv_teach.grading._tokens import as_positions, labels, read_positions, sort_labels, token, value_hint

SINK_RUNS = (
    Run((2, 3)),
    Run((1, 3)),
    Run((4, 2), (1, 1, 2), F64),
    Run((1, 1), (3, 1, 5), F16),
    Run((2, 5), (1, 4, 3), BF16),
    Run((3, 4), (3, 1, 5), zeros=True),
    Run((1, 2), zeros="runs"),  # the sink itself a zero token, then whole windows of zeros
    Run((1, 2), (1, 1, 2), steps=140),  # positions past 127, where int8 positions wrap
    Run((2, 3), (1, 2, 2), BF16, steps=300),  # a position record in the keys' dtype rounds past 256
    Run((1, 3), layout="sliced"),  # k_new = qkv[..., D:2 * D]: not contiguous
    Run((2, 2), (3, 2, 3), layout="expanded"),  # k_new = x[:1].expand(3, ...)
)
SINK_LIVE = ((1, 2), (2, 5), (3, 1), (3, 1))  # two with one shape (a memo keyed on it)


def _pinned_later(cache, s: Step, W: int, n: int = 12):
    """How many leading positions the learner's cache still holds after ``n`` more updates (its real number of
    sinks, once the window has moved far past them); None if that cannot be read."""
    b, h, _, d = s.k_new.shape
    k = None
    for p in range(s.p + 1, s.p + 1 + n):
        try:
            k, _ = cache.update(*token(p, s.k_new.dtype, s.k_new.device, (b, h, d), s.base))
        except Exception:
            return None
    if k is None:
        return None
    seen = s.p + 1 + n
    held = {x for x in labels(k, base=s.base) if isinstance(x, int) and x < seen - W}
    m = 0
    while m in held:
        m += 1
    return m if held == set(range(m)) else None


def _sink_hint(got: list, exp: list, seen: int, S: int, W: int, later: int | None = None) -> str:
    if any(isinstance(g, str) and g.startswith("v") for g in got):
        return "the keys you returned hold values: are k and v swapped somewhere?"
    if any(isinstance(g, str) and g[:1].isalpha() for g in got):
        return "tokens fed to another instance came back: state is shared between instances."
    if "0" in got and "0" not in exp:
        return "unfilled slots (zeros) came back: return only slots that hold a token."
    if len(set(map(str, got))) != len(got) and "0" not in got:
        return "the same token came back twice: each stored token once."
    g, e = set(got), set(exp)
    missing, extra = e - g, g - e
    swapped = set(range(min(W, seen))) | set(range(max(0, seen - S), seen))
    if S != W and g == swapped and later in (None, W):
        return (f"num_sinks and window_size are swapped: SinkCache({S}, {W}) should keep {S} sink(s) and a window of "
                f"{W}, and yours keeps the first {W} and the last {S}. The statement's order is SinkCache(num_sinks, "
                "window_size): def __init__(self, num_sinks, window_size).")
    if later and (later > S + 1 or later < S - 1):
        return (f"you keep the first {later} tokens as sinks, but num_sinks={S}: is the number of sinks hard-coded "
                "(StreamingLLM's 4)? Use self.num_sinks.")
    if missing & set(range(S)):
        if missing == {S - 1} and not extra - {seen - W - 1}:
            return f"off by one: you keep the first {S - 1} tokens as sinks; num_sinks={S} means positions 0..{S - 1}."
        return (f"the sinks were evicted: positions 0..{S - 1} must stay forever, whatever comes later "
                "(evict only from the window part).")
    if extra == {S} or (S in extra and seen - W != S):
        return f"off by one: you keep positions 0..{S} as sinks; num_sinks={S} means p < num_sinks, i.e. 0..{S - 1}."
    if seen - 1 in missing:
        return "the token you just added is missing: add it first, then return."
    if missing and min(missing) == max(0, seen - W) and not extra:
        return f"off by one: your window keeps W - 1 recent tokens; it should keep W = {W} (the new one included)."
    if extra and max(extra) == seen - W - 1:
        return f"off by one: your window keeps W + 1 recent tokens; it should keep W = {W}."
    return f"keep positions 0..{S - 1} (the sinks) and the last {W} positions; nothing else."


class SinkJudge(Judge):
    oracle_cls = SinkKVCache
    fresh_positions = True
    arg_names = ("num_sinks", "window_size")

    def step(self, s: Step) -> None:
        S, W = self.args
        got = labels(s.k, base=s.base)
        exp = sorted(self.oracle.positions.tolist())
        if s.zeros or not labelled(s):  # labels are not positions here: judge by the positions the cache reports
            exp_l = labels(s.ek, base=s.base)
            if sort_labels(got) != sort_labels(exp_l) or len(got) != len(exp_l):
                if not s.zeros:
                    raise fail(s.case, f"update() returned other keys than the library's sink cache after {s.p + 1} "
                               f"{short(s.k_new.dtype)} tokens (this far, a key's value cannot name its token exactly;"
                               " every shorter run passed).", expected=f"{len(exp_l)} keys", got=f"{len(got)} keys",
                               hint=f"keep positions 0..{S - 1} and the last {W}, however long the run: count tokens "
                               "with a Python int, never in a tensor of the keys' dtype.", generic=True)
                raise fail(s.case, "update() returned the keys of (any order is fine; zero tokens read as 0):",
                           expected=exp_l, got=got,
                           hint="zero is a legitimate key: keep and return tokens whose keys are all zeros like any "
                           "other (count positions, never look for zeros).")
            pos = as_positions(s.case, call(s.case, "the positions property", lambda: s.cache.positions))
        else:
            if sort_labels(got) != sort_labels(exp) or len(got) != len(exp):
                later = _pinned_later(s.cache, s, W)
                raise fail(s.case, "update() returned the keys of positions (any order is fine):",
                           expected=exp, got=got, hint=_sink_hint(got, exp, s.p + 1, S, W, later))
            pos = read_positions(s.case, s.cache)
            if pos != got:
                raise fail(s.case, "positions must list, in order, the absolute position of each key update() "
                           "returned:", expected=got, got=pos, hint="keep a position next to each slot, and report "
                           "them in the same order as the keys you return.")
        if sorted(pos) != exp or len(pos) != s.k.shape[2]:
            raise fail(s.case, "positions (sorted) after this update:", expected=exp, got=sorted(pos),
                       hint=rounded_positions(sorted(pos), exp, s.k_new.dtype)
                       or "positions[i] is the absolute position of key i of what update() returned.")
        # exact contents, token by token, whatever order the learner chose
        mine = torch.tensor([pos.index(q) for q in exp], device=s.k.device)
        theirs = torch.argsort(self.oracle.positions.to(s.ek.device))
        if not torch.equal(s.k.index_select(2, mine), s.ek.index_select(2, theirs)):
            raise fail(s.case, "the right positions, but the key tensors differ from the tokens fed in.",
                       hint="store k_new as given, without arithmetic or reshaping, and report positions in the "
                       "order of the keys.")
        if not torch.equal(s.v.index_select(2, mine), s.ev.index_select(2, theirs)):
            vgot = labels(s.v, values=True, base=s.base)
            raise fail(s.case, "the keys are right, the values are not. Value positions:", expected=got, got=vgot,
                       hint=value_hint(vgot, got, got, s.k, s.v))


def check_sink_cache(cls) -> None:
    """Exercise 07: ``SinkCache(num_sinks, window_size)``: the first ``num_sinks`` tokens forever plus the last W."""
    refuse_library("check_sink_cache", cls, SinkKVCache, "SinkCache")
    dev = pick_device()
    check_runs(SinkJudge, cls, SINK_RUNS, dev, pristine(cls))
    interleave(SinkJudge, cls, SINK_LIVE, dev)
    passed(f"{_name(cls)} keeps the sinks and the last W tokens, like the library's SinkKVCache "
           "(num_sinks, W = " + ", ".join(dict.fromkeys(f"({r.args[0]}, {r.args[1]})" for r in SINK_RUNS))
           + "; runs of 4(S + W) + 3 tokens and of 140 and 300 (bfloat16); 6 token shapes, sliced and expanded too; "
           "float32/64, float16, bfloat16; zero tokens; "
           "4 live instances; integer positions; bounded memory).")


__all__ = ["check_sink_cache"]
