"""Right answers to exercises 02 (sliding window), 03 (ring buffer) and 07 (sinks), in many styles."""

from collections import deque

import torch

from swkv_teach.caches.base import KVCache
from tests.right_answers import right

# The library's own classes are not right answers: the checks refuse them (they are the oracle).


# ---------------------------------------------------------------- 01 sliding window
@right("check_sliding_window_cache")
class SeedReference:
    """The problem statement's reference solution, verbatim."""

    def __init__(self, window_size: int):
        self.window_size = window_size
        self.k = None
        self.v = None

    def update(self, k_new, v_new):
        if self.k is None:
            self.k, self.v = k_new, v_new
        else:
            self.k = torch.cat([self.k, k_new], dim=2)
            self.v = torch.cat([self.v, v_new], dim=2)
        if self.k.shape[2] > self.window_size:
            self.k = self.k[:, :, -self.window_size :, :]
            self.v = self.v[:, :, -self.window_size :, :]
        return self.k, self.v


@right("check_sliding_window_cache")
class TokenListRestacked:
    """A list of one-token tensors, re-stacked with torch.cat at every step."""

    def __init__(self, window_size):
        self.window_size, self.ks, self.vs = window_size, [], []

    def update(self, k_new, v_new):
        self.ks.append(k_new)
        self.vs.append(v_new)
        self.ks, self.vs = self.ks[-self.window_size :], self.vs[-self.window_size :]
        return torch.cat(self.ks, dim=-2), torch.cat(self.vs, dim=-2)


@right("check_sliding_window_cache")
class DequeRestacked:
    """deque(maxlen=W) of (k, v) pairs, stacked on every update."""

    def __init__(self, window_size):
        self.items = deque(maxlen=window_size)

    def update(self, k_new, v_new):
        self.items.append((k_new, v_new))
        return torch.cat([k for k, _ in self.items], dim=2), torch.cat([v for _, v in self.items], dim=2)


@right("check_sliding_window_cache")
class NarrowContiguousCopies:
    """narrow() instead of slicing, and contiguous copies returned."""

    def __init__(self, window_size):
        self.window_size, self.k, self.v = window_size, None, None

    def update(self, k_new, v_new):
        self.k = k_new.clone() if self.k is None else torch.cat((self.k, k_new), 2)
        self.v = v_new.clone() if self.v is None else torch.cat((self.v, v_new), 2)
        n = self.k.size(2)
        if n > self.window_size:
            self.k = self.k.narrow(2, n - self.window_size, self.window_size)
            self.v = self.v.narrow(2, n - self.window_size, self.window_size)
        return self.k.contiguous().clone(), self.v.contiguous().clone()


@right("check_sliding_window_cache")
class RolledBuffer:
    """A preallocated W-slot buffer: torch.roll one slot left, write the newest last, return the filled tail."""

    def __init__(self, window_size):
        self.W, self.k, self.v, self.n = window_size, None, None, 0

    def update(self, k_new, v_new):
        if self.k is None:
            B, H, _, D = k_new.shape
            self.k = torch.zeros(B, H, self.W, D, dtype=k_new.dtype, device=k_new.device)
            self.v = torch.zeros_like(self.k)
        self.k = torch.roll(self.k, shifts=-1, dims=2)
        self.v = torch.roll(self.v, shifts=-1, dims=2)
        self.k[:, :, -1:] = k_new
        self.v[:, :, -1:] = v_new
        self.n = min(self.n + 1, self.W)
        return self.k[:, :, self.W - self.n :], self.v[:, :, self.W - self.n :]


@right("check_sliding_window_cache")
class SharedShiftLeftBuffer:
    """One (2, B, H, W, D) buffer for keys and values, shifted left in place at every step."""

    def __init__(self, window_size):
        self.W, self.buf, self.n = window_size, None, 0

    def update(self, k_new, v_new):
        if self.buf is None:
            B, H, _, D = k_new.shape
            self.buf = k_new.new_zeros(2, B, H, self.W, D)
        self.buf[:, :, :, :-1] = self.buf[:, :, :, 1:].clone()
        self.buf[0, :, :, -1:] = k_new
        self.buf[1, :, :, -1:] = v_new
        self.n = min(self.n + 1, self.W)
        return self.buf[0, :, :, self.W - self.n :], self.buf[1, :, :, self.W - self.n :]


