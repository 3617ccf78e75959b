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
# # Lesson 14 — Interview drill
#
# **Time:** about 70 minutes to read, plus 60–100 to answer the twenty questions aloud before you open each fold (3–5 minutes each). **You need:**
# lessons 0–13; it comes last so that every question is about something taught (each answer says where its
# topic is taught). Sources: [references](../docs/references.md); formulas: [cheat sheet](../docs/cheatsheet.md).
#
# **By the end you will be able to**
#
# * give the cost of a decode step with and without a cache, complete, and say which term dominates when;
# * do the KV-memory arithmetic of a real model in your head, GQA, windows and hybrid stacks included;
# * compare eviction policies and memory layouts by what is exact, what it costs, and what it wastes;
# * state the window convention with its boundary, and name who counts $W + 1$ keys;
# * turn bytes into milliseconds on a GPU, say what keeps a fused kernel from running, and batch prompts
#   of different lengths without breaking their positions.
# * say what a sliding-window cache must keep for speculative decoding, and what a rejected draft costs.
#
# Twenty questions of the kind asked in ML-systems and LLM-serving interviews: complexity, memory
# arithmetic, trade-offs between eviction policies and memory layouts, RoPE, chunked prefill, the window
# convention's off-by-one, and what a GPU or a server does with a cache: bandwidth, fused kernels, batches,
# prefix caching, speculative decoding. Say your answer out loud (or write it down) before opening
# the folded one. The answers are short on purpose: an interviewer wants the key idea and a number.
#
# Two small calculators come first, so you can change the numbers and redo the arithmetic in any
# question. They check themselves against the library.
#
# The window convention, used throughout (from `swkv_teach.masks`): query `i` attends key `j`
# exactly when $i - W < j \le i$.

# %%
import torch

import swkv_teach
from swkv_teach import RingBufferKVCache

torch.manual_seed(0)
dev = swkv_teach.device()


def kv_cache_bytes(layers, kv_heads, head_dim, tokens, bytes_per_value=2, batch=1):
    # 2: every token stores one key and one value, in every layer, for every KV head
    return 2 * layers * kv_heads * head_dim * tokens * bytes_per_value * batch


