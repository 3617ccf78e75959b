"""Wrong answers to exercise 07, SinkCache(num_sinks, window_size)."""

import torch

from tests.wrong_answers import wrong


class _Sinks:
    """A correct chronological sink cache; each bug overrides `keeps` or `positions`."""

    def __init__(self, num_sinks, window_size):
        self.num_sinks, self.window_size = num_sinks, window_size
        self.k = self.v = None
        self.pos = []
        self.seen = 0

    def keeps(self, p):
        return p < self.num_sinks or p >= self.seen - self.window_size

    def update(self, k_new, v_new):
        if self.k is None:
            self.k, self.v = k_new, v_new
        else:
            self.k, self.v = torch.cat([self.k, k_new], dim=2), torch.cat([self.v, v_new], dim=2)
        self.pos.append(self.seen)
        self.seen += 1
        keep = [i for i, p in enumerate(self.pos) if self.keeps(p)]
        idx = torch.tensor(keep, device=self.k.device)
        self.k, self.v = self.k.index_select(2, idx), self.v.index_select(2, idx)
        self.pos = [self.pos[i] for i in keep]
        return self.k, self.v

    @property
    def positions(self):
        return torch.tensor(self.pos)


@wrong("check_sink_cache", "sinks were evicted")
class EvictsTheSinks(_Sinks):
    """A plain window of S + W tokens: the sinks slide out like everything else."""

    def keeps(self, p):
        return p >= self.seen - self.window_size - self.num_sinks


@wrong("check_sink_cache", "off by one", "sinks")
class OneSinkTooMany(_Sinks):
    """Pins positions 0..S (p <= num_sinks)."""

    def keeps(self, p):
        return p <= self.num_sinks or p >= self.seen - self.window_size


@wrong("check_sink_cache", "off by one", "w - 1")
class WindowOneShort(_Sinks):
    """The window part keeps W - 1 tokens (p > seen - W)."""

    def keeps(self, p):
        return p < self.num_sinks or p > self.seen - self.window_size


@wrong("check_sink_cache", "positions")
class PositionsReversed(_Sinks):
    """Right tokens, positions listed newest first."""

    @property
    def positions(self):
        return torch.tensor(self.pos[::-1])


@wrong("check_sink_cache", "hold values")
class SwapsKV(_Sinks):
    """Returns (v, k)."""

    def update(self, k_new, v_new):
        k, v = super().update(k_new, v_new)
        return v, k


@wrong("check_sink_cache", "hold", "evict")
class StoresEverythingReturnsSinksAndWindow(_Sinks):
    """Returns the sinks and the last W, but keeps every token it was ever given."""

    def update(self, k_new, v_new):
        self.all_k = [*getattr(self, "all_k", []), k_new]
        self.all_v = [*getattr(self, "all_v", []), v_new]
        return super().update(k_new, v_new)


# ---------------------------------------------------------------- issue 10: blind spots and misdiagnoses
class _PinnedRing:
    """A right sink cache with pinned slots (sinks in front, a ring behind); bugs below override one part."""

    def __init__(self, num_sinks, window_size):
        self.S, self.W = num_sinks, window_size
        self.k = self.v = None
        self.seen = 0

    def alloc(self, k_new):
        B, H, _, D = k_new.shape
        self.k = k_new.new_zeros(B, H, self.S + self.W, D)
        self.v = k_new.new_zeros(B, H, self.S + self.W, D)

    def slot(self, p):
        return p if p < self.S else self.S + (p - self.S) % self.W

    def update(self, k_new, v_new):
        if self.k is None:
            self.alloc(k_new)
        s = self.slot(self.seen)
        self.k[:, :, s] = k_new[:, :, 0]
        self.v[:, :, s] = v_new[:, :, 0]
        self.seen += 1
        n = min(self.seen, self.S + self.W)
        return self.k[:, :, :n], self.v[:, :, :n]

    def pos_list(self):
        n = min(self.seen, self.S + self.W)
        latest = {}
        for p in range(self.seen):
            latest[self.slot(p)] = p
        return [latest[s] for s in range(n)]

    @property
    def positions(self):
        return torch.tensor(self.pos_list())


@wrong("check_sink_cache", "batch and heads are mixed up")
class HeadsBatchBuffer(_PinnedRing):
    """Buffers allocated (heads, batch, S + W, head_dim): right whenever batch == heads."""

    def alloc(self, k_new):
        B, H, _, D = k_new.shape
        self.k = k_new.new_zeros(H, B, self.S + self.W, D)
        self.v = k_new.new_zeros(H, B, self.S + self.W, D)


