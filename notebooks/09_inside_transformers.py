# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
# ---

# %% [markdown]
# # Lesson 9 — Your cache inside Hugging Face Transformers
#
# **Time:** about 75 minutes for the lesson (section 8 included), plus 30–50 for [exercise 11](../exercises/11_hf_cache_layer.ipynb), done where the lesson reaches it. **You need:** lessons 3 (the ring buffer) and 4 (decoding with the cache).
#
# **By the end you will be able to**
#
# * name the four methods a `transformers` cache layer must get right, and say what each one feeds;
# * explain what transformers' two sliding layers do every step (one concatenates, one rolls) and what it costs;
# * put the ring from lesson 3 inside `model.generate` of Mistral, Gemma 2 and Gemma 3, and say why its slot order
#   is safe for one new token and not for a chunk;
# * check parity, memory and speed against transformers' own caches.
#
# Window convention (`swkv_teach.masks`): query $i$ attends key $j$ when $i - W < j \le i$, Hugging Face's mask rule;
# its flash-attention path agrees since 4.56. Everything here runs on tiny random models built in the notebook: nothing is downloaded, except in
# the optional last cell, which you run yourself on Colab.

# %%
# NBVAL_IGNORE_OUTPUT
import inspect
import statistics
import textwrap
import time

import torch
import transformers
from transformers.cache_utils import (
    CacheLayerMixin,
    DynamicSlidingWindowLayer,
    StaticSlidingWindowLayer,
)

from swkv_teach.bench.hf_cache import hf_cache_rows, table
from swkv_teach.hf import hf_cache
from swkv_teach.hf_cache import WindowLayer, cache_kwarg

torch.manual_seed(0)
torch.set_num_threads(1)
print("transformers", transformers.__version__, "| torch", torch.__version__)

# %% [markdown]
# ## 1. The interface, read from the source
#
# A `transformers` cache is "mostly a list" of per-layer objects (`class Cache`, `cache_utils.py`). Each layer is a
# `CacheLayerMixin` (`cache_utils.py` line 23 in transformers 5.25.0, line 27 in 5.15.0, Colab's) and the model calls
# four of its methods:
#
# | method | called by | returns |
# |---|---|---|
# | `update(k, v)` | each attention layer, every forward | the keys/values the new queries attend over |
# | `get_seq_length()` | the model, before its layers | tokens **seen**: the new tokens' positions start there |
# | `get_mask_sizes(q)` | `masking_utils`, **before** `update` | `(kv_length, kv_offset)`: which positions the keys hold |
# | `is_sliding` (a flag) | `masking_utils` | which mask; the sliding one is sized from the first sliding layer |
#
# `update` takes and returns `(batch, kv_heads, tokens, head_dim)`; the keys it returns hold positions
# `kv_offset, kv_offset + 1, …, kv_offset + kv_length - 1`.
#
# The mask itself is built from positions alone: `sliding_window_overlay` (`masking_utils.py` line 90 in 5.25.0, 92 in
# 5.15.0) is `kv_idx > q_idx - sliding_window`, and `_preprocess_mask_arguments` asks the cache for
# `get_mask_sizes(q_length, layer_idx)` (line 844 in 5.25.0, 833 in 5.15.0) with `layer_idx` the first layer whose
# `is_sliding` is True (`create_sliding_window_causal_mask`, `is_sliding.index(True)`, line 1200 in 5.25.0, 1170 in
# 5.15.0). Two pitfalls follow: seen must not be confused with stored, and `is_sliding` must be right per layer.

# %%
# NBVAL_IGNORE_OUTPUT
print("abstract methods:", *sorted(CacheLayerMixin.__abstractmethods__), sep="\n  ")
# dedented: the method as written in its class, without the class's indent
print(textwrap.dedent(inspect.getsource(DynamicSlidingWindowLayer.get_mask_sizes)))

