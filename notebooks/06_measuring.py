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
# # Lesson 6 — Measuring: time, memory, and what the update costs in a decode step
#
# **Time:** about 125 minutes for the lesson (no exercise; the going-further questions are measurements to make). **You need:** lessons 1, 3 and 4 (the naive and ring caches, the decoder).
#
# **By the end you will be able to**
#
# * time a cache update so the number means something: many calls per clock read, repeats, the
#   least disturbed repeat, CUDA events on a GPU, ratios within one run;
# * count memory two ways, held and allocated per step, and catch a view that keeps a bigger
#   storage alive;
# * say whether a faster cache makes *decoding* faster, from the update's share of a step;
# * predict what changes at serving scale;
# * measure what a KV cache saves against recomputing, and say why the ratio is far below the FLOP count
#   for short prefixes;
# * say which SDPA backend a call can use, why the decoder passes no mask for one in-window query, and
#   which `flash_attn_with_kvcache` argument each part of a ring buffer becomes.
#
# Lesson 3 argued that the ring buffer's update is O(1) while cat-and-slice is O(W). This lesson
# measures it, the way you would before claiming it in a design review:
#
# 1. **time** of one update as the window grows: a timing loop written out, then the course's
#    bench with naive, ring, and Hugging Face's own sliding-window cache layers;
# 2. **memory** over the steps of a decode: bytes held, and bytes *allocated* per step;
# 3. the update's **share** of a decode step: does a faster cache make decoding faster?
# 4. the cache against recomputing, on the clock, beside the FLOP model's prediction;
# 5. how fused attention kernels consume a cache: PyTorch's SDPA backends, what an explicit mask rules out,
#    and FlashAttention's `flash_attn_with_kvcache` mapped argument by argument onto the course's caches;
# 6. on a GPU: the same with CUDA timings and `torch.cuda.memory_allocated`.
#
# Timings depend on the machine and on whatever else it is doing, so the tests do not compare
# them, and the sentences below that quote them are computed from this run's numbers. Read ratios
# within one run, not numbers across machines. Memory counts are exact and are compared. The byte
# and FLOP formulas are on the [cheat sheet](../docs/cheatsheet.md).

# %%
# %matplotlib inline
import statistics
import time

import torch
import matplotlib.pyplot as plt

import swkv_teach
from swkv_teach import RingBufferKVCache, SlidingWindowKVCache, bench
from swkv_teach.bench.measure import AllocationCounter, bytes_held

torch.manual_seed(0)
# small tensors: one thread is as fast, and steadier on a busy machine
torch.set_num_threads(1)
plt.rcParams.update({"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 10})
DPI = 110
dev = swkv_teach.device()

# %%
# NBVAL_IGNORE_OUTPUT
print("running on", dev)

# %% [markdown]
# ## 1. Time per update against the window
#
# ### A timing loop, written out
#
# One update takes a few microseconds, about what reading the clock costs, so timing single calls
# measures the clock. Instead: fill the cache past `W` (we want the steady state, not the first
# allocation), run many updates between two clock reads, divide, and repeat a few times. On a
# shared machine other programs only ever *add* time, so the fastest repeat is the least disturbed
# one; Python's `timeit` documentation recommends the minimum for this reason (`Timer.repeat`).

# %%
def time_update_us(cache, k, v, calls, repeats=5):
    """(best, median) µs per one-token update, over `repeats` runs of `calls` each."""
    for _ in range(cache.window_size + 1):  # past the window: steady state
        cache.update(k, v)
    per_call = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            cache.update(k, v)
        per_call.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return min(per_call), statistics.median(per_call)


g = torch.Generator().manual_seed(0)
# 8 heads, head_dim 64
k, v = torch.randn(1, 8, 1, 64, generator=g), torch.randn(1, 8, 1, 64, generator=g)
mine = {}
for W in (16, 1024):
    for name, cls in (("ring", RingBufferKVCache), ("naive", SlidingWindowKVCache)):
        mine[(W, name)] = time_update_us(cls(W), k, v, calls=200)

# %%
# NBVAL_IGNORE_OUTPUT
for (W, name), (best, median) in mine.items():
    print(
        f"W={W:>5} {name:>6}: best {best:8.2f} µs, median {median:8.2f} µs per update")
print("naive / ring at W=1024 (best repeats):"
      f" {mine[(1024, 'naive')][0] / mine[(1024, 'ring')][0]:.0f}x")

# %% [markdown]
# The ring's time hardly moves from $W = 16$ to $W = 1024$; the naive cache's grows with `W`.
#
# ### The bench
#
# `swkv_teach.bench.run` does the same with more care (`swkv_teach/bench/measure.py`): it sizes
# `calls` so each repeat lasts long enough, times the subjects of one window *in turns*, repeat by
# repeat, so a burst of load hits all of them rather than one, and on CUDA brackets the calls with
# CUDA events after a `synchronize()` (the GPU runs behind Python, so a CPU clock would time the
# launches, not the work). For each window it times, with the same one-token keys and values
# `(batch 1, 8 heads, 1, head_dim 64)`:
#
# * `floor`: two `copy_` calls into slots prepared in advance, the least an in-place write can cost;
# * our `ring`, `sinks` and `naive` caches;
# * Hugging Face's `DynamicSlidingWindowLayer` and `StaticSlidingWindowLayer` (when installed);
# * one SDPA read (one query over `W` keys), for scale;
# * lesson 7's paged and int8 caches (left out of the table below; `swkv-teach bench` shows them);
# * the decode speed of a tiny Mistral: our `Decoder` with ring and naive caches, and Hugging Face's
#   `MistralForCausalLM`, same weights (section 3).
#
# `quick=True` keeps each measurement short (the cells still run for a while: every cache at four windows,
# then three decoders, once to warm up and once timed). `swkv-teach bench` runs the
# full-size version from a shell.

# %%
windows = [16, 64, 256, 1024]
opts = dict(quick=True, device=dev, threads=1, progress=False)
# a first, discarded run warms every path up: the first decode timed in a fresh kernel
# (Hugging Face's above all) is slower than the rest, and set the smallest window apart
_ = bench.run(windows=windows[:1], repeats=1, **opts)

# %%
result = bench.run(windows=windows, repeats=7, **opts)
rows = {(r["window"], r["cache"]): r for r in result["updates"]}
# µs per update, least disturbed repeat
best = {key: r["us"]["min"] for key, r in rows.items()}

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'W':>5}  {'cache':<31}{'best µs':>9}{'median µs':>11}{'×ring':>8}{'held':>10}"
      f"{'alloc/step':>12}")
