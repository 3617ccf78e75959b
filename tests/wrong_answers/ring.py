"""Wrong answers to exercise 03, RingBufferKVCache."""

import torch

from tests.wrong_answers import wrong


class _Ring:
    """A correct ring (the solution's shape); each bug overrides one part."""

    def __init__(self, window_size):
        self.window_size = window_size
        self.k_buf = self.v_buf = None
        self.seen = 0

    def alloc(self, k_new):
        B, H, _, D = k_new.shape
        self.k_buf = k_new.new_zeros(B, H, self.window_size, D)
        self.v_buf = k_new.new_zeros(B, H, self.window_size, D)

    def write(self, k_new, v_new):
        if self.k_buf is None:
            self.alloc(k_new)
        slot = self.seen % self.window_size
        self.k_buf[:, :, slot] = k_new[:, :, 0]
        self.v_buf[:, :, slot] = v_new[:, :, 0]
        self.seen += 1
        return min(self.seen, self.window_size)

    def update(self, k_new, v_new):
        n = self.write(k_new, v_new)
        return self.k_buf[:, :, :n], self.v_buf[:, :, :n]

    @property
    def positions(self):
        W = self.window_size
        s = torch.arange(min(self.seen, W))
        return s + W * torch.div(self.seen - 1 - s, W, rounding_mode="floor")

    def ordered(self):
        order = torch.argsort(self.positions).to(self.k_buf.device)
        return self.k_buf.index_select(2, order), self.v_buf.index_select(2, order)


@wrong("check_ring_buffer_cache", "unfilled")
class ReturnsUnfilledZeros(_Ring):
    """Returns the whole buffer from the first step, zero slots included."""

    def update(self, k_new, v_new):
        self.write(k_new, v_new)
        return self.k_buf, self.v_buf


@wrong("check_ring_buffer_cache", "new memory", "data_ptr")
class ReallocatesEveryStep(_Ring):
    """Correct contents, but clones the buffer at every step (O(W) copy and an allocation per token)."""

    def update(self, k_new, v_new):
        n = self.write(k_new, v_new)
        self.k_buf, self.v_buf = self.k_buf.clone(), self.v_buf.clone()
        return self.k_buf[:, :, :n], self.v_buf[:, :, :n]


@wrong("check_ring_buffer_cache", "positions", "slot order")
class PositionsChronological(_Ring):
    """Keys in slot order, but positions reported sorted (chronological)."""

    @property
    def positions(self):
        return torch.arange(max(0, self.seen - self.window_size), self.seen)


@wrong("check_ring_buffer_cache", "positions")
class PositionsFromLen(_Ring):
    """positions = arange(len): slot indices, not absolute positions."""

    @property
    def positions(self):
        return torch.arange(min(self.seen, self.window_size))


@wrong("check_ring_buffer_cache", "chronological", "slot order")
class RollsToChronological(_Ring):
    """Rolls the buffer into chronological order at every step: right tokens, O(W) copy, wrong order."""

    def update(self, k_new, v_new):
        n = self.write(k_new, v_new)
        if self.seen > self.window_size:
            shift = -(self.seen % self.window_size)
            return self.k_buf.roll(shift, dims=2), self.v_buf.roll(shift, dims=2)
        return self.k_buf[:, :, :n], self.v_buf[:, :, :n]


@wrong("check_ring_buffer_cache", "dtype", "float64")
class DefaultDtypeBuffer(_Ring):
    """Allocates the buffers with torch.zeros' default dtype (float32)."""

    def alloc(self, k_new):
        B, H, _, D = k_new.shape
        self.k_buf = torch.zeros(B, H, self.window_size, D, device=k_new.device)
        self.v_buf = torch.zeros(B, H, self.window_size, D, device=k_new.device)


@wrong("check_ring_buffer_cache", "device", needs_accelerator=True)
class CPUBuffer(_Ring):
    """Allocates the buffers on the CPU whatever the tokens' device."""

    def alloc(self, k_new):
        B, H, _, D = k_new.shape
        self.k_buf = torch.zeros(B, H, self.window_size, D, dtype=k_new.dtype)
        self.v_buf = torch.zeros(B, H, self.window_size, D, dtype=k_new.dtype)


