"""Checks for the cache exercises: 02 sliding window and 03 ring buffer (07, attention sinks, is in :mod:`.sinks`).

Each compares what the learner's ``update`` returns with the library's own cache
of the same kind (the oracle), exactly, step by step, over the runs of
:mod:`._drive`: windows 1, 2, 3, 4, 5, 8, runs of ``4W + 3`` tokens (so ``W - 1``,
``W``, ``W + 1`` and long after are crossed), token shapes with ``batch != heads``,
one head, batch 1 and a distinct head_dim, float32/float64/float16/bfloat16, all-zero
keys and values, tokens sliced and expanded (not contiguous), for the ring a 300-token bfloat16
run (positions past 256), then several live instances side by side; at every step the
caller's tensors stay untouched and the memory the cache keeps stays bounded.
The hints below name the bug from the labels of the tokens returned
(see :mod:`._tokens`), the most specific diagnosis first.
"""

from __future__ import annotations

import torch

from swkv_teach.caches import RingBufferKVCache, SlidingWindowKVCache
from swkv_teach.device import device as pick_device
from swkv_teach.grading._own import refuse_library
from swkv_teach.grading._drive import (BF16, F16, F64, SHAPE0, Judge, Run, Step, check_runs, interleave, make, pristine,
                                       labelled, rounded_positions, shared_state, short)
from swkv_teach.grading._report import ExerciseFailed, call, fail, passed, rehint
from swkv_teach.grading._report import learner_name as _name
from swkv_teach.grading._tokens import (as_positions, check_kind, labels, read_positions, sort_labels, token, unpack_kv,
                                        value_hint)
from swkv_teach.grading.sinks import check_sink_cache  # re-exported: exercise 07's check, long imported from here


SLIDING_RUNS = (
    Run((3,)),  # the problem statement's window first: a window hard-coded to 3 then shows up at 5
    Run((5,)),
    Run((1,)),
    Run((2,), (1, 1, 2), F64),  # batch 1, one head
    Run((8,), (3, 1, 5), F16),  # one head, batch 3
    Run((4,), (1, 4, 3), BF16),  # batch 1
    Run((3,), (2, 2, 3)),  # batch == heads > 1: batch and heads swapped (same shape) shows only in the data
    Run((3,), (3, 1, 5), zeros=True),
    Run((2,), SHAPE0, BF16, zeros=True),
    Run((1,), zeros="runs"),  # a zero first token, then windows of nothing but zeros
    Run((3,), (1, 2, 2), zeros="runs"),
    Run((2,), (1, 1, 2), steps=140),  # positions past 127, where int8 positions wrap
    Run((3,), layout="sliced"),  # k_new = qkv[..., D:2 * D], as a fused projection gives it: not contiguous
    Run((2,), (3, 2, 3), layout="expanded"),  # k_new = x[:1].expand(3, ...): one memory row for the whole batch
)
LIVE = ((2,), (5,), (3,), (3,))  # instances alive together, two with one window (a memo keyed on it)


def _shown(runs) -> str:
    ws = sorted({r.args[-1] for r in runs})
    return ", ".join(map(str, ws))


# ---------------------------------------------------------------- sliding: diagnosis
def _counts_hint(n: int, W: int, more: list) -> str | None:
    """Name the bug from how many tokens the cache returns now (``n``) and on the next updates (``more``)."""
    if not more:
        return None
    seq = [n] + more
    if any(m == W for m in seq) and any(m == W + 1 for m in seq) and all(m in (W, W + 1) for m in seq):
        return (f"your cache trims only every other step: it returns {seq} tokens on consecutive updates. Evict "
                f"at every update: after appending, keep the last window_size (here {W}) whenever shape[2] > W.")
    if all(b < a for a, b in zip(seq, seq[1:])) or (seq[-1] < seq[0] and seq[-1] < W):
        return (f"your cache shrinks from step to step ({seq} tokens on consecutive updates): you slice with a "
                "counter of all tokens seen (like self.n - W) on a tensor that only holds the window. Slice "
                "relative to its own length: self.k[:, :, -self.window_size:].")
    if all(m > n for m in more):
        return ("nothing is evicted: after appending, keep only the last window_size tokens (slice [-W:] on dim 2). "
                "Count tokens with k.shape[2]: len(k) is the batch and shape[-1] the head_dim; and with W = 1, "
                "[-(W - 1):] is [-0:], the whole tensor.")
    return None