# lesson 7 covers the rest
shown = ("floor", "ring", "sinks", "naive", "hf_dynamic_sliding", "hf_static_sliding")
for r in (r for r in result["updates"] if r["cache"] in shown):
    W, name = r["window"], r["cache"]
    ratio = best[(W, name)] / best[(W, "ring")]
    print(f"{W:>5}  {r['label']:<31}{best[(W, name)]:>9.2f}{r['us']['median']:>11.2f}"
          f"{ratio:>8.1f}{r['bytes_held'] / 1024:>8,.0f} K"
          f"{r['bytes_per_step'] / 1024:>10,.0f} K")
for note in result["notes"]:
    print("note:", note)

# %% [markdown]
# Columns: µs per update (best repeat and median), ×ring (ratio to the ring's best, same run),
# `held` (KiB the cache keeps) and `alloc/step` (KiB it allocates per update, section 2). Byte counts
# are exact, so they can be checked:

# %%
ring_rows = [r for r in result["updates"] if r["cache"] == "ring"]
print("the ring allocates nothing per step, at every window:",
      all(r["bytes_per_step"] == 0 for r in ring_rows))
print("the ring holds exactly 2·B·H·W·D·4 bytes:",
      all(r["bytes_held"] == 2 * 1 * 8 * r["window"] * 64 * 4 for r in ring_rows))
print(
    "the naive cache allocates W + 1 tokens of k and v per step:",
    all(rows[(W, "naive")]["bytes_per_step"] == 2 * 8 * (W + 1) * 64 * 4
        for W in windows))

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(6.8, 3.8), dpi=DPI)
styles = {
    "naive": ("#D62728", "o"),
    "ring": ("#4C72B0", "o"),
    "floor": ("#999999", "."),
    "hf_dynamic_sliding": ("#2CA02C", "s"),
    "hf_static_sliding": ("#9467BD", "s")
}
for name, (color, marker) in styles.items():
    if (windows[0], name) in rows:
        ax.plot(windows, [best[(W, name)] for W in windows], marker=marker, color=color,
                label=rows[(windows[0], name)]["label"])
ax.set(xscale="log", yscale="log", xlabel="window W (tokens)",
       ylabel="µs per update (best repeat)",
       title=f"Cache update time, 8 heads × head_dim 64, float32, {dev.type}")
ax.set_xticks(windows, [str(w) for w in windows])
ax.legend(fontsize=9, loc="upper left")
ax.grid(alpha=0.3, which="both")
fig.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# The figure plots each cache's best time per update against the window, both axes logarithmic.

# %% [markdown]
# What to look for (your numbers will differ, the shapes should not):
#
# * **ring** stays within a small factor of **floor** at every window: two small copies, whatever
#   `W` is.
# * **naive** climbs with `W`: every update copies the whole window (`torch.cat`).
# * Hugging Face's **dynamic** layer concatenates too and grows like naive. Its **static** layer
#   preallocates, but once full it `roll`s the whole window by one token into a new tensor and
#   copies that back (`StaticSlidingWindowLayer.update` in transformers 5.25.0, `cache_utils.py` line 524, the roll at line 575):
#   two O(W) passes per token, so it grows with `W` as well.
#
# `transformers` missing? Those rows are simply absent, and a note says so.