@wrong("check_sink_cache", "shared between instances", "alive")
class ClassStateResetInInit(_Sinks):
    """Stored tokens and positions on the class, reset in __init__: right alone, wrong with two caches alive."""

    def __init__(self, num_sinks, window_size):
        self.num_sinks, self.window_size = num_sinks, window_size
        cls = type(self)
        cls.k = cls.v = None
        cls.pos = []
        cls.seen = 0

    def update(self, k_new, v_new):
        cls = type(self)
        cls.k = k_new if cls.k is None else torch.cat([cls.k, k_new], dim=2)
        cls.v = v_new if cls.v is None else torch.cat([cls.v, v_new], dim=2)
        cls.pos = cls.pos + [cls.seen]
        cls.seen += 1
        keep = [i for i, p in enumerate(cls.pos) if p < self.num_sinks or p >= cls.seen - self.window_size]
        idx = torch.tensor(keep, device=cls.k.device)
        cls.k, cls.v = cls.k.index_select(2, idx), cls.v.index_select(2, idx)
        cls.pos = [cls.pos[i] for i in keep]
        return cls.k, cls.v


@wrong("check_sink_cache", "dtype", "float16")
class StartsFromEmptyFloat32(_Sinks):
    """Starts from an empty float32 tensor: cat promotes float16/bfloat16 tokens to float32."""

    def update(self, k_new, v_new):
        if self.k is None:
            self.k = self.v = torch.empty(*k_new.shape[:2], 0, k_new.shape[3], device=k_new.device)
        return super().update(k_new, v_new)


@wrong("check_sink_cache", "integer", "float32")
class FloatPositions(_Sinks):
    """positions as a float tensor (torch.tensor(self.pos, dtype=torch.float32))."""

    @property
    def positions(self):
        return torch.tensor(self.pos, dtype=torch.float32)


@wrong("check_sink_cache", "zero is a legitimate key")
class DropsZeroTokens(_PinnedRing):
    """Returns only the slots that are not all zeros (to skip unfilled ones): a zero token vanishes."""

    def update(self, k_new, v_new):
        k, v = super().update(k_new, v_new)
        keep = (k != 0).flatten(3).any(-1).any(0).any(0)
        self._keep = keep
        return k[:, :, keep], v[:, :, keep]

    @property
    def positions(self):
        pos = torch.tensor(self.pos_list())
        return pos[self._keep.cpu()]


@wrong("check_sink_cache", "squeeze", "(3, 1, 1, 5)")
class SqueezedWrite(_PinnedRing):
    """Writes each token with k_new.squeeze(): broadcasts by luck for most shapes, not for batch 3 and one head."""

    def update(self, k_new, v_new):
        if self.k is None:
            self.alloc(k_new)
        s = self.slot(self.seen)
        self.k[:, :, s] = k_new.squeeze()
        self.v[:, :, s] = v_new.squeeze()
        self.seen += 1
        n = min(self.seen, self.S + self.W)
        return self.k[:, :, :n], self.v[:, :, :n]


@wrong("check_sink_cache", "hard-coded", "self.num_sinks")
class FourSinksWhateverNumSinks(_Sinks):
    """Keeps StreamingLLM's 4 sinks whatever num_sinks says."""

    def keeps(self, p):
        return p < 4 or p >= self.seen - self.window_size


# ---------------------------------------------------------------- the library's own answer handed in
import swkv_teach  # noqa: E402


@wrong("check_sink_cache", "library's own", "swkv_teach.SinkKVCache")
class LibrarySinks(swkv_teach.SinkKVCache):
    """SinkCache = swkv_teach.SinkKVCache (here a subclass, so the library's class stays clean)."""


@wrong("check_sink_cache", "returned a list [k, v]", "expected a tuple")
class SinksReturnList(_Sinks):
    """Right keys and values, returned as [k, v], a list, where the statement asks for a tuple (k, v)."""

    def update(self, k_new, v_new):
        return list(super().update(k_new, v_new))


# ---------------------------------------------------------------- issue 18: holes and true diagnoses


@wrong("check_sink_cache", "shared between instances", "mutable default argument", "self.pos")
class SinksMutableDefault(_Sinks):
    """def __init__(self, num_sinks, window_size, pos=[]): positions list shared."""

    def __init__(self, num_sinks, window_size, pos=[]):
        super().__init__(num_sinks, window_size)
        self.pos = pos