def human(n_bytes):
    for unit, size in [("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)]:
        if n_bytes >= size:
            return f"{n_bytes / size:g} {unit}"
    return f"{n_bytes} B"


# the formula against a real cache:
# 1 layer, batch 2, 4 KV heads, head_dim 8, window 16, fp16
ring = RingBufferKVCache(16)
k = torch.zeros(2, 4, 1, 8, dtype=torch.float16, device=dev)
ring.update(k, k)
same = kv_cache_bytes(1, 4, 8, 16, 2, batch=2) == ring.nbytes
print("formula matches the library's nbytes:", same)

# %%
# change these and rerun
layers, kv_heads, head_dim, fp16 = 32, 8, 128, 2          # Mistral 7B
W, batch = 4096, 32
model = (layers, kv_heads, head_dim)

print("per token:                 ", human(kv_cache_bytes(*model, 1, fp16)))
print("one sequence, window 4096: ", human(kv_cache_bytes(*model, W, fp16)))
print(f"batch of {batch}, window 4096:  ",
      human(kv_cache_bytes(*model, W, fp16, batch)))
print("one sequence, 32k, no window:", human(kv_cache_bytes(*model, 32768, fp16)))
print("same model with MHA (32 KV heads), window 4096:",
      human(kv_cache_bytes(layers, 32, head_dim, W, fp16)))


# %%
def attention_flops(T, d, W=None):
    # scores q·k and the weighted sum of values:
    # 2 multiply-adds per key per dimension, per query
    keys_seen = sum(min(i + 1, W or T) for i in range(T))
    return 4 * d * keys_seen


T, d = 32768, 128
full, windowed = attention_flops(T, d), attention_flops(T, d, W=4096)
print(f"one head, T = {T}: full causal {full / 1e9:.1f} GFLOPs, "
      f"window 4096 {windowed / 1e9:.1f} GFLOPs, ratio {full / windowed:.2f}")

# %% [markdown]
# ## Complexity

# %% [markdown]
# ### Q1. What a KV cache saves, and what it costs
#
# **What does a KV cache save at each decode step, and what does it cost? Give the per-step compute with and without it for a model of width `d` at step `t`, and say which term dominates when.**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# Let a layer hold `P` weights (projections and MLP, $P \sim 12 \cdot d^2$ to $14 \cdot d^2$). **Without a cache**
# a step reruns the *whole model* over all `t` tokens: the later layers' keys depend on the earlier
# layers' outputs, so nothing short of the full forward gives them. Per layer that is $2P \cdot t$ FLOPs of
# dense work plus causal attention over the prefix, $\approx 2 \cdot t^2 \cdot d$: $O(t \cdot d^2 + t^2 \cdot d)$ per step,
# $O(N^2 \cdot d^2 + N^3 \cdot d)$ for `N` tokens. **With a cache** only the new token passes through the layer,
# `2P`, and its query reads the `t` cached keys and values, $4 \cdot t \cdot d$: $O(d^2 + t \cdot d)$ per step.
# Which term dominates: the dense one while `t` is small next to $P/d$; for Mistral 7B's shape
# ($P \approx 218\,\text{M}$, $d = 4096$) attention takes over at $t \approx 27\text{k}$ with a cache and $\approx 53\text{k}$ without.
# A window caps the cached attention term at $4 \cdot W \cdot d$, so the step cost stops growing.
# The price of the cache is memory: $2 \times \text{layers} \times \text{kv heads} \times \text{head dim} \times \text{bytes}$ per token, kept for
# as long as the token may be attended to, and read at every step (on a GPU that read, not the
# FLOPs, usually sets the speed: $(\text{weights} + \text{batch} \times \text{KV bytes}) / \text{bandwidth}$ is a floor on each step, about
# 4.3 ms for Mistral 7B on an H100 SXM at batch 1 and 1k tokens). Lesson 0, sections 1 and 2, works the numbers; lesson 6,
# section 4, measures the cache against recomputing.
#
# </details>

# %% [markdown]
# ### Q2. Cat-and-slice against a ring buffer
#
# **Per decode step, what does the naive cat-and-slice sliding-window cache cost, and what does a ring buffer cost? Does the ring make the decode step O(1)?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# Naive: `torch.cat` allocates $W + 1$ tokens and copies them, for keys and for values, every
# step: O(W) memory traffic and one allocation per token and layer (the slice after it is a free
# view). Ring: write one token into slot $p \bmod W$: O(1), no allocation. The *step* is still O(W),
# though, because attention must read all `W` cached keys. The ring removes the extra
# copy (the cat reads the whole window and writes it again, on top of attention's read) and the
# allocator churn, not the attention read itself.
#
# </details>

# %% [markdown]
# ### Q3. Attention over a whole sequence, with and without a window
#
# **What is the cost of attention over a whole sequence of `T` tokens with and without a window `W`, for prefill and for generating `N` tokens?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# Full causal prefill: $O(T^2 \cdot d)$ (about $T^2/2$ query–key pairs). With a window: $O(T \cdot W \cdot d)$, since
# each query sees at most `W` keys. Generating `N` tokens: $O(N \cdot T \cdot d)$ with a full cache, growing
# with context, versus $O(N \cdot W \cdot d)$ with a window, a constant per token. The calculator above shows
# the ratio at $T = 32768$, $W = 4096$: close to 4x, not 8x, because the first `W` queries cost
# the same either way and causal attention already halves the full $T^2$.
#
# </details>

# %% [markdown]
# ## Memory arithmetic

# %% [markdown]
# ### Q4. Mistral 7B's cache in bytes
#
# **Mistral 7B has 32 layers, 8 KV heads, head_dim 128, and runs in fp16 with window 4096. How big is the KV cache per token, per sequence, and for a batch of 32 sequences?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# Per token: $2 \times 32 \times 8 \times 128 \times 2\,\text{B} = 131\,072\,\text{B} = 128\,\text{KiB}$. Per sequence, full window:
# $4096 \times 128\,\text{KiB} = 512\,\text{MiB}$. Batch of 32: `16 GiB`, more than the fp16 weights (about 14.5 GB in all).
# Without the window, a 32k-token sequence would need 4 GiB, and 32 of them 128 GiB.
# (The calculator cell above reproduces every number.)
#
# </details>

# %% [markdown]
# ### Q5. Grouped-query attention and the cache
#
# **Grouped-query attention: how does the number of KV heads change the cache, and what is the saving for Mistral 7B (32 query heads, 8 KV heads) versus multi-head attention?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# The cache stores keys and values per **KV head**, so its size is proportional to the number of
# KV heads, not query heads. Under MHA each of the 32 query heads has its own K and V; under GQA
# groups of 4 query heads share one, so the cache is 4× smaller (512 MiB instead of 2 GiB per
# sequence at $W = 4096$). MQA (one KV head) is the extreme: 32× smaller, with some quality cost.
# GQA and a window multiply: both shrink the same product.
#
# </details>

# %% [markdown]
# ### Q6. How many sequences fit on 80 GB
#
# **Your serving GPU has 80 GB. Weights take 15 GB and activations and overhead another 10 GB. Roughly how many concurrent Mistral 7B sequences fit with window 4096, and what would you change to fit more?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# About 55 GB is left for the cache. At 512 MiB (0.5 GiB, about 0.54 GB) per full-window sequence,
# that is about 100 sequences. To fit more: quantize the cache (fp8 or int8 halves it: ~200),
# use a paged layout so short sequences do not reserve a whole window (most requests are shorter
# than 4096 tokens), or share prompt prefixes between requests. A smaller window would also do
# it, but the model was trained with 4096, so that changes its outputs.
#
# Where taught: paged blocks and an int8 cache in [lesson 7](07_serving_memory.ipynb); prefix
# sharing in [lesson 12](12_prefix_caching.ipynb) and vLLM's PagedAttention paper (Kwon et al. 2023,
# arXiv:2309.06180); caches below 8 bits
# in KIVI (Liu et al. 2024, arXiv:2402.02750, 2 bits).
#
# </details>

# %% [markdown]
# ## Policies and layouts

# %% [markdown]
# ### Q7. Three eviction policies
#
# **Compare three eviction policies: sliding window, sliding window with attention sinks, and LRU / heavy-hitter (H2O-like) eviction. When is each exact, and what does each cost?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# * **Sliding window**: evict by *age*, the oldest first. Exact for a model trained with that
#   window (it never looks further back anyway). O(1) bookkeeping.
# * **Sinks + window** (StreamingLLM): also keep the first `S` tokens (4 in the paper) forever.
#   Models park attention mass on the first tokens; dropping them wrecks a model that was trained
#   with *full* attention once the window slides past. Sinks let such a model stream
#   indefinitely, which is still an approximation of full attention; with $S = 0$ it is the plain
#   window. Cost: `S` extra slots.
# * **LRU / H2O**: evict by *use* or by accumulated attention score. Every decode step reads every
#   cached key, so plain "least recently used" degenerates to FIFO unless "use" means something
#   like "received a large attention weight" (H2O keeps these heavy hitters). Content-dependent
#   eviction can keep important old tokens, but it is never exact, needs the attention weights
#   (which fused kernels such as flash attention do not return), and its bookkeeping costs more.
#   LRU is not what sliding-window attention needs: SWA's rule depends only on positions.
#
# Where taught: LRU and sinks in [lesson 5](05_eviction_policies.ipynb); H2O in
# [lesson 8](08_which_tokens_to_keep.ipynb) and its paper (Zhang et al. 2023, arXiv:2306.14048).
#
# </details>

# %% [markdown]
# ### Q8. Three memory layouts
#
# **Compare three memory layouts for a sliding-window cache: contiguous with cat + slice, a ring buffer, and paged blocks as in vLLM's PagedAttention.**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# * **Contiguous cat + slice**: simplest, chronological order for free, but an O(W) copy and an
#   allocation per step and layer, and a batch needs padding to a common length.
# * **Ring buffer**: preallocated `W` slots per sequence, O(1) writes, constant memory. Keys come
#   back in slot order, so positions must be carried (RoPE applied before caching, a mask from
#   positions for chunks). It reserves the whole window even for a 10-token request.
# * **Paged blocks**: a pool of fixed-size blocks (e.g. 16 tokens) and a block table per sequence.
#   No *external* fragmentation (any free block serves any sequence) and memory grows with the real
#   length, but not none: the last block of each sequence is partly empty, up to `block - 1`
#   slots wasted per sequence (vLLM bounds the waste to that one block: Kwon et al. 2023,
#   arXiv:2309.06180, §4). Prefixes can be shared between requests (copy-on-write blocks).
#   With a window, blocks that have slid entirely out of every query's window go back to the pool.
#   Cost: an indirection (gather by block table) inside the attention kernel, and an allocator to
#   maintain.
#
# Where taught: contiguous and ring in [lesson 3](03_ring_buffer.ipynb); paged blocks and what
# the block size trades in [lesson 7](07_serving_memory.ipynb), and in the PagedAttention paper.
#
# </details>

# %% [markdown]
# ### Q9. Keys in slot order
#
# **A ring buffer returns keys in slot order, e.g. positions `[8, 9, 6, 7]`. Why is that fine for decoding one token, and when is it not?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# One query's attention is a weighted sum over keys; a sum does not depend on order, provided each
# key carries its own position (RoPE applied before caching) and keys and values are permuted
# together. Every key the ring holds is inside the current query's window, so no mask is needed.
# It stops being fine (a) for a **chunk** of queries (prefill, speculative decoding), where each query
# has a different window, so the mask must come from positions,
# `window_mask(q_positions, cache.positions, W)`; (b) when something assumes time order, such as
# re-rotating keys, display, or comparing with a contiguous cache bit for bit. Floating-point sums in
# a different order also differ in the last bits.
#
# </details>

# %% [markdown]
# ## RoPE, prefill, conventions

# %% [markdown]
# ### Q10. RoPE before or after the cache
#
# **Do you cache keys before or after applying rotary position embeddings (RoPE)? What are the consequences for a sliding window and for attention sinks?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# Usually **after**: each key is rotated once by its absolute position (taken from the count of
# tokens *seen*, not the number *stored*) and cached as is. Relative distances stay correct, the
# slot order does not matter, and nothing is recomputed. Caching **before** RoPE means re-rotating
# every cached key at every step (O(W) extra work), but it lets you assign *new* positions.
# StreamingLLM does that with sinks: it uses positions within the cache, so the model never sees a
# distance longer than it was trained on. That changes the model's outputs, deliberately. Classic
# bug: rotating with `len(cache)` instead of `seen`, which freezes positions once the cache is full:
# exact for the first $W + 1$ tokens, wrong after ([lesson 4](04_decoding_with_the_cache.ipynb) runs it
# on the trained model).
#
# </details>

# %% [markdown]
# ### Q11. Chunked prefill of a long prompt
#
# **A 10 000-token prompt arrives for a model with $W = 4096$. How do you prefill it in chunks with a bounded cache, and what must the cache hand to each chunk?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# Process chunks of `c` tokens (the Mistral 7B paper suggests $c = W$). The first query of a chunk
# starting at position `n` may see keys $n - W + 1, \dots, n$, so the cache must return the last
# $W - 1$ stored keys followed by the chunk's `c` keys ($W - 1 + c$ in all), and the attention mask
# is `window_mask(q_positions = n … n + c - 1, cache.positions, W)`: causal inside the chunk,
# windowed against the past. Afterwards only the last `W` keys are kept. Peak memory is then
# $O(W + c)$ keys instead of `O(10 000)`, and the result equals prefilling the whole prompt at once.
#
# </details>

# %% [markdown]
# ### Q12. Which keys a query sees: the off-by-one
#
# **With window `W`, which keys does query `i` attend to? How many? What does flash attention's `window_size` argument need to be, and does everyone count the same way?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# In this course, keys `j` with $i - W < j \le i$: exactly `W` keys, the query's own included (for
# $W = 3$, query 5 sees 3, 4, 5). The same count in:
#
# * **flash-attention**: `window_size=(left, right)` counts keys *besides* the query on each side, and
#   the window is **aligned to the bottom right**: `flash_attn_func`'s docstring (and the README) says
#   query `i` attends `[i + seqlen_k - seqlen_q - window_size[0], i + seqlen_k - seqlen_q + window_size[1]]`.
#   With `seqlen_q = seqlen_k` (a prompt) that is `[i - window_size[0], i + window_size[1]]`; with one
#   query over `seqlen_k` keys (decode), query 0 is the *last* key's position, so it reads the last
#   `window_size[0] + 1` keys, which is what makes one-token decode work without passing a position. The
#   rule is `window_size=(W - 1, 0)`;
# * **Hugging Face**'s mask rule: `masking_utils.sliding_window_overlay` keeps
#   `kv_idx > q_idx - sliding_window` (already in 4.55.4); its flash-attention path agrees since 4.56
#   (the fix below);
# * **mistral-inference's xformers path**: `make_local_attention(W)` (`cache.py`), whose mask
#   (`_materialize_causal_mask` in xformers' `attn_bias.py`) is `torch.triu(..., diagonal=-W + 1)`.
#
# Not everyone: Mistral's first **reference code**, `one_file_ref.py` (mistral-src, first commit,
# line 261), builds its prefill mask with `torch.triu(mask, diagonal=-sliding_window)`, which admits
# $i - W \le j \le i$, **$W + 1$** keys, while its decode path reads a rolling buffer of `W` slots. The
# paper (arXiv:2310.06825) says both: §2's wording, "positions between i − W and i", reads as $W + 1$,
# while its Figure 1 caption says "each token can attend to at most W tokens from the previous layer
# (here, W = 3)" and its rolling buffer cache "has a fixed size of W". The caption is not one-sided
# either: it goes on "after k attention layers, information can move forward by up to k × W tokens", and
# §2 says "a distance of up to W × k", a reach of `W` per layer, which only the $W + 1$ reading gives.
# And Hugging Face's flash-attention path passed `window_size=(W, W)` (transformers issue #39408):
# with causal masking $W + 1$ keys, one more than its eager/SDPA path, so the same model gave
# different results depending on the backend; fixed in PR #40163 (August 2025). Lesson 0 builds the
# reference's mask and shows the extra key. For interviews: write the convention down once, and
# test the boundary at $W - 1$, `W`, $W + 1$. (Mistral 7B v0.2 and later dropped sliding-window
# attention altogether: its model card lists "No Sliding-Window Attention".)
#
# </details>

# %% [markdown]
# ### Q13. How far back information reaches
#
# **After `L` layers of sliding-window attention with window `W`, how far back can information reach? Does dropping keys older than `W` lose anything?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# Each layer moves information at most $W - 1$ positions, so after `L` layers a token can be
# influenced by about $L \times (W - 1)$ earlier tokens: about 131k for Mistral 7B ($32 \times 4095 = 131\,040$). Dropping
# keys older than `W` from each layer's cache loses nothing *for a model trained with the window*:
# the older information is already folded into the hidden states of the tokens still in the
# window. It is an approximation only for a model trained with full attention.
#
# </details>

# %% [markdown]
# ### Q14. A 3e-8 difference: bug or not?
#
# **Your ring-buffer cache and the naive cache give attention outputs differing by `3e-8`. Bug or not? How do you test a cache properly?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# Not a bug: the ring returns keys in slot order, and a floating-point sum in a different order
# rounds differently. Test with tolerances against an **oracle** that never uses a cache
# (full-sequence attention with the window mask), and compare cache *contents* exactly after
# sorting by position (`ring.ordered()` vs the naive cache: `torch.equal`). Cover the boundary
# steps $W - 1$, `W`, $W + 1$, several wrap-arounds, chunk sizes that do and do not divide `W`, and
# the GPU as well as the CPU.
#
# </details>

# %% [markdown]
# ### Q15. A hybrid local/global stack's memory
#
# **A 62-layer model with 16 KV heads of 128 dims (bf16) serves 128k-token contexts. Compare the KV cache per sequence with every layer global, and with 5 local layers (window 1024) per global one. Which layers set the memory?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# Per token and layer: $2 \times 16 \times 128 \times 2\,\text{B} = 8\,\text{KiB}$. All global: $62 \times 131\,072 \times 8\,\text{KiB} = 62\,\text{GiB}$.
# With 5 : 1 (Gemma 3's ratio): 10 global layers hold $10 \times 131\,072 \times 8\,\text{KiB} = 10\,\text{GiB}$ and 52 local
# layers $52 \times 1024 \times 8\,\text{KiB} \approx 0.4\,\text{GiB}$: about 10.4 GiB, six times less. The global layers set the
# memory; shrinking the local window further would hardly help, raising the share of local layers
# does. The calculator: `kv_cache_bytes(10, 16, 128, 131072) + kv_cache_bytes(52, 16, 128, 1024)`.
# Lesson 0, section 3 draws it.
#
# </details>

# %%
print("all global:", human(kv_cache_bytes(62, 16, 128, 131072)))
mixed = kv_cache_bytes(10, 16, 128, 131072) + kv_cache_bytes(52, 16, 128, 1024)
print("5 : 1 local/global, W = 1024:", human(mixed))

# %% [markdown]
# ## GPUs, kernels and serving

# %% [markdown]
# ### Q16. Bytes into milliseconds
#
# **Mistral 7B in fp16 on an H100 SXM (3.35 TB/s). What is the floor on milliseconds per decode step at batch 1 and 4k tokens of context? At batch 32 and 32k tokens, with a full cache and with a 4096 window? When does the KV cache, not the weights, set the pace?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# Decode is memory-bound: a step reads every weight once (shared by the batch) and every sequence's cache,
# for about 2 FLOPs per weight, so $\text{ms} \ge (\text{weight bytes} + \text{batch} \times \text{KV bytes}) / \text{bandwidth}$. Weights:
# of its 7.24 G parameters a step reads 7.11 G (the 32 layers and the output head, but one row of the
# input embedding per token, not the table), at 2 bytes each: 14.2 GB, 4.2 ms alone; at 4k tokens the cache adds
# 0.5 GiB: about 4.4 ms. Batch 32 at 32k: $32 \times 32768 \times 128\,\text{KiB} \approx 137\,\text{GB}$ of cache, about 45 ms a step (and
# it does not fit in 80 GB); with the window, $32 \times 4096 \times 128\,\text{KiB} \approx 17\,\text{GB}$, about 9.4 ms, and it fits. The
# cache dominates once $\text{batch} \times \text{tokens} \times 128\,\text{KiB}$ passes the weights' 14.2 GB, about 108k tokens in the batch: past that
# a window saves *time*, not only memory. Lesson 0, section 2.
#
# </details>

# %%
# the weights a step reads, counted as lesson 0 counts them: 32 layers of P weights,
# the output head and one row of the input embedding (not the whole table), fp16
d7, d_kv7, mlp7, vocab7 = 4096, 8 * 128, 14336, 32_000
P = d7 * d7 + 2 * d7 * d_kv7 + d7 * d7 + 3 * d7 * mlp7
weights = (32 * P + vocab7 * d7 + d7) * 2   # bytes
bandwidth = 3.35e12                          # bytes/s, H100 SXM data-sheet bandwidth
print(f"weights read per step: {weights / 1e9:.1f} GB")
for batch, tokens in ((1, 4096), (32, 32768), (32, 4096)):
    kv = kv_cache_bytes(32, 8, 128, tokens, batch=batch)
    ms = (weights + kv) / bandwidth * 1e3
    print(f"batch {batch:>2}, {tokens:>5} cached tokens each: {ms:5.1f} ms per step "
          f"(cache {kv / 1e9:5.1f} GB)")

# %% [markdown]
# ### Q17. Why FlashAttention never runs
#
# **A profile of your decoder on an A100 shows SDPA running the math or memory-efficient kernel, never FlashAttention, although every step passes a correct window mask. Why, and what do you change? What would you hand FlashAttention's own `flash_attn_with_kvcache` instead of a mask?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# PyTorch's FlashAttention backend refuses any explicit `attn_mask` (`check_for_attn_mask`: "Flash
# Attention does not support non-null attn_mask"), so a masked call falls back. For one new token over a
# ring or naive cache every returned key is inside the query's window: the mask is all True, so pass none
# (the course's `needs_no_mask`). A prompt no longer than the window in a fresh cache is plain causal
# (`is_causal=True`). Chunks past the window genuinely need their band; that is where
# `flash_attn_with_kvcache` fits: `window_size=(W - 1, 0)` instead of a mask and a cache indexed by position.
# The kernel reads indices `0 … cache_seqlens − 1` and writes new keys at `cache_seqlens`, so what
# `cache_seqlens` is depends on the layout. Paged, with a `block_table` whose out-of-window entries are never
# read: tokens *seen* per row (a key's logical index is its position). A ring of `W` slots, unrotated:
# `min(seen, W)`, the keys it holds (tokens seen would run past its end; mistral-inference clamps with
# `.clamp(max=cache_size)`), the new key written by the ring itself; the window, aligned to the bottom
# right, still covers `W` keys. RoPE inside the kernel (`rotary_cos`, `rotary_sin`) happens only while the
# kernel writes new keys: it refuses the tables without a new `k` ("If rotary cos/sin are provided, new key /
# value to be appended to KV cache must also be provided", `csrc/flash_attn/flash_api.cpp`) and rotates the
# new `k` and `q` at indices `cache_seqlens, cache_seqlens + 1, …` (the docstring of `flash_attn_with_kvcache`
# in `flash_attn/flash_attn_interface.py`). A full ring has `cache_seqlens = W`: a new `k` would be written
# past its last slot and rotated at position `W`, not at its true position. So **for a ring, RoPE is applied
# outside the kernel** and the ring writes its own slot. **For a paged cache**, in-kernel RoPE works: pass the
# new `k`, `v` with `cache_seqlens` the row's length *before* the new tokens (its tokens seen), and they are
# written and rotated at their true positions; with `rotary_interleaved=False`, since the default pairs
# dimensions 0 & 1 and the course and Hugging Face pair `t` with $t + d/2$. Lessons 6 (section 5) and 7
# (section 3); a paged decode kernel written out in [lesson 11](11_fused_decode_kernel.ipynb).
#
# </details>

# %% [markdown]
# ### Q18. Batching prompts of different lengths
#
# **You batch two prompts of 100 and 70 tokens with left padding. What must the mask and the positions be? A colleague prefills with `position_ids` from the attention mask, then decodes with one position counter for the whole batch, and the short prompt's continuation goes wrong. Why, and why would one shared counter used everywhere have worked with RoPE?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# No real query may attend a pad key, and each row counts positions from its own first token
# (`attention_mask.cumsum(-1) - 1`; FlashAttention: `cache_seqlens` and `cache_leftpad` per row). The
# colleague's short row cached its keys at positions 0..69 and now rotates its queries at 100, 101, ...:
# every distance is 30 too large, and RoPE scores depend on the distance. A counter shared by prefill and
# decode shifts a row's keys and queries alike, so the distances, and the scores, are unchanged (a model
# with absolute position embeddings would still break). The pad mask is needed either way. Lesson 4,
# section 8, runs all four variants on the trained decoder.
#
# </details>

# %% [markdown]
# ### Q19. Prefix-cache hits in a hybrid model
#
# **A hybrid model has full-attention layers and sliding-window layers (Gemma 3's 5 : 1 stack), served with prefix caching. A new request shares its first 3,000 tokens with a cached one. How does vLLM decide how many tokens are a cache hit, and why can the answer be shorter than what the full-attention layers hold?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# Each kind of layer keeps its own blocks (vLLM's KV cache groups) and has its own rule for a hit. Full
# attention needs *every* block of the prefix, so its hit is the longest run of cached blocks from the start
# (and any shorter prefix hits too). A sliding-window layer needs only the blocks holding the $W - 1$
# positions before the first token it computes; the older ones may long be freed. All groups must resume at
# the *same* token, so the hit is a length every group accepts. vLLM's `HybridKVCacheCoordinator`
# (`vllm/v1/core/kv_cache_coordinator.py`) puts the full-attention group first ("Put full attention first:
# its efficient left-to-right scan provides a tighter initial bound"), and `find_longest_cache_hit` finds the
# full-attention hit, then asks the sliding-window manager for the longest hit *within* that length: it
# searches from right to left for enough contiguous cached blocks to cover the window
# (`SlidingWindowManager.find_longest_cache_hit`, `vllm/v1/core/single_type_kv_cache_manager.py`). With two
# kinds of layer one pass suffices; with more, it repeats until no group shortens the length, then trims the
# full-attention blocks to it. So if the window's blocks near token 3,000 were evicted, the hit ends at the
# last block boundary where the window's blocks are all still cached, although full attention holds all
# 3,000 tokens. Lesson 12, section 3 (the sliding-window hit rule); lesson 7 (hybrid stacks and vLLM's KV
# cache groups).
#
# </details>

# %% [markdown]
# ### Q20. Speculative decoding on a sliding window
#
# **You serve Mistral 7B, a window of $W = 4096$ in every layer, with speculative decoding: $k = 5$ drafts per round, verified in one forward, on a ring-buffer cache. What must the ring keep, what does a round that rejects 3 of the 5 drafts cost, and why can a ring of exactly 4096 slots not do it?**
#
# <details class="swkv-answer"><summary><b>Answer</b> (try first)</summary>
#
# The verify writes $k + 1 = 6$ tokens, the pending one and the 5 drafts, at positions $n \dots n + 5$, in one
# forward (a chunk: each query masked to its own window). A ring of $S$ slots writes position $p$ into slot
# $p \bmod S$. With $S = W = 4096$, the token at $n + i$ lands on the key of $n + i - 4096$. Keep $a$ drafts and the
# next query sits at $n + a + 1$ and needs keys $j > n + a + 1 - 4096$: every rejected token with $i \ge a + 2$ has
# overwritten one of them. Rejecting 3 of 5 ($a = 2$), the tokens at $n + 4$ and $n + 5$ destroyed the keys of
# $n - 4092$ and $n - 4091$, which nothing can restore short of recomputing those positions in every layer; a plain
# ring can take back one token at most. So the ring needs spare slots. With $W + k - 1 = 4100$, the token at $n + i$
# lands on $n + i - 4100$, needed only if $i > a + 5$: never, since $i \le 5$. The course's ring keeps one more,
# **$W + k = 4101$ slots**, because its verify writes the 6 keys in place *before* reading them (no gather, no
# copy): the last draft, at $n + 5$, must then not land on $n - 4095$, which the verify's first query reads. The
# rejection costs a counter: `seen` goes back by 3, no tensor is copied, and the stale slots are masked. In
# memory, 5 more slots per layer: $5 \times 128\,\text{KiB} = 640\,\text{KiB}$ per sequence beside the window's
# 512 MiB. In time, the verify cost about one decode step whatever was rejected (memory-bound: 6 tokens read the same
# bytes as one), and the round still emits $a + 1 = 3$ tokens, the 2 kept drafts and the model's correction, for one
# verify and 5 draft steps: a rejection wastes arithmetic and draft work, not memory traffic. transformers'
# `DynamicSlidingWindowLayer` gets there by keeping $W - 1 + k + 1$ states while recording and cropping them (a copy
# of the window every forward); its static layer cannot roll back past the window; vLLM writes drafts to fresh paged
# slots, rolls back `num_computed_tokens`, and frees a window's blocks only on settled tokens. Lesson 13, sections 1,
# 3 and 6.
#
# </details>

# %%
# check the answer on real rings: keys are their own positions, n = 5000 tokens seen
def rejected_three(lookahead, W=4096, n=5000, k=5, kept=2):
    ring = RingBufferKVCache(W, lookahead=lookahead)
    pos = torch.arange(n + k + 1, dtype=torch.float32).view(1, 1, -1, 1)
    ring.update(pos[:, :, :n], pos[:, :, :n])
    ring.update(pos[:, :, n:], pos[:, :, n:])  # the verify: pending + 5 drafts
    held = set(ring.k_buf.flatten().int().tolist())
    # the stored keys the next query (at n + kept + 1) attends
    needed = set(range(n + kept + 1 - W + 1, n + kept + 1))
    try:
        ring.rollback(k - kept)
        refused = "rollback(3) done"
    except ValueError:
        refused = "rollback(3) refused"
    return ring.capacity, sorted(needed - held), refused


for lookahead in (0, 4, 5):  # 4: enough for the rollback (this update reads first)
    slots, lost, said = rejected_three(lookahead)
    print(f"{slots} slots: keys the next query needs but lost: {lost}; {said}")

# %% [markdown]
# ## Where each topic is taught
#
# * Q1, Q3, Q4, Q5, Q13, Q15: [lesson 0](00_why_cache.ipynb) (costs, bytes, hybrid stacks, forgetting).
# * Q2, Q9, Q14: [lesson 3](03_ring_buffer.ipynb); measured in [lesson 6](06_measuring.ipynb).
# * Q7 (LRU, sinks): [lesson 5](05_eviction_policies.ipynb). Q10, Q11: RoPE in [lesson 3](03_ring_buffer.ipynb),
#   the `len(cache)` bug and chunked prefill in [lesson 4](04_decoding_with_the_cache.ipynb).
# * Q6, Q8 (paged blocks, int8 caches): [lesson 7](07_serving_memory.ipynb); Q7 (H2O):
#   [lesson 8](08_which_tokens_to_keep.ipynb); prefix sharing: [lesson 12](12_prefix_caching.ipynb).
# * Q12: the convention's docstring in `swkv_teach/masks.py` and lesson 0's off-by-one section.
# * Q16: [lesson 0](00_why_cache.ipynb), section 2; Q17: [lesson 6](06_measuring.ipynb), section 5, [lesson 7](07_serving_memory.ipynb),
#   section 3, and the kernel of [lesson 11](11_fused_decode_kernel.ipynb); Q18:
#   [lesson 4](04_decoding_with_the_cache.ipynb), section 8; Q19: [lesson 12](12_prefix_caching.ipynb), section 3, and
#   [lesson 7](07_serving_memory.ipynb) (KV cache groups).
# * Q20: [lesson 13](13_speculative_decoding.ipynb), sections 1 (why a verify costs about one step), 3 (the ring's
#   lookahead drawn) and 6 (transformers and vLLM).
# * Building the naive cache yourself: [lesson 1](01_six_steps.ipynb) and
#   [exercise 02](../exercises/02_sliding_window_cache.ipynb).
# * All sources: [references](../docs/references.md); formulas: [cheat sheet](../docs/cheatsheet.md).
#
# ## Going further
#
# * Redo Q20 with sampling instead of greedy decoding: what decides whether a draft is kept, what is emitted after a
#   rejection, and why the text still follows the model's distribution? Then compare with lesson 13, section 4, and
#   `swkv_teach.speculative.accept_sampled`.
# * Redo Q6 for a 5 : 1 hybrid model instead of Mistral 7B: how many sequences fit, and what now
#   limits the batch?