@wrong("check_ring_buffer_cache", "ordered()", "chronologically")
class OrderedInSlotOrder(_Ring):
    """ordered() returns the slots as they are."""

    def ordered(self):
        n = min(self.seen, self.window_size)
        return self.k_buf[:, :, :n].clone(), self.v_buf[:, :, :n].clone()


@wrong("check_ring_buffer_cache", "ordered()", "p % w")
class SlotOffByOne(_Ring):
    """Writes token p into slot (p + 1) % W."""

    def write(self, k_new, v_new):
        if self.k_buf is None:
            self.alloc(k_new)
        slot = (self.seen + 1) % self.window_size
        self.k_buf[:, :, slot] = k_new[:, :, 0]
        self.v_buf[:, :, slot] = v_new[:, :, 0]
        self.seen += 1
        return min(self.seen, self.window_size)

    def update(self, k_new, v_new):
        self.write(k_new, v_new)
        n = min(self.seen, self.window_size)
        if n < self.window_size:
            idx = torch.tensor([(p + 1) % self.window_size for p in range(n)], device=self.k_buf.device)
            return self.k_buf.index_select(2, idx), self.v_buf.index_select(2, idx)
        return self.k_buf, self.v_buf


@wrong("check_ring_buffer_cache", "shared between instances")
class SharedBuffer(_Ring):
    """Keeps the buffers and the counter on the class, shared by all instances."""

    store = {}

    def __init__(self, window_size):
        self.window_size = window_size

    k_buf = property(lambda self: self.store.get("k"), lambda self, t: self.store.__setitem__("k", t))
    v_buf = property(lambda self: self.store.get("v"), lambda self, t: self.store.__setitem__("v", t))
    seen = property(lambda self: self.store.get("seen", 0), lambda self, n: self.store.__setitem__("seen", n))


@wrong("check_ring_buffer_cache", "hold", "evict")
class KeepsAHistoryLog(_Ring):
    """A correct ring that also appends every token to a debugging log: memory grows without bound."""

    def update(self, k_new, v_new):
        self.log = [*getattr(self, "log", []), (k_new.clone(), v_new.clone())]
        return super().update(k_new, v_new)


# ---------------------------------------------------------------- issue 10: blind spots and misdiagnoses
@wrong("check_ring_buffer_cache", "squeeze", "(3, 1, 1, 5)")
class SqueezedWrite(_Ring):
    """Writes the token with k_new.squeeze(): broadcasts by luck for most shapes, not for one head and batch 3."""

    def write(self, k_new, v_new):
        if self.k_buf is None:
            self.alloc(k_new)
        slot = self.seen % self.window_size
        self.k_buf[:, :, slot] = k_new.squeeze()
        self.v_buf[:, :, slot] = v_new.squeeze()
        self.seen += 1
        return min(self.seen, self.window_size)


@wrong("check_ring_buffer_cache", "batch and heads are mixed up")
class HeadsBatchBuffer(_Ring):
    """Allocates the buffers (heads, batch, W, head_dim): right whenever batch == heads."""

    def alloc(self, k_new):
        B, H, _, D = k_new.shape
        self.k_buf = k_new.new_zeros(H, B, self.window_size, D)
        self.v_buf = k_new.new_zeros(H, B, self.window_size, D)


@wrong("check_ring_buffer_cache", "shared between instances", "alive")
class ClassBufferResetInInit(_Ring):
    """Buffers and counter on the class, reset in __init__: right alone, wrong with two rings alive."""

    def __init__(self, window_size):
        self.window_size = window_size
        type(self).k_buf = type(self).v_buf = None
        type(self).seen = 0

    def write(self, k_new, v_new):
        cls = type(self)
        if cls.k_buf is None:
            B, H, _, D = k_new.shape
            cls.k_buf = k_new.new_zeros(B, H, self.window_size, D)
            cls.v_buf = k_new.new_zeros(B, H, self.window_size, D)
        slot = cls.seen % self.window_size
        cls.k_buf[:, :, slot] = k_new[:, :, 0]
        cls.v_buf[:, :, slot] = v_new[:, :, 0]
        cls.seen += 1
        return min(cls.seen, self.window_size)


