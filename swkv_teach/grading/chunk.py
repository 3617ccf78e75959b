"""Check for exercise 04, the chunk contract: ``chunk_mask(q_positions, k_positions, window_size)``.

After a multi-token update a cache returns its keys in *its* order (a ring's slot order, the
``W - 1`` stored keys then the chunk, ...) together with ``positions``; the chunk's queries must
be masked from those positions alone. The expected mask is the library's
:func:`swkv_teach.masks.window_mask` with no sinks: query ``p`` sees key ``s`` iff
``p - W < s <= p``.

Cases, smallest window first so the first failure prints whole:

1. *a cache's chunks*: the library's ``SlidingWindowKVCache`` and ``RingBufferKVCache`` fed chunks
   of 1 to ``W + 3`` tokens until at least ``max(4W, 24)`` tokens are seen, ``W = 1..9``; queries
   are the chunk's positions, keys the cache's ``positions`` (slot order once the ring wrapped);
2. *keys in any order*: a ring's whole buffer then the chunk, the same shuffled, random subsets
   with gaps, several wraps, up to 28 keys;
3. *queries in any order*: shuffled, with gaps, a single decode query;
4. *a long conversation*: positions around 1000, 32768, 70000, up to 2**31 - 1 in int32 (where ``k + W``
   overflows; ``q - W`` cannot) and (int64 only) past 2**31, where a cast to bfloat16, float16, int16, float32
   or int32 no longer holds every position exactly;
5. *mixed dtypes and huge gaps*: int64 queries past 2**31 beside int32 keys at the limit (and the reverse),
   positions 2**32 apart (a difference narrowed to int32 wraps), positions past 2**53 (float64 merges them).

Positions are int64 or int32 (the two mixed in some cases) on :func:`swkv_teach.device`. Every
call gets fresh tensors, which must come back unchanged; when the queries are the keys' last
entries and the dtypes agree, ``q_positions`` is a view of ``k_positions`` (``k[-c:]``), as after a
cache's update, so an in-place trick on one shows in the other. A wrong mask is named by probing
the learner's function on a few fixed inputs (:data:`PROBES`) plus the failing case: a bug
hypothesis (:func:`hypotheses`) is named only when it explains every one of them. The library's
own ``window_mask`` handed in as the answer is refused: the check compares with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from swkv_teach.caches import RingBufferKVCache, SlidingWindowKVCache
from swkv_teach.device import device as pick_device
from swkv_teach.grading._own import is_own
from swkv_teach.grading._layout import LAYOUTS, laid_out, name_layout
from swkv_teach.grading._report import ExerciseFailed, call, fail, learner_name, passed
from swkv_teach.masks import allowed, window_mask

__all__ = ["check_chunk_mask"]

WINDOWS = range(1, 10)
I32, I64 = torch.int32, torch.int64
DTYPES = ((I64, I64), (I32, I32), (I32, I64), (I64, I32))  # (q_positions, k_positions), cycled over the cases


@dataclass
class Case:
    """One call: query and key positions (CPU, int64; cast and moved per call), window, where they came from."""

    q: torch.Tensor
    k: torch.Tensor
    W: int
    label: str
    dtypes: tuple | None = None  # (q, k) dtypes when the case needs them (positions past int32); else cycled
    big: bool = False  # positions past what a float or a narrow integer holds exactly


# ------------------------------------------------------------------ cases
def _cache_cases():
    """Chunks through the library's caches: queries = the chunk, keys = ``cache.positions``."""
    for W in WINDOWS:
        pattern = [1, 2, W + 1, 1, 1, W, 3, 1, W + 3, 1, 2, 1, 1]
        for cls in (SlidingWindowKVCache, RingBufferKVCache):
            cache, fed, n = cls(W), [], 0
            while cache.seen < max(4 * W, 24):
                c = pattern[n % len(pattern)]
                n += 1
                cache.update(torch.zeros(1, 1, c, 1), torch.zeros(1, 1, c, 1))
                fed.append(c)
                seen = cache.seen
                yield Case(torch.arange(seen - c, seen), cache.positions.clone().cpu(), W,
                           f"{cls.__name__}(window_size={W}) after chunks of {fed} tokens: q_positions is the "
                           f"last chunk, k_positions is cache.positions")