# %% [markdown]
# ## 2. Memory over the steps of a decode
#
# Memory comes in two kinds: what the cache **holds** between steps, and what each step
# **allocates** (fresh memory the allocator must find, fill and later free). We decode 48 tokens
# through a naive and a ring cache ($W = 16$, 2 heads, head_dim 16, float32, so one token's key
# is 128 bytes) on the CPU, where counting is exact, and record after each step:
#
# * `cache.nbytes`: what the cache says it holds;
# * `bytes_held(...)` from the bench: the bytes of the *storages* behind its tensors. A view keeps
#   its whole storage alive, which `nbytes` does not see;
# * bytes allocated by the update, counted by the bench's `AllocationCounter` (a PyTorch dispatch
#   mode that adds up every storage an operation creates). It is short enough to read: every
#   operation runs through `__torch_dispatch__`, and an output whose storage is none of its inputs'
#   is new memory (`copy_` into a slot and views reuse storage and count 0; `cat` counts its result).

# %%
# NBVAL_IGNORE_OUTPUT
import inspect

print(inspect.getsource(AllocationCounter))

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

print(
    f"{'step':>4} | {'naive nbytes':>12} {'held':>6} {'alloc':>6} | {'ring nbytes':>11}"
    f" {'held':>6} {'alloc':>6}")
for t in (1, 2, 8, 16, 17, 32, 48):
    n, r = memory["naive"], memory["ring"]
    print(f"{t:>4} | {n['nbytes'][t - 1]:>12} {n['held'][t - 1]:>6}"
          f" {n['alloc'][t - 1]:>6} | {r['nbytes'][t - 1]:>11} {r['held'][t - 1]:>6}"
          f" {r['alloc'][t - 1]:>6}")
total = {name: sum(m["alloc"]) for name, m in memory.items()}
print(f"allocated over {steps} steps: naive {total['naive']:,} B, ring"
      f" {total['ring']:,} B")

# %% [markdown]
# Reading the table:
#
# * Both caches stop growing at $W = 16$ tokens. One token's key is $2\,\text{heads} \times 16\,\text{dims} \times 4\,\text{B} = 128\,\text{B}$,
#   so 16 tokens of keys and values are $2 \times 16 \times 128 = 4096\ \text{B}$.
# * The **ring** allocates once, on the first step: its 4096 B of buffers (both, zeros) plus a 128 B index of
#   slot numbers it uses to report positions. Never again after that.
# * The **naive** cache allocates at every step: the `torch.cat` result, $W + 1$ tokens of keys and
#   values (4352 B) once full. Over 48 steps it has allocated far more than it ever holds.
# * And it holds more than it says: its `k` is a view of the last `W` tokens of a $W + 1$-token
#   `cat` result, so the storage behind it is 4352 B while `nbytes` counts 4096.

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(6.8, 3.4), dpi=DPI)
x = range(1, steps + 1)
for name, color in (("naive", "#D62728"), ("ring", "#4C72B0")):
    cumulative = [sum(memory[name]["alloc"][: t + 1]) / 1024 for t in range(steps)]
    ax.plot(x, cumulative, color=color, label=name)
ax.axvline(W, color="grey", lw=1, linestyle="--")
ax.set(xlabel="tokens decoded", ylabel="KiB allocated so far", ylim=(0, None),
       title=f"Allocated since the start: the naive cache keeps paying (W={W})")
ax.legend(loc="upper left")
ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# In the figure, the naive cache's allocations climb at every step; the ring's line is flat after its first
# step.

# %% [markdown]
# Why care about allocations if the memory is freed again right away? On a GPU, PyTorch's caching
# allocator usually hands the same block back, so it is cheap, but the copy into it is not; with
# many sequences of different lengths in one server, blocks of every size fragment the pool. A
# cache that allocates nothing after its first step has a memory footprint you can compute before
# you start: $2 \times \text{layers} \times \text{kv heads} \times W \times \text{head dim} \times \text{itemsize}$ per sequence.
#
# ## 3. The update's share of a decode step
#
# A faster update matters only if the update is a noticeable part of a step. The bench gives two
# views.
#
# **Against one attention read.** `update / (update + SDPA read)`: the cache's work compared with
# the attention it feeds, for one layer (best repeats).

# %%
# NBVAL_IGNORE_OUTPUT
read = {r["window"]: r["us"]["min"] for r in result["attention"]}
share = {
    (W, name): best[(W, name)] / (best[(W, name)] + read[W])
    for W in windows
    for name in ("naive", "ring")
}
print(f"{'W':>5} {'naive':>7} {'ring':>7}   (update / (update + SDPA read of W keys))")
for W in windows:
    print(f"{W:>5} {share[(W, 'naive')]:>7.0%} {share[(W, 'ring')]:>7.0%}")

# %% [markdown]
# The naive update is a large share of one layer's work at every window: both it and the read are
# O(W), and the copy reads and writes the whole window. The ring's share shrinks as `W` grows,
# since its cost stays flat while the read's grows.
#
# **Against a whole decode step of a model.** The bench also decodes with a tiny Mistral
# (2 layers, hidden size 64, 4 heads, 2 kv heads of 16 dims) through our `Decoder` with each cache,
# and through Hugging Face's model with its own cache, same weights. A decode step updates one cache
# per layer; the rest is embedding, projections, norms, MLP, the head, and Python.

