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