@wrong("check_ring_buffer_cache", "zero is a legitimate key")
class FilledFromNonZeroSlots(_Ring):
    """Counts filled slots by looking for slots that are not all zeros: a zero token looks unwritten."""

    def update(self, k_new, v_new):
        self.write(k_new, v_new)
        n = int((self.k_buf != 0).flatten(3).any(-1).any(0).any(0).sum())
        return self.k_buf[:, :, :n], self.v_buf[:, :, :n]


@wrong("check_ring_buffer_cache", "count from before this update")
class SlicesWithStaleCount(_Ring):
    """Computes the number of filled slots before incrementing seen: the newest slot is left out until full."""

    def update(self, k_new, v_new):
        n = min(self.seen, self.window_size) if self.seen >= self.window_size else self.seen
        self.write(k_new, v_new)
        n = self.window_size if self.seen >= self.window_size else n
        return self.k_buf[:, :, :n], self.v_buf[:, :, :n]


@wrong("check_ring_buffer_cache", "view", "copy")
class OrderedReturnsAView(_Ring):
    """ordered() slices the buffer when it is already chronological: a view the next update overwrites."""

    def ordered(self):
        n = min(self.seen, self.window_size)
        if self.seen % self.window_size == 0 or self.seen < self.window_size:
            return self.k_buf[:, :, :n], self.v_buf[:, :, :n]
        return super().ordered()


@wrong("check_ring_buffer_cache", "integer", "float32")
class FloatPositions(_Ring):
    """positions from float arithmetic (torch.floor of a true division): a float tensor."""

    @property
    def positions(self):
        W = self.window_size
        s = torch.arange(min(self.seen, W), dtype=torch.float32)
        return s + W * torch.floor((self.seen - 1 - s) / W)


@wrong("check_ring_buffer_cache", "python list")
class PositionsAsList(_Ring):
    """positions as a Python list: the decoder calls cache.positions.to(device)."""

    @property
    def positions(self):
        return super().positions.tolist()


@wrong("check_ring_buffer_cache", "grew", "self.state.trace")
class TraceInAHelperObject(_Ring):
    """A right ring whose helper object keeps a trace of every slot written: grows forever, one level down."""

    def update(self, k_new, v_new):
        if not hasattr(self, "state"):
            self.state = type("State", (), {})()
            self.state.trace = []
        self.state.trace.append(self.seen % self.window_size)
        return super().update(k_new, v_new)


@wrong("check_ring_buffer_cache", "dtype", "float16")
class HalfPrecisionUpcast(_Ring):
    """Allocates float32 buffers for 16-bit tokens (to 'keep precision'): returns float32 for float16/bfloat16."""

    def alloc(self, k_new):
        B, H, _, D = k_new.shape
        dt = torch.float32 if k_new.element_size() < 4 else k_new.dtype
        self.k_buf = torch.zeros(B, H, self.window_size, D, dtype=dt, device=k_new.device)
        self.v_buf = torch.zeros(B, H, self.window_size, D, dtype=dt, device=k_new.device)


@wrong("check_ring_buffer_cache", "grew", "self.written")
class PositionsFromAnEverGrowingList(_Ring):
    """Right slots and positions, but positions come from a list of every position ever written."""

    def update(self, k_new, v_new):
        self.written = [*getattr(self, "written", []), self.seen]
        return super().update(k_new, v_new)


@wrong("check_ring_buffer_cache", "changed when update() was called", "copy")
class OrderedViewOfAScratchBuffer(_Ring):
    """ordered() writes the chronological order into one scratch buffer and returns it: the next call overwrites it."""

    def ordered(self):
        if getattr(self, "scratch", None) is None or self.scratch[0].shape != self.k_buf.shape:
            self.scratch = (torch.empty_like(self.k_buf), torch.empty_like(self.v_buf))
        order = torch.argsort(self.positions).to(self.k_buf.device)
        n = len(order)
        torch.index_select(self.k_buf, 2, order, out=self.scratch[0][:, :, :n])
        torch.index_select(self.v_buf, 2, order, out=self.scratch[1][:, :, :n])
        return self.scratch[0][:, :, :n], self.scratch[1][:, :, :n]


