"""A paged sliding-window cache: fixed-size blocks from a shared pool, one block table per sequence.

Serving engines hold the keys and values of many sequences at once. vLLM's
PagedAttention (Kwon et al., SOSP 2023, section 4) cuts each sequence's cache
into blocks of ``block_size`` tokens taken from one pool, so no sequence
reserves memory for tokens it has not produced yet, and a *block table* maps a
sequence's logical blocks to the pool's physical ones. A sliding window adds
one rule: a block goes back to the pool as soon as none of its tokens is among
the last ``W``, so a sequence's memory stays flat while the pool serves others.

Token ``p`` of a sequence lives in logical block ``p // block_size`` at offset
``p % block_size``; the block table lists the pool blocks of the logical blocks
still held, oldest first. Worked example, ``W = 3``, ``block_size = 2``, one
token per step, a fresh pool handing out blocks 0, 1, 2, ...::

    seen  stored (last W)   logical blocks held   block table   returned to the pool
      1   [0]               0                     [0]
      2   [0, 1]            0                     [0]
      3   [0, 1, 2]         0, 1                  [0, 1]
      4   [1, 2, 3]         0, 1                  [0, 1]        (token 1 still in block 0)
      5   [2, 3, 4]         1, 2                  [1, 2]        block 0: tokens 0 and 1 left the window
      7   [4, 5, 6]         2, 3                  [2, 3]        block 1

Between updates a sequence holds at most ``ceil((W - 1) / block_size) + 1``
blocks (``W`` consecutive tokens straddle that many); its first block may
still hold tokens that left the window and its last may be partly unwritten.
Without a window only the last one wastes room: "vLLM limits all the memory
wastes for a request within one block" (PagedAttention paper, section 4.3).

vLLM does the same for sliding-window layers (``vllm/v1/core/single_type_kv_cache_manager.py``
at commit 129ab7c): ``SingleTypeKVCacheManager.remove_skipped_blocks`` frees, before each
step, the blocks wholly before the tokens still needed, which
``SlidingWindowManager.get_num_skipped_tokens`` puts at
``max(0, num_computed_tokens - sliding_window + 1)`` (the next query's ``W - 1``
predecessors), and puts a null block in their place in the table. We
free one token later, keeping the last ``W`` as the ring does, so that
:meth:`PagedKVCache.ordered` matches the ring's. vLLM's free blocks queue up
first-in, first-out (``FreeKVCacheBlockQueue``, ``vllm/v1/core/kv_cache_utils.py``);
so do ours.

Layout (the pool is :mod:`swkv_teach.caches.pool`): the pool stores keys and values
as ``(num_blocks, block_size, heads, head_dim)`` each, so a block is one contiguous
slab and the flat view
``(num_blocks * block_size, heads, head_dim)`` is addressed by
``block * block_size + offset`` (FlashAttention's paged layout, so
:func:`~swkv_teach.attention.paged_attention` reads it as it is). ``update``
gathers what the new queries attend over into a fresh ``(1, heads, n, head_dim)``
tensor, as the interface promises. The decoder's one-token steps call
:meth:`PagedKVCache.update_in_place` instead: it returns the pool itself, as a
strided view, with an additive mask that is 0 on this sequence's window, so
attention reads the blocks where they lie and nothing is copied (a paged kernel
walks the block table instead of masking). Serving many sequences at once
through block tables is :mod:`swkv_teach.serving`.

Window convention: :mod:`swkv_teach.masks`.
"""

from __future__ import annotations

import torch

from swkv_teach._validate import check_kv, check_positive_int
from swkv_teach.caches import _state
from swkv_teach.caches.base import KVCache
from swkv_teach.caches.pool import BlockPool, PoolExhausted, blocks_spanned, write_to_blocks

__all__ = ["BlockPool", "PagedKVCache", "PoolExhausted", "write_to_blocks"]  # the pool's names stay importable here


