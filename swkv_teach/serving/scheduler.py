"""Continuous batching: many requests on one block pool, one decoder forward per step over all of them.

A request is a prompt, a number of new tokens and a way to pick them (greedy, or sampling
with its own seed). The :class:`Scheduler` keeps a queue of waiting requests and a batch of
running ones. It has two ways to fill a step.

**Reserved (``token_budget=None``, lesson 7).** Each :meth:`Scheduler.step`

1. **admits** waiting requests, first come first served, while the batch has room
   (``max_running``) and the pool can promise each its peak number of blocks;
2. **prefills** each newcomer with its own forward (the prompt as one chunk, or in
   chunks of ``prefill_chunk`` tokens), which also picks its first new token;
3. runs **one** :meth:`~swkv_teach.model.Decoder.step_paged` over every running request
   that has a token to feed: row ``b`` at its own position (its own RoPE angles), its keys
   written into its own blocks of the shared pool, attention through its block-table row
   with :func:`~swkv_teach.attention.paged_attention` (when a speculative row verifies drafts,
   the rows differ in length: the varlen forward of the budget mode, below);
4. **retires** finished requests and returns their blocks; blocks that left every
   request's window go back after each forward, so a long request holds at most
   ``ceil((W - 1) / block_size) + 1`` blocks while decoding.

A request is admitted only when the pool can promise its peak (:meth:`Scheduler.blocks_needed`),
so nothing is ever preempted; the price is room promised but not yet used, and running
requests wait a step while a newcomer is prefilled.

**One token budget (``token_budget=N``), as vLLM v1.** vLLM's scheduler has "no decoding
phase nor prefill phase": each step hands out a token budget (``max_num_scheduled_tokens``)
so that each request's ``num_computed_tokens`` catches up with its ``num_tokens`` (the
``NOTE(woosuk)`` comment in ``Scheduler.schedule``, ``vllm/v1/core/sched/scheduler.py`` lines
701-719 of vLLM v0.33.0). Here each step

1. gives every decoding request its one token first, then spends the rest of the budget on
   chunks of partly-read prompts, then on waiting requests (first come first served). vLLM
   walks its running list in order ("First, schedule the RUNNING requests", line 793), then
   the waiting ones (line 1049); putting decode rows first keeps a long prompt from taking a
   running request's token;
2. takes blocks as they are needed. When the pool has none, the **newest** running request is
   preempted: its blocks are freed, its computed tokens forgotten, and it goes back to the front
   of the queue, to be recomputed later (prompt and the tokens it already produced, as one
   prefill): vLLM's ``preempted_req = self.running.pop()`` (line 970) and ``_preempt_request``
   (``num_computed_tokens = 0``, ``waiting.prepend_request``: lines 1799-1842). As there, no
   waiting request is admitted in a step that preempted (``if not preempted_reqs``, line 1050);
3. runs **one** forward over all of it, rows of different lengths packed as FlashAttention's
   varlen layout (:func:`~swkv_teach.serving.forward.step_varlen`), logits only where a token
   is picked, each row whose chunk reaches its last token (vLLM's ``logits_indices =
   query_start_loc[1:] - 1``, ``vllm/v1/worker/gpu_model_runner.py`` line 2195).

A preempted request keeps its tokens and its sampling generator, so its output equals
generating it alone, greedy or sampled.

**Prefix caching (``prefix_caching=True``, either mode).** Full blocks are named by a hash
chain and kept after use in an LRU free queue (:mod:`swkv_teach.caches.prefix`). A request
read from the queue (a newcomer, or a preempted one) first looks its blocks up
(:func:`~swkv_teach.caches.prefix.find_longest_cache_hit`, vLLM's sliding-window rule: only
the blocks holding the ``W - 1`` positions before the first computed token are held), then,
with a ``store``, asks the store for the next blocks in its chain, copying each hit into a
fresh block, and computes only the rest; at least its last token is always computed (its
logits pick the next token; ``max_cache_hit_length = request.num_tokens - 1``,
``vllm/v1/core/kv_cache_manager.py`` line 302). Every block that fills up is cached; blocks
evicted from the cache are written to the store. :meth:`Scheduler.stats` counts it all, hits
as vLLM's ``PrefixCacheStats`` (``vllm/v1/metrics/stats.py`` line 121: ``queries`` are tokens
looked up, ``hits`` the tokens a hit covers, skipped sliding-window positions included).

A block is cached only after the forward that computes its keys. In the reserved mode each
newcomer has its own prefill forward, so the next one admitted finds its blocks; with a
``token_budget``, requests admitted in the same step share one forward, so none of them hits
another's blocks, not even an identical prompt's (four copies of a 205-token prompt: 576 prompt
tokens hit in the reserved mode, 0 with ``token_budget=1024``; lesson 12, section 4). vLLM
differs: it caches a block when it is scheduled (``KVCacheManager.allocate_slots`` ends with
``cache_blocks(request, num_tokens_to_cache)``, ``num_tokens_to_cache = min(total_computed_tokens
+ num_new_tokens, request.num_tokens)``, ``vllm/v1/core/kv_cache_manager.py`` lines 616-625 of
v0.33.0, called for each waiting request in turn, ``scheduler.py`` line 1435), so a duplicate
scheduled later in the same step hits it.

**Speculative rows (``submit(..., speculative=PromptLookup(k))``, either mode).** A speculative
request decodes by verifying: each step it drafts up to ``k`` tokens by prompt lookup
(:mod:`swkv_teach.speculative`) and feeds ``[pending, d1 .. dm]`` as one row of ``m + 1`` tokens in the
same forward as every other row, with logits at all ``m + 1`` positions; it keeps the ``a`` drafts the
target agrees with (greedy: the same tokens as plain decoding; sampled: the exact accept/reject
rule, the same distribution) and one more token, the correction or the bonus. Its keys at positions
``n .. n + m`` are written before anyone knows which are kept: their blocks are taken from the pool
before the forward (and, with a budget, their ``m + 1`` tokens from the budget); ``written`` then
moves to ``n + a + 1``, and every block that holds only rejected positions goes
straight back to the pool. A rejected key left in a kept block is never read (no query looks past
its own position) and the next forward overwrites it. Only blocks full of accepted tokens are hashed
for the prefix cache. In the reserved mode the promise covers the ``k`` extra positions
(:meth:`Scheduler.blocks_needed` with ``lookahead=k``). With a budget, drafts are a bonus: once every
running row has its token or chunk, speculative rows draft into the budget and the free blocks left,
before any waiting request is admitted; a draft never preempts anyone (where the pool is short, the
row drafts fewer). A preempted speculative row forgets its drafts and recomputes as any other.

This is how vLLM v1 does it (v0.34.0, the PyPI sdist). A request's drafts are part of the tokens it
is scheduled for (``num_new_tokens = num_tokens_with_spec + num_output_placeholders -
num_computed_tokens``, cut to the token budget, and the drafts cut with it:
``spec_token_ids[:num_scheduled_spec_tokens]``; ``vllm/v1/core/sched/scheduler.py`` lines 855-864 and
1026-1037), so ``allocate_slots`` takes blocks for them; its separate ``num_lookahead_tokens``
(``vllm/v1/core/kv_cache_manager.py`` lines 407, 571-574) is for drafters that write keys of their
own, such as EAGLE, and is 0 for n-gram drafting (``SpeculatorConfig.num_lookahead_tokens``,
``vllm/v1/worker/gpu/spec_decode/speculator_config.py`` line 111). Blocks are cached only up to
``request.num_tokens``, "ensuring only finalized tokens are cached", never drafts (``kv_cache_manager.py``
lines 637-646). A row with ``m`` drafts gets ``m + 1`` logits, at the last ``m + 1`` positions of its
query (``cu_num_logits``, ``vllm/v1/worker/gpu/model_runner.py`` lines 1497-1511;
``logits_start = query_end - num_logits`` in ``_combine_sampled_and_draft_tokens_kernel``,
``vllm/v1/worker/gpu/input_batch.py`` lines 438-444); greedy verification accepts "IFF draft matches
target argmax" (``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py`` line 618). After the
step, ``num_computed_tokens -= num_rejected`` (``scheduler.py`` lines 2398-2408) and a preemption drops
the drafts (``spec_token_ids = []``, line 1878). Two differences. vLLM schedules a running
request's drafts with its token, in the running list's order, so a row's drafts may take the budget
or the blocks of a running row after it (which is then preempted); here drafts come after every
running row. And vLLM
keeps the blocks taken for rejected drafts ("num_required_blocks may be smaller than num_req_blocks",
``vllm/v1/core/single_type_kv_cache_manager.py`` lines 238-241) for the next step to fill; here they
go back at once, so a request never holds a block with no accepted key.

Window convention: :mod:`swkv_teach.masks`.
"""

