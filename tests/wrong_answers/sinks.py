"""Wrong answers to exercise 05, SinkCache(num_sinks, window_size)."""

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
