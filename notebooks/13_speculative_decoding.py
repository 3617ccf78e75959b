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
# # Lesson 13 — Speculative decoding on a ring: draft, verify in one forward, roll back without copying
#
# **Time:** about 105 minutes for the lesson, plus 35–60 for [exercise 14](../exercises/14_speculative_verify.ipynb), done where the lesson reaches it.
# **You need:** lesson 0 (the bandwidth floor of a decode step), lesson 3 (the ring and the chunk contract),
# lesson 4 (the decoder and its checkpoint) and lesson 9 (transformers' cache layers).
#
# **By the end you will be able to**
#
# * explain why verifying $k + 1$ tokens costs about one decode step on a GPU (lesson 0's floor), and say what
#   it costs on this CPU, measured;
# * name two drafters that need no second model, prompt lookup and early exit, and where transformers and vLLM
#   implement them;
# * draw a ring with lookahead: which of its $W + k$ slots a verify writes, what a rollback moves (a counter),
#   and why $W$ slots are not enough;
# * state the acceptance rule, greedy and sampled, prove in three lines that sampling stays exact, and check it;
# * measure the acceptance rate and the speed-up with 95 % intervals, beside the speed-up Leviathan et al.
#   predict;
# * say what transformers and vLLM do with a sliding window when drafts are rejected.
#
# Decoding writes one token per forward, and at batch 1 a forward's time goes into *reading* the weights and
# the cache, not into arithmetic (lesson 0). **Speculative decoding** (Leviathan, Kalman and Matias 2023; Chen et
# al. 2023) spends that idle arithmetic: a cheap *drafter* guesses the next $k$ tokens, the model checks all of
# them in **one** forward, keeps the longest prefix it agrees with, and adds one token of its own. Greedy, the
# output is exactly plain decoding's; sampled, exactly the model's distribution. The cache must then take back
# the rejected drafts, and that is where a sliding window bites: a plain ring of $W$ slots has already
# overwritten keys the next query needs. The course's ring keeps $k$ more slots and takes tokens back by moving
# a counter. Terms: [glossary](../docs/glossary.md) ("Lookahead / rollback"); formulas: the
# [cheat sheet](../docs/cheatsheet.md); sources: [references](../docs/references.md).

# %%
# %matplotlib inline
import statistics
import textwrap
import time

import matplotlib.pyplot as plt
import torch

import swkv_teach
from swkv_teach.bench.speculative import expected_speedup
from swkv_teach.caches import RingBufferKVCache
from swkv_teach.model import LayerCaches
from swkv_teach.plots_speculative import plot_ring_round, record_round
from swkv_teach.speculative import PromptLookup, early_exit

