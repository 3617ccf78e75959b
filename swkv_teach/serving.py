"""Continuous batching: many requests on one block pool, one decoder forward per step over all of them.

A request is a prompt, a number of new tokens and a way to pick them (greedy, or
sampling with its own seed). The :class:`Scheduler` keeps a queue of waiting
requests and a batch of running ones, and each :meth:`Scheduler.step`

1. **admits** waiting requests, first come first served, while the batch has room
   (``max_running``) and the pool can promise each its peak number of blocks;
2. **prefills** each newcomer with its own forward (the prompt as one chunk, or in
   chunks of ``prefill_chunk`` tokens), which also picks its first new token;
3. runs **one** :meth:`~swkv_teach.model.Decoder.step_paged` over every running
   request that has a token to feed: row ``b`` at its own position (its own RoPE
   angles), its keys written into its own blocks of the shared pool, attention
   through its block-table row with :func:`~swkv_teach.attention.paged_attention`
   (``cache_seqlens`` = tokens it has written);
4. **retires** finished requests and returns their blocks; blocks that left every
   request's window go back after each forward, so a long request holds at most
   ``ceil((W - 1) / block_size) + 1`` blocks while decoding.

Why prefill as its own forward, not mixed into the decode batch? vLLM's scheduler has "no
decoding phase nor prefill phase": each step hands a token budget to requests so that each
one's ``num_computed_tokens`` catches up with its tokens, which covers chunked prefill
(the ``NOTE(woosuk)`` comment at the top of ``Scheduler.schedule`` in
``vllm/v1/core/sched/scheduler.py``). That keeps the decode rows moving while a long prompt
is read, at the price of ragged query lengths in one batch (varlen attention). Here
``paged_attention`` takes one ``seqlen_q`` for the batch, so a prompt goes through its own
forward (batch 1), which reads exactly like ``Decoder.generate`` and keeps every request's
tokens equal to generating it alone; ``prefill_chunk`` bounds the blocks a long prompt
needs while it is read. The cost shows in the occupancy trace: running requests wait one
step while a newcomer is prefilled.

Blocks: one :class:`~swkv_teach.caches.BlockPool` hands out block numbers (first in, first
out); every layer has its own ``(num_blocks, block_size, n_kv_heads, head_dim)`` keys and
values, indexed by the same numbers (as vLLM's layers share one block table). A request is
admitted only when the pool can promise its peak (:meth:`Scheduler.blocks_needed`), so a
running request never waits for a block and nothing is preempted; a request whose peak
exceeds the whole pool is refused when submitted. The price is room promised but not yet
used (``reserved_blocks`` against ``used_blocks`` in the trace). vLLM takes blocks as they
are needed instead and, when ``allocate_slots`` finds none for a running request, preempts
the newest running one (``preempted_req = self.running.pop()``, first come first served),
frees its blocks and sets its ``num_computed_tokens = 0``, so it is recomputed later
(``Scheduler.schedule``, ``vllm/v1/core/sched/scheduler.py``).

Window convention: :mod:`swkv_teach.masks`.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from swkv_teach._validate import check_nonnegative_int, check_positive_int
from swkv_teach.caches import BlockPool
from swkv_teach.caches.pool import blocks_spanned

__all__ = ["Request", "Scheduler", "serve"]


@dataclass
class Request:
    """One request: ``prompt`` token ids, ``max_new_tokens``, and how to pick them (as ``Decoder.generate``)."""

    prompt: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    seed: int | None = None
    id: int = -1
    tokens: list[int] = field(default_factory=list)  # the new tokens, in order
    table: list[int] = field(default_factory=list)  # logical block -> pool block, -1 once returned
    written: int = 0  # tokens whose keys are in the pool (the next one's position)
    reserved: int = 0  # blocks promised at admission
    generator: torch.Generator | None = None

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.max_new_tokens

    @property
    def output(self) -> list[int]:
        """Prompt followed by the new tokens: what ``Decoder.generate`` returns for it."""
        return self.prompt + self.tokens


class Scheduler:
    """Serve requests on ``decoder`` with continuous batching over a pool of ``num_blocks`` blocks.

    Args:
        decoder: a :class:`~swkv_teach.model.Decoder` (e.g. ``load_pretrained()[0]``).
        num_blocks, block_size: the pool (``block_size`` tokens per block; vLLM's default is 16).
        max_running: most requests in one decode forward.
        prefill_chunk: prompt tokens per prefill forward (None: the whole prompt in one).
        window_size: ``W`` (default the decoder's).

    ``trace`` gets one dict per :meth:`step`: ``step``, ``running``, ``waiting``,
    ``used_blocks`` (held now), ``reserved_blocks`` (promised), ``prefilled`` (requests
    admitted this step), ``decoded`` (rows of this step's decode forward), ``seconds``.
    """

    def __init__(self, decoder, num_blocks: int, block_size: int = 16, max_running: int = 16,
                 prefill_chunk: int | None = None, window_size: int | None = None):
        self.decoder = decoder
        self.pool = BlockPool(num_blocks, block_size)
        self.max_running = check_positive_int("max_running", max_running)
        self.prefill_chunk = None if prefill_chunk is None else check_positive_int("prefill_chunk", prefill_chunk)
        c = decoder.config
        self.window_size = c.window_size if window_size is None else check_positive_int("window_size", window_size)
        p = next(decoder.parameters())
        shape = (num_blocks, block_size, c.n_kv_heads, c.head_dim)
        self.kv = [(torch.zeros(shape, dtype=p.dtype, device=p.device), torch.zeros(shape, dtype=p.dtype,
                                                                                       device=p.device))
                   for _ in decoder.layers]
        self.device = p.device
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: dict[int, Request] = {}
        self.trace: list[dict] = []
        self._ids = 0

    # ------------------------------------------------------------------ requests
    def blocks_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        """The most blocks a request holds at once (what admission promises it).

        Its keys are written at positions ``0 .. prompt_len + max_new_tokens - 2`` (the last
        new token is never fed back). A forward of ``c`` tokens at position ``n`` needs keys
        ``n - W + 1 .. n + c - 1``: ``W + c - 1`` consecutive positions, spread over at most
        ``ceil((W + c - 2) / block_size) + 1`` blocks, and never more blocks than the
        positions ever written fill.
        """
        if max_new_tokens == 0:
            return 0
        bs, W = self.pool.block_size, self.window_size
        written = prompt_len + max_new_tokens - 1
        chunk = prompt_len if self.prefill_chunk is None else min(self.prefill_chunk, prompt_len)
        span = min(written, W + chunk - 1)
        return min(-(-written // bs), blocks_spanned(span, bs))

    def submit(self, prompt, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
               seed: int | None = None) -> int:
        """Queue a request; returns its id. ``prompt``: token ids (list or 1-D long tensor)."""
        ids = prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
        self.decoder._check_ids("prompt", torch.tensor([ids], dtype=torch.long))
        check_nonnegative_int("max_new_tokens", max_new_tokens)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"temperature must be a number >= 0 (0 = greedy); got {temperature!r}")
        if top_k is not None:
            check_positive_int("top_k", top_k)
        need = self.blocks_needed(len(ids), max_new_tokens)
        if need > self.pool.num_blocks:
            raise ValueError(
                f"this request can never fit the pool: a prompt of {len(ids)} tokens and {max_new_tokens} new "
                f"tokens with window {self.window_size} and prefill chunks of "
                f"{self.prefill_chunk or len(ids)} tokens hold up to {need} blocks of {self.pool.block_size} "
                f"tokens at once, but the pool has {self.pool.num_blocks}; build a larger pool"
                + ("" if self.prefill_chunk else " or pass a smaller prefill_chunk")
            )
        request = Request(ids, max_new_tokens, temperature, top_k, seed, id=self._ids)
        if seed is not None:
            request.generator = torch.Generator(device=self.device).manual_seed(check_nonnegative_int("seed", seed))
        self._ids += 1
        self.waiting.append(request)
        return request.id

    # ------------------------------------------------------------------ blocks
    def _reserved(self) -> int:
        return sum(r.reserved for r in self.running)

    def _hold(self, request: Request, lo: int, hi: int) -> None:
        """Make sure ``request`` holds the blocks of positions ``lo .. hi - 1``."""
        bs = self.pool.block_size
        for logical in range(lo // bs, (hi - 1) // bs + 1):
            while len(request.table) <= logical:
                request.table.append(-1)
            if request.table[logical] < 0:
                request.table[logical] = self.pool.take(request.id)

    def _release_out_of_window(self, request: Request) -> None:
        """Return the blocks wholly before the next query's window (``written - W + 1`` onwards is needed)."""
        first_needed = max(0, request.written - self.window_size + 1) // self.pool.block_size
        for logical in range(first_needed):
            if request.table[logical] >= 0:
                self.pool.give(request.table[logical])
                request.table[logical] = -1

    def _retire(self, request: Request) -> None:
        for logical, block in enumerate(request.table):
            if block >= 0:
                self.pool.give(block)
                request.table[logical] = -1
        self.finished[request.id] = request

    def _table(self, requests: list[Request]) -> torch.Tensor:
        width = max(len(r.table) for r in requests)
        return torch.tensor([r.table + [-1] * (width - len(r.table)) for r in requests], dtype=torch.long,
                            device=self.device)

    # ------------------------------------------------------------------ forwards
    def _pick(self, logits: torch.Tensor, requests: list[Request]) -> None:
        """Append each request's next token from its row of ``logits`` ``(B, vocab)``, as ``generate`` picks."""
        greedy = logits.argmax(dim=-1).tolist()
        for b, r in enumerate(requests):
            if r.temperature == 0:
                r.tokens.append(greedy[b])
            else:
                r.tokens.append(int(self.decoder._pick(logits[b : b + 1], r.temperature, r.top_k, r.generator)))

    def _prefill(self, request: Request) -> None:
        prompt = torch.tensor([request.prompt], dtype=torch.long, device=self.device)
        chunk = self.prefill_chunk or len(request.prompt)
        for s in range(0, len(request.prompt), chunk):
            ids = prompt[:, s : s + chunk]
            self._hold(request, s, s + ids.shape[1])
            logits = self.decoder.step_paged(ids, torch.tensor([s]), self.kv, self._table([request]),
                                             self.window_size)
            request.written = s + ids.shape[1]
            self._release_out_of_window(request)
        self._pick(logits[:, -1], [request])

    def _admit(self) -> list[Request]:
        admitted = []
        while self.waiting and len(self.running) < self.max_running:
            request = self.waiting[0]
            need = self.blocks_needed(len(request.prompt), request.max_new_tokens)
            if self._reserved() + need > self.pool.num_blocks:
                break  # first come, first served: later requests wait behind it
            self.waiting.popleft()
            request.reserved = need
            if request.max_new_tokens == 0:
                self._retire(request)
                continue
            self.running.append(request)
            self._prefill(request)
            admitted.append(request)
        return admitted

    @torch.no_grad()
    def step(self) -> dict:
        """Admit and prefill newcomers, one decode forward over the running requests, retire the finished."""
        t0 = time.perf_counter()
        admitted = self._admit()
        rows = [r for r in self.running if not r.done and r not in admitted]
        if rows:
            for r in rows:
                self._hold(r, r.written, r.written + 1)
            ids = torch.tensor([[r.tokens[-1]] for r in rows], dtype=torch.long, device=self.device)
            start = torch.tensor([r.written for r in rows])
            logits = self.decoder.step_paged(ids, start, self.kv, self._table(rows), self.window_size)
            for r in rows:
                r.written += 1
                self._release_out_of_window(r)
            self._pick(logits[:, -1], rows)
        for r in [r for r in self.running if r.done]:
            self.running.remove(r)
            self._retire(r)
        record = {"step": len(self.trace), "running": len(self.running), "waiting": len(self.waiting),
                  "used_blocks": self.pool.used_blocks, "reserved_blocks": self._reserved(),
                  "prefilled": len(admitted), "decoded": len(rows), "seconds": time.perf_counter() - t0}
        self.trace.append(record)
        return record

    def run(self) -> dict[int, list[int]]:
        """Step until every submitted request is finished; ``{id: prompt + new tokens}``."""
        while self.waiting or self.running:
            before = (len(self.waiting), len(self.running))
            self.step()
            if not self.running and (len(self.waiting), len(self.running)) == before:
                raise RuntimeError("no request could be admitted (this cannot happen: submit checks the pool)")
        return {i: r.output for i, r in sorted(self.finished.items())}


def serve(decoder, requests, num_blocks: int, block_size: int = 16, max_running: int = 16,
          prefill_chunk: int | None = None) -> tuple[dict[int, list[int]], Scheduler]:
    """Serve ``requests`` (dicts of :meth:`Scheduler.submit`'s arguments) to the end; ``(outputs, scheduler)``."""
    scheduler = Scheduler(decoder, num_blocks, block_size, max_running, prefill_chunk)
    for r in requests:
        scheduler.submit(**r)
    return scheduler.run(), scheduler
