"""The ring's lookahead drawn (lesson 13): which slots a verify writes, what a rollback moves.

:func:`record_round` runs one speculative round on a real :class:`~swkv_teach.caches.RingBufferKVCache`
whose keys are their own positions (token ``p``'s key is the number ``p``) and reads its buffer after
each phase, so a picture shows what the cache holds, not what a formula says it should. The worked
example of the lesson, ``W = 6``, 14 tokens seen, a verify of ``[p14, d15, d16, d17]`` (the pending
token and 3 drafts) of which 1 draft is kept::

    lookahead k = 3 (9 slots)   slot 0    1    2    3    4    5    6    7    8
    before the verify                p9   p10  p11  p12  p13  p5   p6   p7   p8    query 14 sees 9..14
    after the verify                 p9   p10  p11  p12  p13  p14  p15  p16  p17   slots 5..8 written
    after rollback(2)                the same slots; seen = 16: p16, p17 stale     query 16 sees 11..16

    lookahead 0 (6 slots)       slot 0    1    2    3    4    5
    before the verify                p12  p13  p8   p9   p10  p11                  query 14 sees 9..14
    after the verify                 p12  p13  p14  p15  p16  p17                  p17 overwrote p11
    rollback(2) refused: query 16 needs p11..p15, and p11 is gone

:func:`plot_ring_round` draws such states, one row each, as a Figure made without pyplot
(:mod:`swkv_teach.plots`). Tests find the boxes by ``gid`` (``"row1-slot5"``). Window convention:
:mod:`swkv_teach.masks` (query ``i`` sees keys ``i - W < j <= i``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from swkv_teach._figure import DPI
from swkv_teach._validate import check_nonnegative_int, check_positive_int
from swkv_teach.caches import RingBufferKVCache

__all__ = ["RING_COLORS", "RingState", "plot_ring_round", "record_round"]

# colour-blind-safe: blue = the next query's window, pale = held outside it, grey hatched = rolled back,
# red = a rejected token that overwrote a key the window still needs
RING_COLORS = {"window": "#4C72B0", "outside": "#C6DBEF", "stale": "#E0E0E0", "clobbered": "#D62728",
               "empty": "#FFFFFF"}
RING_LABELS = {"window": "in the next query's window", "outside": "held, outside that window",
               "stale": "rejected, rolled back: stale, masked", "clobbered": "rejected, overwrote a key still needed",
               "empty": "empty"}


@dataclass(frozen=True)
class RingState:
    """One moment of a ring of ``window + lookahead`` slots, read from its keys.

    Attributes:
        label: what just happened, for the row's title.
        window: ``W``; the next query, at position ``seen``, attends ``seen - W < j <= seen``.
        lookahead: ``k``; the ring has ``W + k`` slots and token ``p`` goes to slot ``p % (W + k)``.
        slots: the position whose key each slot holds (None: never written), slot order.
        seen: tokens the ring counts now: the next query's position.
        written: the slots the last forward wrote.
        refused: the ring's error message when it refused the rollback (``seen`` is then the
            count the rollback asked for), else None.
    """

    label: str
    window: int
    lookahead: int
    slots: tuple[int | None, ...]
    seen: int
    written: tuple[int, ...] = ()
    refused: str | None = None

    @property
    def next_slot(self) -> int:
        """The slot the next token is written to: ``seen % (W + k)``."""
        return self.seen % (self.window + self.lookahead)

    @property
    def needed(self) -> tuple[int, ...]:
        """Stored keys the next query attends: positions ``seen - W + 1 .. seen - 1`` (its own comes with it)."""
        return tuple(range(max(0, self.seen - self.window + 1), self.seen))

    @property
    def stale(self) -> tuple[int, ...]:
        """Slots holding a token at or past ``seen``: written by a verify, then rolled back."""
        return tuple(s for s, p in enumerate(self.slots) if p is not None and p >= self.seen)

    @property
    def lost(self) -> tuple[int, ...]:
        """Needed positions no slot holds any more: overwritten by a token that was rolled back."""
        held = {p for p in self.slots if p is not None and p < self.seen}
        return tuple(p for p in self.needed if p not in held)

    def kind(self, slot: int) -> str:
        """``"window"``, ``"outside"``, ``"stale"``, ``"clobbered"`` or ``"empty"``: how the figure colours ``slot``."""
        p = self.slots[slot]
        if p is None:
            return "empty"
        if p >= self.seen:
            return "clobbered" if any(q % len(self.slots) == slot for q in self.lost) else "stale"
        return "window" if p in self.needed else "outside"


def _read(cache: RingBufferKVCache, top: int) -> tuple[int | None, ...]:
    """Each slot's position, read from the keys (the first ``min(top, capacity)`` slots have been written)."""
    keys = cache.k_buf[0, 0, :, 0].tolist()
    return tuple(int(keys[s]) if s < top else None for s in range(cache.capacity))