ZERO_HINT = ("tokens whose keys and values are all zeros were left out: zero is a legitimate key. Count the tokens "
             "written (seen, or shape[2]) instead of looking for zero slots.")


def _dropped_zeros(got: list, exp: list) -> bool:
    return len(got) < len(exp) and [g for g in got if g != "0"] == [e for e in exp if e != "0"]


def _hard_coded(n: int, W: int) -> str:
    return f"your cache keeps {n} tokens but window_size is {W}: is the window hard-coded? Use self.window_size."


def _window_hint(got: list, exp: list, seen: int, W: int, more: list, zeros: bool = False) -> tuple[str, bool]:
    """Why a sliding-window cache returned ``got`` instead of ``exp`` after ``seen`` tokens; (hint, generic).

    ``more``: how many tokens the learner's cache returned on the next updates; ``zeros``: odd tokens are zeros.
    """
    n = len(got)
    history = list(range(seen))
    if zeros and _dropped_zeros(got, exp):
        return ZERO_HINT, False
    if any(isinstance(g, str) and g.startswith("v") for g in got):
        return "the keys you returned hold values: are k and v swapped somewhere (store, cat or return)?", False
    if any(isinstance(g, str) and g[:1].isalpha() for g in got):
        return "tokens fed to another instance came back: state is shared between instances.", False
    if "0" in got and "0" not in exp:
        return "zeros came back where keys should be: only return slots that were written.", False
    if seen - 1 not in got and got == history[:n] and more and more[0] == n:
        return "you kept the oldest tokens and dropped the newest: evict from the front (keep [-W:], not [:W]).", False
    if got == list(range(max(0, seen - 1 - W), seen - 1)) and seen - 1 not in got:
        return ("you returned the cache as it was before this update: add the new token first, then return "
                "the updated tensors."), False
    if sort_labels(got) == sort_labels(exp) and got != exp:
        if got and got[0] == seen - 1:
            return "newest first: you are prepending. Append at the end, torch.cat([self.k, k_new], dim=2).", False
        return "the right tokens in the wrong order: keep them chronological, oldest first.", False
    counted = _counts_hint(n, W, more)
    if counted and (n > len(exp) or n < len(exp)):
        return counted, False
    if n > len(exp) and got == history[-n:]:
        if n == W + 1:
            return (f"off by one: update returned W + 1 = {n} tokens; the window holds exactly W = {W}, so the "
                    "new query would see key i - W. Either the cache keeps W + 1 (evict when shape[2] > "
                    "window_size, then keep [-window_size:]) or it returns the appended tensors before evicting "
                    "(evict first, then return self.k, self.v)."), False
        return _hard_coded(n, W), False
    if n < len(exp) and (n == 0 or got == history[-n:]):
        if n == W - 1:
            return (f"off by one: you keep W - 1 = {n} tokens; the window holds exactly W = {W}, the new token "
                    "included (i - W < j <= i)."), False
        return _hard_coded(n, W), False
    if seen - 1 not in got and got == history[:n]:
        return "you kept the oldest tokens and dropped the newest: evict from the front (keep [-W:], not [:W]).", False
    if seen - 1 not in got:
        return "the token you just added is missing: the new token is always part of the window.", False
    return "compare the two lists above: which tokens should be evicted, and which kept?", True


def _changed_hint(k: torch.Tensor, ek: torch.Tensor) -> str:
    """Why the right tokens came back with other numbers."""
    if k.shape == ek.shape and k.shape[0] == k.shape[1] > 1 and torch.equal(k.transpose(0, 1), ek):
        B, H, T, D = k.shape
        return (f"batch and heads are swapped: with tokens ({B}, {H}, 1, {D}), batch == heads, the shape cannot "
                "show it, but the data moved (a reshape to (heads, batch, ...) and a transpose?). Keep k_new's "
                "(batch, heads, tokens, head_dim) layout as given: torch.cat along dim 2 needs no reshape.")
    return "store k_new as given (no arithmetic, no re-ordering of batch, heads or dims)."


