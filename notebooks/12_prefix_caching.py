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
# # Lesson 12 — Where LRU really lives: prefix caching, a block store on Redis, and Redis's own LRU
#
# **Time:** about 150 minutes for the lesson (installing Redis, about 5, included), plus 30–50 for [exercise 13](../exercises/13_prefix_cache_lru.ipynb), done where the lesson reaches it.
# **You need:** lesson 5 (the build guide's LRU taken apart) and lesson 7 (blocks, block tables, the scheduler).
# Sections 5 and 6 start a throwaway `redis-server` on this machine (how to install it: section 0).
#
# **By the end you will be able to**
#
# * say where an LRU belongs in a serving engine: over *freed blocks*, not over tokens, and map the build
#   guide's `OrderedDict` LRU onto vLLM's free block queue (`put` → a block freed, `get` → a hit taken out of the
#   queue, `popitem(last=False)` → eviction);
# * name a block by a hash chain, draw one, and explain why a block's hash must cover every token before it and
#   be the same in every process;
# * apply vLLM's sliding-window hit rule: only the $W - 1$ positions before the first computed token must be cached;
# * measure prefix caching on a multi-turn chat: prefill tokens computed and tokens/s with caching off, on, and
#   with a block store behind a pool too small for the conversation;
# * put that store on Redis, shared by two processes, and say what happens when Redis goes down;
# * compare an exact LRU with Redis's sampled approximation (`maxmemory-samples` 1, 5, 10) on the same block
#   accesses, and explain why Redis's clock needs a trick to be measured at all.
#
# Lesson 5 showed that the build guide's LRU is the wrong tool for a sliding window: attention needs the last
# `W` tokens, whoever read what. That leaves an impression worth correcting: real engines *do* run an LRU over
# the KV cache, one level up. vLLM's automatic prefix caching keeps the blocks a finished request leaves behind,
# named by a hash of the tokens they hold, and evicts them least recently used first when a new block is needed.
# Stores such as LMCache keep KV blocks in further tiers (CPU memory, local disk, a remote Redis) so that another
# process can skip the prefill (LMCache's `docs/source/kv_cache/storage_backends/redis.rst` at commit fe1fb2f2,
# line 9 and "Remote Storage Explanation"). And the
# build guide's roadmap asked for exactly this: its cache "can be swapped out for a Redis-backed or sharded version
# later", with "Redis Eviction Policies" in its reading list.

# %%
# %matplotlib inline
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pprint import pprint

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import FancyArrowPatch, Rectangle

import swkv_teach
from swkv_teach import LRUKVCache
from swkv_teach.bench.lru_replay import compare_lru, exact_lru_hits, prompt_block_trace
from swkv_teach.caches.prefix import (
    FreeBlockQueue,
    PrefixCache,
    block_hashes,
    find_longest_cache_hit,
)
from swkv_teach.serving import SYSTEM_PROMPT, Scheduler, serve_chat
from swkv_teach.store import (
    LocalStore,
    RedisServer,
    RedisStore,
    block_layout,
    encode_block,
)