def record_round(window: int, lookahead: int, seen: int, drafts: int, accepted: int) -> list[RingState]:
    """Three :class:`RingState` of one verify-and-rollback on a real ring: before, after the verify, after the rollback.

    The ring is ``RingBufferKVCache(window, lookahead)`` fed ``seen`` tokens, then one chunk of
    ``drafts + 1`` tokens (the pending token and the drafts, positions ``seen .. seen + drafts``), then
    ``rollback(drafts - accepted)``. Where the ring refuses the rollback (its ``rollback_limit``: a
    rejected token overwrote a key the next query needs), the last state says so (``refused``) and
    shows the slots as the verify left them, with ``seen`` the count the rollback asked for.
    """
    window = check_positive_int("window", window)
    lookahead = check_nonnegative_int("lookahead", lookahead)
    seen = check_nonnegative_int("seen", seen)
    drafts = check_nonnegative_int("drafts", drafts)
    accepted = check_nonnegative_int("accepted", accepted)
    if accepted > drafts:
        raise ValueError(f"accepted must be at most drafts={drafts} (a verify keeps some of its drafts); got {accepted}")
    if seen == 0:
        raise ValueError("seen must be at least 1: a verify follows a prompt (the pending token's context)")
    cache = RingBufferKVCache(window, lookahead)

    def keys(first: int, n: int) -> torch.Tensor:
        return torch.arange(first, first + n, dtype=torch.float32).view(1, 1, n, 1)

    k = keys(0, seen)
    cache.update(k, k)
    before = RingState("before the verify", window, lookahead, _read(cache, seen), seen)
    k = keys(seen, drafts + 1)
    cache.update(k, k)
    top = seen + drafts + 1
    after = _read(cache, top)
    written = tuple(s for s in range(len(after)) if after[s] != before.slots[s])
    verified = RingState(f"the verify wrote p{seen}..p{top - 1} (pending + {drafts} drafts)", window, lookahead, after,
                         top, written)
    r = drafts - accepted
    try:
        cache.rollback(r)
    except ValueError as e:
        return [before, verified, RingState(f"rollback({r}) refused", window, lookahead, after, top - r,
                                            refused=str(e))]
    assert _read(cache, top) == after, "a rollback moves a counter; it must not touch a slot"
    return [before, verified, RingState(f"rollback({r}): {accepted} of {drafts} drafts kept", window, lookahead,
                                        after, cache.seen)]


def plot_ring_round(states: list[RingState], title: str | None = None) -> Figure:
    """The ring's slots in each state, one row each: the tokens they hold, coloured by what the next query needs.

    Blue: in the next query's window; pale: held, outside it; grey hatched: rolled back (stale,
    masked by position); red: a rejected token that overwrote a key the window still needs. A
    thick outline marks the slots the last forward wrote; a red triangle, the next write.
    """
    if not states or not all(isinstance(s, RingState) for s in states):
        raise ValueError(f"states must be a non-empty list of RingState (from record_round); got {states!r}")
    n_slots = len(states[0].slots)
    if any(len(s.slots) != n_slots for s in states):
        raise ValueError("states must all come from one ring (the same number of slots)")
    rows = len(states)
    fig = Figure(figsize=(max(7.5, 0.95 * n_slots + 1.5), 1.7 * rows + 1.2), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    for r, state in enumerate(states):
        y = -1.7 * r
        for s, p in enumerate(state.slots):
            kind = state.kind(s)
            new = s in state.written
            ax.add_patch(Rectangle((s - 0.45, y - 0.4), 0.9, 0.8, facecolor=RING_COLORS[kind], gid=f"row{r}-slot{s}",
                                   hatch="//" if kind == "stale" else None, edgecolor="black" if new else "#888888",
                                   linewidth=2.6 if new else 0.8))
            if p is not None:
                ax.text(s, y, f"p{p}", ha="center", va="center", fontsize=12, weight="bold",
                        color="white" if kind in ("window", "clobbered") else "#222222")
        ax.plot(state.next_slot, y + 0.5, marker="v", color=RING_COLORS["clobbered"], markersize=9,
                gid=f"row{r}-next")
        q = state.seen
        sees = f"seen = {q}, so query {q} sees p{max(0, q - state.window + 1)}..p{q}"
        if state.refused:
            gone = ", ".join(f"p{state.slots[p % n_slots]} overwrote p{p}" for p in state.lost)
            sees = f"query {q} needs p{state.needed[0]}..p{q - 1}, and {gone}"
        ax.text(-0.5, y + 0.72, f"{r + 1}. {state.label}: {sees}", ha="left", va="bottom", fontsize=11)
    ax.set_xlim(-0.6, n_slots - 0.4)
    ax.set_ylim(-1.7 * (rows - 1) - 0.6, 1.35)
    ax.set_xticks(range(n_slots))
    ax.set_xlabel(f"slot (token p goes to slot p mod {n_slots})")
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    first = states[0]
    ax.set_title(title or f"A ring of W + k = {first.window} + {first.lookahead} slots", fontsize=12)
    kinds = [k for k in RING_COLORS if any(s.kind(i) == k for s in states for i in range(n_slots))]
    handles = [Patch(facecolor=RING_COLORS[k], edgecolor="#888888", hatch="//" if k == "stale" else None,
                     label=RING_LABELS[k]) for k in kinds]
    handles += [Patch(facecolor="white", edgecolor="black", linewidth=2.6, label="written by the last forward"),
                Line2D([], [], marker="v", color=RING_COLORS["clobbered"], linestyle="", markersize=9,
                       label="next write")]
    fig.legend(handles=handles, loc="outside lower center", ncol=3 if n_slots >= 8 else 2, fontsize=10,
               frameon=False)
    return fig