def _ring_slots(n: int, W: int) -> torch.Tensor:
    """Positions a ring of ``W`` slots holds after ``n`` tokens, in slot order (slot ``p % W``)."""
    slots = torch.arange(min(n, W))
    return slots + W * torch.div(n - 1 - slots, W, rounding_mode="floor")


def _any_order_cases(gen: torch.Generator):
    """Keys in any order, too old ones among them, gaps, 20+ keys; then queries in any order."""
    for W in (1, 2, 3, 5, 8, 9):
        for n in (W, 4 * W + 1, 7 * W + 3, 60 + W):  # 0..3 wraps, then many
            c = 1 + (n + W) % (W + 3)
            chunk = torch.arange(n, n + c)
            held = torch.cat([_ring_slots(n, W), chunk])
            yield Case(chunk, held, W, f"a ring's whole buffer (slot order, {n} tokens seen) then a chunk of {c}")
            shuffled = held[torch.randperm(len(held), generator=gen)]
            yield Case(chunk, shuffled, W, f"the same {len(held)} keys shuffled")
        n = 80 + 3 * W
        pool = torch.arange(max(0, n - 3 * W - 10), n + W)  # past keys, too old ones included, and the chunk
        keys = pool[torch.randperm(len(pool), generator=gen)][: max(20, 2 * W + 10)]
        yield Case(torch.arange(n, n + W), keys, W, f"{len(keys)} keys with gaps, in random order")
    for W in (2, 3, 5, 8):
        n = 5 * W + 2
        keys = torch.cat([_ring_slots(n, W), torch.arange(n, n + W + 2)])
        chunk = torch.arange(n, n + W + 2)
        yield Case(chunk[torch.randperm(len(chunk), generator=gen)], keys, W, "queries in shuffled order")
        yield Case(chunk[::2].flip(0).clone(), keys, W, "queries with gaps, newest first")
        yield Case(torch.tensor([n + W + 1]), keys, W, "one decode query")


# (W, tokens seen before the chunk, dtypes): around 1000 bfloat16 steps by 4 (exact only to 256); across
# 32768 int16 wraps and float16 steps by 16 then 32 (exact to 2048); at 70000 float16 is inf; across 2**31
# int32 wraps and float32 steps by 256 (exact to 2**24)
# int32 at its limit: a chunk whose last position is 2**31 - 1, where `k + W` (not `q - W`) wraps around
INT32_TOP = 2**31 - 1
BIG = ((4, 998, None), (5, 32764, None), (3, 69998, None), (6, INT32_TOP + 1 - 8, (I32, I32)),
       (6, 2**31 - 4, (I64, I64)))


def _big_cases():
    """A long conversation: a ring's whole buffer then a chunk, at positions a lossy cast cannot hold."""
    for W, n, dtypes in BIG:
        c = W + 2
        chunk = torch.arange(n, n + c)
        yield Case(chunk, torch.cat([_ring_slots(n, W), chunk]), W,
                   f"a long conversation: a ring's whole buffer after {n} tokens, then a chunk of {c}", dtypes, True)


def _mixed_cases():
    """Each tensor keeps its own dtype, compared as the integers it holds: casting one to the other's dtype, or
    subtracting a first position and narrowing the difference, or a float64 past 2**53, all lose a position."""
    yield Case(_p(2**31, 2**31 + 1), _p(2**31 - 3, 2**31 - 2, 2**31 - 1), 3,
               "int64 queries just past 2**31, int32 keys at the int32 limit", (I64, I32), True)
    yield Case(_p(2**32, 2**32 + 1), _p(0, 1, 2**32 - 1, 2**32, 2**32 + 1), 2,
               "int64 positions 2**32 apart: keys 0 and 1 are far too old", (I64, I64), True)
    yield Case(_p(5), _p(3, 4, 5, 2**32 + 5), 2, "int32 queries, int64 keys, one of them 2**32 later", (I32, I64), True)
    yield Case(_p(2**53 + 1), _p(2**53, 2**53 + 1, 2**53 + 2), 1,
               "int64 positions past 2**53 (float64 holds integers exactly only up to there)", (I64, I64), True)


def cases() -> list[Case]:
    """Every case the check runs, in order (the same list every time: its own generator)."""
    gen = torch.Generator().manual_seed(7)
    return [*_cache_cases(), *_any_order_cases(gen), *_big_cases(), *_mixed_cases()]


# ------------------------------------------------------------------ diagnosis
def _p(*values) -> torch.Tensor:
    return torch.tensor(values)