def _lookahead(cache, start: int, s: Step, run_shape, n: int = 4) -> list:
    """How many tokens the learner's cache returns on ``n`` more updates (a diagnosis aid; failures ignored)."""
    counts = []
    b, h, _, d = s.k_new.shape
    for p in range(start, start + n):
        try:
            k, _ = cache.update(*token(p, s.k_new.dtype, s.k_new.device, (b, h, d), s.base))
            counts.append(int(k.shape[2]))
        except Exception:
            break
    return counts


def _compare_values(s: Step, k_labels: list, what: str = "Value positions:") -> None:
    if not torch.equal(s.v, s.ev):
        vgot, vexp = labels(s.v, values=True, base=s.base), labels(s.ev, values=True, base=s.base)
        raise fail(s.case, f"the keys are right, the values are not. {what}", expected=vexp, got=vgot,
                   hint=value_hint(vgot, k_labels, vexp, s.k, s.v))


class SlidingJudge(Judge):
    oracle_cls = SlidingWindowKVCache
    arg_names = ("window_size",)

    def step(self, s: Step) -> None:
        W = self.args[0]
        if not torch.equal(s.k, s.ek):
            got, exp = labels(s.k, base=s.base), labels(s.ek, base=s.base)
            if got == exp:
                raise fail(s.case, "update() returned the right tokens, but their numbers changed.",
                           hint=_changed_hint(s.k, s.ek))
            more = _lookahead(s.cache, s.p + 1, s, None)
            hint, generic = _window_hint(got, exp, s.p + 1, W, more, s.zeros)
            zeros = ["(zero tokens in this run are all zeros and read as 0)"] if s.zeros else []
            raise fail(s.case, "update() returned the keys of positions (left) vs expected (right):", *zeros,
                       expected=exp, got=got, hint=hint, generic=generic)
        _compare_values(s, labels(s.k, base=s.base))


def _first_example(cls, dev) -> None:
    """The problem statement's doctest: window 3, one (1, 2, 1, 4) token in, the same shape out."""
    case = f"the problem's example: {_name(cls)}(window_size=3), first update of a (1, 2, 1, 4) token"
    cache = make(case, cls, 3)
    gen = torch.Generator().manual_seed(0)
    k1 = torch.randn(1, 2, 1, 4, generator=gen).to(dev)
    v1 = torch.randn(1, 2, 1, 4, generator=gen).to(dev)
    k, v = unpack_kv(case, call(case, "update()", cache.update, k1, v1))
    if k.shape == v.shape and torch.equal(k, v):
        raise fail(case, "update() returned the same tensor as keys and as values: your values equal your keys.",
                   hint="values equal keys: return the cached values second (`return self.k, self.v`, "
                   "not `return self.k, self.k`).")
    if k.shape == v1.shape and torch.equal(k, v1) and torch.equal(v, k1):
        raise fail(case, "update() returned (v, k): the keys came back as values and the values as keys.",
                   hint="k and v are swapped somewhere (store, cat or return): return self.k, self.v.")
    if k.dim() < 4 and [d for d in k.shape if d != 1] == [2, 4]:
        raise fail(case, "the first update should return exactly the token that came in:",
                   expected="shape (1, 2, 1, 4), equal to k1/v1", got=f"shape {tuple(k.shape)}",
                   hint="dims of size 1 went missing: squeeze() drops the batch of 1 (and the token dim), and "
                   "stacking the squeezed tokens cannot put them back. Keep k_new 4-D, (batch, heads, 1, "
                   "head_dim), and join tokens with torch.cat(..., dim=2).")
    if tuple(k.shape) != (1, 2, 1, 4) or not torch.equal(k, k1) or not torch.equal(v, v1):
        raise fail(case, "the first update should return exactly the token that came in:",
                   expected="shape (1, 2, 1, 4), equal to k1/v1",
                   got=f"shape {tuple(k.shape)}, keys equal: {torch.equal(k, k1) if k.shape == k1.shape else False}",
                   hint="on the first call there is nothing to concatenate onto: self.k, self.v = k_new, v_new.")