# %% [markdown]
# ## 2. transformers' two sliding layers, and what a step costs
#
# * **`DynamicSlidingWindowLayer`** (5.25.0 line 196, 5.15.0 line 203), the default cache's sliding layer: every
#   update does `torch.cat([self.keys, key_states])` (5.25.0 line 242) and keeps the last $W - 1$: a fresh
#   `(W, head_dim)` tensor per layer per token, an O(W) copy.
# * **`StaticSlidingWindowLayer`** (5.25.0 line 524, 5.15.0 line 504), used by `cache_implementation="static"`: once
#   full, a one-token update does `self.keys.roll(-1, dims=-2)` (5.25.0 line 575, 5.15.0 line 553), writes the new
#   token at the end and copies the result back: two O(W) copies, so `torch.compile` sees fixed addresses.
#
# The ring of lesson 3 writes one slot, $p \bmod W$, and returns the whole buffer: no copy at all. Below, one layer
# each, window 1024, 200 one-token updates once full.


# %%
# NBVAL_IGNORE_OUTPUT
def time_updates(layer, W=1024, steps=200, heads=2, d=32):
    k = torch.randn(1, heads, W, d)
    layer.update(k, k)  # fill the window
    one = torch.randn(1, heads, 1, d)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        layer.update(one, one)
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


us = {
    "dynamic (cat + slice)": time_updates(
        DynamicSlidingWindowLayer(sliding_window=1024)
    ),
    "static (roll)": time_updates(
        StaticSlidingWindowLayer(max_cache_len=4096, sliding_window=1024)
    ),
    "ours: WindowLayer('ring')": time_updates(WindowLayer("ring", 1024)),
}
ring_us = us["ours: WindowLayer('ring')"]
for name, t in us.items():
    print(f"{name:28} {t:7.1f} µs per update   {t / ring_us:5.1f}x the ring")

# %% [markdown]
# > **Your turn, before reading on:** [exercises/11_hf_cache_layer.ipynb](../exercises/11_hf_cache_layer.ipynb)
# > has you write this layer over your own ring (`update`, `get_mask_sizes`, `get_seq_length`, its lazy
# > initialisation) and `ring_cache(model)`, checked inside a real tiny
# > Mistral, Gemma 2 and Gemma 3 (`generate` and chunked calls). Section 3 shows how the library's layer does it, so
# > try the exercise first, then come back.

# %% [markdown]
# ## 3. The ring as a layer, and the one-token invariant
#
# `swkv_teach.hf_cache.WindowLayer` wraps any of the course's window caches (`make_cache(kind, W)`). With `n`
# tokens seen before `q` new ones it reports what HF's dynamic layer reports:
#
# ```
# kv_offset = max(n - W + 1, 0)        kv_length = min(n, W - 1) + q
# ```
#
# **One token** ($q = 1$, window full): the ring returns its `W` slots in **slot** order, not position order. HF's
# mask row for that query covers positions $n - W + 1, \dots, n$, all inside the window, so every entry is True and the
# order cannot change which keys are attended, nor, in exact arithmetic, the result (softmax over keys is a sum).
# In floating point another order of the sum can change the last bits, which is why the parity below is checked
# to 1e-4, not bit for bit. No roll, no copy.
#
# **A chunk** ($q > 1$): now the mask differs from row to row (query $n + 1$ must not see key $n - W + 1$), and HF
# lays it out by position. Slot order would silently attend the wrong keys. So the ring's chunk path returns the
# stored keys the first query may see **chronologically**, then the chunk. $W = 3$, 7 tokens seen:

# %%
layer = WindowLayer("ring", 3)
for p in range(7):
    layer.update(torch.full((1, 1, 1, 1), float(p)), torch.zeros(1, 1, 1, 1))
print("one token at position 7: mask sizes", layer.get_mask_sizes(1), end="\n  -> ")
k, _ = layer.update(torch.full((1, 1, 1, 1), 7.0), torch.zeros(1, 1, 1, 1))
print("keys returned (slot order)", k.flatten().tolist())
print("chunk of 2 (positions 8, 9): mask sizes", layer.get_mask_sizes(2), end="\n  -> ")
k, _ = layer.update(torch.tensor([8.0, 9.0]).view(1, 1, 2, 1), torch.zeros(1, 1, 2, 1))
print("keys returned (position order)", k.flatten().tolist())
print("seen:", layer.get_seq_length(), "| stored:", len(layer.cache))