torch.manual_seed(0)
torch.set_num_threads(1)
plt.rcParams.update({"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 10})
DPI = 110

# on the CPU: the serving runs below compare like with like
model, tok = swkv_teach.load_pretrained()
W, BS = model.config.window_size, 16
print(
    f"window W = {W}, block_size = {BS}: a block holds {BS} tokens' keys and values\n"
    f"in each of {model.config.n_layers} layers"
)

# %% [markdown]
# ## 0. Redis on this machine
#
# Sections 5 and 6 run a real `redis-server`, started by the lesson on `127.0.0.1` with no persistence, and
# stopped at the end (`swkv_teach.store.RedisServer`). Two things must be installed: the server program and the
# Python client.
#
# * **Colab / Debian / Ubuntu:** `!apt-get -qq install -y redis-server` and `!pip install redis`.
# * **macOS:** `brew install redis`; **conda:** `conda install -c conda-forge redis-server redis-py`.
# * `make lab` installs the client (the `lab` extra); the course's CI installs the server.

# %%
HAVE_REDIS = shutil.which("redis-server") is not None
try:
    import redis  # noqa: F401
except ImportError:
    HAVE_REDIS = False
print("redis-server and the redis client found:", HAVE_REDIS)
if not HAVE_REDIS:
    print(
        "sections 5 and 6 need them: see the install lines above, then restart the"
        " kernel"
    )

# %% [markdown]
# ## 1. The build guide's LRU, reborn as the free block queue
#
# A serving engine (lesson 7) hands out blocks of `BS` tokens from one pool. Without prefix caching, a finished
# request's blocks are simply free. With it, a block that holds a **full** block of a prompt keeps its keys and
# its name when its request finishes, and waits in a queue; a later request whose prompt starts with the same
# tokens takes the block back instead of computing it again. When a request needs a fresh block and none is
# empty, the queue's head, the block **freed the longest ago**, is evicted. That queue is an LRU, and it is the
# build guide's `OrderedDict` one, with three differences:
#
# | build guide (`LRUKVCache`, lesson 5) | prefix cache's free queue (`FreeBlockQueue`) | vLLM v0.33.0 |
# |---|---|---|
# | `put(id, k, v)`: the entry becomes most recent | a request frees a cached block: `append` at the tail | `BlockPool.free_blocks`, `block_pool.py:816-846` |
# | `get(id)` promotes the entry | a new request hits the block: `remove` it from the queue ("touch"); it is in use, so not evictable, and returns to the tail when freed again | `BlockPool.touch`, `block_pool.py:792-810` |
# | `popitem(last=False)`: evict the LRU entry | `allocate` with no empty block: `popleft`, and forget the block's hash | `get_new_blocks` → `_maybe_evict_cached_block`, `block_pool.py:706-790` |
# | every entry may be evicted | blocks **in use** are not in the queue at all | `FreeKVCacheBlockQueue`, `kv_cache_utils.py:258-274` |
# | `max_size` entries | the blocks no request holds | |
#
# vLLM's queue is a doubly linked list through the blocks themselves, so that `remove` from the middle is O(1)
# without allocating (`kv_cache_utils.py:259-265`); an `OrderedDict` gives the same three operations in O(1).
# One more rule: when a request finishes, its blocks are freed **last first** ("Free blocks in reverse order so that
# the tail blocks are freed first", `single_type_kv_cache_manager.py:598-599`), so the tail of a prompt, the part
# least likely to be shared, is evicted before its head (`kv_cache_utils.py:267-274`). (vLLM citations: v0.33.0,
# paths under `vllm/v1/core/` unless given in full.)
#
# **Your turn, before reading on:** [exercise 13](../exercises/13_prefix_cache_lru.ipynb) has you write the hash
# chain and this free queue (touch on a hit, evict the least recently freed, never a block in use), graded against
# the library's `swkv_teach.caches.prefix`. The cells below use the library's.

# %%
lru = LRUKVCache(3)
for i in (0, 1, 2):
    lru.put(i, f"k{i}", f"v{i}")
lru.get(0)
lru.put(3, "k3", "v3")
print("build guide's LRU after put 0,1,2, get(0), put(3):", lru.ids(), "(1 evicted)")

queue = FreeBlockQueue()
for block in (0, 1, 2):  # three cached blocks freed, in this order
    queue.append(block)
queue.remove(0)  # a new request hits block 0: in use now, out of the queue
print(
    "free queue after freeing 0,1,2 and a hit on 0:      ", list(queue), "(0 is in use)"
)
print(
    "allocate() with no empty block evicts block",
    queue.popleft(),
    "| queue now",
    list(queue),
)
queue.append(0)  # the request that held block 0 finishes
print("block 0 freed again goes to the tail:                 ", list(queue))

# %% [markdown]
# ## 2. Naming a block: the hash chain
#
# A block's keys depend on its tokens **and on every token before them** (each layer's keys are computed from
# hidden states that attended to the whole prefix, and RoPE encodes the position). So a block is named by
# `hash(parent's hash, its own token ids)`, the first block's parent being a fixed value: vLLM's
# `hash_block_tokens` hashes `(parent_block_hash, curr_block_token_ids_tuple, extra_keys)`
# (`kv_cache_utils.py:707-737`; `extra_keys` carry LoRA names, image hashes, a cache salt). Two prompts share a
# block's hash exactly when they share everything up to the end of that block. Only **full** blocks are named: a
# partial block's keys are not final until it fills.
#
# The hash must also be the same in every process, or two servers sharing a store would never find each other's
# blocks. Python's `hash()` of a `str` or `bytes` (and a `datetime`) is salted per process (`PYTHONHASHSEED`, the
# note under `object.__hash__` in the Python docs); a tuple of small ints is not (`hash((1, 2, 3))` is the same in
# every process, as the cell below shows), but it is 64 bits, built for dictionaries, not for collisions an
# adversary may look for, and its algorithm is CPython's to change. vLLM hashes with SHA-256 by default
# (`prefix_caching_hash_algo = "sha256"`, `vllm/config/cache.py:259-263`) and derives the
# first block's parent from a fixed seed (`"vllm-none-hash"`) unless `PYTHONHASHSEED` is set, and from random bytes
# only for its non-cryptographic hashes (`resolve_none_hash_seed`, `kv_cache_utils.py:117-131`). The library's
# `hash_block_tokens` is SHA-256 over the parent's 32 bytes and the ids as 8-byte integers. Two conversations'
# first prompts, drawn as a tree: the system prompt's blocks are shared, then the chains part.

# %%
SALT = "print(hash('def read_lines'), hash((1, 2, 3)))"
two = [
    subprocess.run(
        [sys.executable, "-c", SALT],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "random"},
    ).stdout.split()
    for _ in range(2)
]
print(
    f"hash of a str the same in two processes: {two[0][0] == two[1][0]}; "
    f"hash((1, 2, 3)) the same: {two[0][1] == two[1][1]}"
)

first_lines = ["def read_lines(path):\n", "class Stack:\n"]
prompts = [tok.encode(SYSTEM_PROMPT + line) for line in first_lines]
chains = [block_hashes(p, BS) for p in prompts]
shared = sum(1 for a, b in zip(*chains) if a == b)
print(
    f"prompts of {len(prompts[0])} and {len(prompts[1])} tokens: {len(chains[0])} and"
    f" {len(chains[1])} full blocks, the first {shared} shared;\npartial last blocks of"
    f" {len(prompts[0]) % BS} and {len(prompts[1]) % BS} tokens (no hash)"
)


# %% tags=["hide-input"]
def column(i):
    """Block i's column: blocks 2 .. shared - 3 are left out ("..." stands for them)."""
    return i if i < 2 else i - (shared - 2) + 3


def draw_chain(ax, prompt, chain, y, start, color, partial=True):
    """A prompt's blocks from `start` on row y: last 5 characters, start of the hash."""
    for i in range(start, len(chain) + (1 if partial and len(prompt) % BS else 0)):
        if 2 <= i < shared - 2:
            continue
        full, x = i < len(chain), column(i) * 1.3
        ax.add_patch(
            Rectangle(
                (x, y - 0.38),
                1.1,
                0.76,
                facecolor=color if full else "white",
                edgecolor="black",
                linestyle="-" if full else "--",
            )
        )
        text = tok.decode(prompt[i * BS : (i + 1) * BS]).replace("\n", "⏎")
        ax.text(
            x + 0.55,
            y + 0.15,
            repr(text[-5:])[1:-1],
            ha="center",
            va="center",
            fontsize=10,
            family="monospace",
        )
        ax.text(
            x + 0.55,
            y - 0.17,
            chain[i].hex()[:5] if full else "none",
            ha="center",
            va="center",
            fontsize=10,
            family="monospace",
            weight="bold" if full else "normal",
        )
        if i > 0:
            prev = i - 1 if i != shared - 2 else 1
            y0 = 0.0 if prev < shared else y
            ax.add_patch(
                FancyArrowPatch(
                    (column(prev) * 1.3 + 1.1, y0),
                    (x, y),
                    arrowstyle="-|>",
                    mutation_scale=12,
                    color="gray",
                )
            )
    if start == 0:
        ax.text(2 * 1.3 + 0.5, y, "...", ha="center", va="center", fontsize=14)


fig, ax = plt.subplots(figsize=(8, 4.2), dpi=DPI)
# shared, once
draw_chain(ax, prompts[0], chains[0][:shared], 0.0, 0, "#C6DBEF", partial=False)
draw_chain(ax, prompts[0], chains[0], 1.1, shared, "#FDD0A2")
draw_chain(ax, prompts[1], chains[1], -1.1, shared, "#C7E9C0")
for y, label in (
    (1.1, "def\nread_lines"),
    (-1.1, "class\nStack"),
    (0.0, "system\nprompt"),
):
    ax.text(-0.15, y, label, ha="right", va="center", fontsize=10)
ax.set(
    xlim=(-1.6, column(max(len(p) // BS for p in prompts)) * 1.3 + 1.2),
    ylim=(-1.6, 1.6),
    title=f"Blocks of {BS} tokens, named by hash(parent, tokens)",
)
ax.axis("off")
fig.tight_layout()
plt.show()

# %% [markdown]
# *The figure:* each box is a full block, with its last 5 characters and the first hex digits of its hash;
# the blue chain is the system prompt both prompts share (its blocks 2 to 9 left out), and the dashed
# boxes ("none") are partial blocks, which get no hash.
#
# The branches start where the two prompts first differ *within a block*: the block that holds the end of the
# system prompt and the start of the user's line differs between them, and so does every block after it, even
# one whose own tokens happened to match, because its parent differs.

# %%
cache = PrefixCache(num_blocks=3)  # exercise 13's worked example: blocks of 2 tokens
table = [cache.allocate() for _ in range(3)]
for block, h in zip(table, block_hashes([1, 2, 3, 4, 5, 6], 2)):
    cache.cache(block, h)
cache.release(table)
print(
    "one request cached blocks",
    table,
    "and finished;\nfree queue, least recently freed first:",
    list(cache.free_queue),
)
second = block_hashes([1, 2, 3, 4, 9, 9], 2)
hit = cache.lookup(second)
cache.acquire(hit)
print(
    "a second request shares the first two blocks: lookup ->",
    hit,
    ";\nit allocates block",
    cache.allocate(),
    f"(evicting the tail of the first: {cache.evictions} eviction)",
)

# %% [markdown]
# ## 3. Sliding-window hits: only the last $W - 1$ positions matter
#
# With full attention, a hit must start at block 0: block `i`'s keys are useless without block $i - 1$'s, since
# the first computed token attends to all of them. With a sliding window the first computed token, at position
# `n`, attends to keys $n - W + 1, \dots, n$ only (query $i$ sees $i - W < j \le i$). So only the $W - 1$ positions
# before `n` must be cached: the last $\lceil (W - 1) / \text{block\_size} \rceil$ blocks before it. Blocks further back may
# have been evicted long ago; vLLM puts its `null_block` in their place. Its `SlidingWindowManager` needs
# `cdiv(sliding_window - 1, block_size)` contiguous cached blocks (`single_type_kv_cache_manager.py:956-966`)
# and searches from the right, stopping at the first run that long (`single_type_kv_cache_manager.py:1015-1037`);
# if no run is long enough, the run from block 0 still counts (lines 1040-1044). The library's
# `find_longest_cache_hit` follows it. On this model ($W = 64$, blocks of 16) that is 4 blocks:

# %%
prompt = tok.encode(SYSTEM_PROMPT + "def mean(values):\n" * 2)
hashes = block_hashes(prompt, BS)
pool = PrefixCache(num_blocks=len(hashes))
blocks = [pool.allocate() for _ in hashes]
for b, h in zip(blocks, hashes):
    pool.cache(b, h)
# the request's first 3 blocks are freed first, then the rest: an unusual order, to
# evict exactly them next (a real scheduler frees a request's tail first)
pool.release(blocks[:3])
pool.release(blocks[3:])
for _ in range(3):
    # another request takes 3 blocks: no empty block, so the 3 at the head are evicted
    pool.allocate()
print(
    f"prompt of {len(prompt)} tokens, {len(hashes)} full blocks; after other traffic"
    " the cached ones are\n ",
    ["Y" if pool.get(h) is not None else "-" for h in hashes],
)
for window in (None, W):
    hit = find_longest_cache_hit(
        pool, hashes, BS, window_size=window, max_tokens=len(prompt) - 1
    )
    held = [b for b in hit if b is not None]
    print(
        f"{'full attention' if window is None else f'window W = {window}'}:"
        f" {len(hit) * BS} tokens skipped, {len(held)} blocks held"
    )

# %% [markdown]
# Full attention loses the whole prompt with its first block. The window keeps its hit: the request skips every
# token but the last, which is always computed because its logits pick the next token (vLLM caps a hit at
# `num_tokens - 1`, `vllm/v1/core/kv_cache_manager.py:294-301`), and it holds only the 4 blocks that last query can
# see. The scheduler counts such a hit as vLLM does: the hit length that `find_longest_cache_hit` returns, the
# skipped early positions included (`kv_cache_manager.py:302-306`), recorded in `PrefixCacheStats`
# (`kv_cache_manager.py:255-264`, `vllm/v1/metrics/stats.py:121`).
#
# **Hybrid models: the global layers bound every hit.** Gemma 2 and 3 mix sliding-window layers with global
# (full-attention) ones: Gemma 3 has five local layers to one global. vLLM gives each kind its own blocks and its own
# search, and `HybridKVCacheCoordinator.find_longest_cache_hit` puts full attention first (the groups are sorted so,
# `vllm/v1/core/kv_cache_coordinator.py:756-760`): the global layers' hit is the run of cached blocks **from block 0**,
# and the sliding-window search then runs only **within** it (`max_length=_max_length`, the current hit length,
# line 888); with one full and one sliding kind a single pass settles it (`is_simple_hybrid`, lines 837-840), and the
# full-attention blocks are cut back to the final length (lines 919-931). So the window's rule above saves a hybrid
# model nothing once a global layer's early block is evicted: five layers in six could start at token 240 holding 4
# blocks, but the sixth needs every block before that. Below, the sliding layers hold what `pool` holds (blocks 3 to
# 14), and the global layers' own pool holds only the prompt's first 8 blocks, then only its first 5:

# %%
for kept in (8, 5):
    # the global layers' blocks: the first `kept` still cached
    global_pool = PrefixCache(num_blocks=kept)
    for b, h in zip([global_pool.allocate() for _ in range(kept)], hashes):
        global_pool.cache(b, h)
    full_hit = len(
        find_longest_cache_hit(global_pool, hashes, BS, max_tokens=len(prompt) - 1)
    )
    hybrid = find_longest_cache_hit(
        pool, hashes, BS, window_size=W, max_tokens=full_hit * BS
    )
    print(
        f"global layers hold blocks 0-{kept - 1}: their hit {full_hit * BS} tokens;\n"
        f"  the sliding layers, searched within it: {len(hybrid) * BS} tokens skipped"
        " (alone they would skip 240)"
    )

# %% [markdown]
# With 8 global blocks the hit is 128 tokens, not 240: the window layers find their 4 blocks (4 to 7) before
# token 128. With 5 it is **0**: before token 80 the window needs blocks 1 to 4, blocks 1 and 2 are gone, and the
# run from block 0 is empty, although each kind alone would have skipped 80 or 240 tokens. The hit is the longest
# length at which *every* kind of layer has what it needs.
#
# ## 4. A multi-turn chat, with caching off, on, and with a store
#
# The workload (`swkv_teach.serving.serve_chat`): 8 conversations share a system prompt of about 200 characters;
# each has 3 turns, each turn's prompt being the previous prompt, the model's 24-token reply and a new line. A
# server without prefix caching computes the system prompt once per request and each history once per turn.
# Four servers run it, one after the other:
#
# * **off**: no prefix caching, a pool of 64 blocks (enough for the 8 conversations at once);
# * **on**: the same pool, with prefix caching;
# * **on, small pool**: 40 blocks: a turn's histories no longer fit beside the running requests, so cached
#   blocks are evicted before the next turn needs them;
# * **on, small pool + store**: the same, with a `LocalStore` (an in-process LRU by bytes) behind the pool: every
#   evicted block is written to it, and a request asks the store for the blocks the pool lacks before computing.

# %%
CHAT = {"conversations": 8, "turns": 3, "max_new_tokens": 24}
SERVERS = {
    "off": lambda: Scheduler(model, num_blocks=64, block_size=BS),
    "on": lambda: Scheduler(model, num_blocks=64, block_size=BS, prefix_caching=True),
    "on, small pool": lambda: Scheduler(
        model, num_blocks=40, block_size=BS, prefix_caching=True
    ),
    "on, small pool + store": lambda: Scheduler(
        model,
        num_blocks=40,
        block_size=BS,
        prefix_caching=True,
        store=LocalStore(max_bytes=16 << 20),
    ),
}
runs = {}
for name, make in SERVERS.items():
    scheduler = make()
    runs[name] = (serve_chat(scheduler, tok, **CHAT), scheduler.stats())
reference = runs["off"][0]["outputs"]
print(
    f"{'server':24} {'prompt tokens':>13} {'computed':>9} {'share':>6} {'evicted':>8}"
    f" {'from store':>10}  same tokens"
)
for name, (out, st) in runs.items():
    print(
        f"{name:24} {st['prefix_query_tokens']:13d} {st['prefill_tokens_computed']:9d}"
        f" {st['prefill_tokens_computed'] / st['prefix_query_tokens']:6.0%}"
        f" {st['cached_blocks_evicted']:8d} {st['store_hit_blocks']:10d} "
        f" {out['outputs'] == reference}"
    )

# %% [markdown]
# With caching on, the server computes about an eighth of the prompt tokens: the system prompt once, each
# history once, then only each turn's new line and the partial block before it. The small pool loses part of
# that (blocks evicted before the next turn asks for them), and the store wins it back: an evicted block costs
# one copy from the store instead of a prefill. Every server gives the same tokens, and here that is no accident:
# on this CPU reference, in float32, a cached or fetched block holds the very bits a prefill computes, and the
# decode step's arithmetic does not depend on what else is in the batch. That holds for this reference, not for
# GPU engines in general: there a different batch composition (or a block computed in another forward, with
# another split of the work) changes the order of floating-point sums, and a near-tie between two tokens can flip.
# vLLM "does not guarantee the reproducibility of the results by default" (`docs/usage/reproducibility.md` in
# v0.33.0); outputs independent of the batch it promises only with batch invariance on, `VLLM_BATCH_INVARIANT=1`
# (`docs/features/batch_invariance.md`, `vllm/envs.py:638`). Tokens per second (medians of 2 interleaved runs;
# this machine's figures, noisy):

# %%
# NBVAL_IGNORE_OUTPUT
speed = {name: [] for name in SERVERS}
for _ in range(2):
    for name, make in SERVERS.items():
        out = serve_chat(make(), tok, **CHAT)
        speed[name].append(out["new_tokens"] / out["seconds"])
for name, rates in speed.items():
    rate, off = statistics.median(rates), statistics.median(speed["off"])
    print(f"{name:24} {rate:7.0f} tokens/s   ({rate / off:.2f}x off)")

# %% [markdown]
# What these timings can show and what they cannot. The prefill tokens saved (the table above) are exact and the
# same on every machine; tokens per second are this machine's and noisy: the output stored with the lesson is
# one run on the machine that built it, and the tests do not compare it (your run prints its own). Caching on
# runs faster here: it skips most of the prefill. The small pool runs fewer requests at once and recomputes what
# it evicted. The store gives back the *prefill tokens* the small pool lost, but on this tiny model it need not
# give back any *speed*: reading a block back (fetch, checksum, copy into the pool) costs about as much as
# recomputing its 16 tokens through 300,000 parameters, so the "+ store" row may come out no faster than the
# small pool alone, or a little slower. The prefill a hit saves grows with the model (about
# $2 \times \text{parameters}$ FLOPs per token, lesson 0), the fetch with the bytes of its keys and values. Fetching
# wins when it takes less time than recomputing, that is above a **break-even bandwidth**
#
# $$B^{*} = \frac{\text{KV bytes per token} \times \text{FLOP/s}}{2 \times \text{parameters}},$$
#
# and whether a store clears it depends on the link, not only on the model. Mistral 7B keeps 128 KiB per token
# (fp16) and computes about 14.5 GFLOP per token; at 500 TFLOP/s (a good H100 prefill) recomputing takes about
# 29 µs per token, while 10 Gbit Ethernet (1.25 GB/s) fetches 128 KiB in 105 µs: the store is *slower*. The cell
# below prints $B^{*}$. (It leaves out attention's own prefill FLOPs, which grow with the context and favour
# fetching for long prompts.) CacheGen (Liu et al., [arXiv:2310.07240](https://arxiv.org/abs/2310.07240))
# compresses the KV cache because fetching it over a network can take longer than recomputing it, and "Compute or
# Load KV Cache? Why Not Both?" (Jin et al., [arXiv:2410.03065](https://arxiv.org/abs/2410.03065)) computes part
# of a prefix and loads the rest at once, because neither is always faster. Tiers such as LMCache pay off where the
# bandwidth is there (CPU memory over PCIe, fast local disks) or the GPU's FLOPs are busy elsewhere.


# %%
def break_even_bandwidth(kv_bytes_per_token, flops_per_s, parameters):
    """Bytes/s above which fetching a token's keys and values beats recomputing them."""
    return kv_bytes_per_token * flops_per_s / (2 * parameters)


# 2 (k, v) x layers x kv heads x head_dim x fp16
MISTRAL_KV, MISTRAL_PARAMS = (
    2 * 32 * 8 * 128 * 2,
    7.24e9,
)
for flops in (500e12, 989e12):
    bw = break_even_bandwidth(MISTRAL_KV, flops, MISTRAL_PARAMS)
    # seconds per token
    recompute, fetch = (
        2 * MISTRAL_PARAMS / flops,
        MISTRAL_KV / 1.25e9,
    )
    print(
        f"Mistral 7B at {flops / 1e12:3.0f} TFLOP/s: recompute {recompute * 1e6:4.1f}"
        f" µs/token, break-even {bw / 1e9:4.1f} GB/s;\n  a 10 GbE fetch takes"
        f" {fetch * 1e6:.0f} µs/token"
    )

# %%
fig, ax = plt.subplots(figsize=(8, 3.6), dpi=DPI)
names = list(runs)
computed = [runs[n][1]["prefill_tokens_computed"] for n in names]
ax.barh(names[::-1], computed[::-1], color=["#2CA02C", "#FF7F0E", "#1F77B4", "#7F7F7F"])
for y, v in enumerate(computed[::-1]):
    ax.text(v + 60, y, f"{v}", va="center")
ax.set(
    xlabel="prompt tokens computed (prefill), 24 requests",
    xlim=(0, max(computed) * 1.15),
    title=(
        "Prefix caching computes each shared block once; a store wins back what a small"
        " pool evicts"
    ),
)
fig.tight_layout()
plt.show()

# %% [markdown]
# *The figure:* the prompt tokens each of the four servers computed for the same 24 requests; the shorter the bar,
# the more prefill the cache (and the store) saved.
#
# One limit of this scheduler: a block is cached after the forward that computes its keys. In the reserved mode
# every newcomer is prefilled in its own forward, so the next one finds its blocks; with a `token_budget`, the
# requests admitted in one step share one forward, and none of them hits another's blocks, not even an identical
# prompt's. vLLM names a block when it is *scheduled*, before its keys are computed (`KVCacheManager.allocate_slots`
# ends with `cache_blocks(request, num_tokens_to_cache)`, `num_tokens_to_cache = min(total_computed_tokens +
# num_new_tokens, request.num_tokens)`, `vllm/v1/core/kv_cache_manager.py:616-625`, called for each waiting request
# in turn, `vllm/v1/core/sched/scheduler.py:1435`), so there a duplicate scheduled later in the same step does hit.
# Four copies of the system prompt, submitted together:

# %%
duplicate = tok.encode(SYSTEM_PROMPT)
for budget in (None, 1024):
    sched = Scheduler(
        model, num_blocks=64, block_size=BS, prefix_caching=True, token_budget=budget
    )
    for _ in range(4):
        sched.submit(duplicate, max_new_tokens=4)
    sched.run()
    st = sched.stats()
    mode = "reserved mode" if budget is None else f"token_budget={budget}"
    print(
        f"{mode:17}: {st['prefix_hit_tokens']:3d} of {st['prefix_query_tokens']} prompt"
        f" tokens hit, {st['prefill_tokens_computed']} computed"
    )

# %% [markdown]
# ## 5. The store on Redis, shared by two processes
#
# A `LocalStore` dies with its process. `swkv_teach.store.RedisStore(url)` keeps the same blocks in a Redis
# server that every process, and every machine, can reach: a second server process skips the prefill of prompts
# the first one served. Each value carries a header and a checksum, so nothing Redis hands back is another model's
# block or a corrupted one (a checksum guards against corruption, not against numerics: what it returns are the
# bits the writer computed):
#
# * the header is the **layout**: a format version, a fingerprint (SHA-256) of the model's config and weights,
#   the dtype, block size, layer count, KV heads and head size; a value of another model, dtype or layout is a
#   miss, counted in `store_rejected`, never used;
# * a SHA-256 of the whole value: a truncated or corrupted value is a counted miss too;
# * keys are `swkv[:namespace]:<model fingerprint>:<layout digest>:<block hash>`, so two models on one Redis never
#   even read each other's blocks;
# * Redis down: every operation is a miss counted in `store_errors`, nothing raises, and the store tries again
#   after a backoff that doubles up to one second, so hits resume within about a second of Redis coming back
#   (the tests stop and restart a real server in the middle of a run).

# %%
layout = block_layout(model, BS)
k = torch.zeros(layout["num_layers"], BS, layout["n_kv_heads"], layout["head_dim"])
print("layout:")
pprint(
    {
        key: value[:12] + "..." if key == "model" else value
        for key, value in layout.items()
    },
    width=88,
    sort_dicts=False,
)
print(
    f"one block: {k.numel()} keys + {k.numel()} values in float32 = {2 * k.numel() * 4}"
    " bytes;\nstored with header and checksum:"
    f" {len(encode_block(bytes(32), layout, k, k))} bytes"
)

# %% [markdown]
# The first process below is a separate Python: it serves the chat with a small pool and a `RedisStore`, so its
# evicted blocks land in Redis, and exits. Then this notebook serves the same chat with a large pool that never
# evicts (so it writes nothing), on the same Redis: every store hit it gets was written by the other process.

# %%
FIRST = """
import json, torch
torch.set_num_threads(1)
from swkv_teach import load_pretrained
from swkv_teach.serving import Scheduler, serve_chat
from swkv_teach.store import RedisStore
model, tok = load_pretrained()
s = Scheduler(model, num_blocks=40, block_size=16, prefix_caching=True,
              store=RedisStore(URL))
out = serve_chat(s, tok, conversations=8, turns=3, max_new_tokens=24)
print(json.dumps({"outputs": out["outputs"], "put": s.stats()["store_put_blocks"]}))
"""
if HAVE_REDIS:
    server = RedisServer().start()
    script = f"URL = {server.url!r}\n" + FIRST
    other = json.loads(
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True
        ).stdout.splitlines()[-1]
    )
    store = RedisStore(server.url)
    here = Scheduler(
        model, num_blocks=160, block_size=BS, prefix_caching=True, store=store
    )
    out = serve_chat(here, tok, **CHAT)
    st = here.stats()
    print(
        f"the other process wrote {other['put']} blocks to Redis;\nthis one wrote"
        f" {st['store_put_blocks']}, hit {st['store_hit_blocks']} blocks there"
        f" ({st['store_rejected']} rejected, {st['store_errors']} errors)"
    )
    print(
        f"prompt tokens computed here: {st['prefill_tokens_computed']} of"
        f" {st['prefix_query_tokens']};\nsame tokens as without caching, in both"
        f" processes: {out['outputs'] == other['outputs'] == reference}"
    )
    server.stop()

# %% [markdown]
# ## 6. Exact LRU against Redis's sampled LRU
#
# Redis evicts with `maxmemory-policy allkeys-lru` when it holds more than `maxmemory` bytes, but it keeps no
# recency list: each key carries only a 24-bit access clock (`LRU_BITS 24`, redis 7.0.15 `src/server.h:847`), no
# links to other keys. When it must evict it samples `maxmemory-samples` random keys (default 5,
# `src/config.c:3076`; `evictionPoolPopulate`, `src/evict.c:146-150`), merges them into a pool of the 16 idlest
# keys seen so far (`EVPOOL_SIZE`, `src/evict.c:54`) and evicts the idlest in the pool (`performEvictions`,
# `src/evict.c:540`). More samples approach the exact LRU and cost more CPU per eviction.
#
# Measuring it needs one trick. Redis's idle time comes from a 24-bit clock in **seconds** (`LRU_CLOCK_RESOLUTION
# 1000` ms, `src/server.h:849`; `estimateObjectIdleTime`, `src/evict.c:92`): replay the chat's block accesses as
# fast as a client can, in under a second, and every block looks equally old, so Redis evicts almost at random.
# `swkv_teach.bench.lru_replay` therefore gives access `t` of `n` its own second: it checks a hit with `EXISTS`,
# which does not touch the key (`LOOKUP_NOTOUCH`, `src/db.c:704`), and writes every access with
# `RESTORE key 0 value REPLACE IDLETIME n - t` (`src/cluster.c:6021`). Recency is then exactly the trace's order,
# and only the sampling differs from the exact LRU (an `OrderedDict`, given the number of blocks Redis held).
#
# The trace: every full block of every chat prompt, in order (a store's lookups), each block a value of the real
# encoded size. A few `maxmemory` budgets put Redis's capacity on both sides of the point where the chat's
# working set stops fitting. Dividing a budget by a block's bytes overestimates it: Redis's own memory (its
# `used_memory` in `INFO memory` before any block is written, about a megabyte, and a little more once a client
# writes) counts against `maxmemory` too, and each block costs its value plus its key and the allocator's rounding.
# So a budget holds about `(maxmemory - baseline) / per-block cost` blocks; the run below prints the empty
# server's `used_memory`, the per-block cost (the slope between the smallest and largest budget) and the baseline
# that fits.

# %%
chat_prompts = [r["prompt"] for turn in runs["off"][0]["requests"] for r in turn]
trace = prompt_block_trace(chat_prompts, BS)
value_bytes = len(encode_block(bytes(32), layout, k, k))
capacities = list(range(2, 61))
exact = [exact_lru_hits(trace, c) / len(trace) for c in capacities]
print(
    f"{len(trace)} block accesses, {len(set(trace))} distinct blocks of {value_bytes}"
    " bytes"
)
for c in (10, 15, 20, 25, 30, 45):
    print(
        f"exact LRU holding {c:2d} blocks: hit rate"
        f" {exact_lru_hits(trace, c) / len(trace):.0%}"
    )

# %% [markdown]
# The exact LRU has a cliff: below about 15 blocks it hits nothing at all. The chat's conversations come round
# in the same order every turn, a loop longer than the cache, which is LRU's worst case: the block needed next is
# always the one just evicted. Now Redis, 2 repeats of each setting (its sampling is random):

# %%
# NBVAL_IGNORE_OUTPUT
BUDGETS = ["1300kb", "1400kb", "1550kb", "1750kb", "2000kb"]
rows = []
if HAVE_REDIS:
    with RedisServer(
        config={"maxmemory": BUDGETS[-1], "maxmemory-policy": "allkeys-lru"}
    ) as empty:
        baseline = redis.Redis.from_url(empty.url).info("memory")["used_memory"]
    for budget in BUDGETS:
        for _ in range(2):
            rows += compare_lru(
                trace, value_bytes, maxmemory=budget, samples=(1, 5, 10)
            )
            rows += compare_lru(
                trace, value_bytes, maxmemory=budget, samples=(5,), clocks=("wall",)
            )
            for r in rows[-4:]:
                r["budget"] = budget
    kib = {
        budget: int(budget[:-2]) * 1024 for budget in BUDGETS
    }  # Redis's "kb" is 1024 bytes
    caps = {
        budget: statistics.median(r["capacity"] for r in rows if r["budget"] == budget)
        for budget in BUDGETS
    }
    # the slope
    per_block = (kib[BUDGETS[-1]] - kib[BUDGETS[0]]) / (
        caps[BUDGETS[-1]] - caps[BUDGETS[0]]
    )
    overhead = statistics.median(kib[b] - caps[b] * per_block for b in BUDGETS)
    said = (
        f"Redis's used_memory before any block: {baseline:,} bytes. One block costs"
        f" ~{per_block:,.0f} bytes in Redis (its {value_bytes:,}-byte value, its key,"
        " the allocator's rounding),\nso a budget holds about (maxmemory -"
        f" {overhead:,.0f}) / {per_block:,.0f} blocks: Redis's own memory, a little"
        " more once a client writes than when empty, counts against maxmemory"
    )
    print("\n".join(textwrap.fill(part, 88) for part in said.split("\n")))
    for budget in BUDGETS:
        mine = [r for r in rows if r["budget"] == budget]
        cap = caps[budget]
        rate = {
            (clock, s): statistics.median(
                r["redis_hit_rate"]
                for r in mine
                if (r["clock"], r["samples"]) == (clock, s)
            )
            for clock, s in (
                ("virtual", 1),
                ("virtual", 5),
                ("virtual", 10),
                ("wall", 5),
            )
        }
        cells = "  ".join(f"{clock} {s:>2}: {v:.0%}" for (clock, s), v in rate.items())
        exact_rate = statistics.median(r["exact_hit_rate"] for r in mine)
        print(
            f"maxmemory {budget:>6} (~{cap:.0f} blocks): exact {exact_rate:.0%}\n"
            f"  Redis {cells}"
        )

# %%
fig, ax = plt.subplots(figsize=(9, 4.2), dpi=DPI)
ax.plot(capacities, exact, color="black", lw=2, label="exact LRU (OrderedDict)")
styles = {1: ("#D62728", "v"), 5: ("#FF7F0E", "o"), 10: ("#2CA02C", "^")}
for s, (color, marker) in styles.items():
    pts = [
        (r["capacity"], r["redis_hit_rate"])
        for r in rows
        if r["samples"] == s and r["clock"] == "virtual"
    ]
    if pts:
        ax.scatter(
            *zip(*pts),
            color=color,
            marker=marker,
            alpha=0.7,
            label=f"Redis allkeys-lru, samples {s}",
        )
pts = [
    (r["capacity"], r["redis_hit_rate"])
    for r in rows
    if r["samples"] == 5 and r["clock"] == "wall"
]
if pts:
    ax.scatter(
        *zip(*pts),
        color="gray",
        marker="x",
        label="Redis, samples 5, replayed within ~1 s (no trick)",
    )
ax.set(
    xlabel="blocks the cache holds",
    ylabel="hit rate over the chat's block accesses",
    ylim=(-0.03, 1.0),
    xlim=(0, 61),
    title=(
        "The chat's block accesses: exact LRU (line) and Redis's sampled LRU (points), "
        "same capacity"
    ),
)
ax.grid(alpha=0.3)
ax.legend(loc="lower right")
fig.tight_layout()
plt.show()

# %% [markdown]
# *The figure:* the black line is an exact LRU's hit rate at each capacity; the points are Redis's, at the capacity
# each `maxmemory` budget gave, for 1, 5 and 10 samples, and (grey crosses) without the one-second trick.
#
# What the measurement says (the points are this run's; Redis samples at random, so they move a little):
#
# * **Where the working set fits** (40 blocks and more), every policy hits nearly everything it can.
# * **Around the cliff** the two part ways, by 10 or 20 points either way from run to run. Where the exact LRU has
#   just come to hold the working set, the sampled one sometimes evicts a block that is old but still needed
#   instead of the oldest, and a later access misses; where the exact LRU is still falling off the cliff, sampling
#   keeps part of the loop. A few blocks above it, 5 or 10 samples are within a few points of exact: the pool of
#   the 16 idlest keys seen so far remembers good candidates across evictions, so even 5 samples find an old block.
# * **Below the cliff** the exact LRU hits nothing: the chat's conversations come round in the same order every
#   turn, and LRU always evicts the block needed next. One sample, close to random eviction, still hits now and
#   then: random eviction cannot be defeated by a loop. 5 and 10 samples are LRU enough to share its pathology.
# * **Without the one-second trick** (gray), every block looks equally idle, so Redis picks among its samples by
#   chance and does about as well as one sample. A real store sees accesses spread over minutes, where the
#   clock's one-second resolution no longer matters.
#
# So for a block store Redis's approximation is a fine LRU: the build guide's `OrderedDict`, the prefix cache's
# free queue and Redis's sampled eviction pool are three answers to the same question, "which block do we
# least expect to need?", at three costs.
#
# ## 7. What to remember
#
# * The LRU of the build guide belongs to serving, over **freed blocks**: a hit takes a block out of the queue (in
#   use, never evicted), a freed block joins the tail, eviction takes the head; blocks are freed tail first.
# * A block is named by a **hash chain** over everything before it, stable across processes (SHA-256, a fixed
#   first parent); only full blocks are named.
# * With a **sliding window** a hit needs only the $\lceil (W - 1) / \text{block\_size} \rceil$ blocks before the first computed
#   token.
# * On a multi-turn chat, prefix caching computes an eighth of the prompt tokens; a store behind a small pool wins
#   back what the pool evicts, and on Redis it is shared by every process, with headers and checksums so that
#   nothing it returns belongs to another model or layout, or is corrupted. A checksum guards against corruption,
#   not numerics: on a GPU engine a reused block can still flip a near-tie (vLLM: `VLLM_BATCH_INVARIANT=1`).
# * A store beats recomputing only above the break-even bandwidth,
#   $\text{KV bytes per token} \times \text{FLOP/s} \,/\, (2 \times \text{parameters})$.
# * Redis's LRU samples: close to exact above the cliff; below it, one sample is close to random eviction and the
#   default 5 samples as bad as exact LRU on a loop. Its clock ticks once a second.
#
# Next: [exercise 13](../exercises/13_prefix_cache_lru.ipynb), if you have not written it yet, then
# [lesson 13](13_speculative_decoding.ipynb): speculative decoding on a ring, before the interview drill.
