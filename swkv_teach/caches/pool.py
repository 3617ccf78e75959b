"""The block pool under paged caches: ``num_blocks`` fixed-size blocks of keys and values, handed out and returned.

One :class:`BlockPool` serves many sequences (:class:`~swkv_teach.caches.PagedKVCache`, one
per sequence, and :mod:`swkv_teach.serving`, which batches them). The pool knows blocks and
owners only: which tokens a block holds, and when it goes back, is the cache's business
(:mod:`swkv_teach.caches.paged` has the worked example of a window's blocks).

Layout: keys and values are each ``(num_blocks, block_size, heads, head_dim)``, so a block is
one contiguous slab and the flat view ``(num_blocks * block_size, heads, head_dim)`` is
addressed by ``block * block_size + offset`` (FlashAttention's paged layout, so
:func:`~swkv_teach.attention.paged_attention` reads it as it is). Free blocks queue up
first-in, first-out, as vLLM's ``FreeKVCacheBlockQueue`` (``vllm/v1/core/kv_cache_utils.py``).
"""

from __future__ import annotations

from collections import deque

import torch

from swkv_teach._validate import check_positive_int


def write_to_blocks(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor) -> None:
    """Write new keys/values into pool storage at flat slots ``block * block_size + offset``.

    Args:
        k_cache, v_cache: ``(num_blocks, block_size, heads, head_dim)`` (the layout of
            :func:`~swkv_teach.attention.paged_attention`), written in place.
        slots: ``(batch, tokens)`` integer flat slots, distinct.
        k, v: ``(batch, heads, tokens, head_dim)``, the decoder's layout.
    """
    n_slots, H, D = k_cache.shape[0] * k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    index = slots.reshape(-1)
    k_cache.view(n_slots, H, D).index_copy_(0, index, k.transpose(1, 2).reshape(-1, H, D))
    v_cache.view(n_slots, H, D).index_copy_(0, index, v.transpose(1, 2).reshape(-1, H, D))


