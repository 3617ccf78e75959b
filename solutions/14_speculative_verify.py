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
# # Exercise 14: verify k drafts in one forward, roll back on a ring
#
# Speculative decoding lets a cheap drafter guess the next few tokens, then has the target model check all of
# them in **one** forward: reading the weights once for $m + 1$ tokens costs about what one decode step costs
# (lesson 0's bandwidth floor). The target keeps the drafts it agrees with, adds one token of its own, and the
# caches forget the rejected drafts. On a sliding-window ring that last step is the delicate one: a ring
# overwrites the slots of tokens leaving the window, so it needs spare slots (a *lookahead*) to take rejected
# drafts back. Lesson 13 draws it; here you write the two pieces: the **acceptance rule** that keeps sampling
# exact, and the **verify-and-rollback** step over library rings.
#
# **How this notebook works.** Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError` line), run the cell, then run the check cell below it. `check_speculative_decoding` prints one line starting with ✅ when your answer is right; otherwise it stops with an `ExerciseFailed` message naming the first case that went wrong, what was expected, what you returned, and a hint. Run it as often as you like.
#
# Window convention, used everywhere in this course: with window `W`, query `i` attends to keys `i - W < j <= i` (W keys, itself included).

# %%
import torch

import swkv_teach
from swkv_teach.caches import RingBufferKVCache
from swkv_teach.grading import check_speculative_accept, check_speculative_decoding
from swkv_teach.model import LayerCaches

DEVICE = swkv_teach.device()  # the GPU when there is one; the checks run there too