# %%
# NBVAL_IGNORE_OUTPUT
if not result["decode"]:
    print("decode comparison skipped:", "; ".join(result["notes"]))
else:
    tok_us = {
        (r["window"], r["impl"]): r["us_per_token"]["min"]
        for r in result["decode"]
    }
    print(f"{'W':>5} {'ring':>9} {'naive':>9} {'HF':>9}  same tokens as HF")
    print(f"{'':>5} {'µs per token (best repeat)':^29}")
    for W in windows:
        same = all(r["same_tokens"] for r in result["decode"] if r["window"] == W)
        ring_, naive_, hf_ = (tok_us[(W, impl)]
                              for impl in ("swkv_ring", "swkv_naive", "hf_mistral"))
        print(f"{W:>5} {ring_:>9.0f} {naive_:>9.0f} {hf_:>9.0f}  {same}")
    step_ratio = {
        W: tok_us[(W, "swkv_naive")] / tok_us[(W, "swkv_ring")]
        for W in windows
    }
    hf_ratio = {
        W: tok_us[(W, "hf_mistral")] / tok_us[(W, "swkv_ring")]
        for W in windows
    }
    update_ratio = best[(windows[-1], "naive")] / best[(windows[-1], "ring")]
    widest = max(windows, key=lambda W: abs(step_ratio[W] - 1))
    slowest = all(
        tok_us[(W, "hf_mistral")] > max(tok_us[(W,
                                                "swkv_ring")], tok_us[(W,
                                                                       "swkv_naive")])
        for W in windows)
    print("\nIn this run, per token:")
    print("  naive / ring:",
          ", ".join(f"{step_ratio[W]:.2f} at W={W}" for W in windows))
    print(f"  the farthest from 1 at W={widest}; one update alone differs"
          f" {update_ratio:.0f}x at W={windows[-1]}")
    print("  Hugging Face / ring:",
          ", ".join(f"{hf_ratio[W]:.1f}x at W={W}" for W in windows))
    print(
        f"  Hugging Face's model was {'the slowest' if slowest else 'not the slowest'}"
        " of the three at every window")

# %%
# NBVAL_IGNORE_OUTPUT
if result["decode"]:
    fig, ax = plt.subplots(figsize=(6.8, 3.4), dpi=DPI)
    impls = (("swkv_ring", "ours, ring", "#4C72B0"),
             ("swkv_naive", "ours, naive", "#D62728"), ("hf_mistral", "Hugging Face",
                                                        "#2CA02C"))
    width = 0.26
    for n, (impl, label, color) in enumerate(impls):
        ax.bar([i + (n - 1) * width for i in range(len(windows))],
               [tok_us[(W, impl)] for W in windows], width, color=color, label=label)
    ax.set_xticks(range(len(windows)), [f"W={W}" for W in windows])
    ax.set(ylabel="µs per token (best repeat)", ylim=(0, None),
           title="A whole decode step of a tiny model: the cache hardly shows")
    ax.legend(loc="upper left", ncol=3)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    plt.show()
    plt.close(fig)

# %% [markdown]
# The bars give the time per decoded token at each window: our decoder with the ring and with the naive
# cache, and Hugging Face's model.

# %% [markdown]
# The honest reading (the numbers are in the sentences printed above, from this run):
#
# * Against the attention read, the naive update is a large share of the work; the ring's is small.
# * Against a whole step of a tiny model, the update is a small part of the work: a 2-layer model with 64
#   hidden units spends its time in Python and in launching a few dozen small operations. So the naive
#   cache's extra copies, which grow with $W$, compete with everything else that moves a step's time,
#   above all the load on the machine while each window ran: the printed ratios say how far apart ring
#   and naive were in this run, and at which window they were farthest apart. A ratio far from 1 at a
#   window where the update table shows little difference is that load, not the cache; rerun the cell
#   and read the ratios again. Hugging Face's model, with its more general cache and mask machinery, is
#   the third bar; its ratio to our ring is printed per window.
# * At serving scale the picture changes. Mistral 7B (32 layers, 8 kv heads of 128 dims, float16,
#   $W = 4096$) holds 16 MiB of keys and values per layer per sequence, and the naive cache copies
#   all of it at every token: 512 MiB read and written per token per sequence, pure overhead on top of
#   the weights, growing with `W` and with the batch. That is where the ring buffer pays off.
#
# Measure before optimising, and measure at the size you will run.

# %% [markdown]
# ## 4. The cache against recomputing: a measured speed-up
#
# Lesson 0 counted the work: without a cache, step `t` reruns the model over all $t + 1$ tokens. Here is
# the clock. The trained decoder of lesson 4 (3 layers, `dim` 96, window 64) produces the token after a
# prefix of `t` tokens in two ways: one `step` through ring caches already holding the prefix, or a full
# forward over the $t + 1$ tokens, as a model without a cache must. Beside the measured ratio, the FLOP
# model of lesson 0 with this model's sizes: per layer `2P` per token of dense work (`P` its parameters),
# $4 \cdot d$ per (query, key) pair of attention (the forward's masked matmul scores all $(t+1)^2$ pairs), and the
# output head. Only ratios are printed: the absolute times are your machine's.