# %% [markdown]
# ## 4. Parity on tiny Mistral, Gemma 2 and Gemma 3
#
# `hf_cache(model, kind)` builds one layer per model layer from the (text) config: Mistral has no `layer_types`
# (every layer slides); Gemma 2 alternates sliding and full layers; Gemma 3 has five sliding layers to one full by
# default (`sliding_window_pattern`, here 3 to keep the model small). Full layers get transformers' own
# `DynamicLayer`. We compare greedy `generate` over W + 4W new tokens, logits at every step, against the
# default cache. (transformers 5.25.0 takes the cache as `cache=` and warns on the old `past_key_values=`, the only
# name 5.15.0 knows; `cache_kwarg(model)` gives the name your version takes.)

# %%
DIMS = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
    attn_implementation="eager",
)
W = 8
torch.manual_seed(0)
models = {
    "Mistral": transformers.MistralForCausalLM(
        transformers.MistralConfig(**DIMS, num_hidden_layers=2, sliding_window=W)
    ),
    "Gemma 2": transformers.Gemma2ForCausalLM(
        transformers.Gemma2Config(**DIMS, num_hidden_layers=4, sliding_window=W)
    ),
    "Gemma 3": transformers.Gemma3ForCausalLM(
        transformers.Gemma3TextConfig(
            **DIMS, num_hidden_layers=6, sliding_window=W, sliding_window_pattern=3
        )
    ),
}
prompt = torch.randint(0, 97, (2, W + 3), generator=torch.Generator().manual_seed(1))
for name, model in models.items():
    model.eval()
    layout = "".join(
        "R" if isinstance(lay, WindowLayer) else "F" for lay in hf_cache(model).layers
    )
    common = dict(
        max_new_tokens=5 * W,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        ref = model.generate(prompt, **common)
        for kind in ("ring", "naive", "int8"):
            out = model.generate(
                prompt, **common, **{cache_kwarg(model): hf_cache(model, kind)}
            )
            diff = [(a - b).abs().max().item() for a, b in zip(out.logits, ref.logits)]
            differ = (out.sequences != ref.sequences).any(0).nonzero()
            first = (
                "none"
                if len(differ) == 0
                else f"step {int(differ[0]) - prompt.shape[1]}"
            )
            close = all(
                d <= 1e-4
                for d in diff[
                    : int(differ[0]) - prompt.shape[1] + 1 if len(differ) else None
                ]
            )
            print(
                f"{name:8} {layout:6} {kind:5} logits within 1e-4 of HF's:"
                f" {'yes' if close else 'no ':3}  first different token: {first}"
            )

# %% [markdown]
# R marks a layer kept in our ring, F a full layer left to transformers. Ring and naive agree with the default cache
# to float rounding (about 1e-6 here) at every step; int8 stores 8-bit keys and values, so its logits move by about
# 1e-2, and its greedy tokens may part from HF's where two candidates are close (after that the two sequences
# differ, so later logits are not comparable). The tests hold int8 to HF's top-1 on at least 95 % of steps along
# HF's own greedy sequence. (`tests/test_hf_cache.py` also checks chunks of 1, 2, 5, $W - 1$ and
# $W + 3$ tokens against a full forward, under the newest transformers and under 5.15.0.)
#
# ## 5. Memory stays flat
#
# After W + 4W tokens, one at a time, each sliding layer holds one window; the full layers hold everything, as HF's.

# %%
model = models["Gemma 2"]
cache = hf_cache(model, "ring")
ids = torch.randint(0, 97, (1, 5 * W), generator=torch.Generator().manual_seed(2))
kw = cache_kwarg(model)
with torch.no_grad():
    for t in range(5 * W):
        model(input_ids=ids[:, t : t + 1], use_cache=True, **{kw: cache})
        if (t + 1) % W == 0:
            held = [
                (
                    lay.cache.nbytes
                    if isinstance(lay, WindowLayer)
                    else 2 * lay.keys.numel() * 4
                )
                for lay in cache.layers
            ]
            print(f"after {t + 1:3} tokens: bytes per layer {held}")

# %% [markdown]
# ## 6. Speed: greedy `generate` against transformers' caches
#
# A Mistral-shaped model (hidden 128, 2 layers, 4/2 heads, head_dim 32), one thread, a prompt of W tokens, then
# greedy steps; the median step is read from `generate`'s streamer. Small sizes here so the cell runs in seconds:
# `python -m swkv_teach.bench.hf_cache` runs the full size ($W = 1024$, 256 new tokens). Expect a small
# difference, and read it with care: the ratios depend on the machine and on what else it is doing while the
# cell runs (on a busy machine they swing by tens of per cent, and the short run below can even put the ring
# behind), so compare them within one run and rerun before believing one. Why so little, when one ring
# update is several times cheaper than cat + slice or the roll (lesson 6's table)? A decode step of this model
# is mostly transformers' own work that every cache pays alike: for one, it builds the sliding
# mask at every step, even for one query over exactly `W` in-window keys (`masking_utils.py`,
# `_ignore_causal_mask_sdpa` tests `kv_length >= local_attention_size`, line 286 in 5.25.0). The ring's whole
# share of a step is a small part of it. How the balance moves on a GPU, at a real model's window, is not measured here.

# %%
# NBVAL_IGNORE_OUTPUT
rows = hf_cache_rows(
    window=256, new_tokens=24, repeats=3, impls=("dynamic", "static", "ring")
)
print(table(rows))

# %% [markdown]
# ## 7. Optional, on Colab with a GPU: a real sliding-window model from the Hub
#
# `google/gemma-3-270m-it`: 18 layers, 15 sliding with a window of 512 tokens and 3 full (its `config.json`;
# the cell prints them). Its weights are released under the **Gemma Terms of Use**: the repository is gated, so
# accept the terms on its Hub page and log in (`huggingface_hub.login()`) first. The cell runs only on Colab with
# a GPU; anywhere else (this stored notebook, the tests) it prints that it skipped, and no output of it is faked.

# %%
import sys  # noqa: E402

if "google.colab" in sys.modules and torch.cuda.is_available():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = "google/gemma-3-270m-it"
    tok = AutoTokenizer.from_pretrained(name)
    real = (
        AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16)
        .to("cuda")
        .eval()
    )
    text = real.config.get_text_config(decoder=True)
    print(
        "window",
        text.sliding_window,
        "| layers",
        "".join("R" if t == "sliding_attention" else "F" for t in text.layer_types),
    )
    ids = tok(
        "Write a short story about a cache that forgets.", return_tensors="pt"
    ).input_ids.to("cuda")
    with torch.no_grad():
        ours = real.generate(
            ids,
            max_new_tokens=600,
            do_sample=False,
            **{cache_kwarg(real): hf_cache(real)},
        )
        ref = real.generate(ids, max_new_tokens=600, do_sample=False)
    same = (ours[0] == ref[0]).float().mean().item()
    print(tok.decode(ours[0, ids.shape[1] :], skip_special_tokens=True)[:600])
    print(
        f"tokens equal to HF's default cache: {100 * same:.1f} % (bf16: small"
        " differences can flip a close token)"
    )