class PagedKVCache(KVCache):
    """One sequence's sliding-window cache of ``window_size`` tokens on blocks from ``pool``.

    Updates are ``(1, heads, tokens, head_dim)``: a sequence is one batch row
    (serve a batch with one cache per sequence on one shared pool). Between
    updates it stores what :class:`~swkv_teach.caches.RingBufferKVCache`
    stores, the last ``W`` tokens, and holds only the blocks they occupy.
    ``update`` returns the stored keys the chunk's first query may still see
    (the last ``W - 1``, chronologically) followed by the chunk, as the ring
    does for chunks; :attr:`positions` lists their positions. ``reset()``
    returns every block; a cache dropped without ``reset()`` keeps its blocks.
    """

    # one-token updates may go through update_in_place: attention then reads the pool where it lies
    # (swkv_teach.model.Block); tests/test_decode_paths.py holds it to update() and to the ring
    reads_in_place = True

    def __init__(self, pool: BlockPool, window_size: int):
        if not isinstance(pool, BlockPool):
            raise TypeError(f"pool must be a BlockPool; got {type(pool).__name__}")
        self.pool = pool
        self.window_size = check_positive_int("window_size", window_size)
        self.sequence_id = pool.new_sequence_id()
        self._table: list[int] = []
        self.reset()

    @staticmethod
    def max_blocks(window_size: int, block_size: int) -> int:
        """Most blocks a sequence holds between updates: ``ceil((W - 1) / block_size) + 1``."""
        return blocks_spanned(check_positive_int("window_size", window_size), block_size)

    # ------------------------------------------------------------- addresses
    def _slots(self, positions: torch.Tensor, table: list[int], first: int) -> torch.Tensor:
        """Flat pool slot ``block * block_size + offset`` of each position, given a block table starting at logical block ``first``."""
        bs = self.pool.block_size
        blocks = torch.tensor(table, dtype=torch.long)[positions // bs - first]
        return (blocks * bs + positions % bs).to(self.pool.k.device)

    def _range(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions ``lo .. hi - 1`` (all held) as ``(1, heads, hi - lo, head_dim)`` copies.

        The positions are consecutive, so they are whole blocks read in table order (one
        ``index_select`` each for keys and values) with the ends trimmed.
        """
        bs = self.pool.block_size
        if hi <= lo:
            empty = self.pool.k.new_zeros(1, self.pool.k.shape[2], 0, self.pool.k.shape[3])
            return empty, empty.clone()
        b0, b1 = lo // bs - self._first, (hi - 1) // bs - self._first + 1  # table entries covering the range
        off = lo - (self._first + b0) * bs
        idx = self._table_t[b0:b1]
        k = self.pool.k.index_select(0, idx).flatten(0, 1)[off : off + hi - lo]  # (n, heads, head_dim)
        v = self.pool.v.index_select(0, idx).flatten(0, 1)[off : off + hi - lo]
        return k.permute(1, 0, 2).unsqueeze(0), v.permute(1, 0, 2).unsqueeze(0)

    # ---------------------------------------------------------------- update
    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``(1, heads, tokens, head_dim)`` keys/values; return ``(k, v)`` to attend over, chronologically."""
        check_kv(k_new, v_new)
        if k_new.shape[0] != 1:
            raise ValueError(
                f"k_new has batch={k_new.shape[0]} (shape {tuple(k_new.shape)}); a PagedKVCache holds one sequence, "
                "batch 1: give each sequence its own PagedKVCache on a shared BlockPool"
            )
        if self._seen and (k_new.shape[1], k_new.shape[3], k_new.dtype, k_new.device) != self._layout:
            H, D, dtype, dev = self._layout
            raise ValueError(
                f"k_new has heads={k_new.shape[1]}, head_dim={k_new.shape[3]}, dtype {k_new.dtype} on {k_new.device} "
                f"but the cache holds heads={H}, head_dim={D}, dtype {dtype} on {dev}; call reset() to start a new sequence"
            )
        self.pool.check_layout(k_new)
        k_new, v_new = k_new.detach(), v_new.detach()  # values, not autograd history (see base.py)

        W, bs, n, c = self.window_size, self.pool.block_size, self._seen, k_new.shape[2]
        lo = max(0, n + c - W)  # first position stored after this update
        new_first, new_last = lo // bs, (n + c - 1) // bs
        old_last = self._first + len(self._table) - 1  # -1 when nothing is held
        n_free = min(len(self._table), max(0, new_first - self._first))
        n_take = new_last - max(new_first, old_last + 1) + 1
        # check before changing anything, counting the blocks this update returns: a pool sized to the
        # bound serves a sequence whose step returns one block and takes another
        if n_take > self.pool.free_blocks + n_free:
            raise PoolExhausted(
                f"{self.pool!r} cannot serve sequence {self.sequence_id}: tokens {n}..{n + c - 1} need "
                f"{n_take} new block{'s' * (n_take != 1)}, this update returns {n_free} and {self.pool.free_blocks} "
                f"of {self.pool.num_blocks} are free ({self.pool.describe_holdings()}). Nothing was changed: "
                "reset() a finished sequence or build a larger pool."
            )

        self._bias = None  # update_in_place's mask is rebuilt after any other update
        self.pool.allocate_like(k_new)
        if c == 1:  # decoding: nothing this step returns is a token the first query needs (see below)
            self._move(n_free, n_take, new_first)
            block = self._table[-1]
            self.pool.k[block, n % bs].copy_(k_new[0, :, 0])  # (heads, head_dim) into its slot
            self.pool.v[block, n % bs].copy_(v_new[0, :, 0])
            self._seen = n + 1
            self._layout = (k_new.shape[1], k_new.shape[3], k_new.dtype, k_new.device)
            self._positions = torch.arange(lo, n + 1, device=k_new.device)  # one token: returned == stored
            return self._range(lo, n + 1)

        # a chunk: its first query sees stored tokens that the chunk itself pushes out of the window, so
        # read them before returning blocks (a block taken in this update may be one just returned)
        k_old, v_old = self._range(max(0, n - (W - 1)), n)
        self._move(n_free, n_take, new_first)
        keep = torch.arange(max(n, lo), n + c)  # the chunk's tokens that survive it
        slots = self._slots(keep, self._table, new_first)
        src = slice(max(n, lo) - n, c)
        self.pool.k.flatten(0, 1).index_copy_(0, slots, k_new[0, :, src].permute(1, 0, 2))
        self.pool.v.flatten(0, 1).index_copy_(0, slots, v_new[0, :, src].permute(1, 0, 2))

        self._seen = n + c
        self._layout = (k_new.shape[1], k_new.shape[3], k_new.dtype, k_new.device)
        self._positions = torch.arange(max(0, n - (W - 1)), n + c, device=k_new.device)
        return torch.cat([k_old, k_new], dim=2), torch.cat([v_old, v_new], dim=2)

    def update_in_place(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """:meth:`update` for one token, returning the pool itself for attention to read in place.

        Returns ``(k, v, bias)``: the whole pool's keys and values as
        ``(1, heads, num_blocks * block_size, head_dim)`` views (nothing copied) and ``bias``
        ``(1, 1, 1, num_blocks * block_size)`` in the keys' dtype: 0 at the slots of this
        sequence's last ``W`` tokens, ``-inf`` everywhere else (tokens that left the window,
        other sequences' blocks, free blocks). ``softmax(q kᵀ/√d + bias) v`` over the pool is
        attention over the window: what a paged kernel computes by walking the block table,
        here by masking. It reads every slot of the pool, so it pays when the pool is this
        sequence's own (``make_cache("paged")``); on a pool many sequences share, serve them
        together with :func:`~swkv_teach.attention.paged_attention` (:mod:`swkv_teach.serving`).

        The state changes exactly as with ``update`` (same blocks, same ``positions``). Once
        the window is running, a step is two ``copy_`` into slot views made once, two entries
        of ``bias`` flipped (the new token's slot to 0, the slot of the token ``W`` back to
        ``-inf``), and a block taken or returned every ``block_size`` steps.
        """
        n, bias = self._seen, self._bias
        if not (
            bias is not None
            and type(k_new) is torch.Tensor
            and type(v_new) is torch.Tensor
            and k_new.shape == v_new.shape == self._one_token
            and k_new.dtype is v_new.dtype is bias.dtype
            and k_new.device == bias.device
            and v_new.device == bias.device
            and not (k_new.requires_grad or v_new.requires_grad)
        ):
            self.update(k_new, v_new)  # every check, and the first token after a chunk or a reset
            return self._in_place(rebuild=True)
        W, bs = self.window_size, self.pool.block_size
        lo = max(0, n + 1 - W)  # first position stored after this token
        new_first = lo // bs
        n_free = min(len(self._table), new_first - self._first)
        n_take = int(n // bs > self._first + len(self._table) - 1)
        if n_take > self.pool.free_blocks + n_free:
            self.update(k_new, v_new)  # raises PoolExhausted, naming the holdings; nothing changed
            return self._in_place(rebuild=True)  # not reached: update counts the blocks the same way
        bias_slots = self._bias_slots
        if n >= W:  # the token W back leaves the window: mask its slot before its block may be returned
            old = n - W
            bias_slots[self._table[old // bs - self._first] * bs + old % bs].fill_(float("-inf"))
        self._move(n_free, n_take, new_first)
        slot = self._table[-1] * bs + n % bs
        k_slots, v_slots, _, _ = self.pool.views()
        k_slots[slot].copy_(k_new)  # no autograd history to drop: the test above refused requires_grad
        v_slots[slot].copy_(v_new)
        bias_slots[slot].fill_(0.0)
        self._seen = n + 1
        self._positions = torch.arange(lo, n + 1, device=k_new.device)
        return self._in_place(rebuild=False)

    def _in_place(self, rebuild: bool) -> tuple[torch.Tensor, ...]:
        if rebuild:  # 0 at the stored window's slots, -inf elsewhere
            k = self.pool.k
            H, D = k.shape[2], k.shape[3]
            self._one_token = torch.Size((1, H, 1, D))
            self._bias = torch.full((self.pool.num_blocks * self.pool.block_size,), float("-inf"),
                                    dtype=k.dtype, device=k.device)
            self._bias[self._slots(self.stored_positions(), self._table, self._first)] = 0.0
            self._bias_slots = self._bias.unbind(0)  # one view per slot: flipping one is a fill_, no indexing
        _, _, k_all, v_all = self.pool.views()
        return k_all, v_all, self._bias.view(1, 1, 1, -1)

    def _move(self, n_free: int, n_take: int, new_first: int) -> None:
        """Return the ``n_free`` oldest blocks, then take ``n_take`` new ones (returning first: the pool may be tight)."""
        if n_free <= 0 and n_take <= 0:
            return
        for block in self._table[:n_free]:
            self.pool.give(block)
        self._table = self._table[n_free:] + [self.pool.take(self.sequence_id) for _ in range(max(0, n_take))]
        self._first = new_first
        self._table_t = torch.tensor(self._table, dtype=torch.long, device=self.pool.k.device)

    # ------------------------------------------------------------ interface
    @property
    def block_table(self) -> list[int]:
        """Pool blocks held, oldest first (logical block ``first + i`` lives in ``block_table[i]``)."""
        return list(self._table)

    @property
    def positions(self) -> torch.Tensor:
        """Absolute position of each key the last ``update`` returned (chronological)."""
        return self._positions

    @property
    def seen(self) -> int:
        return self._seen

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks this sequence holds, keys and values (its last block may be partly empty)."""
        return len(self._table) * self.pool.bytes_per_block

    def stored_positions(self) -> torch.Tensor:
        """Absolute positions of the stored tokens, the last ``W``, chronologically."""
        return torch.arange(max(0, self._seen - self.window_size), self._seen)

    def ordered(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A chronological copy of the stored keys and values, ``(1, heads, len(self), head_dim)`` each."""
        if not self._seen:
            raise RuntimeError("the cache is empty: call update() before ordered()")
        return self._range(max(0, self._seen - self.window_size), self._seen)

    def reset(self) -> None:
        """Return every block to the pool and forget the sequence."""
        for block in self._table:
            self.pool.give(block)
        self._table = []
        self._table_t = None  # _table as a long tensor on the pool's device, remade when the table changes
        self._first = 0  # logical block of _table[0]
        self._seen = 0
        self._layout = None
        self._positions = torch.zeros(0, dtype=torch.long)
        self._bias = None  # update_in_place's additive mask over the pool's slots; None: rebuild it
        self._one_token = None  # torch.Size of a one-token update, set with _bias

    def __len__(self) -> int:
        return min(self._seen, self.window_size)

    def __repr__(self) -> str:
        return (f"PagedKVCache(sequence={self.sequence_id}, stored={len(self)}, seen={self._seen}, "
                f"block_table={self._table})")

    # ------------------------------------------------ telemetry and persistence (caches/_state.py)
    def _stats_extra(self) -> dict:
        return {"blocks_held": len(self._table), "pool_free_blocks": self.pool.free_blocks,
                "pool_blocks": self.pool.num_blocks}

    # The held blocks' contents in table order, their pool ids ("table") and the pool's free queue
    # ("pool_free"). A state restores into any pool with the same block size and enough free blocks.
    # Into a pool like the one it left (make_cache("paged"): a pool of its own) it takes the same ids
    # and puts the free queue back in order, so the blocks lie where they lay and later steps take the
    # blocks they would have taken: attention that reads the pool in place (update_in_place) then sums
    # in the same order, bit for bit. Elsewhere it takes whichever blocks are free; outputs then agree
    # to rounding (the same keys, summed in another order).
    _state_keys = ("seen", "first", "table", "k_blocks", "v_blocks", "positions", "pool_free")

    def _config(self) -> dict:
        return {"window_size": self.window_size, "block_size": self.pool.block_size}

    def _state_layout(self) -> list | None:
        if self._layout is None:
            return None
        H, D, dtype, _ = self._layout
        return [1, H, D, _state.dtype_name(dtype)]

    def _state(self) -> dict:
        idx = self._table_t
        k = self.pool.k.index_select(0, idx) if self._table else None  # (blocks, block_size, heads, head_dim)
        v = self.pool.v.index_select(0, idx) if self._table else None
        return {"seen": self._seen, "first": self._first, "table": list(self._table), "k_blocks": k,
                "v_blocks": v, "positions": _state.copy(self._positions), "pool_free": self.pool.free_order()}

    def _blocks_claim(self, sd: dict):
        return self.pool, len(sd["table"]), len(self._table)

    def _check_state(self, sd: dict) -> None:
        name, seen, bs = type(self).__name__, sd["seen"], self.pool.block_size
        lo = max(0, seen - self.window_size)
        blocks = (seen - 1) // bs - lo // bs + 1 if seen else 0
        if not isinstance(sd["table"], list) or len(sd["table"]) != blocks or sd["first"] != (lo // bs if seen else 0):
            raise ValueError(f"{name}: after seen={seen} tokens a state holds {blocks} blocks from logical block "
                             f"{lo // bs if seen else 0}; got table {sd['table']!r}, first {sd['first']!r}")
        ids = sd["table"] + (sd["pool_free"] if isinstance(sd["pool_free"], list) else [None])
        if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in ids) or len(set(ids)) != len(ids):
            raise ValueError(f"{name}: state['table'] and state['pool_free'] must list distinct block ids (ints >= 0)")
        if not seen:
            if sd["k_blocks"] is not None or sd["v_blocks"] is not None or sd["layout"] is not None:
                raise ValueError(f"{name}: a state with seen=0 holds no blocks and no layout")
            return
        if sd["layout"] is None or sd["layout"][0] != 1:
            raise ValueError(f"{name}: state has seen={seen} but layout {sd['layout']!r}; expected batch 1")
        _, H, D, dt = sd["layout"]
        dtype = _state.dtype_from_name(dt)
        for key in ("k_blocks", "v_blocks"):
            _state.expect_tensor(name, key, sd[key], (blocks, bs, H, D), dtype)
        pool = self.pool
        others = pool.used_blocks - len(self._table)  # blocks other sequences hold: the storage must stay
        if others and pool.k is not None and (tuple(pool.k.shape[2:]) != (H, D) or pool.k.dtype != dtype):
            raise ValueError(
                f"{name}: layout differs from the pool's: the state holds heads={H}, head_dim={D}, dtype {dt}; "
                f"the pool's blocks hold heads={pool.k.shape[2]}, head_dim={pool.k.shape[3]}, dtype {pool.k.dtype} "
                f"for other sequences ({pool.describe_holdings()})"
            )

    def _load_state(self, sd: dict) -> None:
        self.reset()  # gives this sequence's blocks back first: the room check counted them
        if not sd["seen"]:
            return
        _, H, D, dt = sd["layout"]
        device = self.pool.k.device if self.pool.k is not None else sd["k_blocks"].device
        dtype = _state.dtype_from_name(dt)
        pool = self.pool
        pool.allocate_like(torch.empty(1, H, 1, D, dtype=dtype, device=device))
        if pool.claim(sd["table"], self.sequence_id):  # the same ids, when they are free
            self._table = list(sd["table"])
            if pool.used_blocks == len(self._table) and set(pool.free_order()) == set(sd["pool_free"]):
                pool.reorder_free(sd["pool_free"])  # a pool of its own: the queue as it was
        else:
            self._table = [pool.take(self.sequence_id) for _ in sd["table"]]
        self._table_t = torch.tensor(self._table, dtype=torch.long, device=device)
        self.pool.k[self._table_t] = sd["k_blocks"].to(device)
        self.pool.v[self._table_t] = sd["v_blocks"].to(device)
        self._first, self._seen = sd["first"], sd["seen"]
        self._layout = (H, D, dtype, device)
        self._positions = _state.copy(sd["positions"], device)