def _example_isolate(e: ExerciseFailed, cls, snapshot, dev) -> ExerciseFailed:
    """The example failed after a plain run passed: shared state, or the example's batch-1 shape."""
    shared = shared_state(cls, (3,), dev)
    if shared:
        return rehint(e, "state is shared between instances. " + shared,
                      "(two fresh instances, each given two tokens, were looked at side by side)")
    fresh = pristine(snapshot) if snapshot is not None else None
    if fresh is not None:
        try:
            _first_example(fresh, dev)
            return rehint(e, "state is shared between instances: on a fresh copy of your class this example passes, "
                          "but it fails after an earlier instance was used. Keep all state on self, assigned in "
                          "__init__, not in class attributes such as `ks = []` at class level.")
        except Exception:
            pass
    if getattr(e, "generic", False):
        return rehint(e, "with the problem's tokens of shape (1, 2, 1, 4) (batch 1) it fails, while tokens "
                      "(2, 3, 1, 4) passed: something assumes a shape. squeeze() drops batch 1 or a single head; "
                      "take B, H, _, D = k_new.shape and keep the 4-D layout.")
    return e


def check_sliding_window_cache(cls) -> None:
    """Exercise 02: the problem statement's ``SlidingWindowKVCache(window_size)`` with ``update(k_new, v_new)``."""
    refuse_library("check_sliding_window_cache", cls, SlidingWindowKVCache, "SlidingWindowKVCache")
    dev = pick_device()
    snapshot = pristine(cls)
    check_runs(SlidingJudge, cls, SLIDING_RUNS[:1], dev)  # the first instance, alone
    try:
        _first_example(cls, dev)
    except ExerciseFailed as e:
        raise _example_isolate(e, cls, snapshot, dev) from None
    check_runs(SlidingJudge, cls, SLIDING_RUNS[1:], dev, snapshot, earlier=True)
    interleave(SlidingJudge, cls, LIVE, dev)
    passed(f"{_name(cls)} keeps exactly the last W tokens, like the library's SlidingWindowKVCache "
           f"(W = {_shown(SLIDING_RUNS)}; runs of 4W + 3 tokens and one of 140; "
           f"{len({r.shape for r in SLIDING_RUNS})} token shapes, sliced and expanded too; float32/64, float16, "
           "bfloat16; "
           "zero tokens, alone and in runs; 4 live instances; bounded memory).")


# ---------------------------------------------------------------- ring
# A long conversation in bfloat16: a position record kept in the keys' dtype rounds past 256 (float16's past
# 2048 and float32's past 2**24 are named from the record itself, see _drive.float_positions). Tokens this far
# are not labelled exactly (a label is the key's value): the ring is judged against the library's ring tensor
# for tensor, and its positions as integers.
LONG_HALF = (Run((2,), (1, 1, 2), BF16, steps=300),)
RING_RUNS = SLIDING_RUNS + LONG_HALF


class _Slot(str):
    """A label shown bare in a message: ``<empty>`` rather than ``'0'`` for an all-zero slot."""

    def __repr__(self) -> str:
        return str(self)


def _slots(got: list, zeros: bool) -> list:
    """Labels for display: an all-zero slot reads ``<empty>`` (``<zeros>`` in a run whose odd tokens are zeros,
    where it may be a zero token or an unfilled slot)."""
    return [_Slot("<zeros>" if zeros else "<empty>") if g == "0" else g for g in got]


