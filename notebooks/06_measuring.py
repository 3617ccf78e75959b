# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
# ---

# %% [markdown]
# # Lesson 6 — Measuring: time, memory, and what the update costs in a decode step
#
# Lesson 3 argued that the ring buffer's update is O(1) while cat-and-slice is O(W). This lesson
# measures it, the way you would before claiming it in a design review:
#
# 1. **time** of one update as the window grows: naive, ring, and Hugging Face's own
#    sliding-window cache layers (when `transformers` is installed);
# 2. **memory** over the steps of a decode: bytes held, and bytes *allocated* per step;
# 3. the update's **share** of a decode step: does a faster cache make decoding faster?
# 4. on a GPU: the same with CUDA timings and `torch.cuda.memory_allocated`.
#
# Every number comes from `swkv_teach.bench`, the suite behind the command line
# `swkv-teach bench` (run it with no options for the full-size version). Timings depend on the
# machine and on whatever else it is doing, so the tests do not compare them; read ratios within one
# run, not numbers across machines. Memory counts are exact and are compared.

# %%
# %matplotlib inline
import torch
import matplotlib.pyplot as plt

import swkv_teach
from swkv_teach import RingBufferKVCache, SlidingWindowKVCache, bench
from swkv_teach.bench.measure import AllocationCounter, bytes_held
from swkv_teach.bench.report import table

torch.manual_seed(0)
dev = swkv_teach.device()

# %%
# NBVAL_IGNORE_OUTPUT
print("running on", dev)

# %% [markdown]
# ## 1. Time per update against the window
#
# `bench.run` builds, for each window `W`, every cache with the same one-token keys and values
# `(batch 1, 8 heads, 1, head_dim 64)`, fills it past `W`, and times single-token updates:
# median over a few repeats, each repeat many calls between two clock reads (on CUDA, between two
# CUDA events), so the clock's own cost is spread thin. Besides our caches it times
#
# * `floor`: two `copy_` calls into slots prepared in advance, the least an in-place write can cost;
# * Hugging Face's `DynamicSlidingWindowLayer` and `StaticSlidingWindowLayer` (`transformers` 5.x);
# * one SDPA read (one query over `W` keys), for scale;
# * the decode speed of a tiny Mistral: our `Decoder` with ring and naive caches, and Hugging Face's
#   `MistralForCausalLM`, same weights.
#
# `quick=True` keeps each measurement short (a few seconds in all); one thread keeps a busy machine
# from adding noise.

# %%
windows = [16, 64, 256, 1024]
result = bench.run(windows=windows, quick=True, device=dev, threads=1, progress=False)
hf_rows = any(r["cache"].startswith("hf_") for r in result["updates"])

# %%
# NBVAL_IGNORE_OUTPUT
print(table(result))

# %% [markdown]
# The same table as `swkv-teach bench --quick`. The columns: µs per update (median and range),
# `×ring` (ratio to the ring buffer's median), `% step` (the update's share of update + SDPA read,
# section 3), `held` (bytes the cache keeps) and `alloc/step` (bytes it allocates per update,
# section 2). The targets at the end are the ring buffer's goals, judged as ratios within this run.
# The plot:

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=90)
styles = {"naive": ("#D62728", "o"), "ring": ("#4C72B0", "o"), "floor": ("#999999", "."),
          "hf_dynamic_sliding": ("#2CA02C", "s"), "hf_static_sliding": ("#9467BD", "s")}
for name, (color, marker) in styles.items():
    rows = [r for r in result["updates"] if r["cache"] == name]
    if rows:
        ax.plot([r["window"] for r in rows], [r["us"]["median"] for r in rows], marker=marker, color=color,
                label=rows[0]["label"])
ax.set(xscale="log", yscale="log", xlabel="window W (tokens)", ylabel="µs per one-token update (median)",
       title=f"Cache update time, 8 heads x head_dim 64, float32, {dev.type}")
ax.set_xticks(windows, [str(w) for w in windows])
ax.legend(fontsize=7)
ax.grid(alpha=0.3, which="both")
fig.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# What to look for (your numbers will differ, the shapes should not):
#
# * **ring** stays close to **floor** at every window: two small copies, whatever `W` is.
# * **naive** climbs with `W`: every update copies the whole window (`torch.cat`). At small windows
#   it can even beat the ring, because then the copy is tiny and the fixed cost of a few Python
#   calls dominates both.
# * Hugging Face's **dynamic** layer concatenates too and grows like naive. Its **static** layer
#   preallocates, but once full it `roll`s the whole window by one token into a new tensor and
#   copies that back (`StaticSlidingWindowLayer.update` in transformers 5.24): two O(W) passes per
#   token, so it grows with `W` as well.
#
# `transformers` missing? Those rows are simply absent, and the table's notes say so.
#
# ## 2. Memory over the steps of a decode
#
# Memory comes in two kinds: what the cache **holds** between steps, and what each step
# **allocates** (fresh memory the allocator must find, fill and later free). We decode 48 tokens
# through a naive and a ring cache (`W = 16`, 2 heads, head_dim 16, float32, so one token's key
# is 128 bytes) on the CPU, where counting is exact, and record after each step:
#
# * `cache.nbytes`: what the cache says it holds;
# * `bytes_held(...)` from the bench: the bytes of the *storages* behind its tensors. A view keeps
#   its whole storage alive, which `nbytes` does not see;
# * bytes allocated by the update, counted by the bench's `AllocationCounter` (a PyTorch dispatch
#   mode that adds up every storage an operation creates).

