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
# # Exercise 11: your ring as a Hugging Face cache layer
#
# Lesson 9 put the library's ring inside `model.generate` of Mistral and Gemma. Here you write that layer
# yourself: a ring of `W` slots that transformers calls once per layer and step, through the interface
# `CacheLayerMixin` (transformers `cache_utils.py`). The check runs your layer inside tiny random Mistral, Gemma 2
# and Gemma 3 models built locally, with `model.generate` and with chunked calls, against one forward of the same
# tokens without any cache.
#
# **How this notebook works.** Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError` line), run the cell, then run the check cell below it. `check_hf_cache_layer` prints one line starting with ✅ when your answer is right; otherwise it stops with an `ExerciseFailed` message naming the first case that went wrong, what was expected, what you returned, and a hint. Run it as often as you like.
#
# Window convention, used everywhere in this course: with window `W`, query `i` attends to keys `i - W < j <= i` (W keys, itself included).

# %%
import torch
import transformers
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

import swkv_teach
from swkv_teach.grading import check_hf_cache_layer

torch.manual_seed(0)
DEVICE = swkv_teach.device()  # the GPU when there is one; the check feeds your layer there too


# %% [markdown]
# ## Exercise 11: `RingLayer` and `ring_cache`
#
# **Difficulty:** ★★★ (3/3) · **Time:** about 40 min · **Points:** 3
#
# transformers (5.15 and newer) asks each layer four things, always for `(batch, kv_heads, q, head_dim)` keys
# and values of `q` new tokens, after `n` tokens were seen:
#
# * `get_seq_length()`: tokens **seen**, `n`, not tokens stored. The model takes the new tokens' positions
#   (RoPE) and the mask's query offset from it.
# * `get_mask_sizes(q) -> (kv_length, kv_offset)`, called **before** `update` (only for the first sliding layer,
#   and possibly more than once, so it must only read, and `update` must not rely on it having been called:
#   the other layers' updates come without it): the keys `update` will return hold positions
#   `kv_offset, kv_offset + 1, ..., kv_offset + kv_length - 1`. Return what transformers' own
#   `DynamicSlidingWindowLayer.get_mask_sizes` returns (5.24 `cache_utils.py` line 261): the stored keys the
#   first new query (position `n`) can see, `j > n - W`, then the `q` new ones:
#
#   ```
#   kv_offset = max(n - W + 1, 0)        kv_length = min(n, W - 1) + q
#   ```
# * `update(key_states, value_states, *args, **kwargs) -> (k, v)`: store the new tokens in the ring (token `p`
#   in slot `p % W`; after a chunk longer than `W`, its last `W` tokens) and return exactly those keys and
#   values. For **one** token you may return the filled slots in **slot** order, the ring itself with no copy:
#   every key is in that query's window, so the mask row is all True and order cannot matter. For a **chunk**
#   (`q > 1`) the mask differs from row to row and is laid out by position: return the stored keys
#   **oldest first**, then the chunk.
# * `lazy_initialization(key_states, value_states)`: allocate the two `(B, H, W, D)` buffers on the first
#   `update`, with that tensor's batch, heads, head_dim, **dtype and device**; set `self.is_initialized = True`.
#
# `is_sliding = True` on the class: `masking_utils` sizes the sliding mask from the first layer that says so and
# the full mask from the first that does not (`Cache.is_sliding`, `cache_utils.py` line 1940 in 5.24, 1659 in 5.15.0).
#
# `ring_cache(model)` returns a `transformers.Cache(layers=[...])` with one layer per model layer: your
# `RingLayer(W)` for each sliding layer, transformers' `DynamicLayer()` for each **full-attention** layer. Read
# the (text) config with `model.config.get_text_config(decoder=True)`: `W = config.sliding_window`;
# `config.layer_types` lists `"sliding_attention"` / `"full_attention"` per layer (Gemma 2 and 3); Mistral's
# config has no `layer_types` (every layer slides: `config.num_hidden_layers` of them, any number).
#
# The check feeds your layer directly (windows 1 to 8; chunks of 1, 2, 5, `W - 1` and `W + 3` tokens, before
# and long after the window filled; batch 1 and 2; float32/float64/float16/bfloat16; several layers alive at
# once; updates with no `get_mask_sizes` before them; memory held to the window), then runs tiny Mistral (1, 2, 3
# and 5 layers), Gemma 2 and Gemma 3 models with your `ring_cache`:
# every chunk's logits, and every step of greedy `generate`, within 1e-4 of one forward without a cache. Padding, beam search and
# `torch.compile` are out of scope.
#
# <details><summary>Hint 1</summary>
#
# Worked example, `W = 3`, `n = 7` tokens seen (slots hold positions `[6, 4, 5]`):
# one token (position 7) goes into slot 1; `get_mask_sizes(1)` is `(3, 5)` and `update` may return the slots
# as they are, positions `[6, 7, 5]`. A chunk of 2 instead (positions 7, 8): `get_mask_sizes(2)` is `(4, 5)`
# and `update` returns positions `[5, 6, 7, 8]`, in that order.
#
# </details>
#
# <details><summary>Hint 2</summary>
#
# The stored positions the chunk sees are `p = max(n - W + 1, 0), ..., n - 1`, in slots `p % W`:
# `self.k_buf[:, :, slots]` with a tensor of slots copies them in that order; `torch.cat` the chunk after them.
# Then write the chunk's last `min(q, W)` tokens into their slots, the same way.
#
# </details>
#
# <details><summary>Hint 3</summary>
#
# `ring_cache`: `types = getattr(config, "layer_types", None) or ["sliding_attention"] * config.num_hidden_layers`,
# then `Cache(layers=[RingLayer(W) if t == "sliding_attention" else DynamicLayer() for t in types])`.
#
# </details>