# Fixed inputs on which every hypothesis below gives a different mask (a test checks it): slot-order
# keys with one just too old, future keys inside the chunk, a gap, a far-past and a far-future key
# (plain causal vs a wide window, non-causal vs a band), three windows, shuffled queries.
PROBES = (
    Case(_p(23, 24, 25, 26), _p(20, 21, 22, 18, 19, 25, 23, 26, 24), 5, "probe"),
    Case(_p(40, 41, 42), _p(33, 41, 34, 35, 36, 37, 38, 39, 40, 42, 32, 20), 8, "probe"),
    Case(_p(17, 15, 16), _p(14, 15, 12, 13, 16, 17, 20), 3, "probe"),
)


def hypotheses(q: torch.Tensor, k: torch.Tensor, W: int):
    """``(mask, bug)`` for each usual wrong answer, most specific first; CPU int64 positions in."""
    Q, K = q[:, None], k[None, :]
    nq, nk = len(q), len(k)
    col = torch.arange(nk)
    right = window_mask(q, k, W)
    yield right.T, ("transposed: rows must be queries (one per q_positions entry), columns keys "
                    "(one per k_positions entry), i.e. shape (len(q_positions), len(k_positions)).")
    yield ~right, "inverted: True must mean *may attend*."
    yield allowed(Q, K, W + 1), (
        "off by one: each query sees W + 1 keys (k >= q - W), which is Mistral's reference one_file_ref.py "
        "(torch.triu(mask, diagonal=-sliding_window)); this course's convention is W keys, the query's own "
        "included: q - W < k <= q.")
    yield allowed(Q, K, W - 1), "off by one: each query sees W - 1 keys; it should see W, its own included (q - W < k)."
    for w in range(1, 10):
        yield allowed(Q, K, w), f"the window looks hard-coded to {w}: use window_size."
    yield K > Q - W, ("not causal: the chunk's own later tokens are keys too, and an earlier query must not see "
                      "them; add k <= q.")
    yield (Q - K).abs() < W, "not causal: |q - k| < W also lets a query see the next W - 1 keys; use q - W < k <= q."
    yield K <= Q, "plain causal attention: the window is missing (q - W < k)."
    yield (K < Q) & (K > Q - W), ("each query's own key is masked (k < q): a query sees itself, k <= q, and the "
                                  "W - 1 keys before it.")
    yield allowed(q.max().expand(nq)[:, None], K, W), (
        "every query got the newest query's row, a decode mask: in a chunk, each query has its own window, "
        "so build one row per entry of q_positions.")
    yield allowed(q.min().expand(nq)[:, None], K, W), (
        "every query got the oldest query's row: each query has its own window, one row per entry of q_positions.")
    yield allowed(torch.arange(nk - nq, nk)[:, None], col[None, :], W), (
        "the mask is built from lengths (query i at len(k) - len(q) + i, key j at j), not from the positions: "
        "a cache's keys do not start at position 0; compare q_positions with k_positions.")
    yield allowed(Q, (q.max() - nk + 1 + col)[None, :], W), (
        "each key's position was derived from its column (keys assumed chronological, ending at the chunk), but "
        "a ring returns keys in slot order: key j is at k_positions[j], read it from there.")
    yield allowed(Q, k.sort().values[None, :], W), (
        "columns follow sorted positions: you sorted k_positions, but column j must stay the key at "
        "k_positions[j], in the cache's order (or un-sort the columns with the inverse permutation).")
    yield allowed((q[0] + torch.arange(nq))[:, None], K, W), (
        "rows assume consecutive queries q_positions[0], q_positions[0] + 1, ...; read each query's own "
        "position from q_positions[i].")


def _explains(mask: torch.Tensor, got: torch.Tensor) -> bool:
    return got.shape == mask.shape and torch.equal(got, mask)


def _diagnose(fn, dev, failing: Case, got: torch.Tensor) -> str | None:
    """The first hypothesis that explains the learner's mask on every probe it answers and on ``failing``."""
    observed = [(failing, got)]
    for probe in PROBES:
        try:
            out = fn(probe.q.to(dev).clone(), probe.k.to(dev).clone(), probe.W)  # theirs to keep
        except Exception:
            continue
        if isinstance(out, torch.Tensor) and out.dtype == torch.bool:
            observed.append((probe, out.detach().cpu()))
    survivors = None
    for case, out in observed:
        names = [bug for mask, bug in hypotheses(case.q, case.k, case.W) if _explains(mask, out)]
        survivors = names if survivors is None else [b for b in survivors if b in names]
    return survivors[0] if survivors else None