# %%
W, steps = 16, 48
g = torch.Generator().manual_seed(0)
caches = {"naive": SlidingWindowKVCache(W), "ring": RingBufferKVCache(W)}
tensors = {"naive": lambda c: (c.k, c.v), "ring": lambda c: (c.k_buf, c.v_buf)}
memory = {name: {"nbytes": [], "held": [], "alloc": []} for name in caches}
for t in range(steps):
    k, v = torch.randn(1, 2, 1, 16, generator=g), torch.randn(1, 2, 1, 16, generator=g)
    for name, cache in caches.items():
        with AllocationCounter() as counter:
            cache.update(k, v)
        memory[name]["nbytes"].append(cache.nbytes)
        memory[name]["held"].append(bytes_held(tensors[name](cache)))
        memory[name]["alloc"].append(counter.bytes)

print(f"{'step':>4} | {'naive nbytes':>12} {'held':>6} {'alloc':>6} | {'ring nbytes':>11} {'held':>6} {'alloc':>6}")
for t in (1, 2, 8, 16, 17, 32, 48):
    n, r = memory["naive"], memory["ring"]
    print(f"{t:>4} | {n['nbytes'][t - 1]:>12} {n['held'][t - 1]:>6} {n['alloc'][t - 1]:>6} | "
          f"{r['nbytes'][t - 1]:>11} {r['held'][t - 1]:>6} {r['alloc'][t - 1]:>6}")
total = {name: sum(m["alloc"]) for name, m in memory.items()}
print(f"allocated over {steps} steps: naive {total['naive']:,} B, ring {total['ring']:,} B")

# %% [markdown]
# Reading the table:
#
# * Both caches stop growing at `W = 16` tokens. One token's key is `2 heads × 16 dims × 4 B = 128 B`,
#   so 16 tokens of keys and values are `2 × 16 × 128 = 4096 B`.
# * The **ring** allocates once, on the first step: its 4096 B of buffers (both, zeros) plus a 128 B index of
#   slot numbers it uses to report positions. Never again after that.
# * The **naive** cache allocates at every step: the `torch.cat` result, `W + 1` tokens of keys and
#   values (4352 B) once full. Over 48 steps it has allocated far more than it ever holds.
# * And it holds more than it says: its `k` is a view of the last `W` tokens of a `W + 1`-token
#   `cat` result, so the storage behind it is 4352 B while `nbytes` counts 4096.

# %%
# NBVAL_IGNORE_OUTPUT
fig, (left, right) = plt.subplots(1, 2, figsize=(8.4, 3), dpi=90)
x = range(1, steps + 1)
for name, color in (("naive", "#D62728"), ("ring", "#4C72B0")):
    left.plot(x, memory[name]["held"], color=color, label=f"{name}: held")
    left.plot(x, memory[name]["nbytes"], color=color, linestyle=":", lw=2.5, zorder=3, label=f"{name}: nbytes")
    right.step(x, memory[name]["alloc"], where="mid", color=color, label=name)
left.axvline(W, color="grey", lw=1, linestyle="--")
right.axvline(W, color="grey", lw=1, linestyle="--")
left.set(xlabel="tokens seen", ylabel="bytes", title=f"held by the cache (W={W})", ylim=(0, 4800))
right.set(xlabel="tokens seen", ylabel="bytes allocated by this update", title="allocated per step")
left.legend(fontsize=7)
right.legend(fontsize=7)
for ax in (left, right):
    ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# Why care about allocations if the memory is freed again right away? On a GPU, PyTorch's caching
# allocator usually hands the same block back, so it is cheap, but the copy into it is not; with
# many sequences of different lengths in one server, blocks of every size fragment the pool. A
# cache that allocates nothing after its first step has a memory footprint you can compute before
# you start: `2 × layers × kv_heads × W × head_dim × itemsize` per sequence.
#
# ## 3. The update's share of a decode step
#
# A faster update matters only if the update is a noticeable part of a step. The bench gives two
# views.
#
# **Against one attention read.** `% step` is `update / (update + SDPA read)`: the cache's work
# compared with the attention it feeds, for one layer.

# %%
# NBVAL_IGNORE_OUTPUT
share = {(r["window"], r["cache"]): r["share_of_step"] for r in result["updates"]}
print(f"{'W':>5} {'naive':>7} {'ring':>7}   (update / (update + SDPA read of W keys))")
for w in windows:
    print(f"{w:>5} {share[(w, 'naive')]:>7.0%} {share[(w, 'ring')]:>7.0%}")

# %% [markdown]
# **Against a whole decode step of a model.** The bench also decodes with a tiny Mistral
# (2 layers, hidden size 64, 4 heads, 2 kv heads of 16 dims) through our `Decoder` with each cache,
# and through Hugging Face's model with its own cache, same weights. A decode step updates one cache
# per layer; the rest is embedding, projections, norms, MLP, the head, and Python.

