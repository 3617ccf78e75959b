"""Exercise 12's ``attend_block`` one block at a time: the state ``(m_i, l_i, acc)`` after each block, against the
online softmax computed in float64 from the same pool, and the types it leaves the block with.

Each scenario hands the learner's function a known state and a few pool blocks through
:func:`swkv_teach.kernels.decode.attend_steps`; a difference is reported as the quantity that differs (``m_i``,
``l_i`` or ``acc``), the block, and what a right fold gives, and named when the learner's numbers are exactly those
of one known slip (the max over masked slots, base-2 units, no max, the scale twice, exp2 without log2(e), the
rescale upside down, the old max, a block dropped at a block edge, the logical block read, a hard-coded stride).
Pools are NaN wherever the window does not reach, and some are views (a fused K/V pool, heads before slots, a padded
head dim) that the launcher passes without copying.
"""

from __future__ import annotations

import math

import torch

from swkv_teach.grading._report import ExerciseFailed, call, fail

LOG2E = 1 / math.log(2)
ATOL = RTOL = 1e-4


class _Steps:
    """One scenario: a pool, the blocks a query at ``hi - 1`` folds in order, and the state before the first."""

    def __init__(self, title, *, bs=16, D=8, H=1, Hk=1, head=0, lo=0, hi=5, blocks=(3,), scores=None, layout=None,
                 state=None, seed=0):
        self.title, self.bs, self.D, self.H, self.Hk, self.head, self.lo, self.hi = title, bs, D, H, Hk, head, lo, hi
        self.blocks, self.layout = list(blocks), layout
        self.starts = [i * bs for i in range(lo // bs, lo // bs + len(blocks))]
        g = torch.Generator().manual_seed(seed)
        n_blocks = max(blocks) + 2
        self.BLOCK_D = 1 << max(D - 1, 0).bit_length()
        k = torch.randn(n_blocks, bs, Hk, D, generator=g)  # blocks no step names: another row's keys
        v = torch.randn(n_blocks, bs, Hk, D, generator=g)
        q = torch.randn(self.BLOCK_D, generator=g) * 0.5
        q[D:] = 0.0
        if scores is not None:
            q.zero_()
            q[0] = 1.0
        for blk, start in zip(self.blocks, self.starts):
            k[blk] = torch.randn(bs, Hk, D, generator=g)
            v[blk] = torch.randn(bs, Hk, D, generator=g)
            if scores is not None:
                k[blk, :, :, 0] = torch.tensor([float(scores(start + i)) for i in range(bs)])[:, None]
            outside = [i for i in range(bs) if not lo <= start + i < hi]
            k[blk, outside], v[blk, outside] = float("nan"), float("nan")  # never to be read
        self.q, self.k, self.v = q, k, v
        self.state = state or (float("-inf"), 0.0, torch.zeros(self.BLOCK_D))

    def pools(self):
        """The pools as the kernel sees them: contiguous, or a view with other strides (NaN around it)."""
        k, v = self.k, self.v
        if self.layout == "fused":  # vLLM's (num_blocks, 2, block_size, nheads_k, headdim): a block's K then its V
            kv = torch.stack([k, v], dim=1).contiguous()
            return kv[:, 0], kv[:, 1]
        if self.layout == "heads first":  # stored (num_blocks, nheads_k, block_size, headdim), seen transposed
            return k.transpose(1, 2).contiguous().transpose(1, 2), v.transpose(1, 2).contiguous().transpose(1, 2)
        if self.layout == "padded":  # headdim padded to a multiple of 8 lanes more, NaN in the padding
            pad = torch.full(k.shape[:-1] + (k.shape[-1] + 8,), float("nan"))
            kp, vp = pad.clone(), pad.clone()
            kp[..., : self.D], vp[..., : self.D] = k, v
            return kp[..., : self.D], vp[..., : self.D]
        return k, v

    def strides(self) -> str:
        k, _ = self.pools()
        c = self.k.stride()
        return (f"stride_block={k.stride(0)}, stride_slot={k.stride(1)}, stride_head={k.stride(2)} (a contiguous "
                f"pool of this shape has {c[0]}, {c[1]}, {c[2]})")

    def describe(self) -> str:
        pool = f", the pool a view ({self.layout}: {self.strides()})" if self.layout else ""
        return (f"attend_block one block at a time: {self.title} (block_size={self.bs}, headdim={self.D}, query head "
                f"{self.head} of {self.H} over {self.Hk} key/value heads, lo={self.lo}, hi={self.hi}{pool})")

    def block_text(self, i) -> str:
        s = self.starts[i]
        return (f"block {i + 1} of {len(self.blocks)} (pool block {self.blocks[i]}, positions {s}..{s + self.bs - 1}, "
                f"visible {max(s, self.lo)}..{min(s + self.bs, self.hi) - 1})")

    def run(self, attend, device):
        from swkv_teach.kernels.decode import attend_steps

        k, v = self.pools()
        m0, l0, acc0 = self.state
        try:
            out = call(self.describe(), "attend_block", plain, attend_steps, self.q.to(device), k.to(device),
                       v.to(device), self.blocks, self.starts, self.head, self.H // self.Hk, self.lo, self.hi, (m0, l0, acc0.to(device)), attend=attend)
        except ExerciseFailed as e:
            raise explained(e) from None
        return [t.cpu() for t in out]

    # ---------------------------------------------------------------- the right fold and known slips, in float64
    def fold(self, i, state, *, block=None, scale=1.0, base=math.e, raw_max=False, no_max=False, inverted=False,
             old_max=False, drop=False, m_units=1.0):
        """The state after block ``i`` from ``state``; keyword arguments reproduce one slip each."""
        m0, l0, acc0 = (torch.as_tensor(x, dtype=torch.float64) for x in state)
        blk = self.blocks[i] if block is None else block
        start = self.starts[i]
        kvh = self.head // (self.H // self.Hk)
        seen = torch.tensor([self.lo <= start + j < self.hi for j in range(self.bs)])
        if drop:
            seen[:] = False
        kb = torch.nan_to_num(self.k[blk, :, kvh].double())
        vb = torch.nan_to_num(self.v[blk, :, kvh].double())
        s = kb @ self.q[: self.D].double() * scale  # (bs,)
        lnb = math.log(base)
        if no_max:
            p = torch.where(seen, torch.exp(s * lnb), 0.0)
            return torch.tensor(0.0), l0 + p.sum(), acc0 + _pad(p @ vb, self.BLOCK_D)
        pool = torch.where(seen, s, 0.0) if raw_max else torch.where(seen, s, -math.inf)
        tile_max = pool.max()
        if raw_max and (1 << max(self.bs - 1, 0).bit_length()) > self.bs:  # BLOCK_N > BLOCK_SIZE: padding scores 0
            tile_max = torch.maximum(tile_max, torch.tensor(0.0, dtype=torch.float64))
        m_new = torch.maximum(m0, tile_max)
        alpha = torch.exp((m0 - m_new) * lnb) if not inverted else torch.exp((m_new - m0) * lnb)
        if m0 == -math.inf:
            alpha = torch.tensor(0.0, dtype=torch.float64)
        ref = m0 if (old_max and m0 != -math.inf) else m_new
        p = torch.where(seen, torch.exp((s - ref) * lnb), 0.0)
        return m_new * m_units, l0 * alpha + p.sum(), acc0 * alpha + _pad(p @ vb, self.BLOCK_D)


def _pad(x, n):
    return torch.cat([x, x.new_zeros(n - x.shape[0])])


def explained(e):
    """``e`` with a hint that says what happened, when it is the interpreter refusing a mask made int32."""
    from swkv_teach.grading._report import rehint

    if "mask has unsupported dtype" not in str(e):
        return e
    return rehint(e, "Triton's CPU interpreter turned a mask into int32 and tl.load refuses it: a vector of booleans "
                  "& a scalar boolean (say (offs_d < HEAD_DIM) & inside, with inside = (start + i >= lo) & (start + i "
                  "< hi) for one slot i) comes out int32 there. Build the mask from vectors only (a slot test over "
                  "pos = start + offs_n, then seen[:, None] & (offs_d < HEAD_DIM)[None, :]), or broadcast the scalar "
                  "with tl.where(inside, offs_d < HEAD_DIM, False).")


def plain(fn, *args, **kwargs):
    """Run a launch; the stub's NotImplementedError comes back as itself, not wrapped by Triton.

    The interpreter raises ``InterpreterError(repr(e)) from e``; the compiler refuses a ``raise``
    in a jit function with an error that quotes the line.
    """
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        seen = e
        for _ in range(8):
            if seen is None:
                break
            if isinstance(seen, NotImplementedError):
                raise seen from None
            seen = seen.__cause__ or seen.__context__
        if "NotImplementedError" in str(e):
            raise NotImplementedError(str(e)) from None
        raise


def _close(a, b) -> bool:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return bool(torch.allclose(a, b, atol=ATOL, rtol=RTOL, equal_nan=False))


def _same(got, want) -> bool:
    return all(_close(g, w) for g, w in zip(got, want))


def scenarios():
    gqa = dict(H=4, Hk=2, head=3)
    yield _Steps("one block, keys 0..4", blocks=[3], lo=0, hi=5)
    yield _Steps("three blocks of a shuffled pool, the window cutting the first and the last (GQA)",
                 blocks=[5, 1, 6], lo=10, hi=40, seed=1, **gqa)
    yield _Steps("scores rising by 20 in block 2, falling by 200 in block 3 (rescale, then carry the max)",
                 blocks=[2, 0, 4], lo=0, hi=48, seed=2,
                 scores=lambda j: (j % 5) / 5 + (20 if 16 <= j < 32 else 0) - (200 if j >= 32 else 0))
    yield _Steps("a block cut by the window whose visible scores all lie below -100", blocks=[2], lo=20, hi=27,
                 seed=3, scores=lambda j: -150.0 + (j % 7) / 7)
    yield _Steps("cache_seqlens on a block edge: hi = 32, the last block full", blocks=[4, 0], lo=0, hi=32, seed=4)
    yield _Steps("block_size 24, headdim 12 (the tile padded to BLOCK_N = 32, BLOCK_D = 16)", bs=24, D=12,
                 blocks=[1, 3], lo=5, hi=40, seed=5, **gqa)
    for layout in ("fused", "heads first", "padded"):
        yield _Steps("three blocks of a shuffled pool (GQA)", blocks=[5, 1, 6], lo=10, hi=40, seed=6, layout=layout,
                     **gqa)


NAMES = ("m_i", "l_i", "acc")


def _types(case, f32) -> None:
    for i in range(f32.shape[0]):
        wrong = [NAMES[j] for j in range(3) if int(f32[i, j]) == 0]
        if wrong:
            raise fail(case.describe(), f"after {case.block_text(i)}, attend_block returned {' and '.join(wrong)} in "
                       "another type than float32 (float64, say).",
                       hint="m_i, l_i and acc are carried from block to block by the skeleton's loop, which starts "
                       "them float32; Triton's compiler refuses a loop-carried value that changes type (only the CPU "
                       "interpreter lets it pass). Compute in float32, or cast back: .to(tl.float32).")


def _slips(case, i, state, got):
    """A sentence naming the slip whose numbers ``got`` are, or None."""
    right = case.fold(i, state)
    if _close(got[1], right[1]) and _close(got[2], right[2]) and _close(got[0], right[0] * LOG2E):
        return ("m_i came back in base-2 units (the scores times log2(e)), though l_i and acc are right: the skeleton "
                "stores lse = m_i + log(l_i) with natural logs, so keep m_i in the scores' own units (divide the "
                "base-2 max by log2(e), or use tl.exp).")
    tries = [
        (dict(raw_max=True), "the block's max was taken over the raw scores, masked slots included (a masked slot "
         "scores 0 from other=0.0): when every visible score lies below about -87, exp(s - 0) underflows and the "
         "block's keys vanish. Set the scores of masked slots to -inf before tl.max (tl.where(seen, s, -inf))."),
        (dict(no_max=True), "no max was subtracted (m_i stays 0, p = exp(s)): exact for small scores, but exp "
         "overflows once a score passes 88 and underflows below -87. Keep the running max: "
         "m_new = tl.maximum(m_i, tl.max(s, 0)), p = tl.exp(s - m_new)."),
        (dict(scale=1 / math.sqrt(case.D)), "the scores were scaled again (divided by sqrt(HEAD_DIM)): q arrives "
         "already multiplied by softmax_scale, so s = tl.sum(q[None, :] * k, 1) as it is."),
        (dict(base=2.0), "the exponentials are base 2 (tl.exp2) with the scores not multiplied by log2(e): a softmax "
         "at another temperature. Use tl.exp, or exp2 of s * log2(e) with m_i kept in natural units."),
        (dict(inverted=True), "the rescale factor is upside down: the old sums must shrink by alpha = "
         "exp(m_i - m_new) <= 1 when the max rises, not grow by exp(m_new - m_i)."),
        (dict(old_max=True), "p was computed against the max from before this block, exp(s - m_i), then rescaled as "
         "if it were exp(s - m_new): p = exp(s - m_new), with the new max."),
        (dict(drop=True), "this block's keys were all left out although " +
         (f"hi = {case.hi} ends exactly on the block's edge: a count of hi % BLOCK_SIZE is 0 there. Mask with "
          "pos < hi (and pos >= lo), not with a count of keys in the last block."
          if case.hi == case.starts[i] + case.bs else "some of its positions lie in lo <= pos < hi.")),
    ]
    logical = case.starts[i] // case.bs
    if logical != case.blocks[i] and logical < case.k.shape[0]:
        tries.append((dict(block=logical), f"the keys came from pool block {logical} (the logical block, "
                      f"start // BLOCK_SIZE) instead of pool block block_id = {case.blocks[i]}: the block table maps "
                      "logical blocks to pool blocks, and the skeleton hands you the pool block."))
    for kwargs, sentence in tries:
        try:
            if _same(got, case.fold(i, state, **kwargs)):
                return sentence
        except (RuntimeError, ValueError, IndexError):
            continue
    if _close(got[0], right[0]) and _close(got[1], right[1]) and _close(got[2][: case.D], right[2][: case.D]):
        return (f"acc is right in lanes 0..{case.D - 1} but not 0 in the tile's padding lanes {case.D}..{case.BLOCK_D - 1}"
                ": those lanes read past HEAD_DIM (the next head's or the next slot's values). Mask the loads with "
                "d < HEAD_DIM as well as by slot.")
    if _close(got[0], right[0]) and _close(got[1], right[1]):
        rel = float(((got[2] - right[2]).abs().max() / right[2].abs().max().clamp_min(1e-12)))
        if 1e-5 < rel < 1e-2:
            return (f"acc is off by {rel:.1e} of its size while m_i and l_i are right: about float16/bfloat16's "
                    "precision. Keep p and v in float32 for the product p @ v (the pool may be bfloat16: cast the "
                    "loaded values with .to(tl.float32)).")
    return None


def check_steps(attend, device) -> None:
    """Every scenario; the first state that differs is reported, named when it is a known slip's."""
    contiguous_ok = False
    for case in scenarios():
        m, l_, acc, f32 = case.run(attend, device)
        _types(case, f32)
        state = case.state
        for i in range(len(case.blocks)):
            got = (m[i].double(), l_[i].double(), acc[i].double())
            want = case.fold(i, state)
            if _same(got, want):
                state = got
                continue
            differ = [n for n, g, w in zip(NAMES, got, want) if not _close(g, w)]
            named = _slips(case, i, state, got)
            if named is None and case.layout and contiguous_ok:
                named = (f"the same blocks in a contiguous pool gave the right state, so the offsets assume one "
                         f"layout: this pool is a view ({case.strides()}). Build every offset from the strides "
                         "passed, block_id * stride_block + slot * stride_slot + (head // GROUP) * stride_head + d, "
                         "never from BLOCK_SIZE, HEAD_DIM or another stride (stride_slot is not "
                         "stride_block // BLOCK_SIZE, stride_head is not HEAD_DIM).")
            m0, l0 = (float(x) for x in state[:2])
            raise fail(case.describe(),
                       f"after {case.block_text(i)}, starting from m_i = {m0:.6g}, l_i = {l0:.6g}: "
                       f"{', '.join(differ)} differ{'s' if len(differ) == 1 else ''} from the online softmax's.",
                       f"expected m_i = {float(want[0]):.6g}, l_i = {float(want[1]):.6g}; got m_i = "
                       f"{float(got[0]):.6g}, l_i = {float(got[1]):.6g}",
                       expected=want[2][: case.D].float()[:6], got=got[2][: case.D].float()[:6],
                       what="got acc (first 6)",
                       hint=named or ("compare the fold with the statement's: m_new = max(m_i, max of the visible "
                                      "scores), alpha = exp(m_i - m_new), p = exp(s - m_new) (0 where not visible), "
                                      "l = l_i * alpha + sum(p), acc = acc * alpha + sum(p v); read slot i of the "
                                      "block at block_id * stride_block + i * stride_slot + (head // GROUP) * "
                                      "stride_head + d."),
                       generic=named is None)
        if not case.layout and case.title.startswith("three blocks"):
            contiguous_ok = True