# A cast made to "match the attention dtype" or "save memory", and why it fails on a long conversation.
CASTS = (
    (torch.bfloat16, "bfloat16 (.to(torch.bfloat16), .bfloat16())", "holds integers exactly only up to 256"),
    (torch.float16, "float16 (.half())", "holds integers exactly only up to 2048, and 65504 is its largest"),
    (torch.int16, "int16 (.short())", "wraps around past 32767"),
    (torch.float32, "float32 (.float())", "holds integers exactly only up to 2**24 = 16777216"),
    (torch.int32, "int32 (.int())", "wraps around past 2**31 - 1"),
    (torch.float64, "float64 (.double())", "holds integers exactly only up to 2**53"),
)


def _cast_hint(case: Case, got: torch.Tensor) -> str:
    """Name the cast that explains a wrong mask at large positions, or say plainly what the case shows.

    A cast explains it when it gives the learner's mask here and the right mask on the smaller positions the
    answer passed (at 32768 bfloat16 and float16 both merge every position; at 1000 only bfloat16 does).
    """
    if case.dtypes == (I32, I32):
        Q, K, W = case.q.to(I32)[:, None], case.k.to(I32)[None, :], case.W
        for form, mask in (("k_positions + window_size > q_positions", (K <= Q) & (K + W > Q)),
                           ("k_positions + window_size - 1 >= q_positions", (K <= Q) & (K + (W - 1) >= Q)),
                           ("k_positions + window_size > q_positions", (K + W > Q) & (K - Q <= 0))):
            if _explains(mask, got):
                return (f"int32 overflow: {form} adds to a position, and near 2**31 - 1 (the largest int32; here "
                        f"up to {int(case.q.max())}) k + {W} wraps around to a negative number, so keys near the "
                        "limit were masked. Subtract from the query instead, q_positions - window_size < "
                        "k_positions (positions are >= 0, so that cannot overflow), or compare in int64 (.long()).")
    if case.dtypes in ((I64, I32), (I32, I64)):
        Q, K, W = case.q[:, None], case.k[None, :], case.W
        q_dt, k_dt = (("int64", "int32") if case.dtypes == (I64, I32) else ("int32", "int64"))
        for which, mask in (("q_positions", allowed(Q.to(I32).long(), K, W)),
                            ("k_positions", allowed(Q, K.to(I32).long(), W))):
            if _explains(mask, got):
                return (f"{which} (or a difference with it) was narrowed to int32: here q_positions is {q_dt} "
                        f"and k_positions {k_dt}, and casting the int64 one to the other's dtype (.to(other.dtype), "
                        ".type_as) wraps positions past 2**31 - 1 around. Compare them as they come (PyTorch promotes int32 with int64 to "
                        "int64), or cast both up with .long().")
    if case.q.min() > 2**31 and (case.k.min() < case.q.min() - 2**31):
        Q, K, W = case.q[:, None], case.k[None, :], case.W
        for base in (case.q[0], case.q.min(), case.k[0], case.k.min()):
            if _explains(allowed((Q - base).to(I32), (K - base).to(I32), W), got):
                return ("the positions were made relative (a first position subtracted) and the differences "
                        "narrowed to int32: keys more than 2**31 older than the queries wrap around and look "
                        "recent. Compare the positions as they come, in int64.")
    ran = [*_big_cases(), *_mixed_cases()]  # in the order the check runs them: judge a cast on those before
    at = next((i for i, c in enumerate(ran) if c.label == case.label and torch.equal(c.q, case.q)), len(ran))
    passed_before = [c for c in ran[:at] if int(c.q.max()) < int(case.q.max())]

    def cast(c: Case, dt) -> torch.Tensor:
        return allowed(c.q.to(dt)[:, None], c.k.to(dt)[None, :], c.W)

    for dt, name, why in CASTS:
        if _explains(cast(case, dt), got) and all(_explains(cast(c, dt), window_mask(c.q, c.k, c.W))
                                                   for c in passed_before):
            return (f"the positions were cast to {name} before comparing: {name.split()[0]} {why}, so around "
                    f"position {int(case.q.max())} neighbouring positions merge or wrap. Compare the integer "
                    "tensors as they come (int32 or int64): no cast.")
    return (f"right on every case with small positions, wrong around position {int(case.q.max())}: something does "
            "not hold large positions exactly (a cast to a float type, or to a narrower integer type?). Compare the "
            "integer tensors as they come (int32 or int64): no cast.")


