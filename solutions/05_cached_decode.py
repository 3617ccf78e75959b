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
# # Exercise 05: decoding through the caches
#
# Now plug a cache into a model. `swkv_teach.model.Decoder` is a small Mistral-style decoder. Its
# `forward(input_ids)` computes all logits at once with the sliding-window mask (the oracle). You will write
# the step a server runs instead: feed only the *new* tokens, with one KV cache per layer.
#
# **How this notebook works.** Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError` line), run the cell, then run the check cell below it. `check_cached_decode` prints one line starting with ✅ when your answer is right; otherwise it stops with an `ExerciseFailed` message naming the first case that went wrong, what was expected, what you returned, and a hint. Run it as often as you like.
#
# Window convention, used everywhere in this course: with window `W`, query `i` attends to keys `i - W < j <= i` (W keys, itself included).

# %%
import torch

import swkv_teach
from swkv_teach.grading import check_cached_decode

torch.manual_seed(0)
DEVICE = swkv_teach.device()  # the GPU when there is one; the checks run there too
from swkv_teach.model import Decoder, DecoderConfig


# %% [markdown]
# ## Exercise 05: `decode_step(model, input_ids, caches)`
#
# **Difficulty:** ★★☆ (2/3) · **Time:** about 25 min · **Points:** 3
#
# `input_ids` is `(B, c)`: the `c` new tokens. `caches` holds one cache per layer (`model.new_caches()`).
# Return the logits `(B, c, vocab)` of the new tokens, using only the model's parts. What each part takes and
# returns (`dim`, `n_heads`, `n_kv_heads`, `head_dim` and `vocab_size` are in `model.config`):
#
# | call | returns |
# |---|---|
# | `model.embed(input_ids)` | `x`, `(B, c, dim)` |
# | `layer.attn_norm(x)`, `layer.mlp_norm(x)`, `model.norm(x)` | `(B, c, dim)`, each with its own weight |
# | `layer.attn.qkv(h, positions)`, `positions` a 1-D **integer** tensor of the `c` absolute positions (float positions are refused, even where RoPE would give the same keys: float32 rounds positions past 2**24) | `q` `(B, n_heads, c, head_dim)`, `k` and `v` `(B, n_kv_heads, c, head_dim)`, RoPE applied at `positions` |
# | `cache.seen` | tokens this cache has been given so far (an `int`) |
# | `cache.update(k, v)` | `(k, v)` to attend over, each `(B, n_kv_heads, n, head_dim)`, `n` at most `W - 1 + c` |
# | `cache.positions`, read **after** `update` | `(n,)` long: the absolute position of each key `update` just returned, in its order |
# | `layer.attn.attend(q, k, v, q_positions, k_positions)` | `(B, c, dim)`: grouped-query attention with the window mask and `o_proj`, ready to add to the residual |
# | `layer.mlp(h)` | `(B, c, dim)` |
# | `model.lm_head(h)` | logits `(B, c, vocab_size)` |
#
# Each layer is pre-norm: `x + attention(attn_norm(x))`, then `x + mlp(mlp_norm(x))`; then `model.norm` and
# `model.lm_head`.
#
# Not allowed: `model.step`, `model.score`, `model.generate` (the library's own answers) and `model(...)` (the
# oracle, which reruns the whole sequence), however they are called (through `type(model)` too); every layer's cache
# must take the keys and values its `qkv` just made through `update`, and `k_positions` must name the keys `update`
# returned in their order (a ring that has wrapped returns them in slot order, not sorted). The check compares
# your logits with `model.forward` on the whole sequence, one token at a time (window 3, 14 tokens) and with
# prompt chunks longer than the window (window 5). Its tiny decoder has random, non-unit norm weights and
# sharp attention, so a norm swapped or a position off by one shows. Decoding is inference: the check (and the
# demo below) run it under `torch.no_grad()`; `@torch.inference_mode()` on your function is fine too.
#
# <details><summary>Hint 1</summary>
#
# The new tokens' absolute positions are `torch.arange(start, start + c, device=input_ids.device)` with `start = caches[0].seen`, read *before* any `update` (every layer has seen the same tokens).
#
# </details>
#
# <details><summary>Hint 2</summary>
#
# Pre-norm blocks: `x = x + attn(...)` where attention reads `layer.attn_norm(x)`, then `x = x + layer.mlp(layer.mlp_norm(x))`.
#
# </details>
#
# <details><summary>Hint 3</summary>
#
# After `k, v = cache.update(k, v)`, the keys' positions are `cache.positions` (move them to `x.device`); pass them as `k_positions` so the mask is right for chunks too.
#
# </details>

# %% swkv={"exercise": "05", "role": "answer"}
def decode_step(model, input_ids: torch.Tensor, caches) -> torch.Tensor:
    """Logits (B, c, vocab) for the c new tokens input_ids (B, c), through one KV cache per layer."""
    ### BEGIN SOLUTION
    start = caches[0].seen  # absolute position of the first new token: tokens seen, never len(cache)
    positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)  # (c,)
    x = model.embed(input_ids)  # (B, c, dim)
    for layer, cache in zip(model.layers, caches):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), positions)  # RoPE applied
        k, v = cache.update(k, v)  # keys are cached after RoPE
        x = x + layer.attn.attend(q, k, v, positions, cache.positions.to(x.device))
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))  # (B, c, vocab)
    ### END SOLUTION


# %% swkv={"exercise": "05", "points": 3, "role": "check"}
check_cached_decode(decode_step)

# %%
model = Decoder(DecoderConfig(window_size=4)).to(DEVICE).eval()
ids = torch.randint(0, model.config.vocab_size, (1, 12), device=DEVICE)
caches = model.new_caches("ring")
with torch.no_grad():
    steps = torch.cat([decode_step(model, ids[:, t : t + 1], caches) for t in range(ids.shape[1])], dim=1)
    full = model(ids)
print("one token at a time == whole sequence:", torch.allclose(steps, full, atol=1e-4))
print("tokens held per layer:", [len(c) for c in caches], "after", caches[0].seen, "tokens")

# %% [markdown]
# ### Interview follow-up
#
# A colleague computes the RoPE positions as `torch.arange(len(cache), len(cache) + c)`. The first `W + 1` tokens come out right (positions 0..W: token `W` gets position `len(cache) = W`, by luck). What goes wrong after that, and why do tests at short lengths miss it?
#
# <details><summary>One good answer</summary>
#
# `len(cache)` counts tokens *stored*, which stops at `W` once the window is full, while the true position keeps growing. From then on every new token is rotated as if it sat at position `W`, and the query positions given to the mask are wrong too, so logits drift from the oracle. Any test of at most `W + 1` tokens misses it (lesson 4 measures the first wrong position at `W + 1`): always test past the window, and name the two counts apart (`seen` vs stored), as the library's caches do.
#
# </details>