else:
    print(
        "skipped: this cell runs only on Colab with a GPU runtime\n"
        "(it downloads google/gemma-3-270m-it)"
    )

# %% [markdown]
# ## What to remember
#
# * A cache layer answers four questions: what to attend over (`update`), how many tokens came before
#   (`get_seq_length`: **seen**), which positions the keys hold (`get_mask_sizes`, asked **before** `update`), and
#   whether it slides (`is_sliding`, per layer).
# * transformers' sliding layers copy the window every step (cat + slice, or roll); the ring writes one slot.
# * Slot order is safe only when every returned key is visible to every query: one token. Chunks get position order.
# * `hf_cache`'s layers refuse, with an error, what is out of their scope: padded batches, beam search, offloading,
#   and cropping, except a ring built with a lookahead (`hf_cache(model, lookahead=k)`, for assisted generation:
#   `crop(-r)` is its O(1) rollback). They are not compileable (`is_compileable = False`, so transformers' `generate` runs them eagerly);
#   `hf_compileable_cache` gives Mistral-style models a ring transformers can compile (`CompileableRingLayer`), and
#   section 8 compiles the course's own ring.
#
# Graded exercise: [exercises/11_hf_cache_layer.ipynb](../exercises/11_hf_cache_layer.ipynb), if you have not done it yet.