# %% [markdown]
# ## Exercise 14: `accept`, `speculative_caches`, `verify`
#
# **Difficulty:** ★★★ (3/3) · **Time:** about 45 min · **Points:** 3
#
# ### Part 1: the acceptance rule, `accept(p, drafts, q, generator) -> (a, token)`
#
# A drafter proposed $m \ge 0$ tokens `drafts` $= d_0, \dots, d_{m-1}$ (lesson 13 numbers them from 1: its $d_1$ is
# $d_0$ here; either way a draft is judged by the row before it), drawing $d_i$ from its distribution
# $q_i$. The target model, run once over them, gave $m + 1$ distributions $p_0, \dots, p_m$: $p_i$ is the
# target's distribution for the position $d_i$ was drafted for ($p_0$: the token right after the last one
# already chosen; $p_m$: the position after the last draft). Keep the drafts the target would have produced
# itself, in proportion:
#
# * for $i = 0, 1, \dots$: accept $d_i$ with probability $\min\big(1,\ p_i(d_i) / q_i(d_i)\big)$ (a draft the
#   target likes at least as much as the drafter is always kept). At the **first rejection** stop: $a = i$
#   drafts were accepted, and `token` is drawn from the *residual*
#   $r_i = \max(0,\ p_i - q_i) \,/\, \sum \max(0,\ p_i - q_i)$ (entry by entry): the mass the target wants
#   beyond what the drafter proposes.
# * if all $m$ drafts are accepted, $a = m$ and `token` is a **bonus** drawn from $p_m$: the forward computed
#   that distribution anyway.
#
# This is Leviathan et al. 2023 (§2.3) and Chen et al. 2023 (Algorithm 2): every token it emits follows $p$
# exactly, however bad the drafter. The arguments:
#
# * `p`: a `(m + 1, vocab)` float tensor (float32 or float64, on the CPU), each row a distribution (zeros
#   allowed: a target sampled with top-k gives most tokens probability 0).
# * `drafts`: a list of $m$ Python ints (possibly empty).
# * `q`: a `(m, vocab)` tensor of the same kind, or `None` for a drafter that does not sample (prompt lookup):
#   then $q_i$ is one-hot at $d_i$, so $d_i$ is accepted with probability $p_i(d_i)$ and the residual is $p_i$
#   with $d_i$'s entry set to 0, renormalised.
# * `generator`: a `torch.Generator`. Draw **every** random number from it
#   (`torch.rand(..., generator=generator)`, `torch.multinomial(..., generator=generator)`), none from torch's
#   global state or Python's `random`, so that a seed reproduces a run. How many numbers you draw, and in which
#   order, is yours: the check judges the distribution of what you return over thousands of calls, and that two
#   calls with generators seeded alike return the same.
#
# Return `(a, token)`, two Python ints, and leave `p`, `q` and `drafts` as they were.
#
# Worked example, a vocabulary of 4, one draft $d_0 = 2$:
# $p_0 = [0.1, 0.2, 0.3, 0.4]$, $q_0 = [0.1, 0.1, 0.6, 0.2]$, $p_1 = [0.25, 0.25, 0.25, 0.25]$. The draft is
# kept with probability $\min(1, 0.3 / 0.6) = 0.5$, and then `(1, token)` with `token` uniform from $p_1$. Otherwise
# `(0, token)` with `token` from $\max(0, p_0 - q_0) = [0, 0.1, 0, 0.2]$ renormalised: token 1 with probability
# 1/3, token 3 with 2/3. Averaged over the drafts $q_0$ proposes, the first token emitted follows $p_0$
# exactly: token 3, for instance, comes from a draft of 3, always kept ($0.2$), or from a rejected draft of 2
# ($0.6 \times 0.5 \times 2/3 = 0.2$), in all $0.4 = p_0(3)$.
#
# ### Part 2: verify and roll back, `speculative_caches(model, k)` and `verify(model, caches, pending, drafts)`
#
# * `speculative_caches(model, k)`: the caches one sequence decodes through, for rounds of up to `k` drafts:
#   one `RingBufferKVCache` **per layer** of `model`, window `model.config.window_size`, with room to take the
#   rejected drafts back (`RingBufferKVCache(W, lookahead=k)`), returned as
#   `LayerCaches(list_of_rings, W)`.
# * `verify(model, caches, pending, drafts) -> (a, token)`, greedy. `pending` (an int) is the last token
#   chosen, **not yet** in the caches; `drafts` is a list of $m$ ints, $0 \le m \le k$.
#   1. Run the target **once** over `[pending, *drafts]`: `logits = model.step(ids, caches)` with `ids` of shape
#      $(1, m + 1)$ on the model's device; `logits` is `(1, m + 1, vocab)`. Row $i$ is the target's prediction for
#      the token after position $i$ of that chunk: row 0 predicts what should follow `pending`, i.e. $d_0$.
#   2. The target's choice at row $i$ is `logits[0, i].argmax()` (ties to the lowest id, as `argmax` does).
#      $a$ is the number of leading drafts equal to the choice of their row; `token` is the choice at row $a$:
#      the *correction* when a draft was rejected, the *bonus* when all $m$ were accepted.
#   3. Roll back, in **every** layer's cache, the $m - a$ rejected drafts: `cache.rollback(m - a)` (an int).
#      `pending` and the accepted drafts stay; `token` is not fed: like `pending`, it goes first in the next
#      round's verify.
#
#   Return `(a, token)` as Python ints. Use `model.step` (or the layers, as in exercise 05), not the library's
#   `swkv_teach.speculative` (the check's answer key: calling it is refused).
#
# Worked example, $W = 3$, $k = 2$ (5 slots), the caches having seen positions 0..6. `verify(model, caches,
# pending, [d0, d1])` feeds positions 7, 8, 9 in one step (each query masked to its own window, as a chunk is).
# If row 0's choice is $d_0$ and row 1's is not $d_1$: $a = 1$, `token` is row 1's choice, and `rollback(1)`
# takes position 9 back; the caches have seen 9 tokens, and the next verify starts with `token` at position 9.
# Nothing is copied: the ring only moves its counter. It can, because its 5 slots hold positions 5..9: the next
# query, at position 9, needs 7 and 8, which are still there, and its own key overwrites the rejected one's slot.
#
# The check: part 1 statistically (eleven hand-made and random `p`, `q`, drafts, on vocabularies of 4 to 6, 300
# to 2,000 calls each, every `(a, token)` frequency against its exact probability), part 2 against the library's
# `swkv_teach.speculative.verify` on tiny random decoders (windows 1 to 6, `k` 1 to 4, 1 to 3 layers, float32
# and bfloat16, prompts shorter than, as long as and longer than the window, two sequences decoded in turn, each
# with its own rings), about 140 rounds of every $a$ from 0 to $m$, comparing `(a, token)`, what you fed, and every ring's keys and positions
# after each round. Run `check_speculative_accept(accept)` for part 1 alone.
#
# <details><summary>Hint 1 (part 1)</summary>
#
# With `u = torch.rand((), generator=generator)`, "accept with probability $\min(1, \text{ratio})$" is
# `u < ratio`. For `q is None`, `p[i, d]` is the ratio itself. Sample one token from a row `r` (which need not sum to 1) with
# `int(torch.multinomial(r, 1, generator=generator))`.
#
# </details>
#
# <details><summary>Hint 2 (part 1)</summary>
#
# The residual is `(p[i] - q[i]).clamp(min=0)`. For `q is None` it is `p[i].clone()` with entry `d` set to 0:
# `p[i]` alone is a view, and writing into it would change the caller's `p`.
#
# </details>
#
# <details><summary>Hint 3 (part 2)</summary>
#
# `best = logits[0].argmax(-1).tolist()` gives the $m + 1$ choices; count $a$ in a `while` loop that stops at the
# first draft that differs, then `token = best[a]`. $m$ is `len(drafts)`, which may be less than `k`.
#
# </details>