# %%
from swkv_teach.pretrained import load_pretrained

model, tok = load_pretrained(dev)
cfg = model.config
# weights one token passes through per layer
P_layer = sum(p.numel() for p in model.layers[0].parameters())
d_attn = cfg.n_heads * cfg.head_dim
head = cfg.dim * cfg.vocab_size


def step_flops(t, cached):
    """Lesson 0's count for the token after a prefix of t: one cached step, or a forward
    over t + 1 tokens."""
    n = t + 1
    if cached:
        return (cfg.n_layers * (2 * P_layer + 4 * min(n, cfg.window_size) * d_attn) +
                2 * head)
    return cfg.n_layers * (2 * P_layer * n + 4 * n * n * d_attn) + 2 * head * n


def sync():
    # GPU work is asynchronous
    if dev.type == "cuda":
        torch.cuda.synchronize()


try:
    import resource  # Unix only; Windows has none
except ImportError:
    resource = None
# RUSAGE_THREAD (Linux) counts this thread alone; RUSAGE_SELF would add every thread of
# the
# kernel (its heartbeat and messaging threads are preempted too, while the forward runs
# fine)
WHO = getattr(resource, "RUSAGE_THREAD", None)


def switches():
    """Involuntary context switches of this thread so far (0 where the OS cannot say).
    """
    return resource.getrusage(WHO).ru_nivcsw if WHO is not None else 0


def timed(fn):
    """(wall seconds, thread CPU seconds, preempted?) of one call of fn.

    One torch thread (set at the top) runs the forward in this Python thread, so the
    thread's
    CPU time counts the forward's work and not the time it waited while the OS ran
    others.
    """
    sync()
    before, cpu0, t0 = switches(), time.thread_time_ns(), time.perf_counter_ns()
    fn()
    sync()
    wall, cpu = time.perf_counter_ns() - t0, time.thread_time_ns() - cpu0
    return wall / 1e9, cpu / 1e9, switches() > before


ids = torch.randint(0, cfg.vocab_size, (1, 1040),
                    generator=torch.Generator().manual_seed(0))
ids = ids.to(dev)
lengths = [1, 4, 16, 64, 128, 256, 512, 1024]
rounds = 5
INF = float("inf")
wall = {"cached": {}, "recompute": {}}  # least wall-clock time per length
cpu = {"cached": {}, "recompute": {}}  # least thread CPU time per length
caches, clean = {}, {t: 0 for t in lengths}  # clean: forwards never preempted
with torch.no_grad():
    for t in lengths:
        caches[t] = model.new_caches("ring")
        model.step(ids[:, :t], caches[t])  # the prefix, as one chunk
    # round robin: a burst of load slows one round of every length, not every round of
    # one
    for r in range(rounds):
        for t in lengths:
            p = t + 2 * r
            # position p untimed (it warms up after the previous length's big forward)
            model.step(ids[:, p:p + 1], caches[t])
            runs_ = {
                "cached": timed(lambda: model.step(ids[:, p + 1:p + 2], caches[t])),
                "recompute": timed(lambda: model(ids[:, :t + 1]))
            }
            for how, (w, c, preempted) in runs_.items():
                wall[how][t] = min(wall[how].get(t, INF), w)
                cpu[how][t] = min(cpu[how].get(t, INF), c)
            clean[t] += not runs_["recompute"][2]
speedup = {t: wall["recompute"][t] / wall["cached"][t] for t in lengths}
speedup_cpu = {t: cpu["recompute"][t] / cpu["cached"][t] for t in lengths}

# %%
# NBVAL_IGNORE_OUTPUT
flop_ratio = {t: step_flops(t, False) / step_flops(t, True) for t in lengths}
print(f"{'prefix t':>8} {'FLOPs':>8} {'thread CPU':>11} {'wall clock':>11}"
      f" {'not preempted':>14}")
print(f"{'':>8} {'recompute / cached step':^32}")
for t in lengths:
    print(f"{t:>8} {flop_ratio[t]:>8.1f} {speedup_cpu[t]:>11.1f} {speedup[t]:>11.1f} "
          f"{clean[t]:>9} of {rounds}")
rising = all(speedup_cpu[a] < speedup_cpu[b] for a, b in zip(lengths[2:], lengths[3:]))
gap = max(lengths, key=lambda t: wall["recompute"][t] / cpu["recompute"][t])
ratio_at_gap = wall["recompute"][gap] / cpu["recompute"][gap]
fast, share = speedup_cpu[1024], speedup_cpu[1024] / flop_ratio[1024]
lines = [
    f"In this run, on thread CPU time, the cache is {fast:.0f}x faster at t = 1024,",
    f"{share:.0%} of what the FLOPs predict; from t = 16 on, the CPU-time ratio "
    f"{'rises' if rising else 'does not rise'} at every length.",
    f"The recompute's wall clock exceeds its CPU time most at t = {gap} "
    f"({ratio_at_gap:.2f}x):",
    "time spent waiting, not computing.",
]
if WHO is None:
    lines.append("(preemptions not counted: no RUSAGE_THREAD on this system)")