# %% [markdown]
# ## 8. Going further: why the cache decides whether a decode step compiles
#
# `torch.compile` turns a step into a few fused kernels, and on a GPU `mode="reduce-overhead"` records them once
# as a CUDA graph and replays it: no Python, no launch cost. Both need the step to look the same every time. A
# compiled graph is specialised on its tensors' **shapes** (a new shape recompiles, or forces symbolic shapes), and a
# CUDA graph replays fixed kernels on fixed **addresses**. Watch transformers' two sliding layers over six one-token
# updates with $W = 4$, and the course's ring beside them (each key holds its own position, so we can read them):


# %%
def feed(layer, steps=6):
    """One-token updates whose keys hold their position.

    Yields, per step, the shape returned and the tensor the layer stores its keys in.
    """
    for p in range(steps):
        kv = torch.full((1, 1, 1, 2), float(p))
        keys, _ = layer.update(kv, kv.clone())
        yield tuple(keys.shape), (
            layer.keys if isinstance(layer, CacheLayerMixin) else layer.k_buf
        )


from swkv_teach.caches import RingBufferKVCache  # noqa: E402

layers = {
    "DynamicSlidingWindowLayer (cat + slice)": DynamicSlidingWindowLayer(
        sliding_window=4
    ),
    "StaticSlidingWindowLayer (roll)": StaticSlidingWindowLayer(
        max_cache_len=16, sliding_window=4
    ),
    "RingBufferKVCache (one slot)": RingBufferKVCache(4),
}
for name, layer in layers.items():
    # every stored tensor kept alive, so no address is freed and handed out again
    steps = list(feed(layer))
    addresses = {stored.data_ptr() for _, stored in steps}
    print(
        f"{name}\n  tokens returned: {[s[2] for s, _ in steps]}  stored keys at"
        f" {len(addresses)} address(es)\n  stored positions after the last step:"
        f" {steps[-1][1][0, 0, :, 0].int().tolist()}"
    )

# %% [markdown]
# * **cat + slice** returns a new tensor every step, first of a growing length: nothing for a graph to hold on to.
# * **roll** keeps one buffer at one address (`torch._dynamo.mark_static_address`, `cache_utils.py` line 456 in
#   5.25.0), so transformers' compiled `generate` takes it (it compiles only when `cache.is_compileable`,
#   `generation/utils.py` line 2458). But it must keep the keys **in position order**: the mask is built as
#   `kv_arange = torch.arange(kv_length) + kv_offset` (`masking_utils.py` line 531), one contiguous run of
#   positions. So once full, every step rolls the whole window one slot left (`cache_utils.py` lines 575-576): an
#   O(W) copy per layer per token, [2, 3, 4, 5] above.
# * **the ring** writes one slot, $p \bmod W$, at one address: [4, 5, 2, 3]. Eagerly it returns views of its buffer,
#   growing until the window fills; the compiled step reads all `W` slots every time instead. To compile it, nothing in the step may
#   depend on Python numbers that change: the position is a `(1,)` tensor, the slot is `position % W` computed
#   in the graph, and the mask over the `W` slots (slot `s` is filled once `s <= position`) is data
#   (`swkv_teach.caches.ring.ring_slot_and_mask`). `Decoder.compiled_ring` builds that step
#   (`torch.compile(fullgraph=True)`: a graph break would be an error) and `generate(..., compile=True)` uses it,
#   the prompt staying eager. Below, dynamo is told to treat any recompilation as an error, and the model decodes
#   three windows' worth of tokens past its window.