@right("check_sliding_window_cache")
class TimeMajorTransposed:
    """Keeps tokens time-major, (t, B, H, D), and returns them transposed to (B, H, t, D)."""

    def __init__(self, window_size):
        self.W, self.k, self.v = window_size, None, None

    def update(self, k_new, v_new):
        k_t, v_t = k_new.permute(2, 0, 1, 3), v_new.permute(2, 0, 1, 3)  # (1, B, H, D)
        self.k = k_t if self.k is None else torch.cat([self.k, k_t])[-self.W :]
        self.v = v_t if self.v is None else torch.cat([self.v, v_t])[-self.W :]
        return self.k.permute(1, 2, 0, 3), self.v.permute(1, 2, 0, 3)


@right("check_sliding_window_cache")
class StoresInAtLeastFloat32:
    """Keeps 16-bit tokens as float32 internally (exact), and returns them in the caller's dtype."""

    def __init__(self, window_size):
        self.W, self.k, self.v = window_size, None, None

    def update(self, k_new, v_new):
        wide = torch.promote_types(k_new.dtype, torch.float32)
        k, v = k_new.to(wide), v_new.to(wide)
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)[:, :, -self.W :]
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)[:, :, -self.W :]
        return self.k.to(k_new.dtype), self.v.to(k_new.dtype)


@right("check_sliding_window_cache")
class DoubleBufferAmortised:
    """A 2W-slot buffer filled left to right; when full, its last W tokens move to the front (one copy per W steps)."""

    def __init__(self, window_size):
        self.W, self.buf, self.n = window_size, None, 0

    def update(self, k_new, v_new):
        if self.buf is None:
            B, H, _, D = k_new.shape
            self.buf = k_new.new_zeros(2, B, H, 2 * self.W, D)
        if self.n == 2 * self.W:
            self.buf[:, :, :, : self.W] = self.buf[:, :, :, self.W :].clone()
            self.n = self.W
        self.buf[0, :, :, self.n] = k_new[:, :, 0]
        self.buf[1, :, :, self.n] = v_new[:, :, 0]
        self.n += 1
        lo = max(0, self.n - self.W)
        return self.buf[0, :, :, lo : self.n], self.buf[1, :, :, lo : self.n]


# ---------------------------------------------------------------- 03 ring buffer
@right("check_ring_buffer_cache")
class RingWithCopyInto:
    """A ring using copy_ into narrow() views, positions computed in Python."""

    def __init__(self, window_size):
        self.W, self.kb, self.vb, self.n = window_size, None, None, 0

    def update(self, k_new, v_new):
        if self.kb is None:
            shape = (*k_new.shape[:2], self.W, k_new.shape[3])
            self.kb = torch.empty(shape, dtype=k_new.dtype, device=k_new.device)
            self.vb = torch.empty_like(self.kb)
        s = self.n % self.W
        self.kb.narrow(2, s, 1).copy_(k_new)
        self.vb.narrow(2, s, 1).copy_(v_new)
        self.n += 1
        m = min(self.n, self.W)
        return self.kb.narrow(2, 0, m), self.vb.narrow(2, 0, m)

    @property
    def positions(self):
        return torch.tensor([max(p for p in range(self.n) if p % self.W == s) for s in range(min(self.n, self.W))])

    def ordered(self):
        pos = self.positions.tolist()
        order = sorted(range(len(pos)), key=pos.__getitem__)
        idx = torch.tensor(order, device=self.kb.device)
        return self.kb.index_select(2, idx), self.vb.index_select(2, idx)


