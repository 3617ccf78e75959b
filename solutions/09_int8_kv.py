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
# # Exercise 09: an 8-bit KV cache, one token at a time
#
# Keys and values in float16 take 2 bytes an element; in int8, one, plus a scale. The library's
# `Int8RingBufferKVCache` quantises every token it stores with one **absmax** scale per token and head,
# and dequantises what attention reads. Here you write those two functions. Lesson 7 measures what it saves
# and what it costs on the trained checkpoint.
#
# **How this notebook works.** Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError` line), run the cell, then run the check cell below it. `check_int8_quantize` prints one line starting with ✅ when your answer is right; otherwise it stops with an `ExerciseFailed` message naming the first case that went wrong, what was expected, what you returned, and a hint. Run it as often as you like.

# %%
import torch

import swkv_teach
from swkv_teach.grading import check_int8_quantize

DEVICE = swkv_teach.device()  # the GPU when there is one; the checks run there too

# %% [markdown]
# ## Exercise 09: `quantize` and `dequantize`
#
# **Difficulty:** ★☆☆ (1/3) · **Time:** about 15 min · **Points:** 2
#
# * `quantize(x)`: `x` is `(batch, heads, tokens, head_dim)`, any floating dtype, and not necessarily
#   contiguous (a model's keys are `proj(h).view(B, T, H, D).transpose(1, 2)`: use `reshape`, not `view`, if
#   you flatten; `dequantize` gets such `q` and `scale` too). For each token and head
#   (each row along `head_dim`): `scale = max |x| / 127`, `q = round(x / scale)`, **computed in float32**
#   (`x.float()` first: in float16 or bfloat16 the division itself rounds, and float16 cannot even hold the
#   scale of a quiet token). Return `q` as `torch.int8` (same shape as `x`) and `scale` as `torch.float32`,
#   shape `(batch, heads, tokens, 1)`. An all-zero row has `max |x| = 0`, so `x / scale` is `0 / 0 = NaN`
#   there: it needs a guard (divide by 1 where the scale is 0), since what NaN becomes when cast to int8 is not
#   defined; the check watches for NaN reaching that cast. Such a row gets `q = 0` (and any finite scale); every
#   other row gets exactly `max |x| / 127`, however small (no `eps` or floor on the scale).
# * Ties: where `x / scale` lands exactly on `.5`, `q` may round either way (`torch.round` rounds half to even,
#   `floor(t + 0.5)` rounds half up; both are within half a step). The check judges `q` by that half-step bound.
# * Leave `x` unchanged: it is the caller's keys (no `x.div_`, no `x /= scale`); the check rejects in-place writes.
# * `dequantize(q, scale, dtype)`: `q * scale`, multiplied in float32, returned in `dtype`.
#
# Then every element comes back within half a step, `scale / 2 = max|x| / 254`, of the original.
# The library's `swkv_teach.caches.int8.quantize_int8` / `dequantize_int8` are the check's answer key:
# passing them in is refused; write your own.
#
# <details><summary>Hint 1</summary>
#
# `x.float().abs().amax(dim=-1, keepdim=True)` is the absmax of each row in float32, shaped
# `(batch, heads, tokens, 1)` to broadcast against `x` (without `keepdim=True` the last axis disappears).
#
# </details>
#
# <details><summary>Hint 2</summary>
#
# `.to(torch.int8)` *truncates* toward zero (2.7 becomes 2): round first with `torch.round`. And why 127, not
# 128? The largest element would become 128, which int8 cannot hold.
#
# </details>
#
# <details><summary>Hint 3</summary>
#
# A zero row makes `x / scale` a `0 / 0`. `torch.where(scale > 0, scale, torch.ones_like(scale))` is a safe
# divisor; the quotient is 0 there anyway. A `clamp_min(1e-6)` on the scale would also avoid the `0 / 0`, but
# it gives every token quieter than `127e-6` the wrong scale.
#
# </details>

# %% swkv={"exercise": "09", "role": "answer"}
def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., head_dim) -> q int8 (..., head_dim), scale float32 (..., 1): absmax / 127 per row."""
    ### BEGIN SOLUTION
    scale = x.float().abs().amax(dim=-1, keepdim=True) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # a zero row divides by 1 and stays 0
    q = torch.round(x.float() / safe).clamp(-127, 127).to(torch.int8)
    return q, scale
    ### END SOLUTION


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q * scale, in dtype."""
    ### BEGIN SOLUTION
    return (q.float() * scale).to(dtype)
    ### END SOLUTION


# %% swkv={"exercise": "09", "points": 2, "role": "check"}
check_int8_quantize(quantize, dequantize)

# %%
x = torch.tensor([[[[3.0, -1.5, 0.7, 0.0]]]], device=DEVICE)  # one token, one head
q, scale = quantize(x)
print("q     :", q.flatten().tolist(), " scale:", round(scale.item(), 5))
print("x_hat :", [round(v, 4) for v in dequantize(q, scale, x.dtype).flatten().tolist()])
print("bound :", round(x.abs().max().item() / 254, 5), " worst error:", round((dequantize(q, scale, x.dtype) - x).abs().max().item(), 5))

# %% [markdown]
# ### Interview follow-up
#
# Why a scale per token and head rather than one per tensor, and why do systems such as KIVI quantise keys
# per *channel* instead? What does the scale cost in memory?
#
# <details><summary>One good answer</summary>
#
# One scale per tensor is set by the loudest element anywhere: a quiet token or head then uses a handful of
# the 255 levels and loses most of its information. A scale per token and head adapts to each row, and a
# new token can be quantised the moment it arrives, without touching the others (what a cache needs).
# Keys, though, have *outlier channels*: a few dimensions of `head_dim` are large for every token, so a
# per-token scale is dominated by them; KIVI (Liu et al., 2024) quantises keys per channel and values per
# token, and Hugging Face's `QuantizedCache` (transformers `cache_utils.py`) quantises per channel in groups
# (`q_group_size=64`, 4 bits by default) and keeps up to `residual_length=128` recent tokens in full precision,
# re-quantising everything together each time that buffer fills. The scale costs 4
# bytes (float32) per token and head against `head_dim` bytes of int8: 3 % at `head_dim = 128`.
#
# </details>