# %%
# NBVAL_IGNORE_OUTPUT
if not result["decode"]:
    print("decode comparison skipped:", "; ".join(result["notes"]))
else:
    us = {(r["window"], r["impl"]): r["us_per_token"]["median"] for r in result["decode"]}
    print(f"{'W':>5} {'ring µs/token':>14} {'naive µs/token':>15} {'HF µs/token':>12}  same tokens as HF")
    for w in windows:
        same = all(r["same_tokens"] for r in result["decode"] if r["window"] == w)
        print(f"{w:>5} {us[(w, 'swkv_ring')]:>14.0f} {us[(w, 'swkv_naive')]:>15.0f} {us[(w, 'hf_mistral')]:>12.0f}  {same}")

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(6.4, 3), dpi=90)
for name, color in (("naive", "#D62728"), ("ring", "#4C72B0")):
    ax.plot(windows, [share[(w, name)] * 100 for w in windows], marker="o", color=color, label=name)
ax.set(xscale="log", xlabel="window W (tokens)", ylabel="% of update + attention read",
       title="The cache update's share of one layer's decode work", ylim=(0, 100))
ax.set_xticks(windows, [str(w) for w in windows])
ax.legend(fontsize=8)
ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# The honest reading:
#
# * Against the attention read, the naive update is a large share of the work at every window: both
#   are O(W), and the copy reads and writes the whole window. The ring's share is small and shrinks
#   as `W` grows, since its cost stays flat while the read's grows. (On a busy machine the lines
#   wobble; the gap between them is what to read.)
# * Against a whole step of a tiny model, neither cache matters much: a 2-layer model with 64
#   hidden units spends its time in Python and in launching dozens of small operations, and
#   per-token times of ring and naive are close. Hugging Face's model pays for more bookkeeping
#   per step.
# * At serving scale the picture changes. Mistral 7B (32 layers, 8 kv heads of 128 dims, float16,
#   `W = 4096`) holds 16 MiB of keys and values per layer per sequence, and the naive cache copies
#   all of it at every token: 512 MiB read and written per token per sequence, pure overhead on top of
#   the weights, growing with `W` and with the batch. That is where the ring buffer pays off.
#
# Measure before optimising, and measure at the size you will run.
#
# ## 4. On a GPU
#
# Run this notebook on a GPU runtime (Colab: Runtime → Change runtime type → T4) and the cell below
# measures the ring and naive updates at larger windows with CUDA events, and reads
# `torch.cuda.memory_allocated()` around a cache's life: once at allocation, and during 64 decode
# steps. On a CPU it prints a note.

# %%
# NBVAL_IGNORE_OUTPUT
if not torch.cuda.is_available():
    print("No CUDA GPU here: skipped. On a GPU runtime this cell times the updates with CUDA events")
    print("and reads torch.cuda.memory_allocated().")
else:
    gpu = torch.device("cuda")
    big = bench.run(windows=[256, 4096], quick=True, device=gpu, dtype="float16", decode=False, hf=False,
                    progress=False)
    for r in big["updates"]:
        if r["cache"] in ("ring", "naive", "floor"):
            print(f"W={r['window']:>5} {r['label']:<32} {r['us']['median']:8.2f} µs  "
                  f"alloc/step {r['bytes_per_step']:>10,.0f} B")
    W, shape = 4096, (1, 8, 1, 128)                       # one layer of a 7B-class model, float16
    k = torch.randn(*shape, device=gpu, dtype=torch.float16)
    for cls in (RingBufferKVCache, SlidingWindowKVCache):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        cache = cls(W)
        prompt = torch.randn(1, 8, W, 128, device=gpu, dtype=torch.float16)
        cache.update(prompt, prompt)                       # fill the window in one chunk
        del prompt
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated() - base
        for _ in range(64):
            cache.update(k, k)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        print(f"{cls.__name__:<22} nbytes {cache.nbytes / 2**20:6.2f} MiB | memory_allocated after fill "
              f"{held / 2**20:6.2f} MiB | peak during 64 steps {peak / 2**20:6.2f} MiB")
        del cache

# %% [markdown]
# On a GPU the ring's update costs a few µs however large `W` is (mostly the launch of two tiny
# copy kernels), while the naive update's time grows with `W`. `memory_allocated` after filling
# is the ring's `nbytes` (plus a few KiB of position bookkeeping); the naive cache's peak during decoding is about twice its size,
# because each `torch.cat` needs the old window and the new one alive at the same moment.
#
# ## What to remember
#
# * Time updates once the window is full, with many calls per clock read, median of repeats, and
#   CUDA events (after a `synchronize`) on a GPU.
# * Count memory two ways: held (storages, not views) and allocated per step.
# * The ring buffer: flat time in `W`, no allocation after the first step, memory known in advance.
# * Whether it matters depends on the update's share of a step: small for a toy model, large at
#   serving scale. `swkv-teach bench` (no `--quick`) measures the full-size version.