@right("check_ring_buffer_cache")
class TimeMajorRing:
    """Slots time-major, (W, B, H, D); update returns a transposed view, positions as int32."""

    def __init__(self, window_size):
        self.W, self.k, self.v, self.seen = window_size, None, None, 0

    def update(self, k_new, v_new):
        if self.k is None:
            B, H, _, D = k_new.shape
            self.k = k_new.new_zeros(self.W, B, H, D)
            self.v = v_new.new_zeros(self.W, B, H, D)
        self.k[self.seen % self.W] = k_new[:, :, 0]
        self.v[self.seen % self.W] = v_new[:, :, 0]
        self.seen += 1
        n = min(self.seen, self.W)
        return self.k[:n].permute(1, 2, 0, 3), self.v[:n].permute(1, 2, 0, 3)

    @property
    def positions(self):
        slots = torch.arange(min(self.seen, self.W), dtype=torch.int32)
        return slots + self.W * ((self.seen - 1 - slots) // self.W)

    def ordered(self):
        order = torch.argsort(self.positions)
        return (self.k[order.to(self.k.device)].permute(1, 2, 0, 3).contiguous(),
                self.v[order.to(self.v.device)].permute(1, 2, 0, 3).contiguous())


@right("check_ring_buffer_cache")
class OneSharedBufferRing:
    """Keys and values in one (2, B, H, W, D) buffer; positions kept in a long tensor beside the slots."""

    def __init__(self, window_size):
        self.W, self.buf, self.seen = window_size, None, 0
        self.slot_pos = torch.full((window_size,), -1, dtype=torch.long)

    def update(self, k_new, v_new):
        if self.buf is None:
            B, H, _, D = k_new.shape
            self.buf = k_new.new_zeros(2, B, H, self.W, D)
        s = self.seen % self.W
        self.buf[0, :, :, s] = k_new[:, :, 0]
        self.buf[1, :, :, s] = v_new[:, :, 0]
        self.slot_pos[s] = self.seen
        self.seen += 1
        n = min(self.seen, self.W)
        return self.buf[0, :, :, :n], self.buf[1, :, :, :n]

    @property
    def positions(self):
        return self.slot_pos[: min(self.seen, self.W)].clone()

    def ordered(self):
        order = torch.argsort(self.positions).to(self.buf.device)
        return self.buf[0].index_select(2, order), self.buf[1].index_select(2, order)


@right("check_ring_buffer_cache")
class RingKeepingItsLastOrdered(OneSharedBufferRing):
    """ordered() keeps the copy it returned on self (a cache of it): still a copy, never written into."""

    def ordered(self):
        self.last_ordered = super().ordered()
        return self.last_ordered


# ---------------------------------------------------------------- 05 sinks
@right("check_sink_cache")
class ChronologicalSinks:
    """The solution's style: torch.cat, then index_select of the survivors; positions a list made a tensor."""

    def __init__(self, num_sinks, window_size):
        self.S, self.W, self.k, self.v, self.pos, self.seen = num_sinks, window_size, None, None, [], 0

    def update(self, k_new, v_new):
        self.k = k_new if self.k is None else torch.cat([self.k, k_new], dim=2)
        self.v = v_new if self.v is None else torch.cat([self.v, v_new], dim=2)
        self.pos.append(self.seen)
        self.seen += 1
        keep = [i for i, p in enumerate(self.pos) if p < self.S or p >= self.seen - self.W]
        idx = torch.tensor(keep, device=self.k.device)
        self.k, self.v = self.k.index_select(2, idx), self.v.index_select(2, idx)
        self.pos = [self.pos[i] for i in keep]
        return self.k, self.v

    @property
    def positions(self):
        return torch.tensor(self.pos, dtype=torch.long)


@right("check_sink_cache")
class NewestFirstSinks(ChronologicalSinks):
    """Returns keys newest first (and positions in that order)."""

    def update(self, k_new, v_new):
        k, v = super().update(k_new, v_new)
        return k.flip(2), v.flip(2)

    @property
    def positions(self):
        return torch.tensor(self.pos[::-1])


@right("check_sink_cache")
class SeparateSinkAndWindow:
    """Sinks in their own tensor, the window in a deque of tokens; update returns sinks then window."""

    def __init__(self, num_sinks, window_size):
        self.S, self.W, self.seen = num_sinks, window_size, 0
        self.sink_k = self.sink_v = None
        self.window = deque()

    def update(self, k_new, v_new):
        p = self.seen
        self.seen += 1
        if p < self.S:
            self.sink_k = k_new if self.sink_k is None else torch.cat([self.sink_k, k_new], dim=2)
            self.sink_v = v_new if self.sink_v is None else torch.cat([self.sink_v, v_new], dim=2)
        else:
            self.window.append((p, k_new, v_new))
        while self.window and self.window[0][0] < self.seen - self.W:
            self.window.popleft()
        ks = ([self.sink_k] if self.sink_k is not None else []) + [k for _, k, _ in self.window]
        vs = ([self.sink_v] if self.sink_v is not None else []) + [v for _, _, v in self.window]
        return torch.cat(ks, dim=2), torch.cat(vs, dim=2)

    @property
    def positions(self):
        n_sinks = min(self.seen, self.S)
        return torch.tensor(list(range(n_sinks)) + [p for p, _, _ in self.window], dtype=torch.long)


@right("check_sliding_window_cache")
class OnTheLibrarysAbstractBase(KVCache):
    """Built on the library's abstract KVCache interface (not on one of its caches): the learner's own code."""

    def __init__(self, window_size):
        self.window_size, self.k, self.v, self._seen = window_size, None, None, 0

    def update(self, k_new, v_new):
        self._seen += k_new.shape[2]
        if self.k is None:
            self.k, self.v = k_new, v_new
        else:
            self.k = torch.cat([self.k, k_new], dim=2)[:, :, -self.window_size :]
            self.v = torch.cat([self.v, v_new], dim=2)[:, :, -self.window_size :]
        return self.k, self.v

    @property
    def positions(self):
        return torch.arange(self._seen - self.k.shape[2], self._seen)

    @property
    def seen(self):
        return self._seen

    def nbytes(self):
        return 0 if self.k is None else 2 * self.k.numel() * self.k.element_size()

    def reset(self):
        self.k = self.v = None
        self._seen = 0

    def __len__(self):
        return 0 if self.k is None else self.k.shape[2]


# ---------------------------------------------------------------- styles the later checks could over-reject
@right("check_ring_buffer_cache")
class RingWithInt32PositionsAndFlatWrites:
    """Positions kept per slot in an int32 tensor on the keys' device (not a Python int), keys in a flat
    (B * H, W, D) buffer written through reshape (which copies an expanded or sliced token rather than refusing
    it), ordered() by an index_select on that buffer."""

    def __init__(self, window_size):
        self.W, self.seen, self.k = window_size, 0, None

    def update(self, k_new, v_new):
        B, H, _, D = k_new.shape
        if self.k is None:
            self.shape = (B, H, D)
            self.k = torch.zeros(B * H, self.W, D, dtype=k_new.dtype, device=k_new.device)
            self.v = torch.zeros_like(self.k)
            self.pos = torch.zeros(self.W, dtype=torch.int32, device=k_new.device)
        slot = self.seen % self.W
        self.k[:, slot] = k_new.reshape(B * H, D)
        self.v[:, slot] = v_new.reshape(B * H, D)
        self.pos[slot] = self.seen
        self.seen += 1
        n = min(self.seen, self.W)
        return self._heads(self.k[:, :n]), self._heads(self.v[:, :n])

    def _heads(self, t):
        B, H, D = self.shape
        return t.view(B, H, t.shape[1], D)

    @property
    def positions(self):
        return self.pos[: min(self.seen, self.W)].clone()

    def ordered(self):
        n = min(self.seen, self.W)
        order = torch.argsort(self.pos[:n].long())
        return self._heads(self.k[:, :n].index_select(1, order)), self._heads(self.v[:, :n].index_select(1, order))


@right("check_sink_cache")
class SinksWithFloat64PositionRecord(ChronologicalSinks):
    """Keeps a float64 copy of the positions (exact up to 2**53, unlike the keys' float32 or bfloat16) and reports
    them as long: a float record is refused only where its dtype cannot hold the positions."""

    def update(self, k_new, v_new):
        k, v = super().update(k_new, v_new)
        self.fpos = torch.tensor(self.pos, dtype=torch.float64, device=k_new.device)
        return k, v

    @property
    def positions(self):
        return self.fpos.long()


@right("check_sliding_window_cache")
class ReshapedTokensInADeque:
    """Each token kept as k_new.reshape(B, H, D) in a deque (reshape copies a sliced or expanded token where view
    would refuse it), stacked on dim 2 on return."""

    def __init__(self, window_size):
        self.ks, self.vs = deque(maxlen=window_size), deque(maxlen=window_size)

    def update(self, k_new, v_new):
        B, H, _, D = k_new.shape
        self.ks.append(k_new.reshape(B, H, D))
        self.vs.append(v_new.reshape(B, H, D))
        return torch.stack(list(self.ks), dim=2), torch.stack(list(self.vs), dim=2)