torch.manual_seed(0)
torch.set_num_threads(1)  # timings below compare like with like, on one thread
plt.rcParams.update({"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 10})
DPI = 110

model, tok = swkv_teach.load_pretrained()
W, L = model.config.window_size, model.config.n_layers
print(f"the shipped checkpoint: {L} layers, window W = {W}, "
      f"vocabulary of {tok.vocab_size}")

# %% [markdown]
# ## 1. Why verifying $k + 1$ tokens costs about one decode step
#
# Lesson 0 put a floor under a decode step at batch 1: every weight is read once and every cached key and value
# once, for about 2 FLOPs per weight, so the step takes at least
# $(\text{weight bytes} + \text{KV bytes}) / \text{bandwidth}$, and the arithmetic units mostly wait. A forward of
# $n$ tokens over the same cache reads **the same bytes once**: each weight, once loaded, serves all $n$ tokens.
# Only the arithmetic grows, $n$ times. So the floor of an $n$-token forward is
#
# $$t(n) \ge \max\left(\frac{\text{weight bytes} + \text{KV bytes}}{\text{bandwidth}},\;
# \frac{n \cdot \text{FLOPs per token}}{\text{peak FLOP/s}}\right),$$
#
# flat in $n$ until the arithmetic catches up with the reading: about 300 tokens on an H100 SXM (lesson 6,
# section 4: 989 dense fp16 TFLOP/s over 3.35 TB/s). A verify of $k + 1 = 5$ tokens costs what one step costs.
# Mistral 7B in fp16, counted as lesson 0 counts it (the weights a step reads, a window of 4096 keys):

# %%
d7, d_kv7, mlp7, vocab7, layers7, W7 = 4096, 8 * 128, 14336, 32_000, 32, 4096
P = d7 * d7 + 2 * d7 * d_kv7 + d7 * d7 + 3 * d7 * mlp7  # one layer's weights
weight_bytes = (layers7 * P + vocab7 * d7 + d7) * 2  # fp16, as lesson 0
kv_bytes = W7 * 2 * layers7 * d_kv7 * 2  # the window's keys and values, fp16
# per token: 2 FLOPs per weight, and 4 * d per (query, key) pair in every layer
flops_per_token = 2 * weight_bytes / 2 + 4 * W7 * d7 * layers7
bandwidth, peak = 3.35e12, 989e12  # H100 SXM data sheet: bytes/s, dense fp16 FLOP/s


def floor_ms(n):
    """(memory floor, compute floor) of one forward of n tokens, in ms."""
    return (weight_bytes + kv_bytes) / bandwidth * 1e3, n * flops_per_token / peak * 1e3


one = max(floor_ms(1))
print(f"weights {weight_bytes / 1e9:.1f} GB + window {kv_bytes / 2**30:.1f} GiB read "
      f"per forward; {flops_per_token / 1e9:.1f} GFLOP per token")
print(f"{'tokens':>7} {'reading':>9} {'arithmetic':>11} {'floor':>9} "
      f"{'÷ one step':>11}")
for n in (1, 2, 5, 9, 17, 65, 300, 1000):
    mem, math = floor_ms(n)
    print(f"{n:>7} {mem:>6.1f} ms {math:>8.2f} ms {max(mem, math):>6.1f} ms"
          f" {max(mem, math) / one:>10.2f}×")

# %% [markdown]
# The bytes read per forward do not depend on $n$ (the $k + 1$ new keys and values written are $k + 1$ times
# 128 KiB, nothing beside 15 GB). On a GPU the drafts are therefore checked almost for free, and the question
# is only how many of them are right. That is at batch 1. At batch $B$ a verify carries $B(k + 1)$ tokens, and the
# arithmetic catches up with the reading once $B(k + 1)$ nears the ridge of the table above (and earlier in
# practice: kernels reach less than the peak FLOP/s), so speculative decoding pays most at small batch.
#
# **On this CPU** the shipped checkpoint is a different case: its 324 thousand weights (1.3 MB in float32)
# sit in the processor's cache, so a step is bound neither by memory nor by arithmetic but by **overhead**: Python
# and the launch of a few dozen small operations per layer, the same number of operations for 1 token as for 65,
# so the cost grows slowly with the tokens. A verify also
# needs a mask a one-token step on a plain ring skips: a ring with lookahead holds $W + k$ slots, some of them keys
# outside a query's window (lesson 3's chunk contract). The library writes the new keys into their slots and masks
# the stale ones with rows of one pattern built when the ring is allocated, so no key is gathered or copied
# (`RingBufferKVCache.update_in_place`). The cell below measures a forward of $n$ tokens over a ring past its window, the
# median of many, against one plain decode step, in CPU time of this process (a busy neighbour on the machine
# stretches wall time, not this), and prints what it found:

# %%
# NBVAL_IGNORE_OUTPUT
prompt = torch.tensor([tok.encode("def mean(xs):\n    return sum(xs) / len(xs)\n" * 3)])
SIZES = (1, 2, 3, 5, 9, 17, 33, 65)


def forward_ms(n, lookahead, repeats=150):
    """Median CPU ms of one forward of n tokens over rings past the window; n - 1 of
    them are taken back after each, so the ring stays past its window."""
    caches = LayerCaches([RingBufferKVCache(W, lookahead) for _ in range(L)], W)
    model.step(prompt, caches)
    ids = torch.ones(1, n, dtype=torch.long)
    times = []
    for _ in range(repeats):
        t = time.process_time()
        model.step(ids, caches)
        times.append(time.process_time() - t)
        for cache in caches:
            cache.rollback(n - 1)
    return statistics.median(times) * 1e3


step_ms = forward_ms(1, 0)  # the plain ring's one-token step: what plain decoding pays
cpu_ratio = {n: forward_ms(n, max(SIZES)) / step_ms for n in SIZES}
print(f"one decode step on the plain ring: {step_ms:.2f} ms (CPU time, median)")
print("a forward of n tokens on a ring with lookahead, in such steps:")
print("   n: " + " ".join(f"{n:>5}" for n in cpu_ratio))
print("cost: " + " ".join(f"{r:>5.2f}" for r in cpu_ratio.values()))
per_token = (cpu_ratio[65] - cpu_ratio[2]) / 63
print(f"so on this CPU a verify of 5 tokens costs {cpu_ratio[5]:.2f} steps:\na forward "
      f"of 2 tokens costs {cpu_ratio[2] - 1:.2f} steps more than one token does, and "
      f"each token\nafter that {per_token:.3f} steps more")

fig, ax = plt.subplots(figsize=(7.5, 3.8), dpi=DPI)
ns = [1, 2, 3, 5, 9, 17, 33, 65, 129, 300, 600, 1000]
ax.plot(ns, [max(floor_ms(n)) / one for n in ns], "-", color="#4C72B0", lw=2,
        label="Mistral 7B on an H100 SXM: the floor (computed)")
ax.plot(SIZES, list(cpu_ratio.values()), "o-", color="#DD8452", lw=2,
        label="the shipped checkpoint on this CPU (measured)")
ax.axhline(1, color="0.5", lw=1, ls=":")
ax.set(xscale="log", xlabel="tokens in one forward (k + 1 for a verify of k drafts)",
       ylabel="cost ÷ one decode step", ylim=(0, None),
       title="A forward of n tokens costs about one step, until the arithmetic\n"
       "catches up")
ticks = [1, 3, 9, 33, 129, 300, 1000]
ax.set_xticks(ticks, [str(n) for n in ticks])
ax.grid(alpha=0.3)
ax.legend(loc="upper left")
fig.tight_layout()
plt.show()

# %% [markdown]
# *The figure:* the cost of one forward of $n$ tokens in units of one decode step, on a log axis of $n$. The blue
# line is the floor of section 1's formula for Mistral 7B on an H100 (flat until about 300 tokens); the orange
# points are this run's measurements of the shipped checkpoint on this CPU. The orange point at $n = 1$ is one token
# on a ring *with* lookahead, which masks even a single query (some of its slots hold keys outside the window), so
# it need not cost exactly one plain step.
#
# The blue line is why speculative decoding pays on a GPU; the orange points are what the speed-up formula of
# section 5 must be told on this machine: a verify is not one step here but the ratio the cell printed. Read
# that ratio as the price of the chunk path's bookkeeping, which a faster implementation can lower, not as a
# property of speculative decoding.
#
# ## 2. Two drafters that need no second model
#
# A drafter must be much cheaper than the model and often right. Two need nothing beyond what we have.
#
# **Prompt lookup** copies: it finds the context's last few tokens earlier in the context and proposes what
# followed them there. No model runs. transformers calls it `PromptLookupCandidateGenerator`
# (`generation/candidate_generator.py` line 1033 in transformers 5.25.0): n-gram sizes from
# `max_matching_ngram_size` down to 1, and for each the first match from the left that has a continuation
# (lines 1096–1116; its own comment, line 1110, wonders whether the longest continuation would be better). vLLM's
# n-gram speculator does the same on the GPU (`NgramGPUSpeculator`, `vllm/v1/worker/gpu/spec_decode/ngram/speculator.py`
# line 151 in vLLM 0.34.0), but keeps the **rightmost** match of the longest n-gram ("Pack (n, pos) so a single max
# yields longest-n, rightmost-pos", line 82). The library's `PromptLookup` takes the longest n-gram and its
# earliest match, as transformers does. A drafter reads the whole token history: a window bounds the KV cache,
# not what a drafter may copy from.

# %%
lookup = PromptLookup(k=6, max_ngram=3)
context = tok.encode("for key in keys:\n    total += weights[key]\nfor key in ke")
drafts, q = lookup.propose(context, 6)
print("context ends with:", repr(tok.decode(context[-12:])))
print("prompt lookup proposes:", repr(tok.decode(drafts)), "| its q:", q,
      "(one-hot: a copy is certain of itself)")

# %% [markdown]
# The last three characters, `" ke"`, occur first in `"for key in keys"`; what followed them, `"y in k"`, is the
# draft. Where the text repeats (code, a quoted passage, a model that loops) such copies are often right; where
# it does not, lookup finds a short match and proposes something unlikely, or nothing at all.
#
# **Early exit** drafts with the model's own first layers: the same embedding, the first blocks, then the final
# norm and the output head, skipping the rest (self-speculation). transformers runs it with
# `assistant_early_exit=n` (`EarlyExitCandidateGenerator`, `candidate_generator.py` line 1178, which sets
# `num_hidden_layers` to the exit layer for the draft, lines 1224–1230); its docstring asks for a model trained for
# it, "e.g., `facebook/layerskip-llama3.2-1B`" (line 1182). The shipped checkpoint was not trained to exit early,
# so its first layers are weak drafters; how weak is what the acceptance rate will say. `early_exit(model, n, k)`
# shares the weights (nothing is copied) and drafts on a ring of its own. The end of a line of code, drafted by
# the first layer and by the first two:

# %%
text = "import os\nimport sys\n\ndef main(argv):\n    if len(ar"
ids = tok.encode(text)
target_ids = model.generate(torch.tensor([ids]), 8)[0, len(ids):].tolist()
print(f"the full model, greedy ({L} layers): {tok.decode(target_ids)!r}")
for layers in (1, 2):
    drafter = early_exit(model, layers, k=8)
    drafter.begin(model, ids)
    draft_ids, _ = drafter.propose(ids, 8)
    same_as = [a == b for a, b in zip(draft_ids, target_ids)] + [False]
    agree = same_as.index(False)  # drafts before the first disagreement
    print(f"its first {layers} layer(s) draft:   {tok.decode(draft_ids)!r}, "
          f"the first {agree} of 8 as the model")

# %% [markdown]
# The two-layer draft agrees more often, but it runs two of the model's three layers, so each draft step costs
# most of a model step (section 5 measures the one-layer draft's at about half of one), and $k$ such steps per
# round leave little for the verify to win back. Section 5 measures the one-layer draft.
#
# ## 3. The ring's lookahead, drawn
#
# One round of speculative decoding, at batch 1, with $n$ tokens in the cache and the last chosen token `pending`
# (at position $n$, not yet in the cache):
#
# 1. the drafter proposes $m \le k$ tokens $d_1 \dots d_m$;
# 2. **verify**: one forward of the $m + 1$ tokens $[\text{pending}, d_1, \dots, d_m]$, at positions $n \dots n + m$,
#    over the cache: a chunk, so each query is masked to its own window (lesson 3's chunk contract), and each
#    layer's ring stores all $m + 1$ keys;
# 3. **accept** $a$ drafts (section 4), and take one token from the model's row $a$;
# 4. **roll back** the $m - a$ rejected drafts: the cache must be as if only $[\text{pending}, d_1, \dots, d_a]$ had
#    been written, $n + a + 1$ tokens.
#
# A ring with lookahead $k$, `RingBufferKVCache(W, lookahead=k)`, has $W + k$ slots and writes token $p$ into slot
# $p \bmod (W + k)$. Below, a real ring with $W = 6$ and $k = 3$ (keys set to their own positions, so reading the
# buffer reads the cache), 14 tokens seen, a verify of 3 drafts of which 1 is kept:

# %%
round_k3 = record_round(window=6, lookahead=3, seen=14, drafts=3, accepted=1)
fig = plot_ring_round(
    round_k3, title="A ring of W + k = 6 + 3 slots: verify 4 tokens, keep 2")
fig

# %% [markdown]
# *The figure:* the ring's nine slots in three states, one row each; each box is a slot and the token whose key it
# holds. Blue: keys the next query attends; pale: held, outside that window; hatched: rejected drafts, rolled
# back; a thick outline: written by the last forward; the red triangle: where the next token will be written.
#
# * **Row 1.** The four slots outside the window of query 14 hold $p_5 \dots p_8$: old tokens, kept so that a
#   rollback could restore an earlier window.
# * **Row 2.** The verify writes $p_{14} \dots p_{17}$ into exactly those four slots. No verified query, and no query
#   after a rollback, needs $p_5 \dots p_8$: query $n$ sees $n - W < j \le n$, and $5 \dots 8 \le 14 - 6$.
# * **Row 3.** One draft kept: the rollback of 2 moves `seen` from 18 to 16 and **nothing else**: the keys of
#   $p_{16}, p_{17}$ are still in slots 7 and 8. The ring reports their slots' positions as 7 and 8 (the slot
#   formula of lesson 3 at `seen` = 16), outside query 16's window, so the mask drops them; the next two tokens
#   overwrite them. The red triangle sits on slot 7: $16 \bmod 9$.
#
# The same round on a real ring, checked: the buffers before and after the rollback, and the positions the next
# query attends, from the ring's own `positions` and the window convention.

# %%
ring = RingBufferKVCache(6, lookahead=3)


def keys(first, n):
    # (batch 1, heads 1, n tokens, head_dim 1): each key is its own position
    return torch.arange(first, first + n, dtype=torch.float32).view(1, 1, n, 1)


ring.update(keys(0, 14), keys(0, 14))
ring.update(keys(14, 4), keys(14, 4))  # the verify: p14 .. p17, one chunk
buffer, address = ring.k_buf.clone(), ring.k_buf.data_ptr()
print(f"after the verify: seen = {ring.seen}, rollback_limit = {ring.rollback_limit}")
ring.rollback(2)
print(f"after rollback(2): seen = {ring.seen}; buffer unchanged: "
      f"{torch.equal(ring.k_buf, buffer)}, "
      f"same memory: {ring.k_buf.data_ptr() == address}")
k, _ = ring.update(keys(16, 1), keys(16, 1))  # query 16's own key, then it attends
pos = ring.positions.tolist()
inside = [p for p in pos if 16 - 6 < p <= 16]
print("query 16 gets the keys of", [int(x) for x in k.flatten()])
print("which the ring reports at  ", pos)
print("kept by the window 16 - 6 < j <= 16:", sorted(inside),
      "| exactly 11..16:", sorted(inside) == list(range(11, 17)))

# %% [markdown]
# The ring hands query 16 all nine slots; the stale key $p_{17}$ in slot 8 is reported at position 8, outside the
# window, and masked. The window stays $i - W < j \le i$ before and after every rollback: the library's tests run
# rollbacks of $0 \dots k$ across the wrap at $W - 1$, $W$ and $W + 1$ tokens (`tests/test_ring_lookahead.py`),
# and the cell below runs 300 random rounds on one ring and checks, after each rollback, that every key the next
# query needs is still held.

# %%
g = torch.Generator().manual_seed(0)
Wt, kt = 6, 3
ring, ok = RingBufferKVCache(Wt, lookahead=kt), True
ring.update(keys(0, 5), keys(0, 5))
for _ in range(300):
    n = ring.seen
    m = int(torch.randint(0, kt + 1, (), generator=g))  # drafts this round
    a = int(torch.randint(0, m + 1, (), generator=g))  # drafts accepted
    ring.update(keys(n, m + 1), keys(n, m + 1))
    ring.rollback(m - a)
    held = set(ring.stored_positions().tolist())
    ok &= set(range(max(0, ring.seen - Wt + 1), ring.seen)) <= held
print(f"300 random rounds (W = {Wt}, k = {kt}, up to {ring.seen} tokens):\n"
      f"the next query's window held after every rollback: {ok}")

# %% [markdown]
# ### Why $W$ slots are not enough
#
# The same round on a plain ring of $W = 6$ slots:

# %%
round_k0 = record_round(window=6, lookahead=0, seen=14, drafts=3, accepted=1)
fig = plot_ring_round(
    round_k0, title="A ring of W = 6 slots, no lookahead: the same round")
fig

# %% [markdown]
# *The figure:* the plain ring's six slots before the verify, after it, and when the rollback is asked for. The
# verify writes $p_{14} \dots p_{17}$ over $p_8 \dots p_{11}$; the red slot is the rejected $p_{17}$, which
# overwrote $p_{11}$, a key query 16 still needs.
#
# The verify itself is correct on a plain ring: the chunk path gathers the stored keys the first query sees
# *before* it writes the chunk (lesson 3). The damage shows after the rollback. In general, with the verify's
# first position $n$ and $a$ drafts kept, the next query is at $n + a + 1$ and needs keys $j > n + a + 1 - W$.
# The rejected token at $n + i$ ($i > a$) lands in the slot of $n + i - W$ on a ring of $W$ slots, a key still
# needed exactly when $n + i - W > n + a + 1 - W$, that is $i \ge a + 2$: every rejection but the first destroys a
# needed key. With $W + k - 1$ slots it lands on $n + i - W - k + 1$, needed only if $i > a + k$, impossible since
# $i \le k$: for the rollback alone, $k - 1$ spare slots would do (and for $k = 1$, none).
#
# The library keeps one more, $W + k$, because its verify writes the $k + 1$ new keys into the ring **before** it
# reads them (`RingBufferKVCache.update_in_place`: the keys are attended where they lie, nothing gathered or
# copied). The last draft, at $n + k$, then lands on $n + k - S$ for a ring of $S$ slots, and the verify's first
# query still reads $n - W + 1$: so $S \ge W + k$. A verify that reads its window first (the gather above, or
# transformers' concatenation) manages with $W + k - 1$. The ring without lookahead knows it cannot take two
# tokens back, and says so:

# %%
print(textwrap.fill(round_k0[-1].refused, 88))

# %% [markdown]
# The price of the lookahead is $k$ more slots per layer: $(W + k) / W$ of the cache, $4101 / 4096$ for Mistral's
# window and $k = 5$. transformers pays in copies instead, and vLLM in blocks (section 6).
#
# ## 4. The acceptance rule, and why sampling stays exact
#
# The verify's logits have $m + 1$ rows: row $i$ is the model's distribution $p_i$ for the token after draft $i$
# (row 0: after `pending`).
#
# **Greedy.** Keep the longest prefix of drafts that the model would have chosen itself: $d_1 = \arg\max p_0$,
# $d_2 = \arg\max p_1$, and so on; stop at the first disagreement, after $a$ drafts. Then take the model's own token
# from row $a$: the **correction** (where the draft was wrong) or, when all $m$ drafts agreed, a **bonus** token
# from row $m$. A round emits $a + 1$ tokens, each the argmax of the model given exactly the tokens before it:
# plain greedy decoding's tokens, whatever the drafter proposed.
#
# **Sampling** (Leviathan et al. 2023, §2.3; Chen et al. 2023, Algorithm 2). Draft $x$ was sampled from the
# drafter's distribution $q$; keep it with probability $\min(1, p(x) / q(x))$; on the first rejection, sample the
# emitted token from the residual $\mathrm{norm}(\max(0, p - q))$ and stop; if all $m$ are kept, sample the bonus
# from $p_m$. Why the emitted token follows $p$ exactly, writing $\beta = \sum_y \min(p(y), q(y))$ for the
# probability that the draft is kept:
#
# $$P(\text{emit } x) = q(x) \min\left(1, \frac{p(x)}{q(x)}\right) + (1 - \beta)
# \frac{\max(0, p(x) - q(x))}{\sum_y \max(0, p(y) - q(y))}
# = \min(p(x), q(x)) + \big(p(x) - \min(p(x), q(x))\big) = p(x),$$
#
# because $\sum_y \max(0, p(y) - q(y)) = \sum_y \big(p(y) - \min(p(y), q(y))\big) = 1 - \beta$. Each emitted token
# is a draw from $p$ given the tokens before it, so the whole text follows the model's distribution, and the
# drafter only changes how fast. A deterministic drafter (prompt lookup) has a one-hot $q$: the draft is kept with
# probability $p(x)$, and a rejection samples $p$ without $x$. vLLM writes the test in log space, "Probability ratio
# test: p(x) > u * q(x)" (`vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py` lines 714–716, vLLM 0.34.0),
# and its greedy rule is `accepted = target_argmax == draft_sampled` (line 634).
#
# **Your turn, before reading on:** [exercise 14](../exercises/14_speculative_verify.ipynb) has you write this
# acceptance rule, sampled (`accept(...)`), and a greedy `verify(...)`: one forward of $m + 1$ tokens over rings
# built with `RingBufferKVCache(W, lookahead=k)` (section 3), the accepted count, the model's own token, and the
# rollback, graded against the library's `swkv_teach.speculative`. (The exercise numbers drafts from 0: its $d_0$ is
# this section's $d_1$; either way a draft is judged by the row before it.) The cells below use the library's.
#
# The check: one position, a vocabulary of 6, a target $p$ and a drafter $q$ drawn once with a fixed seed. Draw a
# draft from $q$, let the rule decide, record the first emitted token; 20,000 times. A rule that skips the ratio test
# (every draft kept) emits $q$ instead, and the same test must catch it.

# %%
from swkv_teach.speculative import accept_sampled  # noqa: E402  (after the exercise)

V, N = 6, 20_000
torch.manual_seed(13)  # p and q, drawn once
g = torch.Generator().manual_seed(13)  # the drafts and the rule's coins
p = torch.distributions.Dirichlet(torch.ones(V)).sample().double()
q = torch.distributions.Dirichlet(torch.ones(V)).sample().double()
p_rows = torch.stack([p, p])  # row 0 decides the draft; row 1 (the bonus): not counted


def first_token(rule, one_hot):
    # one-hot: a deterministic drafter always proposes the same token (here q's mode)
    d = int(q.argmax()) if one_hot else int(torch.multinomial(q, 1, generator=g))
    a, token = rule(p_rows, [d], None if one_hot else q[None], generator=g)
    return d if a == 1 else token


def keep_every_draft(p_rows, drafts, q_rows, generator=None):  # no ratio test
    return len(drafts), 0


def chi_square(counts):
    expected = N * p
    stat = float(((counts - expected) ** 2 / expected).sum())
    dof = torch.tensor((V - 1) / 2, dtype=torch.float64)
    p_value = float(torch.special.gammaincc(dof, torch.tensor(stat / 2)))
    return stat, p_value


print("target p: ", [round(x, 3) for x in p.tolist()])
print("drafter q:", [round(x, 3) for x in q.tolist()])
for label, rule, one_hot in (("ratio test, sampled drafts", accept_sampled, False),
                             ("ratio test, one-hot drafts", accept_sampled, True),
                             ("every draft kept (no test)", keep_every_draft, False)):
    firsts = torch.tensor([first_token(rule, one_hot) for _ in range(N)])
    counts = torch.bincount(firsts, minlength=V).double()
    stat, pval = chi_square(counts)
    tv = 0.5 * float((counts / N - p).abs().sum())  # total variation distance
    print(f"{label:27}: chi-square {stat:8.1f}, p-value {pval:.3f}, "
          f"distance to p {tv:.3f}")

# %% [markdown]
# With the ratio test the emitted tokens are indistinguishable from draws of $p$ (a large p-value, and a total
# variation distance to $p$ of the order of $1 / \sqrt{N}$); without it they follow $q$, and the test rejects $p$
# beyond doubt. The library's
# test does the same over whole sequences of a Markov chain (`tests/test_speculative.py`), and through the decoder.
#
# ## 5. Measured on the shipped checkpoint: acceptance rate and speed-up
#
# Leviathan et al. (§3.3, Theorem 3.8) predict the speed-up from three numbers: the acceptance rate $\alpha$ (the
# chance that the model keeps a draft, taken as the same for every draft), the number of drafts $k$, and the cost
# $c$ of one drafter step in model steps. A round emits on average
# $E = (1 - \alpha^{k + 1}) / (1 - \alpha)$ tokens for one verify and $k$ draft steps, so
#
# $$\text{speed-up} = \frac{1 - \alpha^{k + 1}}{(1 - \alpha)(c k + 1)},$$
#
# counting a verify as one step: the GPU case of section 1. Prompt lookup runs no model ($c = 0$).
#
# The workloads: 8 independent prompts of 128 characters of held-out Python (the standard-library files the model
# never trained on, lesson 8's segments), as they are (**fresh code**), and the same prompts **quoted back**: each
# followed by a comment and its own first 48 characters again, a repetition prompt lookup can copy from. 96 new
# tokens each, greedy, both drafters, $k = 2, 4, 8$. $\alpha$ is counted as the library's `SpeculativeStats` counts it,
# drafts accepted over drafts the model ruled on, with a 95 % interval from resampling the prompts whole
# (`ratio_interval`): drafts within one text are accepted in runs, not independently, so an interval that treated
# each draft as a coin flip would be too narrow. Every run is also checked against plain greedy decoding, token for
# token. The bench runs the same measurement (`swkv-teach bench`, `swkv_teach.bench.speculative`): this cell
# calls it, and prints the counts; its times are reported in the next cell.

# %%
from swkv_teach.bench.speculative import (  # noqa: E402
    FRESH,
    speculative_rows,
    workloads,
)

prompts = workloads(tok)  # {"fresh code": 8 prompts, "quoted back": the same, quoted}
print("a quoted-back prompt ends:", repr(tok.decode(prompts["quoted back"][0])[-52:]))
NEW, KS = 96, (2, 4, 8)
rows = speculative_rows(ks=KS, new_tokens=NEW, prompts=8, model=model, tokenizer=tok)
drafted = [r for r in rows if r["k"]]
print(f"{len(drafted) * 8} speculative runs, each equal to plain greedy decoding: "
      f"{all(r['same_tokens'] for r in drafted)}\n")
print(f"{'workload':12} {'drafter':26} {'k':>2} {'α [95 % interval]':>19} "
      f"{'tokens/verify':>13} {'E':>5}")
for r in drafted:
    lo, hi = r["alpha_interval"]
    # the prompt's forward gives the first token; every round after it is one verify
    per_verify = (NEW - 1) * 8 / r["rounds"]
    E = expected_speedup(r["alpha"], r["k"], 0.0)  # c = 0: tokens per round
    print(f"{r['workload']:12} {r['drafter']:26} {r['k']:>2} {r['alpha']:5.2f} "
          f"[{lo:.2f}, {hi:.2f}]  {per_verify:13.2f} {E:5.2f}")

# %% [markdown]
# Columns: $\alpha$ with its interval; tokens per verify, measured (new tokens after the first, over the rounds);
# $E$, what the formula expects per round from that $\alpha$ and $k$. Reading the table:
#
# * **Every run emitted plain greedy decoding's tokens**, as section 4 promised: the drafter changes the speed only.
# * **Prompt lookup's $\alpha$ is higher than early exit's** at every $k$, on both workloads: the first layer of a
#   model not trained to exit early is a poor guesser.
# * **Quoting the passage back does not raise prompt lookup's $\alpha$ here.** The model sees only its last $W = 64$
#   tokens: when it continues the quote, the original is more than 150 characters back, out of its window, and it
#   continues from what it sees rather than copying. Prompt lookup does read that far, but its copies are right
#   only where the model would have written the same. What it copies well on both workloads is the model's own
#   output: a tiny model decoding greedily repeats itself.
# * **The measured tokens per verify fall short of $E$** for prompt lookup: the formula assumes $k$ drafts every
#   round, and lookup proposes fewer, or none, where the context has no match.
#
# Now the speed-up. Beside the runs, `speculative_rows` measured $c$ (a drafter's cost per draft in plain decode
# steps: an early-exit step, or prompt lookup's search spread over its $k$ drafts) and the cost $v$ of a verify of
# $k + 1$ tokens in plain steps, as section 1 did. The cell prints, beside the measured ratio of plain to
# speculative time with its interval over the 8 prompts, the formula twice: as published ($v = 1$: a verify costs one
# step, as on a GPU, with this machine's measured $c$) and with this machine's $c$ and $v$, $E / (c k + v)$.

# %%
# NBVAL_IGNORE_OUTPUT
fresh = [r for r in drafted if r["workload"] == FRESH]
c_exit = next(r["c"] for r in fresh if r["drafter"] != "prompt lookup")
print(f"c = {c_exit:.2f} (an early-exit step ÷ a plain step);\nverify cost v in "
      "plain steps: " + ", ".join(f"k={r['k']}: {r['verify_cost']:.2f}"
                                 for r in fresh if r["drafter"] == "prompt lookup"))
print(f"\n{'workload':12} {'drafter':26} {'k':>2} {'measured [95 % interval]':>25} "
      f"{'v = 1, c':>8} {'this CPU':>8}")
for r in drafted:
    lo, hi = r["speedup_interval"]
    paper, here = r["expected"], r["expected_with_verify"]
    print(f"{r['workload']:12} {r['drafter']:26} {r['k']:>2} {r['speedup']:11.2f}× "
          f"[{lo:.2f}, {hi:.2f}] {paper:7.2f}× {here:7.2f}×")
best = max(drafted, key=lambda r: r["speedup"])
lo, hi = best["speedup_interval"]
verdict = ("faster than plain decoding" if lo > 1 else
           "not clearly faster than plain decoding" if hi > 1 else
           "slower than plain decoding")
speed = best["speedup"]
print(f"\nthe best run: {best['drafter']}, k = {best['k']}, on {best['workload']}: "
      f"{speed:.2f}× plain decoding [{lo:.2f}, {hi:.2f}],\n{verdict} at 95 %; "
      f"the formula with v = 1 expected {best['expected']:.2f}×")

# %% [markdown]
# How to read the three speed-up columns: the published formula ($v = 1$, with the measured $c$) is what a verify
# costing one step would give with these acceptance rates; on a GPU $c$ would differ too (an early exit from 1 of 3
# layers reads about a third of the weights; prompt lookup's $c$ is its Python search, small but not 0). The column
# "this CPU" puts in the measured $c$ and $v$; the measured column is the run itself.
# Where the last two agree, the model of a round (drafts, one verify, accepted tokens) explains the time, and what
# separates this CPU from the GPU case is the verify's cost $v$, section 1's ratio (measured here on rings of each
# $k$'s own size, so a little different). Where the run falls below "this CPU", look at what the formula leaves out: rounds in which prompt lookup found fewer than $k$ drafts (tokens per
# verify below $E$ in the table above) and the drafter's own Python. Early exit pays $c k$ draft steps per round for a
# low $\alpha$; prompt lookup pays almost nothing to draft, so its speed-up is set by $\alpha$, its drafts per round
# and $v$. The printed sentence says where this run landed; rerun the two cells and the times move, the acceptance
# rates do not.
#
# ## 6. What the engines do with a sliding window
#
# **transformers 5.25** ([lesson 9](09_inside_transformers.ipynb) read its sliding layers). Assisted generation
# calls `cache.activate_past_recording(...)` before the first draft (`generation/utils.py` line 4002) and
# `cache.crop(-r)` after each verify, with $r$ the rejected drafts (line 4187). Its `DynamicSlidingWindowLayer`
# holds the last $W - 1$ states between forwards; each `update` concatenates them with the new ones (`torch.cat`,
# `cache_utils.py` lines 242–243, a copy of the window every forward, as lesson 9 showed), and once recording
# (`activate_past_recording`, line 211, sets `record_past`) it keeps the whole result, $W - 1 + k + 1 = W + k$ states
# after a verify of $k + 1$, instead of cutting it to $W - 1$ (lines 250–259). `crop(-r)` then slices the last
# $W - 1$ states that precede the rejected ones and moves `cumulative_length` back (lines 303–308); `crop(0)` cuts
# back to $W - 1$ (lines 300–302). The same $W + k$ states as the ring at the peak; the difference is the copy. Its
# static layer, `StaticSlidingWindowLayer`, rolls a fixed buffer and cannot give back what it rolled out:
# `is_croppable` is `max_cache_len <= sliding_window`, set once when the layer is built (line 545, read by the
# property at lines 661–667; "only correct as long as we never went beyond the window", line 652), and assisted
# decoding refuses a cache that is not croppable:
# "Assisted decoding requires a cache that can be cropped to restore the states after draft verification"
# (`generation/utils.py` lines 4103–4106). Both, on the layers themselves:

# %%
from transformers.cache_utils import (  # noqa: E402
    DynamicSlidingWindowLayer,
    StaticSlidingWindowLayer,
)

hf = DynamicSlidingWindowLayer(sliding_window=6)
hf.activate_past_recording()
hf.update(keys(0, 14), keys(0, 14))
hf.crop(0)  # as after a verify with nothing rejected: back to W - 1 states
before = hf.keys.untyped_storage().data_ptr()
hf.update(keys(14, 4), keys(14, 4))  # the verify: pending + 3 drafts
grown = hf.keys.shape[-2]
copied = hf.keys.untyped_storage().data_ptr() != before
hf.crop(-2)  # two drafts rejected
print(f"DynamicSlidingWindowLayer, W = 6: {grown} states after the verify of 4, "
      f"a new tensor: {copied};\nafter crop(-2): {hf.keys.shape[-2]} states, positions "
      f"{[int(x) for x in hf.keys.flatten()]}, {hf.get_seq_length()} tokens seen")
static = StaticSlidingWindowLayer(max_cache_len=32, sliding_window=6)
print("StaticSlidingWindowLayer(max_cache_len=32, sliding_window=6).is_croppable:",
      static.is_croppable)

# %% [markdown]
# The dynamic layer grew to $W + k = 9$ states in a new tensor (copied), and the crop left positions $11 \dots 15$,
# the $W - 1$ keys query 16 needs besides its own: the same answer as the ring, reached by copying. The course's
# `hf_cache(model, lookahead=k)` puts the ring under transformers' assisted generation instead: its layer answers
# `activate_past_recording` by checking the draft length against its lookahead and `crop(-r)` by the ring's
# `rollback(r)`, a counter; greedy and seeded sampled tokens equal those of transformers' own cache on Mistral,
# Gemma 2 and Gemma 3 under transformers 5.15 and 5.25 (`tests/test_hf_speculative.py`). Two limits of 5.15 are
# inside transformers itself, and its default cache fails the same way: an *assistant model* whose own layers slide
# (5.15's recording `update` returns every state since the last crop, `cache_utils.py` lines 252–261 there, while
# the mask covers $W - 1 + q$), and `assistant_early_exit` on Gemma (5.15's `DynamicLayer.crop` slices the keys of a
# layer the early exit never filled, lines 186–188 there). Under 5.25 both run: its recording `update` slices what
# it returns to $W - 1 + q$ states (lines 254–259), and the same tests pass.
#
# **vLLM 0.34.0** (the PyPI source distribution, commit `62d4bc3c7`; paths under `vllm/v1/` unless given in full)
# has no ring for sliding-window attention: its cache is paged (lesson 7), and a token's key goes to the slot its
# *position* names in the block table. A verify's $k + 1$ tokens therefore go to fresh slots, never onto an older
# token, and the question becomes when a block may be freed:
#
# * **Slots for drafts.** `KVCacheManager.allocate_slots` (`core/kv_cache_manager.py` line 401) reserves slots for
#   the new tokens, "including unverified draft tokens" (line 480), plus `num_lookahead_tokens` (lines 571–574): the
#   keys a drafter with a cache of its own (EAGLE) writes past the model's tokens (`vllm/config/vllm.py` lines
#   600–614).
# * **Rollback is a counter.** After a verify the scheduler does `request.num_computed_tokens -= num_rejected`
#   (`core/sched/scheduler.py` lines 2401–2408); the rejected keys stay in their slots until the next step
#   overwrites them, as in the ring.
# * **A window's blocks are freed on settled tokens only.** `SlidingWindowManager.get_num_skipped_tokens` is
#   `max(0, num_computed_tokens - sliding_window + 1 - extra_retained_tokens)` (`core/single_type_kv_cache_manager.py`
#   lines 1153–1188), blocks wholly before it are freed (`remove_skipped_blocks`, lines 687–725), and
#   `allocate_slots` frees "on the processed-token basis: in-flight steps' attention windows still read blocks below
#   the optimistic boundary, and rejected spec tokens can roll it back" (`core/kv_cache_manager.py` lines 582–589).
#   So a request holds the $W - 1$ keys before its last settled token plus whatever is in flight: per request at most
#   `cdiv(sliding_window - 1 + extra_retained_tokens + max_in_flight_tokens, block_size) + 1` blocks
#   (`SlidingWindowSpec.max_admission_blocks_per_request`, `kv_cache_interface.py` lines 932–958), where
#   `max_in_flight_tokens` is sized for a whole batch in flight (`max_concurrent_batches` times
#   `max_num_batched_tokens`, `vllm/config/vllm.py` lines 569–577): thousands of tokens, an admission cap. In steady
#   decoding a request's tokens in flight are its $k + 1$ verify tokens, so it holds about
#   $\lceil (W + k) / \text{block\_size} \rceil + 1$ blocks: the ring's $W + k$, in blocks.
# * **Where vLLM does keep a ring**, it sizes it as we did: `CircularBufferSpec` (one block per request, for the
#   token group a compressing attention still reads) says "`block_size` is the ring capacity. It must exceed the
#   compression ratio by the speculative lookahead: a speculative step stores all of its rows, drafts included,
#   before acceptance is known, while the next step still reads the open group's committed keys from the ring"
#   (`kv_cache_interface.py` lines 982–990). That ring serves compression, not a sliding window; the reasoning is the
#   same.
#
# ## 7. What to remember, and what you can now say in an interview
#
# * At batch 1 a forward reads the same bytes for 1 token or $k + 1$, so on a GPU a verify costs about one decode
#   step until $k + 1$ nears the ridge point (about 300 tokens on an H100). On a small model on a CPU the cost is
#   overhead, and a verify costs what the chunk path's bookkeeping costs: measure it.
# * A round: draft $m \le k$, verify $m + 1$ in one forward (a chunk, each query masked to its own window), accept
#   $a$, emit $a + 1$, roll back $m - a$. Greedy gives plain decoding's tokens exactly; sampled, keep a draft with
#   probability $\min(1, p / q)$ and resample a rejection from $\mathrm{norm}(\max(0, p - q))$: each token follows $p$.
# * A sliding-window ring needs spare slots: with $W$, a rejected draft lands on a key the next query still needs.
#   $W + k - 1$ make every rollback safe; a verify that writes in place before it reads needs $W + k$. Then a
#   rollback moves a counter and copies nothing; stale slots are masked.
# * The speed-up is $(1 - \alpha^{k + 1}) / ((1 - \alpha)(c k + 1))$ when a verify costs one step; measure $\alpha$ with
#   an interval over independent prompts, and the verify's real cost where it is not one step.
# * transformers' dynamic sliding layer keeps the past while recording and crops it (copying the window each
#   forward); its static layer cannot roll back past the window. vLLM writes drafts to fresh paged slots, rolls back
#   `num_computed_tokens`, and frees a window's blocks only on settled tokens: $W - 1$ plus the tokens in flight.
#
# Next: [exercise 14](../exercises/14_speculative_verify.ipynb), if you have not written it yet, then the
# [interview drill](14_interview_drill.ipynb) (lesson 14), whose question 20 asks exactly this with $W = 4096$.
