"""How the suite measures: time per call, bytes allocated per call, bytes held.

Timing. On the CPU a repeat is ``iters`` back-to-back calls between two
``time.perf_counter_ns()`` reads, so the clock's own cost is spread over many
calls. On CUDA the GPU runs behind Python, so a repeat is bracketed by CUDA
events after a ``synchronize()``: it measures the device's time for the whole
batch of calls. Either way a call's figure is ``elapsed / iters`` and the
suite reports the median of the repeats with their min and max. The
subjects of one window take turns, repeat by repeat
(:func:`time_us_interleaved`), so a burst of load from elsewhere hits all of
them rather than one.

Allocation. On CUDA the caching allocator counts every byte it hands out
(``allocated_bytes.all.allocated``): the delta over ``calls`` calls, divided.
The CPU allocator keeps no such counter, so :class:`AllocationCounter` watches
every ATen operation instead and adds up the storages it *creates*: an output
whose storage is none of the operation's inputs' (``copy_`` and views reuse
their input's storage and count 0; ``cat``, ``roll``, ``zeros`` count their
result). Temporaries freed within the step count too, as they should.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclass
class Summary:
    """Median and range of one figure over the repeats."""

    median: float
    min: float
    max: float
    samples: list[float]

    @classmethod
    def of(cls, samples: Iterable[float]) -> "Summary":
        s = list(samples)
        return cls(statistics.median(s), min(s), max(s), s)

    def as_dict(self) -> dict:
        return {"median": self.median, "min": self.min, "max": self.max, "samples": self.samples}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _elapsed_ns(fn: Callable[[], object], iters: int, device: torch.device) -> float:
    """Wall (CPU, MPS) or device (CUDA) nanoseconds for ``iters`` calls of ``fn``."""
    synchronize(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e6  # ms -> ns
    t0 = time.perf_counter_ns()
    for _ in range(iters):
        fn()
    synchronize(device)
    return time.perf_counter_ns() - t0


def calls_per_repeat(fn: Callable[[], object], device: torch.device, min_calls: int, repeat_s: float) -> int:
    """At least ``min_calls``, and enough that one repeat lasts about ``repeat_s`` seconds.

    Fast calls (a few µs) need thousands per repeat or the timer's own cost shows.
    """
    probe = max(1, min_calls // 10)
    per_call = _elapsed_ns(fn, probe, device) / probe / 1e9
    return max(min_calls, int(repeat_s / max(per_call, 1e-9)))


def time_us(fn: Callable[[], object], device: torch.device, iters: int, repeats: int) -> Summary:
    """µs per call of ``fn``: ``repeats`` repeats of ``iters`` calls each (warm the caller's state first)."""
    return Summary.of(_elapsed_ns(fn, iters, device) / iters / 1e3 for _ in range(repeats))


def time_us_interleaved(
    calls: dict[str, tuple[Callable[[], object], int]], device: torch.device, repeats: int
) -> dict[str, Summary]:
    """Like :func:`time_us` for several ``name: (fn, iters)`` at once, taking repeat ``r`` of each in turn.

    On a shared machine the load drifts over seconds; interleaving puts every
    subject's ``r``-th repeat under about the same load, so ratios taken
    within one run hold up better than the figures themselves.
    """
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, (fn, iters) in calls.items():
            samples[name].append(_elapsed_ns(fn, iters, device) / iters / 1e3)
    return {name: Summary.of(s) for name, s in samples.items()}


class AllocationCounter(TorchDispatchMode):
    """Bytes of every storage an ATen op creates while active (module docstring)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat_inputs = tree_flatten((args, kwargs))[0]
        inputs = {t.untyped_storage().data_ptr() for t in flat_inputs
                  if isinstance(t, torch.Tensor)}
        created = {}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if storage.data_ptr() not in inputs:
                    created[storage.data_ptr()] = storage.nbytes()
        self.bytes += sum(created.values())
        return out


def bytes_allocated_per_call(fn: Callable[[], object], device: torch.device, calls: int = 8) -> float:
    """Bytes allocated by one call of ``fn`` in steady state, averaged over ``calls`` calls."""
    if device.type == "cuda":
        synchronize(device)
        before = torch.cuda.memory_stats(device).get("allocated_bytes.all.allocated", 0)
        for _ in range(calls):
            fn()
        synchronize(device)
        return (torch.cuda.memory_stats(device).get("allocated_bytes.all.allocated", 0) - before) / calls
    with AllocationCounter() as counter:
        for _ in range(calls):
            fn()
    return counter.bytes / calls


def bytes_held(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind ``tensors``: what stays allocated, views included whole.

    A view keeps its whole storage alive: the naive cache's ``k`` is a
    ``W``-token slice of a ``W + 1``-token ``cat`` result, so it holds ``W + 1``.
    """
    storages = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


class ForwardClock:
    """What a model's forwards add up to: query tokens, forwards, seconds from the embedding's input to the LM head's
    output (hooks on those two modules, so the same span on the course's decoder and on Hugging Face's model).

    ``threads``: torch's intra-op thread counts the forwards ran with (HF's run in a thread of their own).
    ``scores_dense`` / ``scores_rows`` stay for a caller that counts attention scores (:mod:`.hf_server`).
    """

    def __init__(self):
        self.tokens = self.forwards = 0
        self.model_s = 0.0
        self.scores_dense = self.scores_rows = 0
        self.threads = set()
        self._t0 = None
        self.handles = []

    def watch(self, embed, lm_head) -> "ForwardClock":
        def start(module, args):
            self._t0 = time.perf_counter()
            self.forwards += 1
            self.tokens += args[0].numel()
            self.threads.add(torch.get_num_threads())

        def stop(module, args, out):
            self.model_s += time.perf_counter() - self._t0

        self.handles += [embed.register_forward_pre_hook(start), lm_head.register_forward_hook(stop)]
        return self

    def close(self):
        for h in self.handles:
            h.remove()
