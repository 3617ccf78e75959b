"""transformers' continuous batching behind the course's scheduler verbs, counted (:mod:`.hf_batching`).

:class:`HFServer` wraps ``ContinuousBatchingManager`` (``generation/continuous_batching/continuous_api.py``) so
that :func:`~swkv_teach.serving.serve_chat` drives it as it drives a :class:`~swkv_teach.serving.Scheduler`.
transformers keeps no count of the tokens it computes (5.15, 5.25), so this file counts them: a pre-hook on the
model's forward (query tokens, threads, the dense mask's size), ``PagedAttentionCache.search_prefix_match``
wrapped (the prefix hits), and the batch processor's ``prepare_next_batch`` / ``update_batch`` timed.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from swkv_teach.bench.measure import ForwardClock
from swkv_teach.bench.serving import TOKEN_BUDGET

__all__ = ["HFServer"]


class HFServer:
    """transformers' ``ContinuousBatchingManager`` behind the two verbs :func:`~swkv_teach.serving.serve_chat`
    calls on a :class:`~swkv_teach.serving.Scheduler`: ``submit`` (queued here) and ``run`` (hands the queue to the
    manager's thread and waits for every reply; ``{id: prompt + new tokens}``).

    The manager is started (cache allocated, thread running) here, before any clock, and kept across runs, so
    with block sharing a later turn may find an earlier turn's blocks. ``close()`` stops it.

    Args:
        model: a ``MistralForCausalLM`` (:func:`swkv_teach.hf.to_hf`), attention ``"sdpa"`` or ``"paged|eager"``.
        block_sharing: ``ContinuousBatchingConfig.allow_block_sharing`` (asked for; :meth:`stats` says whether
            transformers used it).
        block_size, num_blocks, max_batch_tokens, max_running: its ``page_size`` (``block_size`` in 5.15),
            ``num_blocks``, ``max_batch_tokens`` (the token budget of a forward), ``max_requests_per_batch``.
        max_new_tokens: the generation config's default (each request passes its own).
        threads: torch's intra-op threads in HF's forwards (None: as found).
        timeout_s: how long :meth:`run` waits for the replies before it raises.
    """

    def __init__(self, model, block_sharing: bool, block_size: int = 16, num_blocks: int = 256,
                 max_batch_tokens: int = TOKEN_BUDGET, max_running: int = 16, max_new_tokens: int = 24,
                 threads: int | None = 1, timeout_s: float = 600.0):
        import transformers

        fields = {f.name for f in dataclasses.fields(transformers.ContinuousBatchingConfig)}
        size = "page_size" if "page_size" in fields else "block_size"  # renamed in 5.17
        cb = transformers.ContinuousBatchingConfig(**{size: block_size}, num_blocks=num_blocks,
                                                   max_batch_tokens=max_batch_tokens,
                                                   max_requests_per_batch=max_running,
                                                   allow_block_sharing=block_sharing)
        generation = transformers.GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=-1,
                                                   pad_token_id=None, bos_token_id=None)
        self.model, self.timeout_s, self.threads = model, timeout_s, threads
        self.manager = model.init_continuous_batching(generation_config=generation, continuous_batching_config=cb)
        self.manager.warmup()  # builds the batch processor (cache, scheduler) here, outside the clock
        cache = self.manager.batch_processor.cache
        self.block_sharing = bool(cache.use_prefix_sharing)  # what HF did with the request (module docstring)
        self.hits = 0
        search = cache.search_prefix_match

        def counted(request_id, prompt_ids):
            found = search(request_id, prompt_ids)
            self.hits += found
            return found

        cache.search_prefix_match = counted
        self.prepare_s = 0.0
        processor = self.manager.batch_processor
        for verb in ("prepare_next_batch", "update_batch"):  # HF's scheduling and batch building, per forward
            setattr(processor, verb, self._timed(getattr(processor, verb)))
        self.clock = ForwardClock().watch(model.model.embed_tokens, model.lm_head)
        self.default_threads = set()
        self._hook = model.register_forward_pre_hook(self._before_forward, with_kwargs=True)
        self.manager.start()
        self._queue, self._ids, self.finished = [], 0, {}
        self.decode_feeds = 0

    def _timed(self, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.prepare_s += time.perf_counter() - t0

        return timed

    def _before_forward(self, module, args, kwargs):
        # HF runs its forwards in a thread of its own: record the thread count it found (torch carries the
        # caller's set_num_threads into new threads) and pin it, so both servers run on the same threads
        self.default_threads.add(torch.get_num_threads())
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        mask = kwargs.get("attention_mask")
        if isinstance(mask, dict):
            mask = next(iter(mask.values()))
        if mask is None:
            return
        cu_k = kwargs["cu_seq_lens_k"]
        cu_k = next(iter(cu_k.values())) if isinstance(cu_k, dict) else cu_k
        q, k = kwargs["cu_seq_lens_q"].diff().tolist(), cu_k.diff().tolist()
        self.clock.scores_dense += mask.shape[-2] * mask.shape[-1]
        self.clock.scores_rows += sum(a * b for a, b in zip(q, k))

    def submit(self, prompt, max_new_tokens: int) -> int:
        ids = prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
        self._queue.append((self._ids, ids, max_new_tokens))
        self._ids += 1
        return self._ids - 1

    def run(self) -> dict[int, list[int]]:
        names = {}
        for i, ids, n in self._queue:
            names[self.manager.add_request(ids, request_id=f"r{i}", max_new_tokens=n)] = (i, ids)
            self.decode_feeds += max(n - 1, 0)  # every new token after the first is fed back once
        self._queue = []
        deadline = time.monotonic() + self.timeout_s
        while names:
            result = self.manager.get_result(timeout=1)
            if result is None:
                if not self.manager.is_running() or time.monotonic() > deadline:
                    status = self.manager.background_thread_status
                    raise RuntimeError(f"HF continuous batching stopped with {len(names)} requests unanswered "
                                       f"(fatal error: {getattr(status, 'fatal_error', None)!r})")
                continue
            if not result.is_finished() or result.request_id not in names:
                continue
            if result.error is not None:
                raise RuntimeError(f"HF continuous batching failed request {result.request_id}: {result.error}")
            i, ids = names.pop(result.request_id)
            self.finished[i] = ids + list(result.generated_tokens)
        return dict(sorted(self.finished.items()))

    def stats(self) -> dict:
        """``forward_tokens``, ``prompt_tokens_computed`` (forward tokens - decode feeds), ``prefix_hit_tokens``
        (what ``search_prefix_match`` returned), ``forwards``, ``model_s``, ``prepare_s`` (in
        ``prepare_next_batch`` and ``update_batch``: scheduling, index and mask building, reading the new tokens
        back), ``scores_dense``, ``scores_rows``, ``threads`` (in the forwards), ``default_threads`` (before this
        server set them), ``block_sharing_used``."""
        c = self.clock
        return {"forward_tokens": c.tokens, "prompt_tokens_computed": c.tokens - self.decode_feeds,
                "prefix_hit_tokens": self.hits, "forwards": c.forwards, "model_s": c.model_s,
                "prepare_s": self.prepare_s,
                "scores_dense": c.scores_dense, "scores_rows": c.scores_rows, "threads": sorted(c.threads),
                "default_threads": sorted(self.default_threads), "block_sharing_used": self.block_sharing}

    def close(self) -> None:
        self.clock.close()
        self._hook.remove()
        self.manager.stop(block=True, timeout=self.timeout_s)
        self.manager.destroy()