else:
    always = [t for t in lengths if clean[t] == 0]
    lines.append(f"Every forward was preempted at t = {always}." if always else
                 "Every length had at least one forward that was not preempted.")
print("\n".join(lines))

# %%
print(
    "the FLOP model: recomputing costs more than t + 1 cached steps' worth at every t:",
    all(flop_ratio[t] >= t + 1 for t in lengths))
print("it predicts the recompute's attention overtakes its dense work at t + 1 = P /"
      f" (2d) = {P_layer / (2 * d_attn):.0f}")

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(6.6, 3.8), dpi=DPI)
ax.plot(lengths, [flop_ratio[t] for t in lengths], "k--", marker="s",
        label="FLOPs (lesson 0)")
ax.plot(lengths, [speedup_cpu[t] for t in lengths], color="#4C72B0", marker="o",
        label="measured, thread CPU time")
ax.plot(lengths, [speedup[t] for t in lengths], color="#DD8452", marker=".", lw=1,
        label="measured, wall clock")
ax.axhline(1, color="grey", lw=1)
ax.axvline(cfg.window_size, color="#D62728", lw=1, linestyle=":")
ax.text(cfg.window_size * 1.1, 1.5, f"t = W = {cfg.window_size}", color="#D62728")
ax.set(xscale="log", yscale="log", xlabel="prefix length t (tokens)",
       ylabel="recompute / cached step",
       title="How much faster the cache makes one decode step")
ax.legend(loc="upper left")
ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# The figure puts the two measured ratios beside the FLOP model's: the blue line counts only the time
# the thread ran, the orange one the clock on the wall, so where orange leaves blue the forward waited.
#
# What it shows (the sentences printed above give this run's numbers):
#
# * **For short prefixes the cache buys little.** The FLOP model says a forward over 5 tokens is 5 times
#   a cached step; the measured ratios of the table's first rows stay far below the FLOP column. A step of this tiny model is a few hundred
#   microseconds of Python and small-kernel launches, and a few more rows of arithmetic hide inside that
#   fixed cost.
# * **For long prefixes the ratio grows with the FLOP ratio, well below it.** The cached step stays flat
#   (a window of 64 keys), the recompute grows linearly, then faster past the $t + 1 = P / (2d)$ where
#   the FLOP model predicts that its attention (all $(t+1)^2$ pairs scored, then masked) overtakes its
#   dense work.
# * **Two clocks, because the machine is shared.** On a machine with more runnable programs than cores,
#   the operating system runs each for a slice of a few milliseconds, then hands the core to another. A
#   forward longer than a slice is likely to be interrupted, and the wall clock then counts the wait.
#   `time.thread_time_ns()` counts only the time this thread ran (one torch thread runs the forward in
#   it), so a wait does not add to it: it is the measurement to read here, and the wall clock is what a
#   user would see. The table's last column counts the forwards of each length that ran without an
#   involuntary context switch of this thread (`resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw`;
#   `RUSAGE_SELF` would count every thread of the kernel, its heartbeat and messaging threads included).
#   Thread CPU time is not free of the load either: another program sharing the core's caches slows the
#   thread while it runs, so read the trend over lengths, and rerun before believing a single point.
#
# On a GPU and a real model the short-prefix story has a second reason, lesson 0's bandwidth: a forward
# over `n` tokens reads every weight once, like a one-token step, and does `n` times the arithmetic. Until
# that arithmetic catches up with the reading, at
# $n \approx \text{peak FLOP/s} \div \text{bandwidth} \div (1\,\text{FLOP per weight byte per token in fp16})$,
# about 300 tokens on an H100 SXM (989 dense fp16 TFLOP/s over 3.35 TB/s, its data
# sheet), recomputing a short prefix costs about as much as one cached step. The cache's win is a
# long-context win.
#
# ## 5. How fused kernels consume a cache
#
# The decoder never computes attention itself: it calls PyTorch's `scaled_dot_product_attention` (SDPA),
# which dispatches to one of several **backends**. `torch.nn.attention.sdpa_kernel` restricts the choice to
# the backends you name, so you can ask which ones accept a given call. Below: one decoding query over a
# full window of 64 keys, with and without an explicit mask (all True: a one-token update of a ring holds
# only keys inside the query's window).

# %%
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from swkv_teach import window_mask
from swkv_teach.model import needs_no_mask

dtype = torch.float16 if dev.type == "cuda" else torch.float32
# one query, 4 heads (the decoder's)
q1 = torch.randn(1, 4, 1, 24, device=dev, dtype=dtype)
k64, v64 = (torch.randn(1, 4, 64, 24, device=dev, dtype=dtype) for _ in range(2))
ring = RingBufferKVCache(64)
# 100 tokens through a window of 64
for p in range(100):
    ring.update(k64[:, :2, :1], v64[:, :2, :1])
# query 99 over the ring's keys
mask = window_mask([99], ring.positions, 64).to(dev)
print("the window mask of one query over a one-token ring update is all True:",
      bool(mask.all()))