# %% swkv={"exercise": "14", "role": "answer"}
def accept(p, drafts, q, generator):
    """(a, token): Leviathan et al.'s rule; every random number from generator."""
    ### BEGIN SOLUTION
    for i, d in enumerate(drafts):
        p_d = float(p[i, d])
        q_d = 1.0 if q is None else float(q[i, d])
        u = float(torch.rand((), generator=generator))
        if u * q_d < p_d:  # probability min(1, p/q): u < p/q, written without dividing
            continue
        if q is None:
            residual = p[i].clone()
            residual[d] = 0.0
        else:
            residual = (p[i] - q[i]).clamp(min=0.0)
        return i, int(torch.multinomial(residual, 1, generator=generator))
    m = len(drafts)
    return m, int(torch.multinomial(p[m], 1, generator=generator))  # the bonus
    ### END SOLUTION


# %%
check_speculative_accept(accept)


# %% swkv={"exercise": "14", "role": "answer"}
def speculative_caches(model, k):
    """One ring per layer, window W, k lookahead slots, in a LayerCaches."""
    ### BEGIN SOLUTION
    W = model.config.window_size
    return LayerCaches([RingBufferKVCache(W, lookahead=k) for _ in model.layers], W)
    ### END SOLUTION


def verify(model, caches, pending, drafts):
    """Feed [pending, *drafts] once, keep the agreeing drafts, roll back the rest."""
    ### BEGIN SOLUTION
    device = next(model.parameters()).device
    ids = torch.tensor([[pending, *drafts]], device=device)  # (1, m + 1)
    best = model.step(ids, caches)[0].argmax(-1).tolist()  # m + 1 choices
    a = 0
    while a < len(drafts) and drafts[a] == best[a]:
        a += 1
    for cache in caches:
        cache.rollback(len(drafts) - a)  # the rejected drafts: a counter moves
    return a, best[a]  # the correction, or the bonus when a == len(drafts)
    ### END SOLUTION


# %% swkv={"exercise": "14", "points": 3, "role": "check"}
check_speculative_decoding(accept, speculative_caches, verify)

# %% [markdown]
# Your `accept` on the worked example: drafts drawn from $q_0$, as a drafter would, 20,000 times. The first
# token emitted (the accepted draft, or the correction) comes out as often as $p_0$ says (to the sampling noise
# of 20,000 draws, about 0.003), although the drafter proposes token 2 twice as often as the target wants it.

