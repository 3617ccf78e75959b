"""An O(1) sliding-window cache: a preallocated ring buffer, token ``p`` written into slot ``p % W``.

Worked example, ``W = 3``, one token per step::

    seen   slots [0, 1, 2]    positions returned
      1    [p0, -,  - ]       [0]            only filled slots come back
      3    [p0, p1, p2]       [0, 1, 2]
      4    [p3, p1, p2]       [3, 1, 2]      p3 overwrote p0 in slot 3 % 3 = 0
      5    [p3, p4, p2]       [3, 4, 2]

Keys come back in *slot* order, not chronological order. For one query that
is harmless: softmax over keys is a sum, and a sum does not care about order,
as long as each key already carries its position (RoPE is applied before
caching). When order matters (chunks, masks, display) use :attr:`positions`
or :meth:`ordered`.

Once full, a one-token update is two ``copy_`` calls into views prepared
when the buffer was allocated: no allocation, no O(W) copy.

Taking tokens back (speculative decoding)
-----------------------------------------
``RingBufferKVCache(W, lookahead=k)`` keeps ``W + k`` slots, token ``p`` in slot
``p % (W + k)``, so a verify of ``k + 1`` tokens overwrites only tokens older
than every verified query's window, and :meth:`~RingBufferKVCache.rollback`
takes back up to ``k`` of them by moving a counter (no tensor copied)::

    W = 3, k = 2 (5 slots), one token per step
    seen   slots [0,  1,  2,  3,  4 ]   window of the next query (position seen)
      7    [p5, p6, p2, p3, p4]         p5, p6 (+ itself): p2..p4 kept for a rollback
    verify p7, p8, p9 (a chunk: each query masked to its own window)
     10    [p5, p6, p7, p8, p9]         p2, p3, p4 overwritten: outside every window from 7 on
    rollback(2): p8, p9 rejected
      8    [p5, p6, p7, p8, p9]         nothing moved; slots 3, 4 are stale, and the
                                        positions the ring reports for them (3, 4) are
                                        outside the next query's window (6, 7, 8), so masked

Once tokens leave the window their slots are reused, so a rollback can go back only
as far as leaves the next query's whole window in the ring: :attr:`~RingBufferKVCache.rollback_limit`
(``k + 1`` once the ring has wrapped with no rollback since; every token before it has).
A ring with lookahead returns up to ``W + k`` keys for one token, some outside its
window, so it is masked (``one_token_in_window`` is False); ``lookahead=0`` is the
plain ring, unchanged.

A verify's ``c <= k + 1`` tokens can go into their slots *before* anything is read, since
they overwrite only tokens outside every window from ``seen`` on. ``update`` then returns
the first query's window and the chunk as one run of slots, chronologically
(:meth:`~RingBufferKVCache._update_verify`), and the decoder does better still:
:meth:`~RingBufferKVCache.update_in_place` returns the buffers themselves with an additive
mask that is a view of one pattern made once (``reads_in_place``), so a verify, or a draft
model's one-token step, gathers nothing and builds no mask from positions.

Window convention: :mod:`swkv_teach.masks`.
"""

from __future__ import annotations

import torch

from swkv_teach._validate import check_kv, check_nonnegative_int, check_positive_int
from swkv_teach.caches import _state
from swkv_teach.caches.base import KVCache
from swkv_teach.masks import window_mask