def _ring_hint(got: list, exp: list, seen: int, W: int, zeros: bool) -> tuple[str, bool]:
    if any(isinstance(g, str) and g.startswith("v") for g in got):
        return "the keys you returned hold values: are k and v swapped somewhere?", False
    if any(isinstance(g, str) and g[:1].isalpha() for g in got):
        return "tokens fed to another instance came back: state is shared between instances.", False
    if zeros and _dropped_zeros(got, exp):
        return ZERO_HINT, False
    if len(got) == len(exp) - 1 and got == exp[: len(got)] and seen <= W:
        return ("the slot you just wrote is missing: you sliced with the count from before this update. "
                "Increment seen first, then return k_buf[:, :, :min(seen, W)]."), False
    if "0" in got and "0" not in exp and len(got) > len(exp):
        return ("unfilled slots came back (<empty>, all zeros): before the buffer is full, return only the filled "
                "slots, k_buf[:, :, :seen]; zero keys would still take attention weight."), False
    if sort_labels(got) == sort_labels(exp):
        if got == sorted(exp, key=lambda x: (isinstance(x, str), x if isinstance(x, int) else 0)):
            return ("you returned the tokens in chronological order; a ring buffer returns its slots in slot "
                    "order (token p lives in slot p % W) without moving anything: no roll, no cat."), False
        return "the right tokens in the wrong slots: token p belongs in slot p % window_size.", False
    if seen - 1 not in got and len(got) == len(exp):
        return "the token you just wrote is missing: write it first, then return the buffer.", False
    return "token p belongs in slot p % window_size; compare the slot contents above.", True


def _slot_shift(cls, dev) -> tuple[int, list] | None:
    """``(d, slots)`` when a fresh ``cls(4)`` writes token ``p`` into slot ``(p + d) % 4`` (d != 0), seen after
    9 tokens (``slots``: the tokens its slots then hold)."""
    try:
        cache, W = cls(4), 4
        for p in range(9):
            k, _ = cache.update(*token(p, device=dev))
        got = labels(k)
    except Exception:
        return None
    if len(got) != W or not all(isinstance(x, int) for x in got):
        return None
    shifts = {(s - x) % W for s, x in enumerate(got)}
    return (shifts.pop(), got) if len(shifts) == 1 and shifts != {0} else None


