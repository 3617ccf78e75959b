"""Wrong answers to exercise 02, SlidingWindowKVCache (the seed's reference, each with one bug)."""

import torch

from tests.wrong_answers import wrong


class _Seed:
    """The seed's reference solution, the base the bugs below are made from."""

    window = None

    def __init__(self, window_size):
        self.window_size = window_size
        self.k = self.v = None

    def append(self, k_new, v_new):
        if self.k is None:
            self.k, self.v = k_new, v_new
        else:
            self.k = torch.cat([self.k, k_new], dim=2)
            self.v = torch.cat([self.v, v_new], dim=2)


@wrong("check_sliding_window_cache", "nothing is evicted")
class NoEviction(_Seed):
    """Appends but never evicts: the cache grows without bound."""

    def update(self, k_new, v_new):
        self.append(k_new, v_new)
        return self.k, self.v


@wrong("check_sliding_window_cache", "dropped the newest", "front")
class EvictsNewest(_Seed):
    """Keeps the first W tokens ([:W]) instead of the last W."""

    def update(self, k_new, v_new):
        self.append(k_new, v_new)
        self.k, self.v = self.k[:, :, : self.window_size], self.v[:, :, : self.window_size]
        return self.k, self.v


@wrong("check_sliding_window_cache", "off by one", "w - 1")
class KeepsWMinus1(_Seed):
    """Evicts down to W - 1 tokens (`>= window_size`, then `[-(W - 1):]`)."""

    def update(self, k_new, v_new):
        self.append(k_new, v_new)
        if self.k.shape[2] >= self.window_size:
            keep = self.window_size - 1
            self.k, self.v = self.k[:, :, self.k.shape[2] - keep :], self.v[:, :, self.v.shape[2] - keep :]
        return self.k, self.v


@wrong("check_sliding_window_cache", "off by one", "w + 1")
class KeepsWPlus1(_Seed):
    """Keeps W + 1 tokens (`[-(W + 1):]`)."""

    def update(self, k_new, v_new):
        self.append(k_new, v_new)
        W = self.window_size + 1
        self.k, self.v = self.k[:, :, -W:], self.v[:, :, -W:]
        return self.k, self.v


@wrong("check_sliding_window_cache", "off by one", "w + 1", "before evicting")
class ReturnsBeforeEvicting(_Seed):
    """Keeps W tokens but returns the appended W + 1 before evicting (the hint once said "you keep W + 1")."""

    def update(self, k_new, v_new):
        self.append(k_new, v_new)
        k, v = self.k, self.v
        self.k, self.v = self.k[:, :, -self.window_size:], self.v[:, :, -self.window_size:]
        return k, v


@wrong("check_sliding_window_cache", "wrong axis", "dim 1")
class WrongAxis(_Seed):
    """Concatenates along dim 1 (heads) instead of dim 2 (tokens)."""

    def update(self, k_new, v_new):
        if self.k is None:
            self.k, self.v = k_new, v_new
        else:
            self.k, self.v = torch.cat([self.k, k_new], dim=1), torch.cat([self.v, v_new], dim=1)
        return self.k[:, -self.window_size * 2 :], self.v[:, -self.window_size * 2 :]


@wrong("check_sliding_window_cache", "prepending")
class Prepends(_Seed):
    """Puts the new token in front: torch.cat([k_new, self.k])."""

    def update(self, k_new, v_new):
        if self.k is None:
            self.k, self.v = k_new, v_new
        else:
            self.k, self.v = torch.cat([k_new, self.k], dim=2), torch.cat([v_new, self.v], dim=2)
        self.k, self.v = self.k[:, :, : self.window_size], self.v[:, :, : self.window_size]
        return self.k, self.v


@wrong("check_sliding_window_cache", "values are not evicted")
class EvictsKeysNotValues(_Seed):
    """Slices self.k but forgets self.v."""

    def update(self, k_new, v_new):
        self.append(k_new, v_new)
        self.k = self.k[:, :, -self.window_size :]
        return self.k, self.v


@wrong("check_sliding_window_cache", "before")
class ReturnsStateBefore(_Seed):
    """Returns what the cache held before this token was added."""

    def update(self, k_new, v_new):
        old = (self.k, self.v) if self.k is not None else (k_new[:, :, :0], v_new[:, :, :0])
        self.append(k_new, v_new)
        self.k, self.v = self.k[:, :, -self.window_size :], self.v[:, :, -self.window_size :]
        return old