# ---------------------------------------------------------------- the library's own answer handed in
import swkv_teach  # noqa: E402


@wrong("check_ring_buffer_cache", "library's own", "swkv_teach.RingBufferKVCache")
class LibraryRing(swkv_teach.RingBufferKVCache):
    """RingBufferKVCache = swkv_teach.RingBufferKVCache (here a subclass, so the library's class stays clean)."""


@wrong("check_ring_buffer_cache", "made a ringbufferkvcache from swkv_teach.caches")
class MakesTheLibrary:
    """A factory: RingBufferKVCache = lambda W: swkv_teach.RingBufferKVCache(W), as a class whose __new__ does it."""

    def __new__(cls, window_size):
        return swkv_teach.RingBufferKVCache(window_size)


# ---------------------------------------------------------------- red team, round 2
@wrong("check_ring_buffer_cache", "ordered()", "stored values chronologically", "the keys are right")
class OrderedSortsKeysOnly(_Ring):
    """ordered() sorts the keys but returns the values in slot order."""

    def ordered(self):
        order = torch.argsort(self.positions).to(self.k_buf.device)
        return self.k_buf.index_select(2, order), self.v_buf[:, :, : min(self.seen, self.window_size)].clone()


@wrong("check_ring_buffer_cache", "landed in slot (p + 1) % w", "after seen was incremented")
class WritesSlotAfterIncrement(_Ring):
    """Increments seen first, then writes token p into slot seen % W = (p + 1) % W."""

    def write(self, k_new, v_new):
        if self.k_buf is None:
            self.alloc(k_new)
        self.seen += 1
        slot = self.seen % self.window_size
        self.k_buf[:, :, slot] = k_new[:, :, 0]
        self.v_buf[:, :, slot] = v_new[:, :, 0]
        return min(self.seen, self.window_size)


@wrong("check_ring_buffer_cache", "batch and heads are swapped", "(2, 2, 1, 3)")
class RingSwapsBatchAndHeads(_Ring):
    """When B == H, writes k_new.reshape(H, B, 1, D).transpose(0, 1): batch and heads swapped, the shape unchanged."""

    def update(self, k_new, v_new):
        B, H, _, D = k_new.shape
        if B == H:
            k_new, v_new = (t.reshape(H, B, 1, D).transpose(0, 1) for t in (k_new, v_new))
        return super().update(k_new, v_new)


# ---------------------------------------------------------------- issue 18: holes and true diagnoses

import functools  # noqa: E402

_BUF = {}


def _buffers(window_size, like):
    """Memo of ring buffers keyed on window_size only."""
    if window_size not in _BUF:
        B, H, _, D = like.shape
        _BUF[window_size] = (like.new_zeros(B, H, window_size, D), like.new_zeros(B, H, window_size, D))
    return _BUF[window_size]


@wrong("check_ring_buffer_cache", "shared between instances", "same tensor memory", "memo")
class MemoKeyedOnWindow(_Ring):
    """Buffers come from a module-level memo keyed on window_size only: two caches with one window share them."""

    def alloc(self, k_new):
        self.k_buf, self.v_buf = _buffers(self.window_size, k_new)


@wrong("check_ring_buffer_cache", "shared between instances", "same tensor memory", "lru_cache")
class LruCacheAlloc(_Ring):
    """@functools.lru_cache on an allocator keyed by (window_size, shape): buffers shared across instances."""

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def _zeros(W, B, H, D, dtype):
        return torch.zeros(B, H, W, D, dtype=dtype), torch.zeros(B, H, W, D, dtype=dtype)

    def alloc(self, k_new):
        B, H, _, D = k_new.shape
        self.k_buf, self.v_buf = self._zeros(self.window_size, B, H, D, k_new.dtype)