class RingJudge(Judge):
    oracle_cls = RingBufferKVCache
    fresh_positions = True
    arg_names = ("window_size",)

    def __init__(self, cls, args):
        super().__init__(cls, args)
        self.ptr = None

    def step(self, s: Step) -> None:
        W = self.args[0]
        if not torch.equal(s.k, s.ek):
            if not labelled(s):
                raise fail(s.case, f"update() returned other keys than the library's ring after {s.p + 1} "
                           f"{short(s.k_new.dtype)} tokens (this far, a key's value cannot name its token exactly; "
                           "every shorter run passed).", hint="token p belongs in slot p % window_size, whatever "
                           "the dtype and however long the run: count tokens with a Python int, never in a tensor "
                           "of the keys' dtype.", generic=True)
            got, exp = labels(s.k, base=s.base), labels(s.ek, base=s.base)
            hint, generic = _ring_hint(got, exp, s.p + 1, W, s.zeros) if got != exp else (
                "the right tokens, but their numbers changed: " + _changed_hint(s.k, s.ek), False)
            shifted = _slot_shift(self.cls, s.k_new.device) if generic or "just wrote" in hint else None
            if shifted:
                d, slots = shifted
                hint, generic = (f"token p landed in slot (p + {d}) % W, not p % W (with W = 4, after tokens 0..8 "
                                 f"the slots held {slots}, expected [8, 5, 6, 7]): is the slot computed after seen "
                                 "was incremented? Write into slot seen % W first, then add 1 to seen."), False
            zeros = ["(some tokens are all zeros in this run: a slot of zeros reads <zeros>, whether it holds a zero "
                     "token or was never written)"] if s.zeros else []
            if not s.zeros and "0" in got + exp:
                zeros = ["(<empty>: a slot that holds all zeros, i.e. was never written)"]
            raise fail(s.case, "update() returned, slot by slot, the keys of positions:", *zeros,
                       expected=_slots(exp, s.zeros), got=_slots(got, s.zeros), hint=hint, generic=generic)
        _compare_values(s, labels(s.k, base=s.base), "Value positions, slot by slot:")
        got_pos, exp_pos = read_positions(s.case, s.cache), self.oracle.positions.tolist()
        if got_pos != exp_pos:
            hint, generic = "positions[i] must be the absolute position of key i of what update() just returned.", True
            if got_pos == sorted(exp_pos):
                hint, generic = ("positions is chronological but your keys come in slot order: report them in slot "
                                 "order."), False
            elif rounded_positions(got_pos, exp_pos, s.k_new.dtype):
                hint, generic = rounded_positions(got_pos, exp_pos, s.k_new.dtype), False
            raise fail(s.case, "positions after this update:", expected=exp_pos, got=got_pos, hint=hint,
                       generic=generic)
        self._ordered(s)
        if s.p + 1 >= W:
            now = (s.k.data_ptr(), s.v.data_ptr())
            if self.ptr is None:
                self.ptr = now
            elif now != self.ptr:
                raise fail(s.case, "once the buffer is full, update() returned tensors in new memory "
                           "(their data_ptr() changed since the buffer filled up).",
                           hint="a ring buffer allocates once and writes each token in place into slot p % W "
                           "(k_buf[:, :, slot] = k_new[:, :, 0], or copy_); return the buffer itself, not a "
                           "torch.cat, clone or new tensor.")

    def _ordered(self, s: Step) -> None:
        ok, ov = unpack_kv(s.case, call(s.case, "ordered()", lambda: s.cache.ordered()), what="ordered()")
        self.changed_since(s)
        eok, eov = self.oracle.ordered()
        check_kind(s.case, ok, ov, s.k_new, what="ordered()")
        if not (torch.equal(ok, eok) and torch.equal(ov, eov)):
            keys_right = torch.equal(ok, eok)
            what, t, et = ("values", ov, eov) if keys_right else ("keys", ok, eok)
            got_o = labels(t, values=keys_right, base=s.base)
            hint = "sort the slots by the position each holds (index_select with argsort of positions)."
            if keys_right:
                hint = ("the keys are right, the values are not: put the values through the same index_select "
                        "as the keys (v_buf.index_select(2, order)).")
            elif "0" in got_o and not s.zeros:
                hint = ("ordered() returned an unwritten (zero) slot: is token p written into slot p % W, and does "
                        "ordered() read the slots that positions describes?")
            raise fail(s.case, f"ordered() should return the stored {what} chronologically, oldest first "
                       f"({what} of positions):", hint=hint, got=_slots(got_o, s.zeros),
                       expected=_slots(labels(et, values=keys_right, base=s.base), s.zeros))
        for name, t, buf in (("keys", ok, s.k), ("values", ov, s.v)):
            if t.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr():
                raise fail(s.case, f"ordered() returned {name} that share memory with the buffer update() returns: "
                           "a view, not a copy. The next update would change what the caller holds.", hint=_COPY)
        self.prev = (s.p, ok, ok.clone(), ov, ov.clone())

    def changed_since(self, s: Step) -> None:
        """What ordered() returned at the previous step must not have changed with this update and ordered()."""
        if getattr(self, "prev", None) is None:
            return
        p, ok, ok0, ov, ov0 = self.prev
        if not (torch.equal(ok, ok0) and torch.equal(ov, ov0)):
            raise fail(s.case, f"the tensors ordered() returned after step {p + 1} changed when update() was called "
                       "again (and ordered() after it): they are a view of something your cache writes into, not "
                       "a copy.", hint=_COPY)


_COPY = ("ordered() must return a copy: index_select (or .clone()) makes new memory; slicing, narrow, permute or "
         "returning the buffer itself do not.")


def check_ring_buffer_cache(cls) -> None:
    """Exercise 03: ``RingBufferKVCache(window_size)``: one-token ``update`` in slot order, ``positions``,
    ``ordered()``."""
    refuse_library("check_ring_buffer_cache", cls, RingBufferKVCache, "RingBufferKVCache")
    dev = pick_device()
    check_runs(RingJudge, cls, RING_RUNS, dev, pristine(cls))
    interleave(RingJudge, cls, LIVE, dev)
    passed(f"{_name(cls)} matches the library's RingBufferKVCache slot for slot (W = {_shown(RING_RUNS)}; "
           f"{len({r.shape for r in RING_RUNS})} token shapes, sliced and expanded too; float32/64, float16, bfloat16; "
           "zero tokens, alone and "
           "in runs; runs of 140 and 300 (bfloat16) tokens; 4 live instances), with integer positions, "
           "ordered() as a copy, no allocation once full and bounded memory.")


__all__ = ["as_positions", "check_ring_buffer_cache", "check_sink_cache", "check_sliding_window_cache"]
