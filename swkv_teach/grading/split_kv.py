"""Check for exercise 12: the inner loop and the combine of a split-KV paged decode kernel.

The learner writes two ``@triton.jit`` functions with the signatures of the library's
:func:`swkv_teach.kernels.decode.attend_block` (fold one pool block into a running softmax,
masked by the window) and :func:`~swkv_teach.kernels.decode.merge` (merge two partial results
by log-sum-exp). The check runs them inside the library's own kernel skeleton
(:func:`~swkv_teach.kernels.decode.decode_launch`): compiled on a CUDA GPU, in Triton's
interpreter on the CPU otherwise. Expected outputs come from
:func:`swkv_teach.attention.paged_attention` over a clean pool of its own.

Order, so the first failure names one bug:

1. ``merge`` alone on eight hand-made pairs (:func:`~swkv_teach.kernels.decode.merge_pairs`): two
   parts, one empty part on either side, two empty parts (``-inf - -inf``), logsumexps of
   +-1000 (an ``exp`` taken before subtracting the max overflows or underflows) and two parts 100
   apart either way (a weight taken relative to one part, ``exp(lse_b - lse_a)``, overflows); the
   types it returns must stay float32 (the combine's loop carries them).
2. ``attend_block`` with the library's ``merge`` and one split, on probes that each isolate one
   thing: one block; a second block whose scores are 20 higher (the accumulator and the sum must
   both be rescaled); a first block 200 higher (the max must be carried: ``exp(200)`` overflows);
   a window starting exactly on and just before a block edge (off by one, named when the result is
   the one ``W - 1`` or ``W + 1`` gives; reading the slot at ``hi`` too, named when the result is
   the one the keys ``lo..hi`` give); 4 query heads over 2 key/value heads (named when the
   result is ``h % 2``'s); NaN in the slots past ``cache_seqlens`` and before the window; a block
   size of 24 and a headdim of 12, whose tiles are padded to 32 and 16.
   When one fails, the state after each block (below) is looked at, and its named slip reported
   instead when the numbers are exactly that slip's.
2b. ``attend_block`` one block at a time (:mod:`._split_kv_steps`): ``(m_i, l_i, acc)`` after each
   block against the online softmax in float64, their types (float32: the skeleton's loop carries
   them, and Triton's compiler refuses a type change the interpreter lets pass), a cut block whose
   visible scores all lie below -100, a block ending exactly at ``hi``, and pools that are views
   (a fused K/V pool, heads stored before slots, a padded headdim) so no stride can be assumed.
3. Both together over ragged batches, MHA/GQA/MQA, block sizes 16/32/24, windows smaller than,
   equal to and larger than what is stored, no window, 1 to 8 splits (some empty), float32 and
   bfloat16, on pools whose every slot outside the windows is NaN and whose table entries outside
   them are -1 or 2**40.

The library's own ``attend_block`` and ``merge`` are refused.
"""

from __future__ import annotations

import math
import warnings

import torch

from swkv_teach.attention import paged_attention
from swkv_teach.grading._own import is_own
from swkv_teach.grading._report import ExerciseFailed, call, fail, passed, show
from swkv_teach.grading._split_kv_steps import check_steps, explained
from swkv_teach.grading._split_kv_steps import plain as _plain

NAME = "check_paged_decode_kernel"
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def _jit(fn) -> bool:
    return any(c.__name__ in ("JITFunction", "InterpretedFunction") for c in type(fn).__mro__)


def _unpack(attend_block, merge):
    if merge is None:  # one object holding both, as exercise 09's check accepts
        attend_block, merge = getattr(attend_block, "attend_block", attend_block), getattr(attend_block, "merge", None)
    for name, fn in (("attend_block", attend_block), ("merge", merge)):
        if not _jit(fn):
            raise fail(f"{NAME}(attend_block, merge)",
                       f"{name} is {show(fn, 80)} ({type(fn).__name__}), not a @triton.jit function.",
                       hint=f"pass the two functions you wrote, each decorated with @triton.jit: "
                       f"{NAME}(attend_block, merge). Triton's kernel can only call jit functions.")
    return attend_block, merge