@wrong("check_ring_buffer_cache", "before any update()", "must be empty")
class PositionsOfTheWholeBuffer(_Ring):
    """Keeps a preallocated (W,) position buffer of zeros and reports all of it, unwritten slots included."""

    def __init__(self, window_size):
        super().__init__(window_size)
        self.pos = torch.zeros(window_size, dtype=torch.long)

    def update(self, k_new, v_new):
        self.pos[self.seen % self.window_size] = self.seen
        return super().update(k_new, v_new)

    @property
    def positions(self):
        return self.pos.clone()


@wrong("check_ring_buffer_cache", "all zeros", "count the tokens")
class ReallocatesWhenTheBufferIsAllZeros(_Ring):
    """`if self.k_buf is None or not self.k_buf.any()`: "nothing stored yet", so zero tokens restart the ring."""

    def update(self, k_new, v_new):
        if self.k_buf is None or not self.k_buf.any():
            self.alloc(k_new)
            self.seen = 0
        return super().update(k_new, v_new)


@wrong("check_ring_buffer_cache", "positions in self.pos", "float32", "exactly only up to", "torch.long")
class PositionsInTheKeysDtype(_Ring):
    """A per-slot position record made with k_new.new_zeros(W): it takes the keys' dtype (float32 here, bfloat16 in a
    half-precision model), which holds integers exactly only up to 2**24 (256 in bfloat16); .long() on the way out
    cannot undo the rounding."""

    def alloc(self, k_new):
        super().alloc(k_new)
        self.pos = k_new.new_zeros(self.window_size)

    def write(self, k_new, v_new):
        if self.k_buf is None:
            self.alloc(k_new)
        self.pos[self.seen % self.window_size] = self.seen
        return super().write(k_new, v_new)

    @property
    def positions(self):
        return self.pos[: min(self.seen, self.window_size)].long()


@wrong("check_ring_buffer_cache", "rounded to bfloat16", "torch.long")
class PositionsAsScalarsOfTheKeysDtype(_Ring):
    """Each slot's position kept as a 0-d tensor k_new.new_tensor(p), in a list: in bfloat16 past position 256
    neighbouring positions round to one value (no tensor record to spot: only a long bfloat16 run shows it)."""

    def write(self, k_new, v_new):
        if self.k_buf is None:
            self.pos = [None] * self.window_size
        self.pos[self.seen % self.window_size] = k_new.new_tensor(self.seen)
        return super().write(k_new, v_new)

    @property
    def positions(self):
        return torch.stack(self.pos[: min(self.seen, self.window_size)]).long()


@wrong("check_ring_buffer_cache", "expanded", "contiguous", ".reshape()")
class WritesThroughAFlatView(_Ring):
    """Writes a token with k_buf.view(B * H, W, D)[:, slot] = k_new.view(B * H, D): fine for a contiguous token,
    but view raises on one expanded over the batch (x[:1].expand(B, ...), stride 0)."""

    def write(self, k_new, v_new):
        if self.k_buf is None:
            self.alloc(k_new)
        B, H, _, D = k_new.shape
        W, slot = self.window_size, self.seen % self.window_size
        self.k_buf.view(B * H, W, D)[:, slot] = k_new.view(B * H, D)
        self.v_buf.view(B * H, W, D)[:, slot] = v_new.view(B * H, D)
        self.seen += 1
        return min(self.seen, W)


@wrong("check_ring_buffer_cache", "counts or records positions in the keys' dtype", "python int")
class CountsInTheKeysDtype(_Ring):
    """Counts tokens in a 0-d tensor made with k_new.new_zeros(()): in bfloat16, 256 + 1 rounds back to 256, so
    past token 256 the slot and the positions stop moving."""

    def write(self, k_new, v_new):
        if self.k_buf is None:
            self.alloc(k_new)
            self.count = k_new.new_zeros(())
        slot = int(self.count) % self.window_size
        self.k_buf[:, :, slot] = k_new[:, :, 0]
        self.v_buf[:, :, slot] = v_new[:, :, 0]
        self.count += 1
        self.seen = int(self.count)
        return min(self.seen, self.window_size)
