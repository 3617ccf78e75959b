"""The ring's one-token decode step as one ``torch.compile`` graph: :class:`CompiledRing`.

:meth:`swkv_teach.model.Decoder.compiled_ring` makes one per (batch, mode, dtype, device) and keeps it;
``Decoder.generate(..., cache="ring", compile=True)`` prefills the prompt eagerly and then steps here.
Everything a graph must not see change is fixed: the ring buffers' addresses, the shapes (``W`` slots,
one token), and the position, slot and mask, which are tensors (``ring_slot_and_mask``), so no step
past the window recompiles (``tests/test_compiled_ring.py`` runs 300 of them with recompilation an
error). Lesson 9, section 8, shows why a cat + slice cache cannot be compiled this way.

Window convention: :mod:`swkv_teach.masks`.
"""

from __future__ import annotations

import torch

from swkv_teach._quiet import import_cpp_extension_quietly
from swkv_teach.ahead_of_time import AheadOfTime
from swkv_teach.caches.layers import LayerCaches
from swkv_teach.caches.ring import RingBufferKVCache, ring_slot_and_mask
from swkv_teach.rope import _inv_freq, _rotary_with

__all__ = ["CompiledRing"]


def _ring_decode(model, input_ids, position, inv_freq, k_bufs, v_bufs):
    """One token ``(B, 1)`` at ``position`` ``(1,)`` through every layer's ring buffers; logits ``(B, 1, vocab)``.

    What :class:`CompiledRing` hands to ``torch.compile``: every shape is fixed (``W`` slots, one
    token), the position, slot and mask are tensors, and nothing branches on data, so one graph
    serves every step. A function of ``model``, not a method: dynamo lifts the weights as inputs.
    """
    x = model.embed(input_ids)  # (B, 1, dim)
    rope = _rotary_with(position, inv_freq, x.dtype)  # once, for every layer
    slot, visible = ring_slot_and_mask(position, k_bufs[0].shape[2])
    visible = visible.view(1, -1)  # (1, W): SDPA wants a mask of at least two dims, the query's and the keys'
    for layer, k_buf, v_buf in zip(model.layers, k_bufs, v_bufs):
        x = layer.forward_ring_slot(x, rope, k_buf, v_buf, slot, visible)
    return model.lm_head(model.norm(x))