# ------------------------------------------------------------------ messages
def _positions(t: torch.Tensor, limit: int = 40) -> str:
    vals = t.tolist()
    text = ", ".join(map(str, vals[:limit])) + (", ..." if len(vals) > limit else "")
    return f"[{text}]"


def _table(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor, title: str) -> list[str]:
    """The mask with its key positions above and query positions beside, 1 = may attend."""
    width = max(len(str(int(x))) for x in torch.cat([q, k])) + 1
    labels = [f"{title}, key at:"] + [f"  query {p}" for p in q.tolist()]
    pad = max(map(len, labels))
    rows = [labels[0].ljust(pad) + "".join(str(int(x)).rjust(width) for x in k)]
    for label, row in zip(labels[1:], mask.tolist()):
        rows.append(label.ljust(pad) + "".join(("1" if x else ".").rjust(width) for x in row))
    return rows


def _first_difference(exp: torch.Tensor, got: torch.Tensor, case: Case) -> str:
    a, b = (int(x) for x in torch.nonzero(exp != got)[0])
    p, s, W = int(case.q[a]), int(case.k[b]), case.W
    why = f"{p} - {W} < {s} <= {p}" if exp[a, b] else (
        f"{s} > {p}: a later key" if s > p else f"{s} <= {p} - {W}: out of the window")
    return (f"query at position {p} (row {a}) and key at position {s} (column {b}): expected "
            f"{'visible' if exp[a, b] else 'masked'} ({why}), got {'visible' if got[a, b] else 'masked'}.")


def _dtype_failure(head, got: torch.Tensor, exp: torch.Tensor):
    g = got.detach().cpu()
    if g.is_floating_point():
        if torch.equal(g == 0, exp) and bool(torch.isneginf(g[~exp]).all()):
            return fail(head, f"returned an additive float mask ({g.dtype}: 0 where a key is visible, -inf where it "
                        "is masked); expected the bool mask window_mask returns, True = may attend.",
                        hint="the additive form is one step later, inside attention (masked_fill(~mask, -inf)); "
                        "return the comparisons combined with &, which are bool already.")
        if torch.equal(g == 1, exp) and bool((g[~exp] == 0).all()):
            return fail(head, f"returned 0./1. floats ({g.dtype}); expected torch.bool.",
                        hint="scaled_dot_product_attention adds a float mask to the scores, so 0/1 floats would "
                        "let every key through: return the bool comparisons themselves, without .float().")
        return fail(head, f"returned dtype {g.dtype}; expected torch.bool (True = may attend).",
                    hint="comparisons (<=, >) give bool tensors; combine them with &.")
    return fail(head, f"returned dtype {g.dtype}; expected torch.bool (True = may attend).",
                hint="masked_fill and scaled_dot_product_attention both refuse a 0/1 integer mask: keep the bool "
                "comparisons, without .int() or .long().")


def _call_line(name: str, case: Case, qd, kd, dev) -> str:
    return (f"{name}(q_positions, k_positions, window_size={case.W}) with q_positions={_positions(case.q)} "
            f"({str(qd).replace('torch.', '')}), k_positions={_positions(case.k)} "
            f"({str(kd).replace('torch.', '')}), on {dev.type}")


# ------------------------------------------------------------------ the check
def _aliases(case: Case, qd, kd) -> bool:
    """Whether the queries are the keys' last entries, as after a cache's update: then q is passed as a view of k."""
    nq, nk = len(case.q), len(case.k)
    return qd == kd and nq <= nk and torch.equal(case.q, case.k[nk - nq:])


def _inputs(case: Case, qd, kd, dev, alias: bool, strided: bool = False):
    """Fresh tensors for one call (the case's own must not be written to); q a view of k's tail if ``alias``;
    both every other entry of a longer tensor (not contiguous) if ``strided``."""
    # clone(): on the CPU, .to() of an int64 tensor returns the case's own tensor, which the answer may write to
    k = case.k.to(device=dev, dtype=kd).clone()
    q = k[len(k) - len(case.q):] if alias else case.q.to(device=dev, dtype=qd).clone()
    if strided and not alias:
        q, k = laid_out(q, "strided"), laid_out(k, "strided")
    return q, k


