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
# # Lesson 2 — Watching eviction
#
# **Time:** about 30 minutes (no exercise: playing with the explorer is the exercise). **You need:** lesson 1 (the sliding-window cache).
#
# **By the end you will be able to**
#
# 1. predict, for any step and window, which tokens a sliding-window cache holds and which it has evicted;
# 2. say where a ring buffer puts each token, and why its token set equals the sliding cache's;
# 3. say what attention sinks add to the window, and why an LRU cache is not a sliding window.
#
# In [lesson 1](01_six_steps.ipynb) you built a sliding-window KV cache. Here you *watch* one work:
# which tokens it keeps, which it throws away, and where each token sits in memory.
#
# Every picture below is drawn from a **real cache** of `swkv_teach.caches`: each token's key is set to its
# own position, and after every step the picture reads the cache's tensors back. Nothing is re-computed
# by hand, so if a cache had a bug, you would see it here.
#
# The rule being drawn is the window convention of `swkv_teach.masks`: with window `W`, the query at
# position `i` sees the keys `j` with $i - W < j \le i$. Terms such as *attention sink* or *LRU* are in the
# [glossary](../docs/glossary.md).

# %%
# %matplotlib inline
import torch

torch.manual_seed(0)  # nothing random below, but every lesson starts the same way

from swkv_teach.plots import (plot_attention_band, plot_slots, plot_step,
                              plot_token_stream)
from swkv_teach.trace import record
from swkv_teach.widgets import EvictionExplorer, compare_policies

# %% [markdown]
# ## The explorer
#
# Press **▶** (or drag the **step** slider) and watch the token stream. At step `t`, token `t` has just
# arrived (outlined in black).
#
# * **Top**: every token of the stream — blue in the cache, grey evicted, white not seen yet.
# * **Bottom left**: the cache's storage, slot by slot, with each token's age (`step - position`).
# * **Bottom right**: the attention mask; the outlined row is the current query, the dots are the keys the
#   cache holds. For a correct window cache the dots sit exactly on the blue band.
#
# Try the **policy** menu. `ring` keeps exactly the tokens `sliding` keeps, in different slots. `sinks` keeps
# those *and* the first `S` tokens (2 here), pinned for ever: it holds `S` more than the window.

# %%
# NBVAL_IGNORE_OUTPUT
explorer = EvictionExplorer(window_size=4, steps=24, policy="sliding")
explorer

# %% [markdown]
# No live kernel (reading this on GitHub)? Here is what the explorer shows at step 6: tokens 3 to 6 are
# kept, 0 to 2 are gone.

# %%
trace = record("sliding", window_size=4, steps=24)
print("cached at step 6:", trace[6].cached)
print("evicted during step 6:", trace[6].evicted)
plot_step(trace, 6)

# %% [markdown]
# The figure shows step 6 of the sliding cache: the tokens it holds, and the one that left as the new token
# came in.

# %% [markdown]
# ## A ring buffer: same tokens, different slots
#
# The sliding cache above copies the whole window every step (`torch.cat`, then slice). A ring buffer
# writes token `p` into slot $p \bmod W$ and never moves anything. The token set is identical; only the
# *order in memory* changes. The red arrow is the write pointer: the slot the next token overwrites,
# always the oldest one.

# %%
ring = record("ring", window_size=4, steps=24)
for t in (3, 4, 5, 9):
    print(f"step {t}: slots {ring[t].slots}, next write -> slot {ring[t].next_slot}")
plot_slots(ring, 9)

# %% [markdown]
# The figure shows the ring's slots at step 9: which token sits in each, and the slot the next token will
# overwrite.

# %% [markdown]
# ## Attention sinks: keep the first tokens forever
#
# Many models trained with full attention park a lot of attention on the very first tokens (StreamingLLM,
# Xiao et al. 2023, shows it in Llama 2 and streams Llama 2, MPT, Falcon and Pythia with it); not every model does, and lesson 5 shows
# that the course's own model, trained with a window, does not. The `sinks` policy pins `S` of them in front
# of the ring (orange) and slides the window behind them. In the mask, the sink columns stay open for
# every query.

# %%
sinks = record("sinks", window_size=4, steps=24, num_sinks=2)
print("cached at step 11:", sinks[11].cached, "sinks:", sinks[11].sinks)
plot_token_stream(sinks, 11)

# %% [markdown]
# The figure shows the token stream at step 11: the two sinks at the start stay, then the window's last
# tokens; everything between them has been evicted.

# %%
plot_attention_band(sinks, 11)

# %% [markdown]
# The figure shows which keys each query attends with sinks: the window's band along the diagonal, plus
# the first two columns, kept for every query.

# %% [markdown]
# ## LRU is not a sliding window
#
# The blog post behind this course used an LRU cache. LRU evicts the least recently *used* token, not the
# oldest one, and every read *promotes* a token. With no reads it is the sliding window exactly. But read
# token 0 at every step, and token 0 is never evicted: the cache now holds a key the window forbids (red
# cross in the explorer's mask), so attention over it is no longer sliding-window attention.
#
# In the explorer, choose `lru` and type `0` into **LRU reads**. Below, the same 24 tokens under both
# policies; red outlines mark where they disagree.

# %%
# NBVAL_IGNORE_OUTPUT
EvictionExplorer(window_size=4, steps=24, policy="lru", access_pattern="0")

# %%
lru = record("lru", window_size=4, steps=24, access_pattern="0")
window = record("sliding", window_size=4, steps=24)
for t in (3, 4, 10):
    print(f"step {t}: sliding {window[t].cached}   lru {lru[t].cached}")
compare_policies(24, 4, policies=("sliding", "lru"), access_pattern="0")

# %% [markdown]
# The figure puts the two caches side by side, step by step: they agree while the window fills, and from
# then on LRU keeps token 0, which every step reads, where the window lets it go.

# %% [markdown]
# ## Why bother
#
# Every policy above holds a bounded number of tokens; [lesson 0](00_why_cache.ipynb) showed what that is worth
# (512 MiB instead of 4 GiB at 32k tokens for Mistral 7B). The four policies differ in *which* tokens they
# hold, and only the first two compute exactly what a sliding-window model was trained to compute.

# %% [markdown]
# ## Your turn
#
# * Predict first, then check with the explorer: with $W = 5$, which slot of the ring holds token 13, and
#   which token does token 15 overwrite? With `sinks` ($S = 2$, $W = 4$), which tokens are held at step 20?
# * Not done with lesson 1's cache yet? [exercises/02_sliding_window_cache.ipynb](../exercises/02_sliding_window_cache.ipynb).
#   The ring buffer's exercise comes with lesson 3, which teaches it; the sinks' with lesson 5.
#
# ## Going further
#
# * Find an access pattern for which `lru` holds exactly the window's tokens at every step although it
#   reads at every step. What must be true of the reads? (Hint: what does a read of the newest token promote?)
# * The explorer's mask panel marks the keys a cache holds. Sketch what it would show for a cache that keeps
#   $W + 1$ tokens, like the reference mask of lesson 0. Which query would see a key it should not?