class CompiledRing:
    """Ring buffers at fixed addresses and a ``torch.compile``-d one-token step over them, for one batch size.

    The eager ring (:class:`~swkv_teach.caches.RingBufferKVCache`) already writes in place, but its
    step is dozens of small kernels with Python between them, and what it returns changes shape
    until the window fills. Here the step is one graph: keys and values go into slot ``p % W`` of
    ``(B, n_kv_heads, W, head_dim)`` buffers made once (``torch._dynamo.mark_static_address``), the
    query attends over all ``W`` slots through a mask that is data (``ring_slot_and_mask``), and
    the position is a ``(1,)`` tensor. A cat + slice cache could not do this: its keys tensor is a
    new allocation of a new length at every step, so a compiled graph would be specialised on each
    length and a CUDA graph (which replays fixed addresses) could not be captured at all.

    Use: ``caches = ring.new_caches()``; prefill eagerly with ``model.step(prompt, caches)`` (a
    chunk, any length); then ``ring.step(next_id, caches)`` per token. The caches stay ordinary
    ring caches (``seen``, ``positions``, ``ordered``, ``state_dict`` as eager ones), whose
    buffers are this object's. One :class:`CompiledRing` per (batch, mode, dtype, device), made
    and kept by :meth:`Decoder.compiled_ring` and reused by every sequence, as transformers' own
    ``generate`` reuses its static cache (so no new compilation per request).

    ``mode``: torch.compile's (``"default"``, ``"reduce-overhead"`` = CUDA graphs on CUDA, ...), or
    ``"aot"``: the same step exported and compiled ahead of time by AOTInductor
    (:class:`~swkv_teach.ahead_of_time.AheadOfTime`), which takes away torch.compile's Python per call
    (its guards and wrappers, about 25 µs on a CPU). ``"default"`` and ``"aot"`` on a CPU also turn on
    inductor's pass that generates one-row matrix products itself (``"post_grad_fusion_options":
    {"decompose_mm_pass": {}}``; ``"default"`` adds ``"cpp_wrapper": True``), unless ``options`` says
    otherwise. Under CUDA graphs the logits returned are copied out of the graph's output memory,
    which the next replay overwrites.

    Every graph input is one of this object's tensors (the token is copied into ``self.ids``, the
    position written into ``self.position``) and the step always runs in inference mode, so neither a
    caller's inference tensors nor its grad mode recompile it.

    ``model``: a :class:`~swkv_teach.model.Decoder`, typed as a module only: model.py imports this file, so this
    file imports nothing of it (what both need, RoPE and the layer caches, sits below both).
    """

    def __init__(self, model: torch.nn.Module, batch: int, mode: str = "default", options: dict | None = None):
        c = model.config
        p = next(model.parameters())
        shape = (batch, c.n_kv_heads, c.window_size, c.head_dim)
        self.model, self.batch, self.mode, self.window_size = model, batch, mode, c.window_size
        self.dtype, self.device = p.dtype, p.device
        with torch.inference_mode(False):  # ordinary tensors even when first asked inside inference_mode:
            # the eager prefill writes them too, and an inference tensor refuses writes outside that mode
            self.k = [torch.zeros(shape, dtype=p.dtype, device=p.device) for _ in model.layers]
            self.v = [torch.zeros(shape, dtype=p.dtype, device=p.device) for _ in model.layers]
            self.position = torch.zeros(1, dtype=torch.long, device=p.device)
            self.ids = torch.zeros(batch, 1, dtype=torch.long, device=p.device)  # the token in: copied, so that
            # every input of the graph is one of ours (a caller's inference tensor would fail dynamo's guards)
            self.inv_freq = _inv_freq(c.head_dim, float(c.rope_theta), p.device).clone()
        for t in (*self.k, *self.v, self.position, self.ids, self.inv_freq):
            # one address for the object's life: CUDA graphs may then write the buffers in place
            torch._dynamo.mark_static_address(t)
        self._ids_shape = torch.Size((batch, 1))
        self._caches: LayerCaches | None = None  # the one LayerCaches over these buffers that may step
        self._graphs = mode == "reduce-overhead" and p.device.type == "cuda"
        if options is None and mode == "default" and p.device.type == "cpu":
            # inductor's C++ wrapper: on a CPU a tiny model's step is mostly the Python between kernels
            # (one interleaved run on the bench's decoder at W = 1024: 2.1x the eager ring with it, 1.9x without).
            # decompose_mm_pass: at decode with batch 1 every linear is one row times a matrix (memory-bound), and
            # inductor's post-grad pass rewrites an mm whose first dimension is 1 on a CPU into a multiply-and-sum
            # it generates and fuses with the norms and activations around it, instead of one BLAS call each
            # (torch 2.13 torch/_inductor/fx_passes/decompose_mem_bound_mm.py, CPU thresholds lines 25-26, the
            # test lines 145-154; a larger batch keeps its BLAS calls). On the bench's decoder the step went from
            # 9 BLAS calls (4 linears a layer, the head) to none, and from 1.75-1.83x to 1.89-1.98x the eager
            # ring at W = 1024 (2.0-2.1x to 2.3-2.4x at W = 64); what is left at W = 1024 is mostly the attention
            # kernel, the same ATen call in both (the bench reports the step outside it).
            options = {"cpp_wrapper": True, "post_grad_fusion_options": {"decompose_mm_pass": {}}}
        if mode == "aot":
            # the same function, exported and compiled ahead of time (swkv_teach.ahead_of_time): no dynamo per call
            cpu = {"post_grad_fusion_options": {"decompose_mm_pass": {}}} if p.device.type == "cpu" else {}
            self._step = AheadOfTime(_ring_decode, cpu if options is None else options)
            return
        import_cpp_extension_quietly()  # inductor's C++ toolchain, without a CUDA build's stray warning
        how = {"options": options} if options else {"mode": mode}  # torch.compile takes one or the other
        # dynamic=False: every CompiledRing compiles _ring_decode, and dynamo keeps one cache per code object, so a
        # second window (another ring shape) would otherwise be recompiled with symbolic shapes ("automatic dynamic")
        # and run slower: measured on the bench's decoder, W = 1024 after W = 64 fell from 1.83x to 1.61x the eager
        # ring; with static shapes each window gets its own specialised graph (1.81x)
        self._step = torch.compile(_ring_decode, fullgraph=True, dynamic=False, **how)

    def new_caches(self) -> LayerCaches:
        """Empty ring caches, one per layer, over this object's buffers (zeroed: nothing of a past sequence).

        The buffers are shared, so the caches made before are finished: only the newest may :meth:`step`.
        With ``mode="aot"``, a model whose parameters were replaced since the step was compiled (not
        changed in place: that the library sees) gets its step compiled again at the next token.
        """
        if isinstance(self._step, AheadOfTime) and not self._step.current(self.model):
            self._step.reset()
        caches = []
        for k, v in zip(self.k, self.v):
            k.zero_()
            v.zero_()
            cache = RingBufferKVCache(self.window_size)
            cache.adopt(k, v)
            caches.append(cache)
        self._caches = LayerCaches(caches, self.window_size, 0)
        return self._caches

    def step(self, input_ids: torch.Tensor, caches: LayerCaches) -> torch.Tensor:
        """One token ``(B, 1)`` through ``caches`` (the last :meth:`new_caches`), compiled; logits ``(B, 1, vocab)``.

        Equal to ``model.step(input_ids, caches)`` (within float rounding: SDPA sums W slots, some
        masked, instead of the filled ones), and the caches count the token as ``step`` would.
        """
        # identity and shape tests only: this runs every token, and its Python is what compiling removed
        if caches is not self._caches:
            raise ValueError("caches must be the last new_caches() of this CompiledRing (its buffers are the graph's; "
                             "earlier caches over them were emptied by the later call)")
        if input_ids.shape != self._ids_shape or input_ids.dtype is not torch.long:
            raise ValueError(f"input_ids must be a ({self.batch}, 1) long tensor (one token per row); got shape "
                             f"{tuple(input_ids.shape)} dtype {input_ids.dtype}")
        seen = caches[0].seen
        if not seen:
            raise ValueError("the caches are empty: prefill the prompt with model.step(prompt, caches) first")
        self.position.fill_(seen)
        self.ids.copy_(input_ids)
        if self._graphs:
            torch.compiler.cudagraph_mark_step_begin()
        if torch.is_inference_mode_enabled():
            logits = self._step(self.model, self.ids, self.position, self.inv_freq, self.k, self.v)
            if self._graphs:  # out of the graph's output memory, which the next replay overwrites
                logits = logits.clone()
        else:
            # one autograd state for every call, inference mode: dynamo guards on it (no_grad or grad mode
            # would each compile the step again), and it spares the step autograd's bookkeeping
            with torch.inference_mode():
                logits = self._step(self.model, self.ids, self.position, self.inv_freq, self.k, self.v)
            logits = logits.clone()  # an ordinary tensor for a caller outside inference mode
        for cache in caches:
            cache.count_written()
        return logits