# %% swkv={"exercise": "11", "role": "answer"}
class RingLayer(CacheLayerMixin):
    """One sliding-attention layer's keys and values in a ring of ``sliding_window`` slots (token p in slot p % W)."""

    is_sliding = True
    is_compileable = False

    def __init__(self, sliding_window: int):
        super().__init__()
        ### BEGIN SOLUTION
        self.sliding_window = sliding_window
        self.k_buf = self.v_buf = None  # (B, H, W, D), allocated by lazy_initialization
        self.seen = 0  # tokens seen so far, not stored
        ### END SOLUTION

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocate the ring like ``key_states``: its batch, heads, head_dim, dtype and device."""
        ### BEGIN SOLUTION
        B, H, _, D = key_states.shape
        self.k_buf = key_states.new_zeros(B, H, self.sliding_window, D)
        self.v_buf = value_states.new_zeros(B, H, self.sliding_window, D)
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True
        ### END SOLUTION

    def get_seq_length(self) -> int:
        """Tokens seen so far (not stored)."""
        ### BEGIN SOLUTION
        return self.seen
        ### END SOLUTION

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)`` of the keys the next ``update`` of ``query_length`` tokens returns."""
        ### BEGIN SOLUTION
        n, W = self.seen, self.sliding_window
        return min(n, W - 1) + query_length, max(n - W + 1, 0)
        ### END SOLUTION

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Store ``(B, H, q, D)`` new keys/values; return the keys/values the new queries attend over."""
        ### BEGIN SOLUTION
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, W, q = self.seen, self.sliding_window, key_states.shape[2]
        if q == 1:  # the one-token invariant: every stored key is in the window, so slot order will do
            slot = n % W
            self.k_buf[:, :, slot] = key_states[:, :, 0]
            self.v_buf[:, :, slot] = value_states[:, :, 0]
            self.seen = n + 1
            filled = min(n + 1, W)
            return self.k_buf[:, :, :filled], self.v_buf[:, :, :filled]
        dev = self.k_buf.device
        old = torch.arange(max(n - W + 1, 0), n, device=dev) % W  # slots of the visible stored keys, oldest first
        k = torch.cat([self.k_buf[:, :, old], key_states], dim=2)  # indexing with a tensor copies
        v = torch.cat([self.v_buf[:, :, old], value_states], dim=2)
        last = torch.arange(max(q - W, 0), q, device=dev)  # the chunk's tokens that stay: its last W
        self.k_buf[:, :, (n + last) % W] = key_states[:, :, last]
        self.v_buf[:, :, (n + last) % W] = value_states[:, :, last]
        self.seen = n + q
        return k, v
        ### END SOLUTION

    def get_max_length(self) -> int:
        return self.sliding_window


def ring_cache(model) -> Cache:
    """A ``transformers.Cache``: ``RingLayer(W)`` per sliding layer of ``model``, ``DynamicLayer()`` per full one."""
    ### BEGIN SOLUTION
    config = model.config.get_text_config(decoder=True)
    n_layers = config.num_hidden_layers
    types = getattr(config, "layer_types", None) or ["sliding_attention"] * n_layers
    return Cache(layers=[RingLayer(config.sliding_window) if t == "sliding_attention" else DynamicLayer()
                         for t in types[:n_layers]])
    ### END SOLUTION


# %% swkv={"exercise": "11", "points": 3, "role": "check"}
check_hf_cache_layer(RingLayer, ring_cache)

# %% [markdown]
# Hint 1's example, on your layer: keys labelled by their position.

# %%
def label(*positions):
    return torch.tensor(positions, dtype=torch.float32, device=DEVICE).view(1, 1, -1, 1)


def demo(run):
    """Run a demo on your layer; until the check above passes, say so in one line instead of a long traceback."""
    try:
        run()
    except Exception as e:  # noqa: BLE001 - any error of a layer that does not pass yet
        print(f"this demo uses your layer and stopped: {type(e).__name__}: {str(e)[:160]}. Fix what the check reports first.")


def ring_example():
    layer = RingLayer(3)
    layer.update(label(0, 1, 2, 3, 4, 5, 6), label(0, 1, 2, 3, 4, 5, 6))  # a prompt of 7 tokens
    print("seen", layer.get_seq_length(), "| one token: mask sizes", layer.get_mask_sizes(1), end=" -> ")
    print("keys", layer.update(label(7), label(7))[0].flatten().tolist(), "(slot order)")
    print("seen", layer.get_seq_length(), "| chunk of 2: mask sizes", layer.get_mask_sizes(2), end=" -> ")
    print("keys", layer.update(label(8, 9), label(8, 9))[0].flatten().tolist(), "(oldest first)")


demo(ring_example)

# %% [markdown]
# And inside a tiny random Gemma 2 (a sliding layer, then a full one), greedy `generate` against transformers'
# default cache:

# %%
config = transformers.Gemma2Config(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=3,
                                   initializer_range=0.1, attn_implementation="eager", bos_token_id=None,
                                   eos_token_id=None, pad_token_id=None)
model = transformers.Gemma2ForCausalLM(config).eval()
prompt = torch.randint(0, 61, (2, 5))


def gemma_example():
    cache = ring_cache(model)
    print("layers:", [type(lay).__name__ for lay in cache.layers])
    kwarg = "cache" if "cache" in __import__("inspect").signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        ours = model.generate(prompt, max_new_tokens=12, do_sample=False, **{kwarg: cache})
        theirs = model.generate(prompt, max_new_tokens=12, do_sample=False)
    print("same tokens as transformers' cache:", torch.equal(ours, theirs), "| seen:", cache.get_seq_length())


demo(gemma_example)

# %% [markdown]
# ### Interview follow-up
#
# transformers describes the keys a layer returns by two numbers, `(kv_length, kv_offset)`. Why is that enough
# for its own sliding layers, why does your ring get away with slot order for one token, and what would it take
# to hand a chunk the ring's slots in slot order, with no copy?
#
# <details><summary>One good answer</summary>
#
# `masking_utils` builds every mask from positions alone: key index `k` of the returned tensor is taken to hold
# position `kv_offset + k` (`_preprocess_mask_arguments` asks `get_mask_sizes`, 5.24 `masking_utils.py` line
# 844), and the sliding rule `kv > q - W` is evaluated on those. transformers' own layers keep keys
# chronologically (cat-and-slice, or a roll), so a contiguous range describes them. For one token every key
# returned is inside the query's window: the mask row is all True, attention is a softmax-weighted sum, and a
# sum does not care about order (each key already carries its RoPE position), so slot order is invisible. For
# a chunk the rows differ and order matters. To serve slot order anyway, the mask would need each key's
# position (a `positions` tensor per layer, as the course's own decoder uses, or a block table as in vLLM), i.e.
# a custom mask function or attention kernel; the price of the simple interface is one `W`-sized copy per chunk,
# which a prefill amortises over its tokens.
#
# </details>