# ---------------------------------------------------------------- issue 18: written as a learner would, unseen


@wrong("check_sink_cache", "sinks", "last 3 positions")
class SinksInsideTheWindow:
    """Counts the sinks as part of the window: keeps S sinks + the last W - S tokens."""

    def __init__(self, num_sinks, window_size):
        self.S, self.W, self.k, self.pos, self.seen = num_sinks, window_size, None, [], 0

    def update(self, k_new, v_new):
        self.k = k_new if self.k is None else torch.cat([self.k, k_new], 2)
        self.v = v_new if self.pos == [] else torch.cat([self.v, v_new], 2)
        self.pos.append(self.seen)
        self.seen += 1
        keep = [i for i, p in enumerate(self.pos) if p < self.S or p >= self.seen - (self.W - self.S)]
        idx = torch.tensor(keep)
        self.k, self.v = self.k[:, :, idx], self.v[:, :, idx]
        self.pos = [self.pos[i] for i in keep]
        return self.k, self.v

    @property

    def positions(self):
        return torch.tensor(self.pos)


@wrong("check_sink_cache", "before any update()", "must be empty")
class SinksFreshPositionsPlaceholder:
    """positions starts as torch.arange(num_sinks) (the sinks 'reserved') before any token arrives."""

    def __init__(self, num_sinks, window_size):
        self.S, self.W, self.k, self.v, self.seen = num_sinks, window_size, None, None, 0
        self.pos = list(range(num_sinks))

    def update(self, k_new, v_new):
        if self.seen == 0:
            self.pos = []
        self.k = k_new if self.k is None else torch.cat([self.k, k_new], 2)
        self.v = v_new if self.v is None else torch.cat([self.v, v_new], 2)
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


@wrong("check_sink_cache", "int8", "torch.long")
class PositionsInInt8(_Sinks):
    """Positions kept as a compact int8 tensor: they wrap to negative numbers past 127."""

    @property
    def positions(self):
        return torch.tensor(self.pos).to(torch.int8)


@wrong("check_sink_cache", "positions in self.fpos", "exactly only up to", "torch.long")
class PositionsInTheKeysDtype(_Sinks):
    """Keeps the positions as k_new.new_tensor(self.pos): the keys' dtype, exact only up to 2**24 in float32 and 256
    in bfloat16."""

    def update(self, k_new, v_new):
        k, v = super().update(k_new, v_new)
        self.fpos = k_new.new_tensor(self.pos)
        return k, v

    @property
    def positions(self):
        return self.fpos.long()


@wrong("check_sink_cache", "rounded to bfloat16", "torch.long")
class PositionsAsScalarsOfTheKeysDtype(_Sinks):
    """A list of 0-d tensors in the keys' dtype, one per kept token: in bfloat16, positions past 256 merge."""

    def update(self, k_new, v_new):
        k, v = super().update(k_new, v_new)
        self.fpos = [k_new.new_tensor(p) for p in self.pos]
        return k, v

    @property
    def positions(self):
        return torch.stack(self.fpos).long()


@wrong("check_sink_cache", "swapped", "sinkcache(num_sinks, window_size)")
class ArgumentsSwapped(_Sinks):
    """__init__(self, window_size, num_sinks): SinkCache(2, 3) keeps 3 sinks and a window of 2."""

    def __init__(self, window_size, num_sinks):
        super().__init__(num_sinks, window_size)


@wrong("check_sink_cache", "slice of a fused projection", "contiguous", ".reshape()")
class FlattensEachToken(_Sinks):
    """Passes each token through a flat vector, k_new.view(-1).view(B, H, 1, D): view raises on a token sliced out
    of a fused projection (qkv[..., D:2 * D])."""

    def update(self, k_new, v_new):
        B, H, _, D = k_new.shape
        return super().update(k_new.view(-1).view(B, H, 1, D), v_new.view(-1).view(B, H, 1, D))


@wrong("check_sink_cache", "counts or records positions in the keys' dtype", "python int")
class CountsInTheKeysDtype(_Sinks):
    """Counts the tokens seen in k_new.new_zeros(()) (the keys' dtype): in bfloat16 the count sticks at 256, and
    with it the window's positions."""

    def update(self, k_new, v_new):
        if not hasattr(self, "count"):
            self.count = k_new.new_zeros(())
        self.seen = int(self.count)
        k, v = super().update(k_new, v_new)
        self.count += 1
        return k, v