class RingBufferKVCache(KVCache):
    """Sliding-window cache of capacity ``window_size`` in a preallocated ``(B, H, W, D)`` buffer.

    The buffer is allocated on the first update, with that update's batch,
    heads, head_dim, dtype and device. A one-token ``update`` returns a view
    of the filled slots (the buffer itself once full, never the unfilled
    zero slots, which would take attention weight). A chunk of ``c`` tokens
    returns the stored keys its first query can still see, chronologically,
    followed by the chunk: a fresh tensor, or with ``lookahead`` and ``2 <= c <=
    lookahead + 1`` a view of the buffer where the run does not wrap.
    """

    num_sinks = 0  # slots pinned to the first positions; SinkKVCache sets it
    one_token_in_window = True  # a one-token update returns the filled slots: sinks and the last W (base.py)
    reads_in_place = False  # with lookahead (no sinks): update_in_place, the decoder's way for up to
    in_place_tokens = 0  # this many new tokens (lookahead + 1): a verify, or a draft model's step

    def __init__(self, window_size: int, lookahead: int = 0):
        self.window_size = check_positive_int("window_size", window_size)
        self.lookahead = check_nonnegative_int("lookahead", lookahead)
        self._period = window_size + lookahead  # window slots cycle with this period
        if lookahead:  # a one-token update also returns the up to k tokens kept for a rollback
            self.one_token_in_window = False
            if not self.num_sinks:  # update_in_place's mask is the window alone (sinks would need their own)
                self.reads_in_place, self.in_place_tokens = True, lookahead + 1
        self.reset()

    # ----------------------------------------------------------------- slots
    @property
    def capacity(self) -> int:
        """Slots in the buffer: ``num_sinks + window_size + lookahead``."""
        return self.num_sinks + self._period

    def _slots_of(self, positions: torch.Tensor) -> torch.Tensor:
        """Slot of each absolute position: sinks in front, the rest cycling through ``W + lookahead`` slots."""
        S, P = self.num_sinks, self._period
        return torch.where(positions < S, positions, S + (positions - S) % P)

    def _slot_positions(self, seen: int) -> torch.Tensor:
        """Absolute position held by each filled slot after ``seen`` tokens (slot order).

        A window slot ``s = S + r`` holds the latest ``p < seen`` with ``p ≡ S + r (mod P)``,
        ``P = W + lookahead``, that is ``p = s + P * ((seen - 1 - s) // P)``; a sink slot holds ``p = s``.
        After a rollback a slot may hold a rolled-back token instead; the position this formula
        gives it is then older than :meth:`_oldest_held`, outside the next query's window.
        """
        S, P = self.num_sinks, self._period
        slot = self._slot_index[: min(seen, self.capacity)]
        p = slot + P * torch.div((seen - 1) - slot, P, rounding_mode="floor")
        return torch.where(slot < S, slot, p) if S else p

    # ---------------------------------------------------------------- update
    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``(batch, heads, tokens, head_dim)`` keys/values; return ``(k, v)`` to attend over."""
        # fast path: one token, same shape, dtype and device as the buffer. Each test below is
        # ~0.1 µs of Python, which is why they are plain attribute reads (dtypes are singletons,
        # so `is` will do) and why `_one_token` is None until the buffer exists.
        if not (
            type(k_new) is torch.Tensor
            and type(v_new) is torch.Tensor
            and k_new.shape == self._one_token
            and v_new.shape == self._one_token
            and k_new.dtype is self._dtype
            and v_new.dtype is self._dtype
            and k_new.device == self._device
            and v_new.device == self._device
            and not k_new.requires_grad
            and not v_new.requires_grad
        ):
            check_kv(k_new, v_new, self.k_buf)
            k_new, v_new = k_new.detach(), v_new.detach()  # values, not autograd history (see base.py)
            if self.k_buf is None:
                self._allocate(k_new)
            if k_new.shape[2] > 1:
                return self._update_chunk(k_new, v_new)

        slot = self._claim_slot()
        self._k_slots[slot].copy_(k_new)
        self._v_slots[slot].copy_(v_new)
        filled = self._seen
        if filled >= self._capacity:
            return self._whole  # the buffers themselves, as a tuple made once
        return self.k_buf[:, :, :filled], self.v_buf[:, :, :filled]

    def _claim_slot(self) -> int:
        """Count one more token and return the slot it goes to; the caller writes it there.

        The one-token write hook: ``update`` writes the slot itself, and a cache whose buffers
        hold something else in the same slots (int8 data and scales) writes its own.
        """
        seen = self._seen
        S = self.num_sinks
        self._seen = seen + 1
        self._positions = None  # recomputed on demand: the hot path stays two copies
        return seen if seen < S else S + (seen - S) % self._period

    def _allocate(self, like: torch.Tensor) -> None:
        B, H, _, D = like.shape
        self._adopt(torch.zeros(B, H, self.capacity, D, dtype=like.dtype, device=like.device),
                    torch.zeros(B, H, self.capacity, D, dtype=like.dtype, device=like.device))

    def _adopt(self, k_buf: torch.Tensor, v_buf: torch.Tensor) -> None:
        """Hold ``k_buf``, ``v_buf`` ``(B, H, capacity, D)`` as the buffers (views welcome, not copied)."""
        B, H, _, D = k_buf.shape
        self._device = k_buf.device
        self._dtype = k_buf.dtype
        self._capacity = self.capacity
        self._one_token = torch.Size((B, H, 1, D))
        self._slot_index = torch.arange(self.capacity, device=k_buf.device)
        self.k_buf, self.v_buf = k_buf, v_buf
        # one (B, H, 1, D) view per slot, made once, so a step does no slicing
        self._k_slots = self.k_buf.split(1, dim=2)
        self._v_slots = self.v_buf.split(1, dim=2)
        self._whole = (self.k_buf, self.v_buf)
        if self.reads_in_place:  # update_in_place's masks, every one a view of this pattern (see there)
            P, W = self._period, self.window_size
            i = torch.arange(3 * P - 1, device=k_buf.device)
            pattern = torch.zeros(3 * P - 1, dtype=k_buf.dtype, device=k_buf.device).masked_fill_(i % P < P - W,
                                                                                                  float("-inf"))
            self._bias_rows = pattern.unfold(0, P, 1)  # (2P, P): row j = pattern[j : j + P]

    # ------------------------------------------------ a step torch.compile can capture (Decoder.compiled_ring)
    def adopt(self, k_buf: torch.Tensor, v_buf: torch.Tensor) -> None:
        """Keep this empty cache's tokens in ``k_buf``, ``v_buf`` ``(B, H, capacity, D)``, buffers made elsewhere.

        A compiled step needs buffers at fixed addresses that outlive one sequence (CUDA graphs replay
        reads and writes of the same memory), so the buffers belong to whoever compiled the step, and
        each new sequence's cache adopts them. Their old contents are never read: a one-token
        ``update`` returns only filled slots, and :func:`ring_slot_and_mask` masks the others.
        """
        if self._seen or self.k_buf is not None:
            raise ValueError(f"adopt needs an empty cache; this one has seen {self._seen} tokens")
        check_kv(k_buf, v_buf, None)
        if k_buf.shape[2] != self.capacity:
            raise ValueError(f"k_buf must hold capacity={self.capacity} slots in dim 2; got shape {tuple(k_buf.shape)}")
        self._adopt(k_buf, v_buf)

    def count_written(self) -> None:
        """Count one token that a compiled step wrote into slot ``ring_slot_and_mask(seen)`` itself.

        The compiled step cannot touch Python state (a graph replays tensor work only), so the caller
        counts its token here afterwards, and ``seen``, ``positions`` and ``state_dict`` stay what
        ``update`` would have made them.
        """
        if self.num_sinks or self.lookahead:
            raise ValueError("a compiled ring step writes slot position % W: it serves rings without sinks or lookahead")
        self._claim_slot()

    def _update_chunk(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        S, W, P, n = self.num_sinks, self.window_size, self._period, self._seen
        tokens = k_new.shape[2]
        if tokens <= self.lookahead + 1 and n >= S:
            return self._update_verify(k_new, v_new)
        # stored keys the chunk's first query (position n) may see: sinks and j > n - W (a slot a
        # rollback left stale reports a position <= n - W, see _slot_positions: never kept)
        held = self._slot_positions(n)
        keep = torch.nonzero((held < S) | (held > n - W)).flatten()
        keep = keep[torch.argsort(held[keep])]  # chronological
        new_pos = torch.arange(n, n + tokens, device=self._device)
        k = torch.cat([self.k_buf.index_select(2, keep), k_new], dim=2)
        v = torch.cat([self.v_buf.index_select(2, keep), v_new], dim=2)
        self._positions = torch.cat([held[keep], new_pos])
        # store the chunk's tokens that survive it: sinks and the last W + lookahead (a rollback may need them)
        survive = torch.nonzero((new_pos < S) | (new_pos >= n + tokens - P)).flatten()
        slots = self._slots_of(new_pos[survive])
        self.k_buf.index_copy_(2, slots, k_new.index_select(2, survive))
        self.v_buf.index_copy_(2, slots, v_new.index_select(2, survive))
        self._seen = n + tokens
        return k, v

    def _update_verify(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A chunk of ``c <= lookahead + 1`` tokens past the sinks (a speculative verify): what
        :meth:`_update_chunk` returns, with no position arithmetic on tensors and no gather.

        It writes the chunk into its slots *first*, then returns the run of slots holding the
        first query's window and the chunk: positions ``lo = max(S, n - W + 1) .. n + c - 1``
        (after the sinks), chronological, one view of the buffer, or two slices joined when the
        run wraps. Safe because of the lookahead: the chunk reuses the slots of positions
        ``n - P .. n + c - 1 - P`` (``P = W + lookahead``), all ``< n - W + 1`` when ``c <= lookahead + 1``,
        so outside every chunk query's window; and ``lo .. n - 1`` are all still held, since
        :meth:`rollback` never goes below ``top - P <= n - W + 1`` (:attr:`rollback_limit`).
        The run is at most ``W - 1 + c <= P`` positions long: it wraps at most once.

        Worked example, ``W = 3``, ``k = 2`` (5 slots), ``n = 7``, chunk of 3 (positions 7, 8, 9)::

            before  [p5, p6, p2, p3, p4]    write 7, 8, 9 into slots 2, 3, 4
            after   [p5, p6, p7, p8, p9]    first query (7) sees 5, 6: lo = 5, slot 0
            returned slots 0..4 = p5..p9    one view, no copy (a chunk one token later, positions
                                            6..10, wraps: slots 1..4 and 0, two slices joined)
        """
        S, W, P, n = self.num_sinks, self.window_size, self._period, self._seen
        tokens = k_new.shape[2]
        end = n + tokens
        self._write(n, k_new, v_new)
        lo = max(S, n - W + 1)
        runs = self._slot_runs(lo, end)
        if S:
            runs = [(0, S), *runs]  # every sink is held (n >= S), before the window in time and in slots
        if len(runs) > 1 and runs[0][1] == runs[1][0]:  # sinks right before the run: one run of slots
            runs = [(runs[0][0], runs[1][1]), *runs[2:]]
        if len(runs) == 1:
            a, b = runs[0]
            k, v = self.k_buf.narrow(2, a, b - a), self.v_buf.narrow(2, a, b - a)
        else:
            k = torch.cat([self.k_buf.narrow(2, a, b - a) for a, b in runs], dim=2)
            v = torch.cat([self.v_buf.narrow(2, a, b - a) for a, b in runs], dim=2)
        positions = torch.arange(lo, end, device=self._device)
        self._positions = torch.cat([self._slot_index[:S], positions]) if S else positions
        self._seen = end
        return k, v

    def _write(self, n: int, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        """Write ``c`` new tokens into their slots: positions ``n .. n + c - 1``, ``n >= S``, ``c <= W + lookahead``."""
        # narrow, not [:, :, a:b]: a third of the cost, and this runs in every layer of every verify
        offset = 0
        for a, b in self._slot_runs(n, n + k_new.shape[2]):  # one or two runs of slots, in position order
            self.k_buf.narrow(2, a, b - a).copy_(k_new.narrow(2, offset, b - a))
            self.v_buf.narrow(2, a, b - a).copy_(v_new.narrow(2, offset, b - a))
            offset += b - a

    def update_in_place(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """:meth:`update` for ``c <= lookahead + 1`` tokens, returning the buffers themselves and a mask of the window.

        What the decoder calls for a verify (and a draft model's one-token steps) on a ring with
        lookahead and no sinks (``reads_in_place``; the paged cache's method of the same name, for
        one token). Returns ``(k, v, bias)``: the buffers ``(B, H, W + lookahead, D)`` in slot order,
        nothing gathered or copied, and ``bias`` ``(c, W + lookahead)`` in their dtype: 0 where query
        ``seen + i`` may attend to the slot, ``-inf`` elsewhere (tokens that left its window, later
        tokens of the chunk, slots a rollback left stale). ``softmax(q kᵀ/√d + bias) v`` is the
        chunk's attention over its windows: what ``update`` and :func:`~swkv_teach.masks.window_mask`
        give, summed in slot order.

        Why the mask needs no positions: once this update has brought ``seen`` to ``P = W + lookahead``
        or more, slot ``s`` holds (or, if stale, stands for a position older than every window of the
        chunk) the one position ``p ≡ s (mod P)`` in ``seen - P .. seen - 1``, and query ``r``
        (a position of the chunk) sees slot ``s`` exactly when ``(r - s) mod P < W``: the window's
        ``W`` slots ending at ``r``'s, cyclically; the chunk's later tokens are ``P - c + 1 .. P - 1
        >= W`` ahead mod ``P`` (``c <= lookahead + 1``), so masked. That row depends only on ``r mod P``:
        it is row ``(P - 1 - r) mod P`` (or ``+ P``) of ``_bias_rows``, windows of one ``(3P - 1,)``
        pattern made at allocation, so the chunk's rows are consecutive rows read bottom-up (a flip
        for ``c > 1``). Example, ``W = 3``, ``lookahead = 2`` (``P = 5``), query 7 after 8 tokens::

            slot s              0    1    2    3    4
            position held       5    6    7    3    4      (3, 4: kept for a rollback)
            (7 - s) mod 5       2    1    0    4    3      < 3: slots 0, 1, 2 = positions 5, 6, 7

        Before that (the first lap), it is :meth:`update` (every check) and a mask from positions.
        ``seen`` moves as with ``update``; ``positions`` are then the slots'.
        """
        c = k_new.shape[2] if isinstance(k_new, torch.Tensor) and k_new.dim() == 4 else None
        if self.num_sinks or c is None or not 1 <= c <= self.lookahead + 1:
            got = f"shape {tuple(k_new.shape)}" if isinstance(k_new, torch.Tensor) else type(k_new).__name__
            raise ValueError(f"update_in_place takes 1 to lookahead + 1 = {self.lookahead + 1} tokens (batch, heads, "
                             f"tokens, head_dim) on a ring without sinks (num_sinks={self.num_sinks}); got k_new "
                             f"{got}: use update")
        n, P = self._seen, self._period
        end = n + c
        shape = self._one_token
        if not (
            end >= P
            and shape is not None
            and type(k_new) is torch.Tensor
            and type(v_new) is torch.Tensor
            and k_new.shape == v_new.shape
            and k_new.shape[:2] == shape[:2]
            and k_new.shape[3] == shape[3]
            and k_new.dtype is self._dtype
            and v_new.dtype is self._dtype
            and k_new.device == self._device
            and v_new.device == self._device
            and not (k_new.requires_grad or v_new.requires_grad)
        ):
            k, v = self.update(k_new, v_new)  # every check, the first lap
            mask = window_mask(torch.arange(n, end, device=k.device), self.positions.to(k.device), self.window_size)
            return k, v, torch.zeros(mask.shape, dtype=k.dtype, device=k.device).masked_fill_(~mask, float("-inf"))
        self._write(n, k_new, v_new)
        self._seen = end
        self._positions = None  # the slots' positions (_slot_positions), made if asked
        rows = self._bias_rows.narrow(0, (P - end) % P, c)  # queries end - 1, end - 2, ..., n
        return self.k_buf, self.v_buf, rows if c == 1 else rows.flip(0)

    def _slot_runs(self, start: int, stop: int) -> list[tuple[int, int]]:
        """Slots of window positions ``start .. stop - 1`` (``S <= start``, at most ``W + lookahead`` of them), as
        ``(first, end)`` runs of consecutive slots in position order: one run, or two where the ring wraps."""
        S, P = self.num_sinks, self._period
        first = S + (start - S) % P
        end = first + (stop - start)
        if end <= S + P:
            return [(first, end)]
        return [(first, S + P), (S, end - P)]

    # ------------------------------------------------------------ taking tokens back
    @property
    def rollback_limit(self) -> int:
        """Most tokens :meth:`rollback` can take back now: every one before the ring wraps, then
        as many as leave the next query's window ``seen - W < j < seen`` whole in the ring
        (``lookahead + 1`` right after a write past the wrap, fewer after a rollback)."""
        oldest = self._oldest_held()
        if oldest == self.num_sinks:  # no window token overwritten yet: any of them can go
            return self._seen
        return self._seen - (oldest + self.window_size - 1)  # the next query needs oldest + W - 1 .. seen - 1

    def rollback(self, r: int) -> None:
        """Forget the last ``r`` tokens, as if they had never been passed to ``update``: O(1), no tensor copied.

        ``seen`` goes back by ``r``; the next ``update`` writes position ``seen`` into the slot the
        first forgotten token held. Raises ``ValueError`` (the cache unchanged) for ``r`` outside
        ``[0, rollback_limit]``: tokens whose slots were reused cannot come back.
        """
        limit = self.rollback_limit
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= limit:
            raise ValueError(
                f"rollback: r must be an int in [0, {limit}] (the tokens this ring can take back now: "
                f"window_size={self.window_size}, lookahead={self.lookahead}, seen={self._seen}); got {r!r}"
            )
        if r:
            self._top = max(self._top, self._seen)
            self._seen -= r
            self._positions = None

    def _oldest_held(self) -> int:
        """Oldest window position still in its slot: ``top - (W + lookahead)``, at least ``num_sinks``.

        ``top`` is one past the highest position ever written: a slot is overwritten only by a
        position congruent to it, so after a rollback (``seen < top``) the slots of ``seen ..
        top - 1`` hold rolled-back tokens and everything from ``top - (W + lookahead)`` to
        ``seen - 1`` is intact.
        """
        return max(self.num_sinks, max(self._top, self._seen) - self._period)

    def _held(self, positions: torch.Tensor) -> torch.Tensor:
        """Which of ``_slot_positions``' entries are tokens still held (not stale slots left by a rollback)."""
        return (positions < self.num_sinks) | (positions >= self._oldest_held())

    # ------------------------------------------------------------ interface
    @property
    def positions(self) -> torch.Tensor:
        """Absolute position of each key the last ``update`` returned, in the order returned."""
        if self._positions is None:
            self._positions = self._slot_positions(self._seen)
        return self._positions

    @property
    def seen(self) -> int:
        return self._seen

    @property
    def nbytes(self) -> int:
        """Bytes of the preallocated buffers (both), ``2 * B * H * capacity * D * itemsize``."""
        if self.k_buf is None:
            return 0
        return 2 * self.k_buf.numel() * self.k_buf.element_size()

    def ordered(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A chronological copy of the stored keys and values (for display and tests).

        Their positions are ``stored_positions()``.
        """
        if self.k_buf is None:
            raise RuntimeError("the cache is empty: call update() before ordered()")
        held = self._slot_positions(self._seen)
        keep = torch.nonzero(self._held(held)).flatten()
        order = keep[torch.argsort(held[keep])]
        return self.k_buf.index_select(2, order), self.v_buf.index_select(2, order)

    def stored_positions(self) -> torch.Tensor:
        """Absolute positions of the stored tokens, chronologically (matching :meth:`ordered`)."""
        held = self._slot_positions(self._seen)
        return torch.sort(held[self._held(held)]).values

    def reset(self) -> None:
        self.k_buf = self.v_buf = None
        self._k_slots = self._v_slots = ()
        self._one_token = None
        self._device = self._dtype = None
        self._slot_index = torch.zeros(0, dtype=torch.long)
        self._whole = None
        self._bias_rows = None
        self._seen = 0
        self._top = 0  # one past the highest position written, kept up to date by rollback only
        self._positions = None

    def __len__(self) -> int:
        """Tokens held: the window, what a rollback may still need, sinks; never a stale slot."""
        if self._top <= self._seen:  # no rollback since the last write past it: every filled slot holds
            return min(self._seen, self.capacity)
        S = self.num_sinks
        return min(self._seen, S) + max(0, self._seen - max(S, self._oldest_held()))

    # ------------------------------------------------ persistence (caches/_state.py)
    # The buffers are saved whole, in slot order: a restored ring returns its keys in the
    # same order, so attention sums them in the same order and the logits match bit for bit.
    # "lookahead" and "top" are left out at their defaults (0; top = seen, no rollback pending),
    # so a plain ring's state reads as it did before rings could roll back (_state.OPTIONAL).
    _state_keys = ("seen", "positions", "k", "v")
    _optional = {"lookahead": 0, "top": None}

    def _config(self) -> dict:
        return {"window_size": self.window_size, "num_sinks": self.num_sinks, "lookahead": self.lookahead}

    def _state_layout(self) -> list | None:
        return _state.layout(self.k_buf)

    def _stats_extra(self) -> dict:
        extra = {"sinks_held": min(self._seen, self.num_sinks)} if self.num_sinks else {}
        if self.lookahead:
            extra.update(lookahead=self.lookahead, rollback_limit=self.rollback_limit)
        return extra

    def _state(self) -> dict:
        top = max(self._top, self._seen)
        return {"seen": self._seen, "positions": _state.copy(self.positions),
                "k": _state.copy(self.k_buf), "v": _state.copy(self.v_buf), "top": top if top > self._seen else None}

    def _check_state(self, sd: dict) -> None:
        check_ring_state(self, sd, ("k", "v"), sd["layout"])

    def _load_state(self, sd: dict) -> None:
        self._restore(sd["k"], sd["v"], sd["seen"], sd["positions"])
        self._top = sd.get("top") or 0

    def _restore(self, k, v, seen: int, positions) -> None:
        """Hold buffers ``k``, ``v`` ``(B, H, capacity, D)`` (copied) after ``seen`` tokens; None: empty."""
        device = self._device
        self.reset()
        if k is None:
            return
        self._allocate(k if device is None else k.to(device))
        self.k_buf.copy_(k)
        self.v_buf.copy_(v)
        self._resume(seen, positions)

    def _resume(self, seen: int, positions) -> None:
        """Count ``seen`` tokens, the last update having returned ``positions`` (after the buffers are filled)."""
        self._seen = seen
        self._positions = _state.copy(positions, self._device)


def check_ring_state(cache, sd: dict, buffers: tuple[str, ...], lay, last_dims: dict | None = None) -> None:
    """Check a ring-shaped state: ``seen``, ``positions`` and each buffer ``(B, H, capacity, D)``.

    ``last_dims``/dtypes per buffer for the int8 cache (scales are ``(B, H, capacity, 1)`` float32).
    """
    name, seen = type(cache).__name__, sd["seen"]
    if seen == 0:
        if any(sd[b] is not None for b in buffers) or lay is not None:
            raise ValueError(f"{name}: a state with seen=0 holds no buffers and no layout")
        return
    if lay is None:
        raise ValueError(f"{name}: state has seen={seen} but no layout")
    B, H, D, dt = lay
    capacity = cache.window_size + getattr(cache, "num_sinks", 0) + getattr(cache, "lookahead", 0)
    for b in buffers:
        last, dtype = (last_dims or {}).get(b, (D, _state.dtype_from_name(dt)))
        _state.expect_tensor(name, b, sd[b], (B, H, capacity, last), dtype)
    top = sd.get("top")
    if top is not None:  # a rollback is pending: rolled-back slots must not reach into the next query's window
        _state.expect_int(name, "top", top, seen + 1, max(capacity, seen + getattr(cache, "lookahead", 0) + 1))
    p = sd["positions"]
    if not isinstance(p, torch.Tensor) or p.dim() != 1 or p.dtype != torch.long or len(p) > seen:
        raise ValueError(f"{name}: state['positions'] must be a 1-D long tensor of at most seen={seen} positions")


def ring_slot_and_mask(position: torch.Tensor, window_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where one token at ``position`` goes in a ``window_size``-slot ring, and which slots it may attend to.

    ``position``: a ``(1,)`` integer tensor, so that a compiled step reads it as data, never as a
    Python number it would specialise (and recompile) on. Returns ``slot`` ``(1,)`` = ``position % W``
    and ``visible`` ``(W,)`` bool: slot ``s`` holds a token once ``s <= position`` (the ring fills
    slots 0, 1, ... in order, then overwrites), and every held token is inside the window
    ``position - W < j <= position``, so ``visible`` is the whole mask: all True from ``W - 1`` on.
    No Python branch on the position: one graph serves the first step and the millionth.
    """
    slot = position % window_size
    visible = torch.arange(window_size, device=position.device) <= position
    return slot, visible