def _right_apart(fn, case: Case, qd, kd, dev, exp: torch.Tensor) -> bool:
    """Whether ``fn`` gets ``case`` right when q_positions and k_positions share no memory."""
    try:
        out = fn(*_inputs(case, qd, kd, dev, alias=False), case.W)
    except Exception:
        return False
    return isinstance(out, torch.Tensor) and out.dtype == torch.bool and torch.equal(out.detach().cpu(), exp)


class _WriteWatch(TorchFunctionMode):
    """Records the first in-place torch operation (``sub_``, ``x[i] = ...``, ``+=``, ``out=``) on memory the
    inputs own: one restored afterwards leaves the inputs unchanged at the end, yet moved them for a moment (and,
    with q_positions a view of k_positions, moved the other one meanwhile)."""

    NOT_WRITES = ("requires_grad_", "share_memory_", "retain_grad")

    def __init__(self, q: torch.Tensor, k: torch.Tensor, alias: bool):
        super().__init__()
        self.q, self.k, self.alias = q, k, alias
        self.found = None

    def _name(self, t: torch.Tensor) -> str | None:
        """Which argument ``t`` writes into: the tensor itself, else one whose memory it shares."""
        if t is self.k or (self.alias and t.untyped_storage().data_ptr() == self.k.untyped_storage().data_ptr()
                           and t is not self.q):
            return "k_positions (q_positions is a view of it)" if self.alias else "k_positions"
        if t is self.q:
            return "q_positions (a view of k_positions)" if self.alias else "q_positions"
        for arg, x in (("k_positions", self.k), ("q_positions", self.q)):
            if t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
                return arg
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.found is None:
            fname = getattr(func, "__name__", "")
            inplace = (fname.endswith("_") and not fname.startswith("_") and fname not in self.NOT_WRITES) or fname in (
                "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__iand__",
                "__ior__")
            targets = [args[0]] if inplace and args else []
            targets += [t for t in (kwargs.get("out"),) if t is not None]
            for t in targets:
                arg = self._name(t) if isinstance(t, torch.Tensor) else None
                if arg:
                    self.found = (arg, fname)
                    break
        return func(*args, **kwargs)