# %%
g = torch.Generator().manual_seed(0)
p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
q = torch.tensor([[0.1, 0.1, 0.6, 0.2]])
first = torch.zeros(4)
for _ in range(20_000):
    d = int(torch.multinomial(q[0], 1, generator=g))
    a, token = accept(p, [d], q, g)
    first[d if a == 1 else token] += 1
print("first token emitted:", [round(x, 3) for x in (first / first.sum()).tolist()])
print("the target's p_0:   ", [round(x, 3) for x in p[0].tolist()])

# %% [markdown]
# Your `verify` in a whole generation: the shipped model (window 64) continues a prompt past its window, drafts
# coming from the context itself (the library's `PromptLookup` finds the last few tokens earlier in the text and
# proposes what followed them). Greedy speculative decoding must give exactly the tokens of plain greedy
# decoding; how many forwards it saves depends on how often the drafts are right, and this small model copies
# its context only now and then.

# %%
from swkv_teach import load_pretrained
from swkv_teach.speculative import PromptLookup

model, tok = load_pretrained(DEVICE)
prompt = tok.encode(
    "def f(x):\n    return x\n\n\ndef g(x):\n    return x\n\n\ndef h(x):\n"
)
k, new = 4, 60
drafter = PromptLookup(k)
with torch.no_grad():
    caches = speculative_caches(model, k)
    logits = model.step(torch.tensor([prompt], device=DEVICE), caches)
    out = [int(logits[0, -1].argmax())]
    forwards, accepted = 1, 0
    while len(out) < new:
        m = min(k, new - len(out) - 1)  # a round emits up to m + 1 tokens
        drafts, _ = drafter.propose(prompt + out, m)
        a, token = verify(model, caches, out[-1], drafts)
        out += drafts[:a] + [token]
        forwards, accepted = forwards + 1, accepted + a
    plain = model.generate(torch.tensor([prompt], device=DEVICE), new)[0, len(prompt):]
print(repr(tok.decode(out)))
print("same tokens as plain greedy decoding:", out == plain.tolist())
print(f"{new} tokens in {forwards} forwards instead of {new}; {accepted} drafts kept")

# %% [markdown]
# ### Interview follow-up
#
# Your server runs a model with a 4,096-token sliding window and speculative decoding with $k = 4$ drafts.
# Its KV cache is a ring of exactly 4,096 slots per layer. What goes wrong, when, and what are the fixes? And
# why does sampling with drafts not change the distribution of what users see?
#
# <details><summary>One good answer</summary>
#
# A verify writes $m + 1 \le 5$ tokens into the ring, position $n + j$ into the slot of position $n + j - W$.
# Until the sequence is longer than the window nothing is lost. After that, the drafts' keys land in the slots
# of the oldest tokens of the window, and if those drafts are rejected, the next query (right after the last
# kept token) still needs the keys they overwrote: with $r$ drafts rejected, its $r - 1$ oldest keys are gone.
# A ring that just moves its counter back then attends over a window with a hole, silently: it holds the
# right number of keys, some of them belonging to tokens that no longer exist. (The course's ring refuses such
# a rollback instead of answering wrong.) Fixes: give the ring spare slots (a lookahead, what
# `RingBufferKVCache(W, lookahead=k)` does: rollback is then a counter, no copy); or keep the past and crop it
# after each verify, as transformers' `DynamicSlidingWindowLayer` does by concatenating (5.25,
# `cache_utils.py`: `activate_past_recording` line 211, `update` lines 222–258 keep every state, `crop` from
# line 281 cuts them back); or write the drafts' keys somewhere else and commit only the accepted ones.
#
# Sampling stays exact because a draft $d$ drawn with probability $q(d)$ and kept with probability
# $\min(1, p(d)/q(d))$ comes out with probability $\min(q(d), p(d))$; the residual $\max(0, p - q)$ hands out
# exactly the missing mass, so each emitted token has probability $p$: the drafter changes the speed, never the
# distribution.
#
# </details>