print("so the decoder's needs_no_mask says:",
      needs_no_mask(ring, tokens=1, window_size=64, num_sinks=0),
      "| for a chunk of 3 tokens:",
      needs_no_mask(ring, tokens=3, window_size=64, num_sinks=0))

# %%
# NBVAL_IGNORE_OUTPUT
def runs(backend, attn_mask):
    try:
        with sdpa_kernel(backend):
            F.scaled_dot_product_attention(q1, k64, v64, attn_mask=attn_mask)
        return "runs"
    except RuntimeError:
        return "refused"


print(f"\nbackends on {dev.type}:      no mask    explicit mask")
for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
    print(f"  {backend.name:<22} {runs(backend, None):>9}    {runs(backend, mask):>9}")

# %% [markdown]
# Read the table for your device (this notebook's stored output is a CPU's):
#
# * **On a CPU**, two backends exist: a flash-style CPU kernel and `MATH` (plain matmuls and softmax, which
#   accept anything); the CUDA-only ones are refused. The CPU flash kernel takes a mask.
# * **On a CUDA GPU** the FlashAttention backend refuses *any* explicit mask: `check_for_attn_mask` in
#   PyTorch's `aten/src/ATen/native/transformers/sdp_utils_cpp.h` (line 260 in torch 2.13.0) returns false
#   with "Flash Attention does not support non-null attn_mask". A masked call falls back to the
#   memory-efficient kernel or to `MATH`. Only `is_causal=True`, or no mask at all, keeps FlashAttention.
#
# That is why the decoder passes **no mask** for one new token over a ring or naive cache
# (`needs_no_mask` in `swkv_teach/model.py`): every key such a cache returns is inside the query's window, the
# mask would be all True, and building it would only rule out the fastest kernel. A chunk of queries needs
# a real mask (each query has its own window), so chunks are masked; so is the no-cache forward past `W`
# (on a CPU that mask costs section 4's forward little). `tests/test_fast_path.py` holds both paths to the oracle.
#
# ### FlashAttention's own cache API, argument by argument
#
# FlashAttention does not need SDPA's mask at all: `flash_attn_with_kvcache` takes the cache itself and the
# window as two integers. Its signature and docstring (`flash_attn/flash_attn_interface.py` in
# Dao-AILab/flash-attention at commit `0251105a`, lines 1485–1599) map onto this course's caches like this:
#
# | `flash_attn_with_kvcache` | what its docstring says (line) | ring buffer (`RingBufferKVCache`) |
# |---|---|---|
# | `q` | `(batch_size, seqlen, nheads, headdim)` (1549) | the decoder's `q` transposed: ours are `(B, heads, T, D)` |
# | `k_cache`, `v_cache` | `(batch_size_cache, seqlen_cache, nheads_k, headdim)` without a block table, `(num_blocks, page_block_size, nheads_k, headdim)` with one (1550–1554) | **no direct match**: the kernel finds key `p` at index `p` (the window rule below is written in indices), a ring keeps it in slot $p \bmod W$. A ring must be unrotated first (mistral-inference's `unrotate`), or paged |
# | `k`, `v` (optional) | new keys, written into the cache "starting at the indices specified by cache_seqlens" (1555–1557) | `None`: the ring's own `update` writes the new key (the kernel would write it at `cache_seqlens`, past a full ring's end) |
# | `cache_seqlens` | "The sequence lengths of the KV cache", `(batch_size,)` int32 (1561–1562); the kernel reads indices `0 … cache_seqlens − 1` and writes new `k`, `v` at `cache_seqlens` (1555–1557) | after `unrotate`, **`min(seen, W)`** per row: the buffer has `W` slots, so once full it holds `W` keys at indices $0 \dots W - 1$ (tokens seen would read and write past its end); mistral-inference clamps the same way (`.clamp(max=cache_size)`, `cache.py` lines 246 and 253). Write the new key yourself (the ring's `update`, then `unrotate`) and pass `k=None` |
# | `window_size` | `(left, right)`; query `i` sees keys `[i + seqlen_k - seqlen_q - window_size[0], i + seqlen_k - seqlen_q + window_size[1]]` (1542–1544, 1572): aligned to the bottom right, so the last query is the last key | $(W - 1, 0)$: with one query and `seqlen_k = min(seen, W)` keys it reads indices `seqlen_k − W … seqlen_k − 1`, every key held: the course's $i - W < j \le i$ |
# | `cache_leftpad` | "The index that the KV cache starts" per row (1567) | where a left-padded row's tokens begin (lesson 4, section 8) |
# | `rotary_cos`, `rotary_sin`, `rotary_interleaved` | rotary embedding is applied "to k and q. Only applicable if k and v are passed in" (1558–1559), at "indices cache_seqlens, cache_seqlens + 1, etc." (1516–1519); `flash_api.cpp` refuses cos/sin without a new `k` (lines 1462–1463: "If rotary cos/sin are provided, new key / value to be appended to KV cache must also be provided"); `rotary_interleaved` defaults to `True`, pairing dimensions 0 & 1, 2 & 3 (GPT-J style); `False` pairs $t$ with $t + d_{rot}/2$ (1501, 1574–1577) | **`None`: a ring applies RoPE outside the kernel.** In-kernel RoPE needs the new `k`, `v` passed, and the kernel would write them at index `cache_seqlens`, which is `W` once the ring is full: past its last slot, $W - 1$. The course's caches hold keys already rotated (lesson 3), so nothing is left for the kernel to rotate. (A layout that does pass `k` must also pass `rotary_interleaved=False`: the course and Hugging Face pair $t$ with $t + d/2$, `_rotate_half`.) |
#
# A paged cache (lesson 7) is the other layout the kernel reads: keys stay in blocks of a shared pool, found
# through a `block_table`, and a key's logical index is its position, so the kernel can write new keys
# itself and rotate them at their true positions. What `cache_seqlens` counts then depends on `k`:
#
# * `k = v = None` (the keys already written, as the course's caches do): `cache_seqlens` is the tokens seen,
#   the new ones included, and RoPE stays outside the kernel;
# * `k`, `v` passed (the only way to get in-kernel RoPE): `cache_seqlens` is the length *before* the new
#   tokens. The kernel writes `k` "starting at the indices specified by cache_seqlens" (docstring 1555–1556)
#   and reads up to `seqlens_k[b] + seqlen_knew` keys (`csrc/flash_attn/flash_api.cpp`, same commit, lines
#   1434–1435).
#
# Lesson 7, section 3, builds the first form's arguments from the library's paged cache and reads through them.
#
# ## 6. On a GPU
#
# Run this notebook on a GPU runtime (Colab: Runtime → Change runtime type → T4) and the cell below
# measures the ring and naive updates at larger windows with CUDA events, and reads
# `torch.cuda.memory_allocated()` around a cache's life: once at allocation, and during 64 decode
# steps. On a CPU it prints a note.