@wrong("check_sliding_window_cache", "swapped")
class SwapsKV(_Seed):
    """Returns (v, k)."""

    def update(self, k_new, v_new):
        self.append(k_new, v_new)
        self.k, self.v = self.k[:, :, -self.window_size :], self.v[:, :, -self.window_size :]
        return self.v, self.k


@wrong("check_sliding_window_cache", "hard-coded")
class HardCodedWindow(_Seed):
    """Keeps the last 3 whatever window_size says (the problem's example hard-coded)."""

    def update(self, k_new, v_new):
        self.append(k_new, v_new)
        self.k, self.v = self.k[:, :, -3:], self.v[:, :, -3:]
        return self.k, self.v


@wrong("check_sliding_window_cache", "shared between instances")
class SharedClassState:
    """Keeps its tokens in a class-level list, shared by every instance."""

    ks, vs = [], []

    def __init__(self, window_size):
        self.window_size = window_size

    def update(self, k_new, v_new):
        self.ks.append(k_new)
        self.vs.append(v_new)
        del self.ks[: -self.window_size], self.vs[: -self.window_size]
        return torch.cat(self.ks, dim=2), torch.cat(self.vs, dim=2)


@wrong("check_sliding_window_cache", "dtype", "float64")
class ChangesDtype(_Seed):
    """Casts the cache to float32 (.float()), changing a float64 caller's dtype."""

    def update(self, k_new, v_new):
        self.append(k_new, v_new)
        self.k, self.v = self.k[:, :, -self.window_size :].float(), self.v[:, :, -self.window_size :].float()
        return self.k, self.v


@wrong("check_sliding_window_cache", "changed by your cache", "clone")
class ModifiesCallersTensors(_Seed):
    """Once full, shifts the window in place: with W = 1 that writes into the caller's first k_new."""

    def update(self, k_new, v_new):
        if self.k is not None and self.k.shape[2] == self.window_size:
            for buf, new in ((self.k, k_new), (self.v, v_new)):
                buf[:, :, :-1] = buf[:, :, 1:].clone()
                buf[:, :, -1:] = new
            return self.k, self.v
        self.append(k_new, v_new)
        return self.k, self.v


@wrong("check_sliding_window_cache", "device", needs_accelerator=True)
class BufferOnCPU(_Seed):
    """Moves the cache to the CPU (.cpu()), away from the caller's GPU."""

    def update(self, k_new, v_new):
        self.append(k_new, v_new)
        self.k, self.v = self.k[:, :, -self.window_size :].cpu(), self.v[:, :, -self.window_size :].cpu()
        return self.k, self.v


@wrong("check_sliding_window_cache", "hold", "evict")
class StoresEverythingReturnsLastW(_Seed):
    """Returns the right last W tokens but never evicts what it stores: memory grows without bound."""

    def update(self, k_new, v_new):
        self.append(k_new, v_new)
        return self.k[:, :, -self.window_size :], self.v[:, :, -self.window_size :]


@wrong("check_sliding_window_cache", "nothing is evicted", "shape[2]", "len(k) is the batch")
class CountsTokensWithLen(_Seed):
    """Counts tokens with len(self.k), which is the batch size, so it never evicts."""

    def update(self, k_new, v_new):
        self.append(k_new, v_new)
        if len(self.k) > self.window_size:
            self.k, self.v = self.k[:, :, -self.window_size :], self.v[:, :, -self.window_size :]
        return self.k, self.v


@wrong("check_sliding_window_cache", "[-0:]")
class EvictsFirstWithMinusZero(_Seed):
    """Evicts before appending with [-(W - 1):]: right for W >= 2, but for W = 1 that is [-0:], everything."""

    def update(self, k_new, v_new):
        if self.k is not None and self.k.shape[2] >= self.window_size:
            keep = -(self.window_size - 1)
            self.k, self.v = self.k[:, :, keep:], self.v[:, :, keep:]
        self.append(k_new, v_new)
        return self.k, self.v