def blocks_spanned(positions: int, block_size: int) -> int:
    """The most blocks ``positions`` consecutive positions can touch: ``ceil((positions - 1) / block_size) + 1``.

    The worst alignment starts at a block's last slot: 1 position there, the rest fill whole blocks and a partial
    one (W = 5, block_size = 4: positions 3..7 touch blocks 0 and 1, positions 7..11 touch 1 and 2, never more
    than ceil(4 / 4) + 1 = 2). The bound of a window's blocks (paged caches) and of a request's (the scheduler).
    """
    n, bs = check_positive_int("positions", positions), check_positive_int("block_size", block_size)
    return -(-(n - 1) // bs) + 1


class PoolExhausted(RuntimeError):
    """The pool has fewer free blocks than an update needs; nothing was changed."""


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` tokens' keys and values, shared by many :class:`PagedKVCache`.

    The storage, keys and values each ``(num_blocks, block_size, heads, head_dim)``,
    is allocated on the first write with that write's heads, head_dim, dtype
    and device; while every block is free, a write of another layout
    re-allocates it. Free blocks are handed out first-in, first-out: a block
    just returned is reused last.
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = check_positive_int("num_blocks", num_blocks)
        self.block_size = check_positive_int("block_size", block_size)
        self._free: deque[int] = deque(range(num_blocks))
        self._owner: dict[int, int] = {}  # block -> id of the sequence holding it
        self._sequences = 0
        self.k: torch.Tensor | None = None  # (num_blocks, block_size, heads, head_dim)
        self.v: torch.Tensor | None = None

    # ---------------------------------------------------------- bookkeeping
    @property
    def free_blocks(self) -> int:
        """Blocks no sequence holds."""
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        """Blocks held by some sequence."""
        return self.num_blocks - len(self._free)

    def new_sequence_id(self) -> int:
        """A fresh id for a sequence on this pool (how errors and :meth:`holdings` name it)."""
        self._sequences += 1
        return self._sequences - 1

    def take(self, owner: int = -1) -> int:
        """Hand out one free block (the one free the longest) to ``owner``; raise :class:`PoolExhausted` if none."""
        if not self._free:
            raise PoolExhausted(f"{self!r} has no free block; {self.describe_holdings()}")
        block = self._free.popleft()
        self._owner[block] = owner
        return block

    def give(self, block: int) -> None:
        """Return ``block`` to the pool; it must be held (giving a free block twice would hand it out twice)."""
        if block not in self._owner:
            raise ValueError(f"block {block!r} is not held by any sequence (free blocks: {sorted(self._free)})")
        del self._owner[block]
        self._free.append(block)

    def is_held(self, block: int) -> bool:
        """Whether some sequence holds ``block`` (a free block, or a number that is no block, is not held)."""
        return block in self._owner

    def free_order(self) -> list[int]:
        """The free blocks in the order :meth:`take` hands them out (the one free the longest first)."""
        return list(self._free)

    # a saved state put back where it lay (PagedKVCache.load_state_dict): the same ids, the same queue
    def claim(self, blocks: list[int], owner: int) -> bool:
        """Hand exactly ``blocks`` to ``owner`` if every one is free; otherwise change nothing and return False."""
        if not set(blocks) <= set(self._free):
            return False
        for block in blocks:
            self._free.remove(block)
            self._owner[block] = owner
        return True

    def reorder_free(self, order: list[int]) -> None:
        """Put the free queue in ``order``, which must list exactly the free blocks."""
        if sorted(order) != sorted(self._free):
            raise ValueError(f"order {order!r} must list exactly the free blocks {sorted(self._free)}")
        self._free = deque(order)

    def holdings(self) -> dict[int, list[int]]:
        """``{sequence id: [blocks it holds]}``, for messages and figures."""
        out: dict[int, list[int]] = {}
        for block, owner in self._owner.items():
            out.setdefault(owner, []).append(block)
        return {s: sorted(b) for s, b in sorted(out.items())}

    def describe_holdings(self) -> str:
        """:meth:`holdings` in words, for error messages ("sequence 0 holds 2 blocks [0, 3], ...")."""
        held = self.holdings()
        if not held:
            return "no sequence holds a block"
        return ", ".join(
            f"{'sequence %d' % s if s >= 0 else 'take() with no owner'} holds {len(b)} block{'s' * (len(b) != 1)} {b}"
            for s, b in held.items()
        )

    # -------------------------------------------------------------- storage
    def check_layout(self, k_new: torch.Tensor) -> None:
        """Raise if ``k_new`` ``(1, heads, tokens, head_dim)`` cannot be written into the allocated blocks."""
        if self.k is None or self.used_blocks == 0:
            return  # storage is (re)allocated for this write
        _, H, _, D = k_new.shape
        if (H, D) != tuple(self.k.shape[2:]) or k_new.dtype != self.k.dtype or k_new.device != self.k.device:
            raise ValueError(
                f"k_new has heads={H}, head_dim={D}, dtype {k_new.dtype} on {k_new.device}, but this pool's "
                f"blocks hold heads={self.k.shape[2]}, head_dim={self.k.shape[3]}, dtype {self.k.dtype} on "
                f"{self.k.device}; every sequence on one pool must share the layout"
            )

    def allocate_like(self, k_new: torch.Tensor) -> None:
        """Allocate the storage for writes shaped like ``k_new``, unless it already fits."""
        _, H, _, D = k_new.shape
        if (
            self.k is not None
            and tuple(self.k.shape[2:]) == (H, D)
            and self.k.dtype == k_new.dtype
            and self.k.device == k_new.device
        ):
            return
        shape = (self.num_blocks, self.block_size, H, D)
        self.k = torch.zeros(shape, dtype=k_new.dtype, device=k_new.device)
        self.v = torch.zeros_like(self.k)
        self._views = None

    def views(self) -> tuple:
        """Views of the storage made once per allocation, for :meth:`PagedKVCache.update_in_place`.

        ``(k_slots, v_slots, k_all, v_all)``: one ``(1, heads, 1, head_dim)`` view per flat slot
        ``block * block_size + offset`` (a write is then one ``copy_``), and the whole pool as
        ``(1, heads, num_blocks * block_size, head_dim)`` (a strided view, no copy), the layout
        ``scaled_dot_product_attention`` reads.
        """
        if getattr(self, "_views", None) is None:
            N, H, D = self.num_blocks * self.block_size, self.k.shape[2], self.k.shape[3]
            flat_k, flat_v = self.k.view(N, H, D), self.v.view(N, H, D)
            self._views = (flat_k.view(N, 1, H, 1, D).unbind(0), flat_v.view(N, 1, H, 1, D).unbind(0),
                           flat_k.permute(1, 0, 2).unsqueeze(0), flat_v.permute(1, 0, 2).unsqueeze(0))
        return self._views

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block, keys and values (0 before the first write)."""
        if self.k is None:
            return 0
        return 2 * self.k[0].numel() * self.k.element_size()

    @property
    def nbytes(self) -> int:
        """Bytes of the whole pool's storage, keys and values, used or not."""
        return self.num_blocks * self.bytes_per_block

    def __repr__(self) -> str:
        return (f"BlockPool(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"free={self.free_blocks}, used={self.used_blocks})")