from __future__ import annotations

import copy
import time
from collections import deque

import torch

from swkv_teach._validate import check_nonnegative_int, check_positive_int
from swkv_teach.caches.pool import blocks_spanned
from swkv_teach.caches.prefix import find_longest_cache_hit, hash_block_tokens
from swkv_teach.serving.forward import step_varlen
from swkv_teach.serving.requests import Request, ServingBlocks
from swkv_teach.speculative import PromptLookup, SpeculativeStats, accept

__all__ = ["Request", "Scheduler", "ServingBlocks", "serve"]


class Scheduler:
    """Serve requests on ``decoder`` with continuous batching over a pool of ``num_blocks`` blocks.

    Args:
        decoder: a :class:`~swkv_teach.model.Decoder` (e.g. ``load_pretrained()[0]``).
        num_blocks, block_size: the pool (``block_size`` tokens per block; vLLM's default is 16).
        max_running: most requests in one forward.
        prefill_chunk: most prompt tokens one request computes per forward (None: no limit but the budget).
        window_size: ``W`` (default the decoder's).
        token_budget: tokens per step, decode and prefill together, in one forward (vLLM's
            ``max_num_batched_tokens``); None: the reserved mode (prefills in their own forwards).
        prefix_caching: keep full blocks after use and reuse them by hash.
        store: a block store (:mod:`swkv_teach.store`) behind the cache; needs ``prefix_caching``.

    ``trace`` gets one dict per :meth:`step`: ``step``, ``running``, ``waiting``,
    ``used_blocks`` (held now), ``reserved_blocks`` (promised; 0 with a token budget),
    ``prefilled`` (requests that computed prompt tokens this step), ``decoded`` (decoding rows),
    ``prefill_tokens``, ``decode_tokens`` (drafts verified included), ``preempted`` (requests preempted
    this step), ``drafted`` and ``accepted`` (speculative rows' drafts verified and kept), ``seconds``.
    """

    def __init__(self, decoder, num_blocks: int, block_size: int = 16, max_running: int = 16,
                 prefill_chunk: int | None = None, window_size: int | None = None, *,
                 token_budget: int | None = None, prefix_caching: bool = False, store=None):
        self.decoder = decoder
        self.pool = ServingBlocks(num_blocks, block_size)
        self.max_running = check_positive_int("max_running", max_running)
        self.prefill_chunk = None if prefill_chunk is None else check_positive_int("prefill_chunk", prefill_chunk)
        self.token_budget = None if token_budget is None else check_positive_int("token_budget", token_budget)
        if not isinstance(prefix_caching, bool):
            raise TypeError(f"prefix_caching must be True or False; got {prefix_caching!r}")
        self.prefix_caching = prefix_caching
        c = decoder.config
        self.window_size = c.window_size if window_size is None else check_positive_int("window_size", window_size)
        if store is not None:
            if not prefix_caching:
                raise ValueError("store needs prefix_caching=True: blocks reach the store when the prefix cache "
                                 "evicts them, and come back by their hashes")
            if self.window_size != c.window_size:
                raise ValueError(f"store needs the decoder's own window ({c.window_size}); got window_size="
                                 f"{self.window_size}: keys computed under another window would be filed under the "
                                 f"same model fingerprint")
        self.store = store
        p = next(decoder.parameters())
        shape = (num_blocks, block_size, c.n_kv_heads, c.head_dim)
        self.kv = [(torch.zeros(shape, dtype=p.dtype, device=p.device), torch.zeros(shape, dtype=p.dtype,
                                                                                       device=p.device))
                   for _ in decoder.layers]
        self.device = p.device
        self.layout = None
        if store is not None:
            from swkv_teach.store import block_layout

            self.layout = block_layout(decoder, block_size, p.dtype)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: dict[int, Request] = {}
        self.trace: list[dict] = []
        self._ids = 0
        self._stats = dict.fromkeys(("prefix_query_tokens", "prefix_hit_tokens", "prefill_tokens_computed",
                                     "preemptions", "store_hit_blocks", "store_put_blocks", "spec_rounds",
                                     "spec_drafted", "spec_accepted", "spec_examined"), 0)

    # ------------------------------------------------------------------ requests
    def blocks_needed(self, prompt_len: int, max_new_tokens: int, lookahead: int = 0) -> int:
        """The most blocks a request holds at once (what admission promises it in the reserved mode).

        Its keys are written at positions ``0 .. prompt_len + max_new_tokens - 2`` (the last
        new token is never fed back; a verify never drafts past that). A forward of ``c`` tokens
        at position ``n`` needs keys ``n - W + 1 .. n + c - 1``: ``W + c - 1`` consecutive
        positions, spread over at most ``ceil((W + c - 2) / block_size) + 1`` blocks, and never
        more blocks than the positions ever written fill. A speculative row with ``lookahead=k``
        verifies ``c = k + 1`` tokens: ``k`` positions more than a plain decode's ``W``. With a
        token budget ``c`` is at most the budget (drafts included), and a preempted request
        recomputes its prompt and new tokens as one prefill.
        """
        check_nonnegative_int("lookahead", lookahead)
        if max_new_tokens == 0:
            return 0
        bs, W = self.pool.block_size, self.window_size
        written = prompt_len + max_new_tokens - 1
        if self.token_budget is None:
            chunk = prompt_len if self.prefill_chunk is None else min(self.prefill_chunk, prompt_len)
            chunk = max(chunk, 1 + lookahead)
        else:
            chunk = min(self.token_budget, self.prefill_chunk or written, written)
        span = min(written, W + chunk - 1)
        return min(-(-written // bs), blocks_spanned(span, bs))

    def submit(self, prompt, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
               seed: int | None = None, speculative: PromptLookup | None = None) -> int:
        """Queue a request; returns its id. ``prompt``: token ids (list or 1-D long tensor).

        ``speculative``: a :class:`~swkv_teach.speculative.PromptLookup` makes it a speculative row
        (the module docstring): up to ``k`` drafts verified per step, greedy or sampled (the exact
        accept/reject rule). The request drafts with its own copy, so one drafter may serve many.
        """
        ids = prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
        self.decoder._check_ids("prompt", torch.tensor([ids], dtype=torch.long))
        check_nonnegative_int("max_new_tokens", max_new_tokens)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"temperature must be a number >= 0 (0 = greedy); got {temperature!r}")
        if top_k is not None:
            check_positive_int("top_k", top_k)
        drafter = self._own_drafter(speculative)
        lookahead = 0 if drafter is None else drafter.k
        need = self.blocks_needed(len(ids), max_new_tokens, lookahead)
        if need > self.pool.num_blocks:
            chunk = (f"token budget {self.token_budget}" if self.token_budget else
                     f"prefill chunks of {self.prefill_chunk or len(ids)} tokens"
                     + (f", verifies of {lookahead + 1}" if lookahead else ""))
            raise ValueError(
                f"this request can never fit the pool: a prompt of {len(ids)} tokens and {max_new_tokens} new "
                f"tokens with window {self.window_size} and {chunk} hold up to {need} blocks of "
                f"{self.pool.block_size} tokens at once, but the pool has {self.pool.num_blocks}; build a larger pool"
                + ("" if self.prefill_chunk else " or pass a smaller prefill_chunk")
            )
        request = Request(ids, max_new_tokens, temperature, top_k, seed, id=self._ids, drafter=drafter,
                          spec=None if drafter is None else SpeculativeStats())
        if drafter is not None:
            drafter.begin(self.decoder, ids)
        if seed is not None:
            request.generator = torch.Generator(device=self.device).manual_seed(check_nonnegative_int("seed", seed))
        self._ids += 1
        self.waiting.append(request)
        return request.id

    @staticmethod
    def _own_drafter(speculative) -> PromptLookup | None:
        """A copy of ``speculative`` for one request (checked first: nothing changes on a refusal)."""
        if speculative is None:
            return None
        if not isinstance(speculative, PromptLookup):
            raise ValueError(
                f"speculative must be a PromptLookup(k) (drafts copied from the request's own tokens) or None; got "
                f"{type(speculative).__name__}: a draft model (DraftModel, early_exit) keeps a ring of its own per "
                f"sequence, beside the pool, which a scheduler row does not carry")
        check_positive_int("speculative.k", speculative.k)
        return copy.deepcopy(speculative)  # a drafter may keep state per sequence: never share one between rows

    def stats(self) -> dict:
        """Counters of the run so far (with a store, its ``stats()`` merged in).

        ``prefix_query_tokens``: tokens of requests read from the queue (a preempted request counts
        again); ``prefix_hit_tokens``: of those, tokens not computed because their blocks were cached
        (the skipped early positions of a sliding-window hit included, as vLLM's ``PrefixCacheStats``
        counts hits); ``prefill_tokens_computed``: the rest, computed (hits + computed = queried: a
        request preempted in the middle of its prefill takes back the part it never computed);
        ``cached_blocks_evicted``; ``preemptions``; ``store_hit_blocks`` (copied from the store),
        ``store_put_blocks`` (written to it). Speculative rows, as
        :class:`~swkv_teach.speculative.SpeculativeStats` counts them (each request's own are in its
        ``spec``): ``spec_rounds`` (verifies), ``spec_drafted``, ``spec_accepted``, ``spec_examined``
        (accepted plus the rejections that ended a round: ``spec_accepted / spec_examined`` is the
        acceptance rate ``α``).
        """
        out = {**self._stats, "cached_blocks_evicted": self.pool.evictions, "cached_blocks": self.pool.cached_blocks}
        if self.store is not None:
            out.update(self.store.stats())
        return out

    # ------------------------------------------------------------------ blocks
    def _reserved(self) -> int:
        return sum(r.reserved for r in self.running)

    def _allocate(self) -> int:
        block = self.pool.allocate()
        for h, b in self.pool.pop_evicted():  # its keys are still there: write them out before they go
            if self.store is not None:
                keys = torch.stack([k[b] for k, _ in self.kv])  # (num_layers, block_size, n_kv_heads, head_dim)
                values = torch.stack([v[b] for _, v in self.kv])
                self.store.put_block(h, self.layout, keys, values)
                self._stats["store_put_blocks"] += 1
        return block

    def _short(self, request: Request, n: int) -> bool:
        """Whether the pool lacks blocks for ``request``'s next ``n`` positions (counted only when it might)."""
        bs, lo, free = self.pool.block_size, request.written, self.pool.free_blocks
        if blocks_spanned(n, bs) <= free:  # n positions touch at most this many blocks: enough either way
            return False
        table = request.table
        return sum(i >= len(table) or table[i] < 0 for i in range(lo // bs, (lo + n - 1) // bs + 1)) > free

    def _hold(self, request: Request, lo: int, hi: int) -> None:
        """Make sure ``request`` holds the blocks of positions ``lo .. hi - 1``."""
        bs = self.pool.block_size
        for logical in range(lo // bs, (hi - 1) // bs + 1):
            while len(request.table) <= logical:
                request.table.append(-1)
            if request.table[logical] < 0:
                request.table[logical] = self._allocate()

    def _cache_full_blocks(self, request: Request) -> None:
        """Name every block ``request`` has filled by its hash (vLLM's ``cache_full_blocks``)."""
        bs, tokens = self.pool.block_size, None
        for i in range(request.cached, request.written // bs):
            if i >= len(request.hashes):
                tokens = request.output if tokens is None else tokens
                parent = request.hashes[i - 1] if i else None
                request.hashes.append(hash_block_tokens(parent, tokens[i * bs : (i + 1) * bs]))
            if request.table[i] >= 0:
                self.pool.cache(request.table[i], request.hashes[i])
        request.cached = max(request.cached, request.written // bs)

    def _release_out_of_window(self, request: Request) -> None:
        """Return the blocks wholly before the next query's window (``written - W + 1`` onwards is needed)."""
        first_needed = max(0, request.written - self.window_size + 1) // self.pool.block_size
        gone = [b for b in request.table[:first_needed] if b >= 0]
        request.table[:first_needed] = [-1] * min(first_needed, len(request.table))
        self._give(gone)

    def _drop_rejected(self, request: Request) -> None:
        """Return the blocks that hold only rejected drafts' keys (every position ``>= written``).

        A rejected key in a kept block (the one holding ``written - 1``) needs no care: no query reads
        past its own position, and the next forward writes its token at ``written`` over it.
        """
        keep = -(-request.written // self.pool.block_size)  # blocks holding some position < written
        self._give([b for b in request.table[keep:] if b >= 0])
        del request.table[keep:]

    def _give(self, blocks: list[int]) -> None:
        """Drop one hold on each of ``blocks`` (a request's, in its order): with prefix caching the last first,
        as vLLM (a request's tail is its least shared part, so it should be evicted first); without, in
        order, so block numbers come and go as lesson 7 shows them."""
        if self.prefix_caching:
            self.pool.release(blocks)
        else:
            for b in blocks:
                self.pool.release([b])

    def _free_all(self, request: Request) -> None:
        self._give([b for b in request.table if b >= 0])
        request.table = []

    def _retire(self, request: Request) -> None:
        self._free_all(request)
        self.finished[request.id] = request

    def _preempt(self, request: Request) -> None:
        """Free every block of ``request`` and queue it first again, to be recomputed (vLLM's ``_preempt_request``)."""
        self._free_all(request)
        if request.written < request.prefill_end:  # its prefill's unread part was never computed: un-query it
            self._stats["prefix_query_tokens"] -= request.prefill_end - request.written
        request.written = request.cached = 0
        request.drafts = []  # as vLLM's _preempt_request (spec_token_ids = []): drafted again after the recompute
        request.preemptions += 1
        self.running.remove(request)
        self.waiting.appendleft(request)
        self._stats["preemptions"] += 1

    def _read_prefix(self, request: Request) -> None:
        """A request read from the queue: hold its cached blocks (pool, then store) and skip their tokens."""
        n, bs = request.num_tokens, self.pool.block_size
        request.prefill_end = n
        self._stats["prefix_query_tokens"] += n
        if not self.prefix_caching:
            return
        tokens = request.output
        limit = (n - 1) // bs  # blocks a hit may cover: the last token is always computed (its logits pick)
        while len(request.hashes) < limit:
            i = len(request.hashes)
            request.hashes.append(hash_block_tokens(request.hashes[-1] if i else None, tokens[i * bs : (i + 1) * bs]))
        hashes = request.hashes[:limit]
        hit = find_longest_cache_hit(self.pool, hashes, bs, self.window_size)
        self.pool.acquire([b for b in hit if b is not None])
        request.table = [-1 if b is None else b for b in hit]
        while len(request.table) < len(hashes):  # the chain continues in the pool, or in the store
            h = hashes[len(request.table)]
            block = self.pool.get(h)
            if block is not None:
                self.pool.acquire([block])
            elif self.store is None or self.pool.free_blocks == 0 or (block := self._fetch(h)) is None:
                break
            request.table.append(block)
            request.written = len(request.table) * bs
            self._release_out_of_window(request)  # so the chain never holds more than a window's blocks
        request.cached = len(request.table)
        request.written = request.cached * bs
        self._release_out_of_window(request)
        self._stats["prefix_hit_tokens"] += request.written

    def _fetch(self, block_hash: bytes) -> int | None:
        """Copy a block from the store into a fresh pool block (cached, held once); None on a miss."""
        got = self.store.get_block(block_hash, self.layout)
        if got is None:
            return None
        keys, values = got
        shape = (len(self.kv), *self.kv[0][0].shape[1:])
        if tuple(keys.shape) != shape or tuple(values.shape) != shape:
            return None  # a store that hands back the wrong shape is a miss, never used
        block = self._allocate()
        for layer, (k, v) in enumerate(self.kv):
            k[block].copy_(keys[layer])
            v[block].copy_(values[layer])
        self.pool.cache(block, block_hash)
        self._stats["store_hit_blocks"] += 1
        return block

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

    def _after_forward(self, request: Request, n: int) -> None:
        request.written += n
        if self.prefix_caching:
            self._cache_full_blocks(request)
        self._release_out_of_window(request)

    def _prefill(self, request: Request) -> None:
        prompt = torch.tensor([request.prompt], dtype=torch.long, device=self.device)
        chunk = self.prefill_chunk or len(request.prompt)
        for s in range(request.written, len(request.prompt), chunk):
            ids = prompt[:, s : s + chunk]
            self._hold(request, s, s + ids.shape[1])
            logits = self.decoder.step_paged(ids, torch.tensor([s]), self.kv, self._table([request]),
                                             self.window_size)
            self._stats["prefill_tokens_computed"] += ids.shape[1]
            self._after_forward(request, ids.shape[1])
        self._pick(logits[:, -1], [request])

    def _admit(self) -> list[Request]:
        admitted = []
        while self.waiting and len(self.running) < self.max_running:
            request = self.waiting[0]
            need = self.blocks_needed(len(request.prompt), request.max_new_tokens, request.lookahead)
            if self._reserved() + need > self.pool.num_blocks:
                break  # first come, first served: later requests wait behind it
            self.waiting.popleft()
            request.reserved = need
            if request.max_new_tokens == 0:
                self._retire(request)
                continue
            self.running.append(request)
            self._read_prefix(request)
            self._prefill(request)
            admitted.append(request)
        return admitted

    def _draft(self, request: Request, room: int | None = None) -> None:
        """Schedule up to ``room`` drafts (None: no bound but ``k``) for a decoding ``request``; none for a plain row.

        Never more than ``k``, and never past ``max_new_tokens``: a verify of ``m`` drafts emits up to
        ``m + 1`` tokens (the accepted ones and the correction or bonus), as ``speculative_generate``.
        """
        if request.drafter is None:
            return
        m = min(request.drafter.k, request.max_new_tokens - len(request.tokens) - 1)
        m = m if room is None else min(m, room)
        request.drafts = list(request.drafter.propose(request.output, m)[0]) if m > 0 else []

    def _draft_within(self, request: Request, room: int, scheduled: dict) -> int:
        """Add drafts to a scheduled decoding row, within ``room`` tokens and the pool's free blocks; how many.

        Drafts are a bonus: they take the budget and blocks the running rows left (before any newcomer, as
        vLLM schedules a running request's drafts before its waiting queue), and never preempt anyone.
        """
        self._draft(request, room)
        while request.drafts and self._short(request, 1 + len(request.drafts)):
            request.drafts.pop()
        self._hold(request, request.written, request.written + 1 + len(request.drafts))
        scheduled[request.id] = (request, 1 + len(request.drafts))
        return len(request.drafts)

    def _forward(self, rows: list[tuple[Request, int]]) -> dict:
        """ONE decoder forward over ``rows`` ``(request, tokens fed)``; every row that reaches its last token picks.

        A row feeds ``output[written : written + n]``, a speculative decoding row ``[pending, *drafts]``
        (``n = 1 + m``). Logits are computed where a token is chosen: a row's last position, and each of a
        verifying row's ``m + 1`` (vLLM's ``logits_indices``, ``m + 1`` of them for a row with ``m`` drafts).
        Returns the step's ``drafted`` and ``accepted`` counts.
        """
        requests = [r for r, _ in rows]
        table, start = self._table(requests), torch.tensor([r.written for r in requests])
        if all(n == 1 and r.tokens and r.written + 1 == r.num_tokens for r, n in rows):
            # every row decodes one token: the varlen forward with all query lengths 1 is step_paged's (B, 1) batch
            # (step_varlen would take the same path, after building what it needs to find that out)
            ids = torch.tensor([[r.tokens[-1]] for r in requests], dtype=torch.long, device=self.device)
            logits = self.decoder.step_paged(ids, start, self.kv, table, self.window_size)[:, -1]  # (B, vocab)
            first = {r.id: b for b, r in enumerate(requests)}
        else:
            ids, cu, pick_at, first = [], [0], [], {}
            for r, n in rows:
                m = len(r.drafts)
                ids.extend(r.output[r.written : r.written + n - m] + r.drafts)
                cu.append(cu[-1] + n)
                if r.written + n - m == r.num_tokens:  # its chunk reaches its last token: it chooses
                    first[r.id] = len(pick_at)
                    pick_at.extend(range(cu[-1] - 1 - m, cu[-1]))
            logits = step_varlen(self.decoder, torch.tensor(ids, dtype=torch.long, device=self.device),
                                 torch.tensor(cu, dtype=torch.int32), start, self.kv, table, self.window_size,
                                 torch.tensor(pick_at, dtype=torch.long, device=self.device))
        counts, picking = {"drafted": 0, "accepted": 0}, []
        for r, n in rows:
            if r.id in first and r.drafter is not None and r.written >= r.prefill_end:  # a speculative decoding row
                self._verified(r, logits[first[r.id] : first[r.id] + 1 + len(r.drafts)], counts)
                continue
            self._after_forward(r, n)
            if r.id in first:
                picking.append(r)
        if picking:
            self._pick(logits[[first[r.id] for r in picking]], picking)
        return counts

    def _verified(self, request: Request, logits: torch.Tensor, counts: dict) -> None:
        """Keep what the target accepts of ``request``'s drafts (``logits`` ``(m + 1, vocab)``), give the rest back.

        The keys of ``pending`` and of the ``a`` accepted drafts stay (``written`` moves ``a + 1``); blocks
        now holding only rejected keys return to the pool. With prefix caching only blocks full of
        accepted tokens are hashed (``_after_forward`` hashes below ``written``, never a draft's block).
        """
        drafts, r = request.drafts, request
        a, token = accept(logits, drafts, None, r.temperature, r.top_k, r.generator)
        if drafts:
            r.drafter.accepted(a)
        examined = a + (a < len(drafts))
        for key, value in (("rounds", 1), ("drafted", len(drafts)), ("accepted", a), ("examined", examined)):
            setattr(r.spec, key, getattr(r.spec, key) + value)
            self._stats[f"spec_{key}"] += value
        counts["drafted"] += len(drafts)
        counts["accepted"] += a
        r.tokens += drafts[:a] + [token]
        r.drafts = []
        self._after_forward(r, 1 + a)
        self._drop_rejected(r)

    def _step_reserved(self) -> dict:
        admitted = self._admit()
        rows = [r for r in self.running if not r.done and r not in admitted]
        counts = {"drafted": 0, "accepted": 0}
        for r in rows:
            self._draft(r)  # the promise covers k more positions (blocks_needed): no other bound
            self._hold(r, r.written, r.written + 1 + len(r.drafts))
        fed = [(r, 1 + len(r.drafts)) for r in rows]
        if rows:
            counts = self._forward(fed)
        return {"prefilled": len(admitted), "decoded": len(rows), "preempted": 0,
                "decode_tokens": sum(n for _, n in fed), **counts}

    def _step_budget(self) -> dict:
        budget, chunk_cap = self.token_budget, self.prefill_chunk or self.token_budget
        scheduled: dict[int, tuple[Request, int]] = {}  # id -> (request, tokens), in scheduling order
        preempted = 0
        decoding = [r for r in self.running if r.written >= r.prefill_end]
        for r in decoding + [r for r in self.running if r.written < r.prefill_end]:
            if budget == 0 or r not in self.running:
                continue
            n = min(r.num_tokens - r.written, budget, chunk_cap)
            while self._short(r, n):
                victim = self.running[-1]  # the newest: first come, first served
                if victim.id in scheduled:
                    budget += scheduled.pop(victim.id)[1]  # its blocks go back in _preempt
                self._preempt(victim)
                preempted += 1
                if victim is r:
                    break
            else:
                self._hold(r, r.written, r.written + n)
                scheduled[r.id] = (r, n)
                budget -= n
        for r, _ in list(scheduled.values()):
            if r.drafter is not None and r.written >= r.prefill_end and budget > 0:
                budget -= self._draft_within(r, min(budget, chunk_cap - 1), scheduled)
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.max_running:
            r = self.waiting[0]
            if r.max_new_tokens == 0:
                self.waiting.popleft()
                self._retire(r)
                continue
            self._read_prefix(r)
            n = min(r.num_tokens - r.written, budget, chunk_cap)
            if self._short(r, n):
                self._free_all(r)  # not this step: back to the queue, its hits counted again when read
                self._stats["prefix_query_tokens"] -= r.num_tokens
                self._stats["prefix_hit_tokens"] -= r.written
                r.written = r.cached = 0
                break
            self.waiting.popleft()
            self.running.append(r)
            self._hold(r, r.written, r.written + n)
            scheduled[r.id] = (r, n)
            budget -= n
        rows = list(scheduled.values())
        stats = {"prefilled": 0, "decoded": 0, "preempted": preempted, "decode_tokens": 0, "prefill_tokens": 0,
                 "drafted": 0, "accepted": 0}
        if not rows:
            return stats
        for r, n in rows:
            decoding = r.written >= r.prefill_end
            stats["decode_tokens" if decoding else "prefill_tokens"] += n
            stats["decoded" if decoding else "prefilled"] += 1
            if not decoding:
                self._stats["prefill_tokens_computed"] += n
        stats.update(self._forward(rows))
        return stats

    @torch.no_grad()
    def step(self) -> dict:
        """One scheduler step (see the module docstring for the two modes); returns its ``trace`` record."""
        t0 = time.perf_counter()
        if self.token_budget is None:
            before = self._stats["prefill_tokens_computed"]
            counts = self._step_reserved()
            counts["prefill_tokens"] = self._stats["prefill_tokens_computed"] - before
        else:
            counts = self._step_budget()
        for r in [r for r in self.running if r.done]:
            self.running.remove(r)
            self._retire(r)
        record = {"step": len(self.trace), "running": len(self.running), "waiting": len(self.waiting),
                  "used_blocks": self.pool.used_blocks, "reserved_blocks": self._reserved() if
                  self.token_budget is None else 0, **counts, "seconds": time.perf_counter() - t0}
        self.trace.append(record)
        return record

    def run(self) -> dict[int, list[int]]:
        """Step until every submitted request is finished; ``{id: prompt + new tokens}``."""
        while self.waiting or self.running:
            before = (len(self.waiting), len(self.running), len(self.finished))
            self.step()
            if not self.running and (len(self.waiting), len(self.running), len(self.finished)) == before:
                raise RuntimeError("no request could be admitted (this cannot happen: submit checks the pool)")
        return {i: r.output for i, r in sorted(self.finished.items())}


def serve(decoder, requests, num_blocks: int, block_size: int = 16, max_running: int = 16,
          prefill_chunk: int | None = None, **kwargs) -> tuple[dict[int, list[int]], Scheduler]:
    """Serve ``requests`` (dicts of :meth:`Scheduler.submit`'s arguments) to the end; ``(outputs, scheduler)``.

    ``kwargs``: :class:`Scheduler`'s keyword arguments (``token_budget``, ``prefix_caching``, ``store``, ...).
    """
    scheduler = Scheduler(decoder, num_blocks, block_size, max_running, prefill_chunk, **kwargs)
    for r in requests:
        scheduler.submit(**r)
    return scheduler.run(), scheduler