# ---------------------------------------------------------------- issue 10: blind spots and misdiagnoses
@wrong("check_sliding_window_cache", "squeeze", "(1, 2, 1, 4)")
class SqueezesTheToken(_Seed):
    """Reads the token's sizes through k_new.squeeze(): breaks with batch 1 or one head."""

    def update(self, k_new, v_new):
        B, H, D = k_new.squeeze().shape
        self.append(k_new.reshape(B, H, 1, D), v_new.reshape(B, H, 1, D))
        self.k, self.v = self.k[:, :, -self.window_size :], self.v[:, :, -self.window_size :]
        return self.k, self.v


@wrong("check_sliding_window_cache", "batch and heads are mixed up")
class HeadsBeforeBatchBuffer:
    """A shift-left buffer allocated (heads, batch, W, head_dim): right whenever batch == heads."""

    def __init__(self, window_size):
        self.W, self.buf, self.n = window_size, None, 0

    def update(self, k_new, v_new):
        B, H, _, D = k_new.shape
        if self.buf is None:
            self.buf = k_new.new_zeros(2, H, B, self.W, D)
        self.buf[:, :, :, :-1] = self.buf[:, :, :, 1:].clone()
        self.buf[0, :, :, -1] = k_new[:, :, 0]
        self.buf[1, :, :, -1] = v_new[:, :, 0]
        self.n += 1
        m = min(self.n, self.W)
        return self.buf[0, :, :, -m:], self.buf[1, :, :, -m:]


@wrong("check_sliding_window_cache", "shared between instances", "alive")
class ClassStateClearedInInit:
    """Keeps k and v on the class and clears them in __init__: right alone, wrong with two caches alive."""

    k = v = None

    def __init__(self, window_size):
        self.window_size = window_size
        type(self).k = type(self).v = None

    def update(self, k_new, v_new):
        cls = type(self)
        cls.k = k_new if cls.k is None else torch.cat([cls.k, k_new], dim=2)[:, :, -self.window_size :]
        cls.v = v_new if cls.v is None else torch.cat([cls.v, v_new], dim=2)[:, :, -self.window_size :]
        return cls.k, cls.v


@wrong("check_sliding_window_cache", "dtype", "float16")
class StartsFromEmptyFloat32:
    """Starts from torch.empty(0) (float32): cat promotes float16/bfloat16 tokens to float32 (float64 survives)."""

    def __init__(self, window_size):
        self.window_size = window_size
        self.k = self.v = torch.empty(0)

    def update(self, k_new, v_new):
        if self.k.numel() == 0:
            self.k = self.v = torch.empty(*k_new.shape[:2], 0, k_new.shape[3], device=k_new.device)
        self.k = torch.cat([self.k, k_new], dim=2)[:, :, -self.window_size :]
        self.v = torch.cat([self.v, v_new], dim=2)[:, :, -self.window_size :]
        return self.k, self.v


@wrong("check_sliding_window_cache", "grew", "self.history")
class KeepsEveryPosition(_Seed):
    """Right tokens, but remembers every position it has seen in a list that never shrinks."""

    def update(self, k_new, v_new):
        self.history = [*getattr(self, "history", []), len(getattr(self, "history", []))]
        self.append(k_new, v_new)
        self.k, self.v = self.k[:, :, -self.window_size :], self.v[:, :, -self.window_size :]
        return self.k, self.v


@wrong("check_sliding_window_cache", "holds", "self.archive")
class ArchivesEveryToken(_Seed):
    """Right tokens, but copies every token into a dict on self: memory outside the k/v tensors grows."""

    def update(self, k_new, v_new):
        if not hasattr(self, "archive"):
            self.archive = {}
        self.archive[len(self.archive)] = (k_new.clone(), v_new.clone())
        self.append(k_new, v_new)
        self.k, self.v = self.k[:, :, -self.window_size :], self.v[:, :, -self.window_size :]
        return self.k, self.v


@wrong("check_sliding_window_cache", "zero is a legitimate key")
class ShiftBufferFindsTokensByNonZero:
    """A shift-left buffer that returns the slots that are not all zeros: drops legitimate zero tokens."""

    def __init__(self, window_size):
        self.W, self.k, self.v = window_size, None, None

    def update(self, k_new, v_new):
        if self.k is None:
            shape = (*k_new.shape[:2], self.W, k_new.shape[3])
            self.k, self.v = k_new.new_zeros(shape), v_new.new_zeros(shape)
        for buf, new in ((self.k, k_new), (self.v, v_new)):
            buf[:, :, :-1] = buf[:, :, 1:].clone()
            buf[:, :, -1:] = new
        filled = (self.k != 0).flatten(3).any(-1).any(0).any(0)
        return self.k[:, :, filled], self.v[:, :, filled]