# ------------------------------------------------------------------ pools
def _pool(dense_k, dense_v, W, bs, poison: bool, seed: int):
    """Rows' keys in shuffled blocks of a pool; slots outside the windows NaN (``poison``) or random finite."""
    g = torch.Generator().manual_seed(seed)
    seqlens = [k.shape[0] for k in dense_k]
    Hk, D = dense_k[0].shape[1:]
    width = max(-(-n // bs) for n in seqlens) + 1
    windows = [(0 if W is None else max(0, n - W), n) for n in seqlens]
    needed = [list(range(lo // bs, (hi - 1) // bs + 1)) for lo, hi in windows]
    num_blocks = 2 * sum(map(len, needed)) + 2  # as many spare blocks, never read, between them
    perm = torch.randperm(num_blocks, generator=g).tolist()
    fill = torch.full if poison else (lambda shape, _: torch.randn(shape, generator=g))
    k_cache, v_cache = fill((num_blocks, bs, Hk, D), float("nan")), fill((num_blocks, bs, Hk, D), float("nan"))
    table = torch.tensor([[(-1, 2**40)[(b + i) % 2] for i in range(width)] for b in range(len(seqlens))])
    for b, ((lo, hi), blocks) in enumerate(zip(windows, needed)):
        for lb in blocks:
            table[b, lb] = blk = perm.pop()
            # a clean pool holds the older keys of a window's first block too, as a real cache does: reading one
            # of them gives what the next larger window gives, which names an off-by-one
            j = torch.arange(max(lb * bs, lo if poison else 0), min((lb + 1) * bs, hi))
            k_cache[blk, j - lb * bs] = dense_k[b][j].float()
            v_cache[blk, j - lb * bs] = dense_v[b][j].float()
    dtype = dense_k[0].dtype
    return k_cache.to(dtype), v_cache.to(dtype), table


def dense_reference(q, dense_k, dense_v, W, bs=16, kv_head=None):
    """paged_attention over a clean pool of its own: row b's keys ``dense_k[b]`` ``(n_b, Hk, D)`` in blocks
    ``b * width ...`` of ``bs`` slots (also the kernel tests' expectation); ``kv_head``: a wrong head mapping, to
    name it."""
    seqlens = [k.shape[0] for k in dense_k]
    width = max(-(-n // bs) for n in seqlens)
    Hk, D = dense_k[0].shape[1:]
    k = torch.zeros(len(seqlens), width * bs, Hk, D, dtype=dense_k[0].dtype)
    v = torch.zeros_like(k)
    for b, n in enumerate(seqlens):
        k[b, :n], v[b, :n] = dense_k[b], dense_v[b]
    table = torch.arange(len(seqlens) * width).view(len(seqlens), width)
    if kv_head is not None:  # spread kv heads out to one per query head, in the wrong order
        k, v = k[:, :, kv_head], v[:, :, kv_head]
        Hk = len(kv_head)
    return paged_attention(q, k.reshape(-1, bs, Hk, D), v.reshape(-1, bs, Hk, D), torch.tensor(seqlens), table, W)


class _Case:
    """One launch: rows of keys, a window, a block size, heads, a dtype, splits; built reproducibly."""

    def __init__(self, title, seqlens, W, bs, H, Hk, D, dtype=torch.float32, splits=1, poison=True, seed=0,
                 scores=None):
        self.title, self.W, self.bs, self.splits, self.poison = title, W, bs, splits, poison
        g = torch.Generator().manual_seed(seed)
        self.q = torch.randn(len(seqlens), 1, H, D, generator=g)
        self.dense_k = [torch.randn(n, Hk, D, generator=g) for n in seqlens]
        self.dense_v = [torch.randn(n, Hk, D, generator=g) for n in seqlens]
        if scores is not None:  # q = e_0 and key j's first coordinate set so that its score is scores(j)
            self.q.zero_()
            self.q[..., 0] = 1.0
            for k in self.dense_k:
                k[:, :, 0] = torch.tensor([float(scores(j)) for j in range(k.shape[0])])[:, None] * math.sqrt(D)
        self.q = self.q.to(dtype)
        self.dense_k = [k.to(dtype) for k in self.dense_k]
        self.dense_v = [v.to(dtype) for v in self.dense_v]
        self.seqlens, self.H, self.Hk, self.D, self.dtype, self.seed = seqlens, H, Hk, D, dtype, seed

    def describe(self) -> str:
        W = self.W if self.W is not None else f"None (no window: every stored key, as window_size={max(self.seqlens)})"
        return (f"{self.title}: cache_seqlens={self.seqlens}, window_size={W}, block_size={self.bs}, "
                f"nheads={self.H}, nheads_k={self.Hk}, headdim={self.D}, {str(self.dtype)[6:]}, "
                f"num_splits={self.splits}")

    def expected(self, W="same", kv_head=None):
        return dense_reference(self.q, self.dense_k, self.dense_v, self.W if W == "same" else W, self.bs, kv_head)

    def one_past(self):
        """The output of a kernel that reads keys lo..hi, hi included: the pool's slot at position hi =
        cache_seqlens, past the window's last key, taken as one more key (rows whose hi ends a block are left
        as they are: the skeleton never visits the next block)."""
        k_cache, v_cache, table = _pool(self.dense_k, self.dense_v, self.W, self.bs, self.poison, self.seed)
        outs = []
        for b, n in enumerate(self.seqlens):
            k, v, W = self.dense_k[b], self.dense_v[b], self.W
            if n % self.bs:
                blk, slot = int(table[b, n // self.bs]), n % self.bs
                k, v = torch.cat([k, k_cache[blk, slot][None]]), torch.cat([v, v_cache[blk, slot][None]])
                W = None if W is None else W + 1  # the same oldest key, one more at the end
            outs.append(dense_reference(self.q[b : b + 1], [k], [v], W, self.bs))
        return torch.cat(outs)

    def run(self, attend, merge, device):
        from swkv_teach.kernels.decode import decode_launch

        k_cache, v_cache, table = _pool(self.dense_k, self.dense_v, self.W, self.bs, self.poison, self.seed)
        seqlens = torch.tensor(self.seqlens, dtype=torch.int32, device=device)
        try:
            return call(self.describe(), "the kernel with your functions", _plain, decode_launch,
                        self.q.to(device), k_cache.to(device), v_cache.to(device), seqlens, table.to(device), self.W,
                        1 / math.sqrt(self.D), self.splits, attend=attend, merge=merge).cpu()
        except ExerciseFailed as e:
            raise explained(e) from None


def _differs(got, want, dtype) -> tuple[int, int] | None:
    """(row, head) of the first output that differs, or None."""
    bad = ~torch.isclose(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype], equal_nan=False)
    if not bool(bad.any()):
        return None
    b, _, h, _ = (int(x) for x in torch.nonzero(bad)[0])
    return b, h


def _mismatch(case: _Case, got, want, where, hint, *lines):
    b, h = where
    return fail(case.describe(), f"row {b}, query head {h}: the output differs from paged_attention's.", *lines,
                expected=want[b, 0, h, :6].float(), got=got[b, 0, h, :6].float(), what="got (first 6)", hint=hint)


# ------------------------------------------------------------------ 1. merge on its own
MERGE_PAIRS = [
    ("two parts", 0.5, 2.0),
    ("logsumexps of 1000 and 990", 1000.0, 990.0),
    ("logsumexps of -1000 and -1010", -1000.0, -1010.0),
    ("an empty first part (lse_a = -inf, o_a = 0)", -math.inf, 1.5),
    ("an empty second part (lse_b = -inf, o_b = 0)", 0.25, -math.inf),
    ("two empty parts (as when the combine starts and split 0 holds no block)", -math.inf, -math.inf),
    ("logsumexps 100 apart, the second larger (0 and 100)", 0.0, 100.0),
    ("logsumexps 100 apart, the first larger (100 and 0)", 100.0, 0.0),
]


def _check_merge(merge, device) -> None:
    from swkv_teach.kernels.decode import merge_pairs

    g = torch.Generator().manual_seed(5)
    lse_a = torch.tensor([p[1] for p in MERGE_PAIRS])
    lse_b = torch.tensor([p[2] for p in MERGE_PAIRS])
    o_a, o_b = torch.randn(len(MERGE_PAIRS), 4, generator=g), torch.randn(len(MERGE_PAIRS), 4, generator=g)
    o_a[torch.isinf(lse_a)] = 0.0
    o_b[torch.isinf(lse_b)] = 0.0
    want_lse = torch.logaddexp(lse_a.double(), lse_b.double())
    wa = torch.where(torch.isinf(lse_a), 0.0, torch.exp(lse_a.double() - want_lse))
    wb = torch.where(torch.isinf(lse_b), 0.0, torch.exp(lse_b.double() - want_lse))
    want_o = torch.nan_to_num(o_a.double() * wa[:, None] + o_b.double() * wb[:, None])
    lse, o, f32 = call(f"{NAME}: merge on its own", "merge", _plain, merge_pairs,
                       *(t.to(device) for t in (lse_a, o_a, lse_b, o_b)), merge=merge, with_types=True)
    wrong = [name for name, j in (("lse", 0), ("o", 1)) if not bool((f32[:, j] == 1).all())]
    if wrong:
        raise fail(f"{NAME}: merge on its own", f"merge returned {' and '.join(wrong)} in another type than float32 "
                   "(float64, say).", hint="the combine carries (lse, o) from split to split in a loop that starts "
                   "them float32; Triton's compiler refuses a loop-carried value that changes type (only the CPU "
                   "interpreter lets it pass). Compute in float32, or cast back: .to(tl.float32).")
    lse, o = lse.cpu().double(), o.cpu().double()
    for i, (title, a, b) in enumerate(MERGE_PAIRS):
        case = f"merge(lse_a={a}, o_a, lse_b={b}, o_b) on its own: {title}"
        both_empty = math.isinf(a) and math.isinf(b)
        lse_ok = bool(lse[i] == want_lse[i]) if both_empty else bool(torch.isclose(lse[i], want_lse[i], atol=1e-4,
                                                                                      rtol=1e-5))
        o_ok = bool(torch.allclose(o[i], want_o[i], atol=1e-4, rtol=1e-4))
        if lse_ok and o_ok:
            continue
        nan = bool(torch.isnan(o[i]).any() or torch.isnan(lse[i]))
        if both_empty and nan:
            hint = ("-inf - -inf = NaN: with both parts empty the max is -inf, and exp(lse_a - max) is exp(NaN). "
                    "The combine starts from an empty part, and a split that holds no block of the window (more "
                    "splits than blocks, a short row) is empty too: where the max is -inf, subtract 0 instead "
                    "(tl.where(m == float('-inf'), 0.0, m)), and divide by 1 where the weights sum to 0.")
        elif math.isinf(a) or math.isinf(b):
            hint = ("an empty part (lse = -inf, o = 0) must weigh exp(-inf - m) = 0 and leave the other part as "
                    "it was; compute both weights against the larger lse, never against the empty one.")
        elif abs(a - b) > 88 and not torch.isnan(o[i]).any() and bool((o[i] - want_o[i]).abs().max() < 1e-3):
            hint = ("o is right but lse is not: lse = m + log(exp(lse_a - m) + exp(lse_b - m)) with m the larger lse "
                    "(here the smaller part's weight is exp(-100), which rounds to 0: lse is the max).")
        elif abs(a - b) > 88:
            hint = (f"the parts' logsumexps differ by {abs(a - b):g}: a weight taken relative to one part, "
                    "exp(lse_b - lse_a), is exp(100), which overflows float32 (past about 88) when the other part is "
                    "the larger. Take both weights against the max, m = tl.maximum(lse_a, lse_b): each is then <= 1.")
        elif abs(a) >= 1000:
            hint = ("exp(1000) overflows and exp(-1000) underflows in float32: subtract the larger lse first, "
                    "m = tl.maximum(lse_a, lse_b), wa = exp(lse_a - m), wb = exp(lse_b - m), lse = m + log(wa + wb).")
        elif not lse_ok:
            hint = ("the merged lse is log(exp(lse_a) + exp(lse_b)) = m + log(exp(lse_a - m) + exp(lse_b - m)): "
                    "not the max, not the sum of the two.")
        else:
            hint = ("o_a and o_b are normalised outputs: the merged o is their mean weighted by exp(lse_x - lse), "
                    "(o_a * wa + o_b * wb) / (wa + wb), so the weights sum to 1.")
        raise fail(case, "the merged (lse, o) is not the log-sum-exp combination of the two parts.",
                   f"expected lse: {want_lse[i].item():.6g}   got lse: {lse[i].item():.6g}",
                   expected=want_o[i].float(), got=o[i].float(), what="got o", hint=hint)


# ------------------------------------------------------------------ 2. attend_block, one split, the library's merge
def _probes():
    yield _Case("one block, keys 0..4", [5], None, 16, 1, 1, 8, poison=False), "basic"
    yield (_Case("two blocks, the second block's scores 20 higher (the max rises)", [20], None, 16, 1, 1, 8, seed=1,
                 poison=False, scores=lambda j: (j % 5) / 5 + (20 if j >= 16 else 0)), "rescale")
    yield (_Case("two blocks, the first block's scores 200 higher (the max must be carried)", [20], None, 16, 1, 1, 8,
                 seed=2, poison=False, scores=lambda j: (j % 5) / 5 + (200 if j < 16 else 0)), "carry")
    for W in (24, 25):
        yield (_Case(f"the window starts at key {40 - W}, {'on' if W == 24 else 'just before'} a block edge", [40], W,
                     16, 1, 1, 8, seed=3, poison=False), "edge")
    yield _Case("GQA: 4 query heads over 2 key/value heads", [20], None, 16, 4, 2, 8, seed=4, poison=False), "gqa"
    yield (_Case("NaN in the slots past cache_seqlens (keys 20..31 of block 1)", [20], None, 16, 1, 1, 8, seed=5),
           "past")
    yield _Case("NaN in the slots before the window (keys 16..19)", [40], 20, 16, 1, 1, 8, seed=6), "before"
    yield (_Case("block_size 24 and headdim 12 (tiles padded to BLOCK_N = 32, BLOCK_D = 16)", [50, 30], None, 24, 2, 1,
                 12, seed=7), "pad")


HINTS = {
    "basic": "read the block at block_id * stride_block + slot * stride_slot + kv_head * stride_head + d, score it "
             "against q (s = tl.sum(q[None, :] * k, 1)), give every slot outside lo <= pos < hi the score -inf "
             "(tl.where(seen, s, float('-inf')): a score of 0 still weighs exp(0 - m)), and fold it in: "
             "m_new = max(m_i, max(s)), "
             "p = exp(s - m_new), l = l_i * exp(m_i - m_new) + sum(p), acc = acc * exp(m_i - m_new) + sum(p v).",
    "rescale": "when a later block raises the max, what was summed under the old max must be rescaled: multiply "
               "both the accumulator acc and the running sum l_i by alpha = exp(m_i - m_new) before adding the "
               "new block (no rescale of one of them leaves the two inconsistent).",
    "carry": "the max must be carried from block to block: m_new = tl.maximum(m_i, tl.max(s, 0)), not the new "
             "block's max alone (then exp(m_i - m_new) = exp(200) overflows to inf, and inf / inf is NaN).",
    "gqa": "query head `head` reads key/value head head // GROUP (heads 0..GROUP-1 share kv head 0), "
           "not head % GROUP or head // nheads_k.",
    "past": "a slot past cache_seqlens (pos >= hi) may hold anything, NaN included: mask the loads of k and v "
            "(mask=..., other=0.0), not only the scores, since p * v with p = 0 and v = NaN is still NaN.",
    "before": "a slot before the window (pos < lo) may hold anything, NaN included: mask the loads of k and v with "
              "the window (pos >= lo) & (pos < hi), not only the scores.",
    "one past": "the slot at pos = hi = cache_seqlens[b] is one past the window's last key (the query's own, at "
                "p = hi - 1): it was never written for this row and may hold anything (a stale key here, NaN in "
                "a freed block). The visible keys are lo <= pos < hi: mask pos < hi, not pos <= hi.",
    "pad": "tl.arange needs powers of two, so the tile has BLOCK_N >= BLOCK_SIZE slots and BLOCK_D >= HEAD_DIM "
           "lanes: slots i >= BLOCK_SIZE belong to the next pool block and must be masked (offs_n < BLOCK_SIZE), "
           "as must lanes d >= HEAD_DIM.",
}


def _check_attend(attend, own_merge, device) -> None:
    for case, kind in _probes():
        got = case.run(attend, own_merge, device)
        want = case.expected()
        where = _differs(got, want, case.dtype)
        if where is None:
            continue
        if not case.poison:
            W = case.W if case.W is not None else max(case.seqlens)  # no window: every stored key
            for other, what in ((W - 1, "W - 1"), (W + 1, "W + 1")):
                if other >= 1 and _differs(got, case.expected(W=other), case.dtype) is None:
                    raise _mismatch(case, got, want, where,
                                    f"the window is off by one: your output is what window_size="
                                    f"{other} ({what}) gives, W = {W}. The query at p = hi - 1 sees keys "
                                    "p - W < j <= p, i.e. lo <= pos < hi with lo = hi - W (the skeleton passes lo "
                                    "and hi): mask (pos >= lo) & (pos < hi).")
            if _differs(got, case.one_past(), case.dtype) is None:
                raise _mismatch(case, got, want, where, HINTS["one past"],
                                "your output is what the keys lo..hi give, hi included: one slot past the "
                                "window's last key.")
        if kind == "gqa":
            group = case.H // case.Hk
            modulo = [h % case.Hk for h in range(case.H)]
            if _differs(got, case.expected(kv_head=modulo), case.dtype) is None:
                raise _mismatch(case, got, want, where, HINTS["gqa"],
                                f"your output is what query head h reading kv head h % {case.Hk} gives "
                                f"(GROUP = {group}).")
        raise _mismatch(case, got, want, where, HINTS[kind] if kind != "edge" else HINTS["basic"])


def _named_by_steps(attend, device) -> None:
    """Raise the step-by-step failure instead when it names the slip (the kernel's probe saw only its output)."""
    try:
        check_steps(attend, device)
    except ExerciseFailed as e:
        if not getattr(e, "generic", False):
            raise e from None


# ------------------------------------------------------------------ 3. both, varied
def _sweep():
    yield _Case("ragged rows, GQA", [1, 37, 70], 32, 16, 4, 2, 16, splits=3, seed=10)
    yield _Case("more splits than blocks (empty splits first)", [5, 64, 16], 64, 16, 2, 1, 8, splits=8, seed=11)
    yield _Case("a window larger than anything stored", [9, 40], 1000, 32, 3, 1, 8, splits=2, seed=12)
    yield _Case("a window equal to what is stored", [48, 30], 48, 16, 2, 2, 16, splits=4, seed=13)
    yield _Case("no window, block size 24", [60, 1, 25], None, 24, 2, 2, 12, splits=5, seed=14)
    yield _Case("window 1", [33, 32], 1, 16, 2, 1, 8, splits=2, seed=15)
    yield _Case("bfloat16, GQA", [50, 17], 20, 16, 4, 2, 16, dtype=torch.bfloat16, splits=3, seed=16)
    yield _Case("bfloat16, MQA, block size 32", [90, 64], 40, 32, 3, 1, 8, dtype=torch.bfloat16, splits=7, seed=17)


def check_paged_decode_kernel(attend_block, merge=None) -> None:
    """Check exercise 12's ``attend_block`` and ``merge`` (``@triton.jit``) inside the library's split-KV kernel."""
    from swkv_teach import kernels

    if not kernels.available():
        raise fail(f"{NAME}(attend_block, merge)", "Triton is not installed here, so no kernel can run.",
                   hint=kernels.INSTALL_HINT)
    problem = kernels.interpreter_problem()
    if problem:  # this machine's Triton and NumPy, not the answer: say so before anything runs
        raise fail(f"{NAME}(attend_block, merge)", "Triton's interpreter cannot run here, whatever the answer.",
                   hint=problem)
    from swkv_teach.kernels.decode import attend_block as own_attend, merge as own_merge

    attend, merge = _unpack(attend_block, merge)
    for answer, own in ((attend, own_attend), (merge, own_merge)):
        if is_own(answer, own):
            raise fail(f"{NAME}(attend_block, merge)",
                       f"this {own.__name__} is the library's own swkv_teach.kernels.decode.{own.__name__}, the very "
                       "function the check's kernel uses: it passes by definition and shows nothing about yours.",
                       hint=f"pass the {own.__name__} you wrote in the cell above. If you did write one, an import "
                       f"that ran after it (from swkv_teach.kernels.decode import {own.__name__}) replaced it: run "
                       "your cell again.")
    device = torch.device("cuda" if torch.cuda.is_available() and not kernels.interpreted() else "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's NumPy warns on log(0) and exp overflow
        _check_merge(merge, device)
        try:
            _check_attend(attend, own_merge, device)
        except ExerciseFailed as failed:
            _named_by_steps(attend, device)
            raise failed from None
        check_steps(attend, device)  # the state after each block: its types, extreme scores, pools that are views
        for case in _sweep():
            got = case.run(attend, merge, device)
            want = case.expected()
            where = _differs(got, want, case.dtype)
            if where is not None:
                raise _mismatch(case, got, want, where,
                                "each part passed its own probes, so look at what they share: the state the "
                                "skeleton hands from block to block and split to split (m_i = -inf, l_i = 0, "
                                "acc = 0 before the first block; an empty split is lse = -inf, o = 0).")
    how = "compiled on the GPU" if device.type == "cuda" else "in Triton's interpreter"
    passed(f"attend_block and merge give paged_attention's output ({how}): one block and many, a rising and a "
           "falling max, window edges on block edges, GQA, NaN outside the windows, empty splits, padded tiles, "
           "float32 and bfloat16.")