# %%
# NBVAL_IGNORE_OUTPUT
if not torch.cuda.is_available():
    print("No CUDA GPU here: skipped. On a GPU runtime this cell times the updates with"
          " CUDA events")
    print("and reads torch.cuda.memory_allocated().")
else:
    gpu = torch.device("cuda")
    big = bench.run(windows=[256, 4096], quick=True, device=gpu, dtype="float16",
                    decode=False, hf=False, progress=False)
    for r in big["updates"]:
        if r["cache"] in ("ring", "naive", "floor"):
            print(f"W={r['window']:>5} {r['label']:<32} {r['us']['median']:8.2f} µs  "
                  f"alloc/step {r['bytes_per_step']:>10,.0f} B")
    # one layer of a 7B-class model, float16
    W, shape = 4096, (1, 8, 1, 128)
    k = torch.randn(*shape, device=gpu, dtype=torch.float16)
    for cls in (RingBufferKVCache, SlidingWindowKVCache):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        cache = cls(W)
        prompt = torch.randn(1, 8, W, 128, device=gpu, dtype=torch.float16)
        # fill the window in one chunk
        cache.update(prompt, prompt)
        del prompt
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated() - base
        for _ in range(64):
            cache.update(k, k)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        print(f"{cls.__name__:<22} nbytes {cache.nbytes / 2**20:6.2f} MiB |"
              f" memory_allocated after fill {held / 2**20:6.2f} MiB | peak during 64"
              f" steps {peak / 2**20:6.2f} MiB")
        del cache

# %% [markdown]
# On a GPU the ring's update costs a few µs however large `W` is (mostly the launch of two tiny
# copy kernels), while the naive update's time grows with `W`. `memory_allocated` after filling
# is the ring's `nbytes` plus its position bookkeeping: an int64 slot index of `W` entries, 32 KiB
# at $W = 4096$ (and, right after a chunk, that chunk's positions, as much again). The naive
# cache's peak during decoding is about twice its size, because each `torch.cat` needs the old
# window and the new one alive at the same moment.
#
# ## What to remember
#
# * Time updates once the window is full, with many calls per clock read and several repeats; on a
#   shared machine read the least disturbed repeat, and on a GPU use CUDA events after a
#   `synchronize`.
# * Count memory two ways: held (storages, not views) and allocated per step.
# * The ring buffer: flat time in `W`, no allocation after the first step, memory known in advance.
# * Whether it matters depends on the update's share of a step: small for a toy model, large at
#   serving scale. `swkv-teach bench` (no `--quick`) measures the full-size version.
#
# ## Going further
#
# * Make the model bigger until the cache shows: time `Decoder` decoding with ring and naive caches
#   for `dim` 64, 256, 1024 and `W` 4096. At which size does the naive cache cost 10 % of a step?
# * Batch it: with 32 sequences the naive cache copies 32 windows per step. Predict the per-token
#   gap at batch 32 from the update table, then measure it.
#
# Next: [lesson 7](07_serving_memory.ipynb) takes memory to serving scale (paged blocks, 8-bit keys);
# the interview drill, [lesson 14](14_interview_drill.ipynb), comes after every lesson it asks about.