@wrong("check_sliding_window_cache", "counter", "shrinks")
class SlicesWithTheTokenCounter(_Seed):
    """Keeps the last W 'by a counter': slices at self.n - W, an absolute index, on a tensor holding only W."""

    def update(self, k_new, v_new):
        self.n = getattr(self, "n", 0) + 1
        self.append(k_new, v_new)
        if self.n > self.window_size:
            self.k, self.v = self.k[:, :, self.n - self.window_size :], self.v[:, :, self.n - self.window_size :]
        return self.k, self.v


@wrong("check_sliding_window_cache", "every other step")
class TrimsEveryOtherStep(_Seed):
    """Trims only once the cache is two over (shape[2] > W + 1): W and W + 1 tokens in turn."""

    def update(self, k_new, v_new):
        self.append(k_new, v_new)
        if self.k.shape[2] > self.window_size + 1:
            self.k, self.v = self.k[:, :, -self.window_size :], self.v[:, :, -self.window_size :]
        return self.k, self.v


@wrong("check_sliding_window_cache", "values equal", "keys")
class ReturnsKeysTwice(_Seed):
    """return self.k, self.k: the values are the keys."""

    def update(self, k_new, v_new):
        self.append(k_new, v_new)
        self.k, self.v = self.k[:, :, -self.window_size :], self.v[:, :, -self.window_size :]
        return self.k, self.k


@wrong("check_sliding_window_cache", "holds", "self.buf")
class FixedTwentyFourTokenBuffer:
    """Appends into a preallocated 24-token buffer: right for runs of 24 tokens or fewer (every run the old
    check made), out of room at 25; the memory bound names it at once, the runs of 4W + 3 would at step 25."""

    def __init__(self, window_size):
        self.W, self.buf, self.n = window_size, None, 0

    def update(self, k_new, v_new):
        if self.buf is None:
            B, H, _, D = k_new.shape
            self.buf = k_new.new_zeros(2, B, H, 24, D)
        self.buf[0, :, :, self.n] = k_new[:, :, 0]
        self.buf[1, :, :, self.n] = v_new[:, :, 0]
        self.n += 1
        lo = max(0, self.n - self.W)
        return self.buf[0, :, :, lo : self.n], self.buf[1, :, :, lo : self.n]


_CALLS = [0]  # module-level: one counter for every instance


@wrong("check_sliding_window_cache", "shared between instances", "module-level")
class ModuleLevelCounter:
    """Counts updates in a module-level variable reset by __init__: a new cache shrinks one already running."""

    def __init__(self, window_size):
        self.W, self.k, self.v = window_size, None, None
        _CALLS[0] = 0

    def update(self, k_new, v_new):
        _CALLS[0] += 1
        self.k = k_new if self.k is None else torch.cat([self.k, k_new], dim=2)
        self.v = v_new if self.v is None else torch.cat([self.v, v_new], dim=2)
        n = min(_CALLS[0], self.W)
        self.k, self.v = self.k[:, :, -n:], self.v[:, :, -n:]
        return self.k, self.v


# ---------------------------------------------------------------- the library's own answer handed in
import swkv_teach  # noqa: E402


@wrong("check_sliding_window_cache", "library's own", "swkv_teach.SlidingWindowKVCache")
class LibrarySubclass(swkv_teach.SlidingWindowKVCache):
    """SlidingWindowKVCache = swkv_teach.SlidingWindowKVCache (here a subclass, so the library's class stays clean)."""


@wrong("check_sliding_window_cache", "keeps the library's own slidingwindowkvcache", "self.inner")
class WrapsTheLibrary:
    """Holds the library's own cache and forwards every update to it."""

    def __init__(self, window_size):
        self.inner = swkv_teach.SlidingWindowKVCache(window_size)

    def update(self, k_new, v_new):
        return self.inner.update(k_new, v_new)