def _check_case(fn, name: str, case: Case, qd, kd, dev, strided: bool = False) -> None:
    head = _call_line(name, case, qd, kd, dev)
    alias = _aliases(case, qd, kd)
    strided = strided and not alias
    if alias:
        head += f", q_positions being k_positions[-{len(case.q)}:] (a view, as after cache.update)"
    if strided:
        head += f", each {LAYOUTS['strided']} (not contiguous)"
    q, k = _inputs(case, qd, kd, dev, alias, strided)
    q_before, k_before = q.clone(), k.clone()
    watch = _WriteWatch(q, k, alias)
    try:
        with watch:
            got = call(head, f"{name}()", fn, q, k, case.W)
    except ExerciseFailed as e:
        if strided and " raised " in str(e):
            raise name_layout(e, "q_positions (and k_positions)", "strided") from None
        raise
    nq, nk = len(case.q), len(case.k)
    for arg, now, before in (("q_positions", q, q_before), ("k_positions", k, k_before)):
        if now.shape != before.shape or now.dtype != before.dtype or not torch.equal(now, before):
            raise fail(head, case.label, f"changed its argument {arg} in place: it was {_positions(before.cpu())}, "
                       f"it is now {now.cpu().tolist()} (shape {tuple(now.shape)}).",
                       hint="the positions belong to the cache: use out-of-place operations "
                       "(unsqueeze, not unsqueeze_; sort() returns a new tensor), or work on a .clone().")
    if watch.found is not None and torch.equal(q, q_before) and torch.equal(k, k_before):
        arg, op = watch.found
        raise fail(head, case.label, f"wrote into its argument {arg} in place ({op}) and put it back: unchanged at the "
                   "end, but moved meanwhile. The statement says the inputs are never changed, even for a moment: "
                   "after a cache's update q_positions is a view of k_positions (k_positions[-c:]), so writing into "
                   "one moves the other while you compute, and the positions belong to the cache.",
                   hint="use out-of-place operations: q_positions - window_size, not q_positions.sub_(window_size) "
                   "(and no [...] =, +=, out= on the inputs); work on a .clone() if you must write.")
    if not isinstance(got, torch.Tensor):
        raise fail(head, case.label, f"returned {type(got).__name__}; expected a torch.Tensor of shape ({nq}, {nk}).",
                   hint="build the mask with torch operations on the two position tensors and return it.")
    if got.layout != torch.strided or got.is_nested or got.is_meta:
        raise fail(head, case.label, f"returned a {'nested' if got.is_nested else 'meta' if got.is_meta else str(got.layout)}"
                   " tensor; expected an ordinary dense (strided) bool tensor.",
                   hint="build the mask with plain comparisons of the position tensors (no .to_sparse(), no meta).")
    if tuple(got.shape) != (nq, nk):
        transposed = tuple(got.shape) == (nk, nq)
        raise fail(head, case.label, f"returned shape {tuple(got.shape)}; expected ({nq}, {nk}): one row per query, "
                   "one column per key.",
                   hint="transposed: rows must be queries, columns keys; put q_positions on the rows "
                   "(q_positions[:, None]) and k_positions on the columns (k_positions[None, :])." if transposed
                   else "the mask is 2-D, (len(q_positions), len(k_positions)); attention broadcasts it over batch "
                   "and heads.")
    exp = window_mask(case.q, case.k, case.W)
    if got.dtype != torch.bool:
        raise _dtype_failure(head, got, exp)
    if got.device != q.device:
        raise fail(head, case.label, f"returned the mask on device {got.device}; the positions are on {q.device}.",
                   hint="attention masks scores on the positions' device: build from the position tensors "
                   "themselves, or create any new tensor with device=q_positions.device.")
    got = got.detach().cpu()
    if not torch.equal(got, exp):
        lines = [case.label, _first_difference(exp, got, case)]
        if nq <= 12 and nk <= 24:
            lines += ["rows are queries, columns keys, 1 = may attend:",
                      *_table(exp, case.q, case.k, "expected"), *_table(got, case.q, case.k, "got")]
        if alias and _right_apart(fn, case, qd, kd, dev, exp):
            raise fail(head, *lines, hint=(
                f"right when q_positions and k_positions are separate tensors, wrong when q_positions is a view of "
                f"k_positions[-{nq}:], as it is after a cache's update (the chunk's positions are the "
                "last keys). Your function writes into one of them in place (sub_ then add_ to 'restore' it, say), "
                "which changes the other while you compute: use out-of-place operations (q_positions - W, not "
                "q_positions.sub_(W))."))
        hint = _diagnose(fn, dev, case, got) or (_cast_hint(case, got) if case.big else None)
        raise fail(head, *lines, hint=hint or "key s is visible to query p exactly when p - W < s <= p, "
                   "whatever the order of the keys; compare every query position with every key position.")


def _is_the_library(fn) -> bool:
    """The library's window_mask itself (or a functools.partial / functools.wraps of it)."""
    return is_own(fn, window_mask)


def check_chunk_mask(fn) -> None:
    """Exercise 04: compare ``fn(q_positions, k_positions, window_size)`` with the library's ``window_mask``."""
    name = learner_name(fn) if callable(fn) else "your function"
    if _is_the_library(fn):
        raise fail(f"check_chunk_mask({name})", "this is the library's own window_mask (swkv_teach.window_mask), the "
                   "very function the check compares with: it passes by definition and shows nothing.",
                   hint="write chunk_mask yourself from q_positions and k_positions (two comparisons combined "
                   "with &) and check that. If you did write one, something run after it (chunk_mask = "
                   "swkv_teach.window_mask, an import) replaced it: run your cell again.")
    dev = pick_device()
    todo = cases()
    for n, case in enumerate(todo):
        qd, kd = case.dtypes or DTYPES[n % len(DTYPES)]
        _check_case(fn, name, case, qd, kd, dev)
        if n % 4 == 3:  # the same positions, every other entry of a longer tensor
            _check_case(fn, name, case, qd, kd, dev, strided=True)
    chunks = sum(1 for c in todo if len(c.q) > 1)
    most = max(len(c.k) for c in todo)
    passed(f"{name} matches window_mask on all {len(todo)} cases ({chunks} multi-token chunks; windows 1..9; keys "
           f"from the sliding and ring caches, shuffled, with gaps, up to {most} keys; int32 and int64 positions "
           f"up to {max(int(c.q.max()) for c in todo)}, a quarter of them strided as well).")