# %%
from swkv_teach.model import Decoder, DecoderConfig  # noqa: E402

torch.manual_seed(0)
tiny = Decoder(DecoderConfig(window_size=16)).eval()
prompt = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(1))
torch._dynamo.reset()
with torch._dynamo.config.patch(error_on_recompile=True):
    # the first call compiles (seconds)
    compiled_tokens = tiny.generate(prompt, 48, compile=True)
    # another prompt length: the same graph
    again = tiny.generate(prompt[:, :5], 48, compile=True)
print(
    "same tokens as the eager ring:",
    torch.equal(compiled_tokens, tiny.generate(prompt, 48)),
    torch.equal(again, tiny.generate(prompt[:, :5], 48)),
)
print(
    "recompilations in 2 x 48 steps, through and past a window of 16: 0\n"
    "(error_on_recompile would have raised)"
)

# %% [markdown]
# How much does it buy? Below, the same tiny model decodes with the eager ring and with the compiled step,
# interleaved, one thread (the bench's `compiled` row does this at $W = 1024$ on the Mistral-shaped decoder:
# `python -m swkv_teach.bench`). On a CPU the gain is mostly the Python between ~60 small kernels, which the
# compiled step (with inductor's C++ wrapper) no longer runs, and the linears: at decode each is one row times a
# matrix, which `CompiledRing` asks inductor to generate as a fused multiply-and-sum (its `decompose_mm_pass`)
# instead of calling BLAS. What compiling leaves alone is the attention: the graph calls the same ATen attention
# kernel over the `W` slots as the eager ring, so the larger the window, the larger the share of the step that
# compiling cannot shrink (the bench times that kernel alone and reports the step outside it).
#
# And `torch.compile` has a cost of its own, paid in Python at every call: dynamo checks its guards (is this still
# the same model, are the tensors still of the same shapes and dtypes?) and runs wrappers around the compiled code.
# For a step this small that is a real share. `compile="aot"` compiles the same step **ahead of time**:
# `torch.export` traces it once, AOTInductor builds a shared library, and each token is one call into it, with no
# guards to check (`swkv_teach.ahead_of_time`). The price is the guards' job: the library knows nothing of what
# changed, so the course checks the inputs itself and, if a weight was replaced, compiles again for the next
# sequence. It is how PyTorch deploys a compiled model, and on a CPU the nearest thing to what a CUDA graph does on a
# GPU. The numbers depend on the machine and its load.

# %%
# NBVAL_IGNORE_OUTPUT
rings = {
    "compiled ring": tiny.compiled_ring(1),
    "ahead of time": tiny.compiled_ring(1, "aot"),
}
runs = {"eager ring": [], **{name: [] for name in rings}}
with torch.no_grad():
    # the first round compiles (the ahead-of-time build takes seconds): not counted
    for _ in range(6):
        for name in runs:
            ring = rings.get(name)
            caches, step = (
                (tiny.new_caches("ring"), tiny.step)
                if ring is None
                else (ring.new_caches(), ring.step)
            )
            nxt = tiny.step(prompt, caches)[:, -1:].argmax(-1)
            start = time.perf_counter()
            for _ in range(64):
                nxt = step(nxt, caches)[:, -1:].argmax(-1)
            runs[name].append(64 / (time.perf_counter() - start))
eager_tps = statistics.median(runs["eager ring"][1:])
for name in runs:
    tps = statistics.median(runs[name][1:])
    print(
        f"{name:<14} {tps:6.0f} tokens/s  {tps / eager_tps:.2f}x the eager ring (median"
        " of 5 interleaved runs)"
    )