@wrong("check_sliding_window_cache", "returned a list [k, v]", "expected a tuple")
class ReturnsList(_Seed):
    """Right tokens, but returns [self.k, self.v], a list, where the statement asks for a tuple."""

    def update(self, k_new, v_new):
        self.append(k_new, v_new)
        self.k, self.v = self.k[:, :, -self.window_size :], self.v[:, :, -self.window_size :]
        return [self.k, self.v]


@wrong("check_sliding_window_cache", "batch and heads are swapped", "(2, 2, 1, 3)")
class ReshapeSwapsBatchAndHeads(_Seed):
    """When B == H, k_new.reshape(H, B, 1, D).transpose(0, 1): batch and heads swapped, the shape unchanged."""

    def update(self, k_new, v_new):
        B, H, _, D = k_new.shape
        if B == H:
            k_new, v_new = (t.reshape(H, B, 1, D).transpose(0, 1) for t in (k_new, v_new))
        self.append(k_new, v_new)
        self.k, self.v = self.k[:, :, -self.window_size :], self.v[:, :, -self.window_size :]
        return self.k, self.v


@wrong("check_sliding_window_cache", "squeeze()", "(2, 1, 4)")
class SqueezeThenStack:
    """Keeps a list of k_new.squeeze() and returns torch.stack(list, dim=-2): right for (2, 3, 1, 4), not batch 1."""

    def __init__(self, window_size):
        self.window_size, self.ks, self.vs = window_size, [], []

    def update(self, k_new, v_new):
        self.ks = (self.ks + [k_new.squeeze()])[-self.window_size :]
        self.vs = (self.vs + [v_new.squeeze()])[-self.window_size :]
        return torch.stack(self.ks, dim=-2), torch.stack(self.vs, dim=-2)


# ---------------------------------------------------------------- issue 18: holes and true diagnoses


@wrong("check_sliding_window_cache", "shared between instances", "mutable default argument", "self.ks")
class MutableDefaultLists:
    """def __init__(self, window_size, ks=[], vs=[]): the default lists are shared by every instance."""

    def __init__(self, window_size, ks=[], vs=[]):
        self.window_size, self.ks, self.vs = window_size, ks, vs

    def update(self, k_new, v_new):
        self.ks.append(k_new)
        self.vs.append(v_new)
        del self.ks[:-self.window_size]
        del self.vs[:-self.window_size]
        return torch.cat(self.ks, 2), torch.cat(self.vs, 2)


# ---------------------------------------------------------------- issue 18: written as a learner would, unseen


@wrong("check_sliding_window_cache", "torch.stack", "torch.cat([...], dim=2)")
class StacksTokens:
    """Keeps a list of tokens and returns torch.stack(self.ks, dim=2) (stack adds a dim; cat joins)."""

    def __init__(self, window_size):
        self.window_size, self.ks, self.vs = window_size, [], []

    def update(self, k_new, v_new):
        self.ks = (self.ks + [k_new])[-self.window_size:]
        self.vs = (self.vs + [v_new])[-self.window_size:]
        return torch.stack(self.ks, dim=2), torch.stack(self.vs, dim=2)


@wrong("check_sliding_window_cache", "all zeros", "count the tokens")
class RestartsWhenTheWindowIsAllZeros:
    """`if self.k is None or not self.k.any()`: a window of zero tokens reads as an empty cache and is dropped."""

    def __init__(self, window_size):
        self.window_size = window_size
        self.k = self.v = None

    def update(self, k_new, v_new):
        if self.k is None or not self.k.any():
            self.k, self.v = k_new, v_new
        else:
            self.k, self.v = torch.cat([self.k, k_new], dim=2), torch.cat([self.v, v_new], dim=2)
        self.k, self.v = self.k[:, :, -self.window_size:], self.v[:, :, -self.window_size:]
        return self.k, self.v


@wrong("check_sliding_window_cache", "changed shape", "squeeze_")
class SqueezesTheCallersTensor:
    """`k_new.squeeze_(2)` to store (B, H, D) rows: reshapes the caller's tensor in place."""

    def __init__(self, window_size):
        self.window_size = window_size
        self.ks, self.vs = [], []

    def update(self, k_new, v_new):
        self.ks = (self.ks + [k_new.squeeze_(2)])[-self.window_size:]
        self.vs = (self.vs + [v_new.squeeze_(2)])[-self.window_size:]
        return torch.stack(self.ks, dim=2), torch.stack(self.vs, dim=2)
