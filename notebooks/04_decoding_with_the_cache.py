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
# # Lesson 4 — Decoding with the cache
#
# **Time:** about 125 minutes for the lesson, plus 25–45 for [exercise 05](../exercises/05_cached_decode.ipynb), done where the lesson reaches it. **You need:** lessons 1–3 (the caches, `seen` vs stored, masks from
# positions).
#
# **By the end you will be able to**
#
# * drive a real decoder with per-layer caches and prove it right against the no-cache oracle, token
#   by token and in prompt chunks;
# * explain rotary position embeddings (RoPE) in a few lines of code, and why they let a ring buffer
#   keep keys in any slot;
# * recognise the `len(cache)`-instead-of-`seen` bug from its symptom (exact for the first $W + 1$
#   tokens, positions `0..W`, then drifting);
# * say what changing the window at inference costs, and test an explanation instead of asserting it;
# * batch prompts of different lengths: left padding, a pad mask, positions per row, and the bug of a
#   shared position counter.
#
# Lessons 1–3 fed caches with random keys. Here a real model produces them: a small Mistral-style
# decoder (`swkv_teach.model.Decoder`), trained on the characters of Python's standard library
# and shipped with the package. No download, no GPU needed.
#
# This lesson
#
# 1. opens the model: its config, what one block does with a cache, and what its attention computes;
# 2. checks that decoding token by token through the caches gives **the same logits** as running
#    the whole sequence at once (the oracle);
# 3. feeds a prompt **longer than the window**, in chunks (chunked prefill), and checks it again;
# 4. checks the model's **RoPE** against a readable one (lesson 3 taught why it lets a key sit in any
#    slot), and runs the classic position bug;
# 5. checks the decoder against Hugging Face's `MistralForCausalLM` (when `transformers` is installed);
# 6. lets the model write text with the ring cache;
# 7. changes the cache's window at inference, measures what that costs, and tests why;
# 8. batches prompts of different lengths: left padding, the pad mask, and positions per row.
#
# Window convention, as everywhere in the course (`swkv_teach.masks`): query `i` attends key `j`
# exactly when $i - W < j \le i$. Unfamiliar term? See the [glossary](../docs/glossary.md); formulas
# are on the [cheat sheet](../docs/cheatsheet.md), sources in [references](../docs/references.md).

# %%
# %matplotlib inline
import math

import torch
import torch.nn.functional as F
import matplotlib.pyplot as plt

import swkv_teach
from swkv_teach import cached_attention, window_mask
from swkv_teach.model import LayerCaches
from swkv_teach.pretrained import load_pretrained
from swkv_teach.train import HELDOUT_FILES, read_stdlib

torch.manual_seed(0)
# the model is tiny: one CPU thread is as fast as several, and steadier on a busy
# machine
torch.set_num_threads(1)
plt.rcParams.update({"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 10})
DPI = 110
dev = swkv_teach.device()
model, tok = load_pretrained(dev)

# %%
# NBVAL_IGNORE_OUTPUT
print("running on", dev)

# %% [markdown]
# ## 1. The model
#
# `load_pretrained()` returns the decoder (in eval mode) and its tokenizer: one token per character,
# 98 of them (tab, newline, printable ASCII, and one "unknown"). The config is a plain dataclass:

# %%
config = model.config
print(type(config).__name__, "(a dataclass):")
for name, value in vars(config).items():
    print(f"  {name} = {value}")
print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
print(f"tokenizer: {tok}, e.g. {tok.encode('def f')}")

# %% [markdown]
# A few of these matter for the cache:
#
# * `window_size=64`: the model was trained with a 64-token sliding window (on sequences of 256
#   characters, so it has seen the window slide). A cache of 64 tokens per layer is all it needs.
# * `n_heads=4`, `n_kv_heads=2`: **grouped-query attention**. Four query heads share two key/value
#   heads, so the cache stores keys and values for 2 heads, not 4: half the memory.
# * `head_dim=24`: per layer and token, the cache holds $2\ (k \text{ and } v) \times 2\,\text{heads} \times 24 = 96$ numbers.
#
# ### One block, with a cache
#
# `Decoder.step(input_ids, caches)` feeds `c` new tokens through the model. Their positions start at
# `caches[0].seen`: tokens the caches have *seen*, not tokens they *store*, which stops at 64. Each
# of the 3 blocks then does, in order (see `Block.forward` in `swkv_teach/model.py`):
#
# 1. **Normalise** `x` with RMSNorm (pre-norm).
# 2. **Project** to queries `(B, 4, c, 24)`, keys and values `(B, 2, c, 24)`, and **rotate** queries
#    and keys by their absolute positions (RoPE). The keys are cached *after* rotation, so a key
#    carries its position wherever it sits in the cache.
# 3. **`cache.update(k, v)`** stores the new keys and values and returns what the new queries attend
#    over; `cache.positions` says which absolute position each returned key has.
# 4. **Attend**: repeat each key/value head for its 2 query heads (GQA), build the mask with
#    `window_mask(q_positions, cache.positions, W)` and run `scaled_dot_product_attention`; project
#    back and add to `x` (residual). (One shortcut: for a single new token over a ring or naive
#    cache every returned key is inside its window, the mask would be all True, and the library
#    skips it, `needs_no_mask` in `model.py`; its tests hold both paths to the oracle.)
# 5. **MLP**: normalise again, SwiGLU, add to `x`.
#
# After the last block: a final RMSNorm and the output head give logits over the 98 characters.
# `Decoder.forward` runs the *same* blocks with no cache: all positions at once, keys at positions
# $0 \dots T-1$, the same `window_mask`. One code path for the mask, so the two can be compared.

# %%
print(model.layers[0])

# %% [markdown]
# ### What `attend` computes
#
# Step 4 calls the library's `cached_attention`, which hands the work to PyTorch's fused
# `scaled_dot_product_attention`. Written out, it is this: repeat each key/value head for its
# query heads, score, mask with the window rule on absolute positions, softmax, weight the values.
# The keys may come in any order (a ring buffer's slot order), as long as `k_pos` lists each key's
# own position.

# %%
def attend_readable(q, k, v, q_pos, k_pos, W):
    """q (B, heads, c, d); k, v (B, kv_heads, n, d) in any order; q_pos (c,), k_pos (n,)
    absolute positions."""
    group = q.shape[1] // k.shape[1]
    # GQA: kv head h serves query heads h*group .. h*group + group - 1
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, heads, c, n)
    i, j = q_pos[:, None], k_pos[None, :]
    # the window rule
    scores = scores.masked_fill(~((i - W < j) & (j <= i)), float("-inf"))
    return scores.softmax(dim=-1) @ v  # (B, heads, c, d)


g = torch.Generator().manual_seed(0)
# 3 new queries, 4 heads
q = torch.randn(2, 4, 3, 24, generator=g)
# 2 kv heads
k, v = torch.randn(2, 2, 10, 24, generator=g), torch.randn(2, 2, 10, 24, generator=g)
# slot order, as a ring returns them
k_pos = torch.tensor([8, 9, 10, 11, 12, 3, 4, 5, 6, 7])
q_pos = torch.tensor([10, 11, 12])
mine = attend_readable(q, k, v, q_pos, k_pos, W=8)
lib = cached_attention(q, k, v, q_pos, k_pos, 8)
print("readable version == swkv_teach.cached_attention (to 1e-5):",
      torch.allclose(mine, lib, atol=1e-5))

# %% [markdown]
# ## 2. Cached decoding equals the full forward
#
# The test every KV cache must pass: feed a text one character at a time through the caches, and
# compare each step's logits with the oracle's, `model(ids)`, which sees the whole text at once and
# never uses a cache. We take a text from the held-out part of the corpus (files the model never
# trained on) and make it longer than the window, so eviction happens many times.

# %%
heldout, files = read_stdlib(HELDOUT_FILES)
print("held-out files:", files)
# (1, 200): 200 > W = 64
ids = torch.tensor([tok.encode(heldout[:200])], device=dev)

with torch.no_grad():
    # (1, 200, 98), no cache
    oracle = model(ids)
    # one RingBufferKVCache per layer
    caches = model.new_caches("ring")
    stepwise = torch.cat(
        [model.step(ids[:, t:t + 1], caches) for t in range(ids.shape[1])], dim=1)

print("logits shape:", tuple(stepwise.shape))
print("max |cached - oracle| < 1e-4:", (stepwise - oracle).abs().max().item() < 1e-4)
print("layer 0's cache:", caches[0])

# %% [markdown]
# After 200 characters each layer's cache has **seen** 200 tokens but **stores** 64, and its size in
# bytes has not grown since token 64. `model.score(ids, cache=..., chunk_size=...)` wraps the loop
# above; it gives the same answer with the naive cat-and-slice cache of lesson 1:

# %%
for kind in ("ring", "naive"):
    diff = (model.score(ids, cache=kind) - oracle).abs().max().item()
    print(f"score(cache={kind!r}): max |diff| < 1e-4: {diff < 1e-4}")

# %% [markdown]
# ## 3. A prompt longer than the window, in chunks
#
# A prompt is known all at once, so we can feed it in **chunks** of `c` tokens (prefill) instead of
# one at a time: fewer steps, bigger matrix multiplies. Chunks make the cache's job harder. The
# chunk's first query still needs the $W - 1$ keys before it, and each later query in the chunk
# has a different window. So `update` returns the stored keys the chunk's first query may see
# followed by the whole chunk, and the mask, built from absolute positions, cuts each query's
# row to its own window.
#
# Feed 100 characters, then a chunk of 16:

# %%
W = config.window_size
with torch.no_grad():
    caches = model.new_caches("ring")
    # positions 0..99, one chunk
    model.step(ids[:, :100], caches)
    model.step(ids[:, 100:116], caches)  # positions 100..115
pos = caches[0].positions
print(f"keys returned for the chunk: {len(pos)} = (W - 1 = {W - 1} stored) + (16 new)")
print(f"their positions: {pos.min().item()}..{pos.max().item()}")
mask = window_mask(torch.arange(100, 116, device=pos.device), pos, W)
print("mask shape (queries, keys):", tuple(mask.shape))
print("query 100 sees positions", pos[mask[0]].min().item(), "to",
      pos[mask[0]].max().item())
print("query 115 sees positions", pos[mask[-1]].min().item(), "to",
      pos[mask[-1]].max().item())

# %% [markdown]
# Query 100 sees `37..100` and query 115 sees `52..115`: 64 keys each, as the convention says. This
# is the [chunk contract](../docs/cheatsheet.md#the-chunk-contract), whose mask you wrote in
# [exercise 04](../exercises/04_chunk_mask.ipynb) after lesson 3. Now
# the whole 200-character text, in chunks of several sizes, including sizes that do not divide 200
# and one chunk of everything. Each must reproduce the oracle:

# %%
for chunk_size in (1, 7, 16, 64, 100, 200):
    for kind in ("ring", "naive"):
        diff = ((model.score(ids, cache=kind, chunk_size=chunk_size) -
                 oracle).abs().max().item())
        print(
            f"chunk_size={chunk_size:>3}, {kind:>5}: max |diff| < 1e-4: {diff < 1e-4}")

# %% [markdown]
# `model.generate` does exactly this: the prompt as one chunk, then one token per step.

# %% [markdown]
# ## 4. RoPE in the model, and the position bug
#
# The ring buffer stores position 70's key in slot $70 \bmod 64 = 6$, and returns keys in slot order.
# Nothing in the attention above knows which slot a key came from, yet the results equal the
# oracle's. The reason is how this model (like Mistral, Llama, Gemma) encodes position: **rotary
# position embeddings** (RoPE, Su et al. 2021, arXiv:2104.09864), which lesson 3 (section 0) taught.
#
# As a reminder, RoPE splits each query and key vector into pairs of numbers and turns pair `t` by the angle
# $\text{position} \times f_t$, with frequencies $f_t = \theta ^{-2t/d}$ running from 1 radian per position down to
# almost nothing ($\theta = 10000$ here). In the halves layout used by Hugging Face and this package, dims
# `t` and $t + d/2$ form pair `t`:

# %%
def rope(x, positions, theta=10000.0):
    """Rotate x (..., T, d) by positions (T,): dims t and t + d/2 turn together by
    positions * f_t."""
    d = x.shape[-1]
    # (d/2,): 1 .. ~1/theta
    f = theta**(-torch.arange(0, d, 2, dtype=torch.float, device=x.device) / d)
    angle = positions.float()[:, None] * f[None, :]  # (T, d/2)
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


# the model's own projection + rotation (Attention.qkv in swkv_teach/model.py) against
# ours
attn, hd = model.layers[0].attn, config.head_dim
x = torch.randn(1, 5, config.dim, generator=torch.Generator().manual_seed(1)).to(dev)
positions = torch.arange(100, 105, device=dev)
with torch.no_grad():
    # projected and rotated by the library
    q_lib, k_lib, _ = attn.qkv(x, positions)
    # position 0: angle 0, the plain projection
    q_raw, k_raw, _ = attn.qkv(x, torch.zeros(5, device=dev))
print("rope() == the model's rotation of q and k (to 1e-5):",
      torch.allclose(rope(q_raw, positions, config.rope_theta), q_lib, atol=1e-5),
      torch.allclose(rope(k_raw, positions, config.rope_theta), k_lib, atol=1e-5))

# %% [markdown]
# Lesson 3 (section 0) showed why this matters: the score of a query rotated to position `i` and a key
# rotated to position `j` depends on $i - j$ only, so keys are rotated once, cached after rotation, and may
# sit in any slot.
#
# All of it rests on one number being right: the position `p` of each new token, which must be the
# count of tokens **seen**. A cache stores at most `W` tokens, so `len(cache)` stops at `W`; use it
# as the position and every token from `W` on is rotated as if it sat at position `W`: right for token
# `W` itself, by luck, wrong for every later one. So the bug is invisible for $W + 1$ tokens.
#
# ### The bug, on the trained model
#
# `Decoder.step` reads the position of the new tokens from `caches[0].seen`. Hand it caches that
# answer `seen` with the number of tokens they store and we have the bug, without touching the
# model. (The wrapper also reports the keys' positions as the buggy code would have recorded them,
# `min(p, W)` when tokens come one at a time, so the mask keeps the same keys and the only thing
# wrong is the rotation.)

# %%
class CountsStoredAsSeen:
    """A cache whose bookkeeping counts tokens stored where it should count tokens seen:
    the bug."""

    def __init__(self, cache, window_size):
        self.cache, self.W = cache, window_size

    def __getattr__(self, name):  # update, nbytes, ...: the real cache's
        return getattr(self.cache, name)

    def __len__(self):
        return len(self.cache)

    @property
    def seen(self):  # the bug: stops at W
        return len(self.cache)

    @property
    def positions(self):  # what that code would have recorded, one token at a time
        return self.cache.positions.clamp(max=self.W)


with torch.no_grad():
    right, buggy = model.new_caches("ring"), LayerCaches(
        [CountsStoredAsSeen(c, W) for c in model.new_caches("ring")], W)
    logits_right = torch.cat(
        [model.step(ids[:, t:t + 1], right) for t in range(ids.shape[1])], dim=1)
    logits_buggy = torch.cat(
        [model.step(ids[:, t:t + 1], buggy) for t in range(ids.shape[1])], dim=1)
# (200,): worst logit error at each position
drift_right = (logits_right - oracle).abs().amax(-1)[0].cpu()
drift_buggy = (logits_buggy - oracle).abs().amax(-1)[0].cpu()
first_bad = next(t for t in range(len(drift_buggy)) if drift_buggy[t] > 1e-3)
print(f"positions 0..{first_bad - 1}: the buggy decoder matches the oracle (< 1e-3):"
      f" {drift_buggy[:first_bad].max() < 1e-3}")
print(f"first wrong position: {first_bad} (= W + 1: token W still gets position"
      " len(cache) = W, by luck)")
agree = ((
    logits_buggy.argmax(-1) == oracle.argmax(-1))[0, first_bad:].float().mean().item())
print("from there on, the buggy decoder's top character agrees with the oracle's")
print(f"at {agree:.0%} of positions")
print("the correct decoder stays within 1e-4 everywhere:",
      drift_right.max().item() < 1e-4)

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(6.6, 3.4), dpi=DPI)
ax.plot(drift_buggy, color="#D62728", label="positions from len(cache) (the bug)")
ax.plot(drift_right, color="#4C72B0", label="positions from seen")
ax.axvline(W, color="grey", linestyle="--", lw=1)
ax.text(W - 2, 1e-3, f"window full (W={W})", color="grey", ha="right")
ax.set_yscale("log")
ax.set(xlabel="position of the decoded character", ylabel="max |logits − oracle|",
       title="The len(cache) bug: exact for W + 1 tokens, then wrong")
ax.legend(loc="center right")
ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# In the figure, the red line (positions from `len(cache)`) stays at float rounding up to the window and
# jumps to errors of whole logits after it; the blue line (positions from `seen`) never leaves rounding.

# %% [markdown]
# Exact for the first $W + 1$ characters, then errors of whole logits: the model now sees every
# recent key at a distance that is off by up to $W - 1$. Any test of at most $W + 1$ tokens passes,
# which is why every test in this course runs well past the window (several times its length) and why the library names
# `seen` and `len(cache)` apart.
#
# **Your turn:** [exercises/05_cached_decode.ipynb](../exercises/05_cached_decode.ipynb) has you write
# `decode_step` yourself: positions from `seen`, one cache per layer, the mask from `cache.positions`,
# checked against the oracle token by token and with a prompt chunk. Do it now, before section 7,
# which writes a forward pass out in full.

# %% [markdown]
# ## 5. The same numbers as Hugging Face
#
# `swkv_teach.hf.from_hf(mistral)` copies the weights of a Hugging Face `MistralForCausalLM` into our
# decoder (`swkv_teach/hf.py` maps the names). If our window rule, RoPE layout, GQA or norms were
# off by anything, logits would differ. We build a tiny random Mistral locally (nothing is
# downloaded), with sliding window 8, and compare the full forward, scoring through the ring cache
# in chunks, and greedy generation.
#
# The check runs when `transformers` is installed (`pip install -e ".[hf]"`) and is skipped
# otherwise; an assertion stops the notebook if parity fails.

# %%
# NBVAL_IGNORE_OUTPUT
import importlib.util

if importlib.util.find_spec("transformers") is None:
    print(
        'transformers is not installed: parity check skipped (pip install -e ".[hf]" to'
        ' run it)')
else:
    from transformers import MistralConfig, MistralForCausalLM

    from swkv_teach.hf import from_hf

    torch.manual_seed(0)
    hf_config = MistralConfig(vocab_size=100, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=16, sliding_window=8,
                              max_position_embeddings=512, initializer_range=0.1,
                              attn_implementation="eager", bos_token_id=None,
                              eos_token_id=None, pad_token_id=None)
    mistral = MistralForCausalLM(hf_config).to(dev).eval()
    ours = from_hf(mistral)
    # > 5 windows
    x = torch.randint(0, 100, (2, 45),
                      generator=torch.Generator().manual_seed(1)).to(dev)
    with torch.no_grad():
        reference = mistral(x).logits
        new = 30
        hf_tokens = mistral.generate(x[:1, :20], max_new_tokens=new, min_new_tokens=new,
                                     do_sample=False)
    worst = max(
        (ours.score(x, cache="ring", chunk_size=c) - reference).abs().max().item()
        for c in (1, 3, 45))
    worst = max(worst, (ours(x) - reference).abs().max().item())
    assert worst < 1e-4, f"logits differ from Hugging Face's by {worst:.2e}"
    assert torch.equal(ours.generate(x[:1, :20], new, cache="ring"),
                       hf_tokens), "greedy tokens differ"
    print("parity holds: logits within 1e-4 of Hugging Face's")
    print("(forward and ring cache, chunks 1, 3, 45),")
    print(f"and greedy generation gives the same {new} tokens")

# %% [markdown]
# ## 6. The model writes
#
# Greedy decoding from the prompt `"def "`, 160 new characters, with the ring cache: longer than
# the window, so the first characters are evicted long before the end, and each layer's memory
# stays at 64 tokens. The model has 0.3 M parameters and trained for a few minutes: it has learnt
# what Python *looks* like (indentation, `self`, dunder names, colons), not what it means. Greedy
# decoding always takes the single most likely character, and a small model easily settles into a
# loop, often of spaces or newlines. Sampling (`temperature`, `top_k`, with a `seed` for
# reproducibility) breaks the loop. The exact text depends on floating-point details of your
# machine, so the output below is not compared by the tests.

# %%
# NBVAL_IGNORE_OUTPUT
prompt = torch.tensor([tok.encode("def ")], device=dev)
greedy = model.generate(prompt, max_new_tokens=160, cache="ring")
sampled = model.generate(prompt, max_new_tokens=160, cache="ring", temperature=0.7,
                         top_k=10, seed=0)
for name, out in (("greedy", greedy), ("sampled (temperature 0.7, top 10, seed 0)",
                                       sampled)):
    text = tok.decode(out[0])
    # a run of trailing spaces and newlines would print as blank lines
    body = text.rstrip()
    print(f"{name}:\n{body}")
    if len(text) > len(body):
        tail = text[len(body):]
        print(f"  ... then {len(tail)} whitespace characters,"
              f" {tail[:24]!r}{'...' if len(tail) > 24 else ''}\n")

# %% [markdown]
# If the greedy text is a single line, the rest of the 160 characters is not missing: the model fell
# into the loop of whitespace described above, and the line under it counts those characters
# (`rstrip()` keeps them from printing as a page of blank lines).
#
# Whatever the text, the cache kind must not change it: ring and naive caches hold the same keys,
# so greedy decoding picks the same characters.

# %%
naive_greedy = model.generate(prompt, max_new_tokens=160, cache="naive")
print("ring and naive caches write the same 160 characters:",
      torch.equal(greedy, naive_greedy))

# %% [markdown]
# ## 7. A cache window other than the training window
#
# Memory is the reason for a window, so it is tempting to shrink it further at inference time: a
# cache of 16 tokens costs a quarter of one of 64. The model is unchanged; only what it may look
# at changes. `score(..., window_size=w)` makes caches of `w` tokens and masks with `w`.
#
# We measure the next-character loss (cross-entropy, nats per character; lower is better) on the
# held-out files, 8 pieces of 256 characters each, with the window the model was trained with
# ($W = 64$), $W/2$, $W/4$, $W/8$, and, out of curiosity, **larger** than trained: `2W`.

# %%
T, N = 256, 8
data = torch.tensor(tok.encode(heldout[:N * T + 1]), device=dev)
# y: the next character
x, y = data[:-1].view(N, T), data[1:].view(N, T)


def loss_of(logits):
    return F.cross_entropy(logits.flatten(0, 1), y.flatten()).item()


windows = [W // 8, W // 4, W // 2, W, 2 * W]
losses = {
    w: loss_of(model.score(x, cache="ring", chunk_size=64, window_size=w))
    for w in windows
}

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'window':>8} {'cache memory':>13} {'loss (nats/char)':>17}")
for w in windows:
    note = "  <- trained with this" if w == W else ""
    print(f"{w:>8} {w / W:>12.3g}x {losses[w]:>17.3f}{note}")
print(f"(uniform guessing over {tok.vocab_size} characters:"
      f" {torch.tensor(tok.vocab_size).log().item():.3f})")

# %% [markdown]
# The exact numbers depend on your Python's standard library (the held-out files change between
# versions), so they are not compared by the tests; the shape is, below. Read the table from the
# trained window downward: the loss rises as the window shrinks, slowly at first, then faster. A
# character model leans mostly on the last few dozen characters (the current identifier, the
# indentation of this line), so halving the window costs little. At $W/8$ the model cannot see the
# start of a longer identifier or the previous line, and every prediction gets a little worse.
#
# The last row is the surprise: a window **larger** than trained is much *worse*, although the
# model sees strictly more. A tempting explanation: its queries now meet keys at distances 64 to
# 127, which it never saw in training (RoPE makes the score a function of distance, and these
# distances are new), so attention goes to keys it has no idea how to use. That is a **hypothesis**;
# another one fits the table as well: perhaps the model is thrown by *more keys* than it was trained
# with, whatever their distance. The next cells tell the two apart.

# %%
print("loss rises as the window shrinks below W:",
      losses[W // 8] > losses[W // 4] > losses[W])
print("a window 2W is worse than W:", losses[2 * W] > losses[W])

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=DPI)
ax.plot(windows, [losses[w] for w in windows], marker="o")
ax.axvline(W, color="grey", linestyle="--", lw=1)
ax.annotate(f"trained window W={W}", xy=(W, losses[W]), xytext=(-60, 40),
            textcoords="offset points", arrowprops=dict(arrowstyle="->", color="grey"))
ax.set_xscale("log", base=2)
ax.set_xticks(windows, [str(w) for w in windows])
ax.set(xlabel="cache window at inference (tokens per layer)",
       ylabel="held-out loss (nats/char)",
       title="Same weights, different cache windows")
ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# The figure plots the held-out loss against the cache window used at inference, the trained window
# dashed: read how the loss moves as the window leaves the one the model was trained with.

# %% [markdown]
# ### Testing the explanation: is it the distance, or the number of keys?
#
# To separate the two, we choose exactly which keys each query sees, by distance $i - j$, with the
# same weights: a forward pass over the held-out pieces that takes any mask (the model's parts, as
# in `Decoder.forward`; only the mask differs). We score queries at positions $2W - 1$ and later, so
# that every mask below is complete for every scored query.

# %%
pos = torch.arange(T, device=dev)
dist = pos[:, None] - pos[None, :]  # (T, T): query position i minus key position j


def band(lo, hi):
    """Query i may attend key j when lo <= i - j < hi."""
    return (dist >= lo) & (dist < hi)


def loss_with_mask(allowed):
    """Held-out loss (queries 2W-1 .. T-1) when query i may attend key j exactly where
    allowed[i, j]."""
    with torch.no_grad():
        h = model.embed(x)  # (N, T, dim)
        for layer in model.layers:
            # RoPE applied at positions 0..T-1
            q, k, v = layer.attn.qkv(layer.attn_norm(h), pos)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                               enable_gqa=True)
            h = h + layer.attn.o_proj(o.transpose(1, 2).flatten(2))
            h = h + layer.mlp(layer.mlp_norm(h))
        logits = model.lm_head(model.norm(h))
    s = 2 * W - 1
    return F.cross_entropy(logits[:, s:].flatten(0, 1), y[:, s:].flatten()).item()


with torch.no_grad():
    reference = F.cross_entropy(
        model(x)[:, 2 * W - 1:].flatten(0, 1), y[:, 2 * W - 1:].flatten()).item()
print("band(0, W) reproduces the model's own loss (to 1e-4):",
      abs(loss_with_mask(band(0, W)) - reference) < 1e-4)

half = W // 2
masks = {
    f"nearest {half} keys": band(0, half),
    f"nearest {W} keys (trained)": band(0, W),
    f"nearest {half} + {half} at distances {W}..{W + half - 1}": (band(0, half)
                                                                  | band(W, W + half)),
    f"nearest {half} + {half} at distances {W + half}..{2 * W - 1}": (band(
        0, half) | band(W + half, 2 * W)),
    f"nearest {2 * W} keys (2W)": band(0, 2 * W)
}
by_mask = {name: loss_with_mask(m) for name, m in masks.items()}

# %%
# NBVAL_IGNORE_OUTPUT
for name, value in by_mask.items():
    print(f"{name:<38} {int(masks[name][-1].sum()):>4} keys   loss {value:.3f}")

# %% [markdown]
# Rows 2, 3 and 4 give every query the same number of keys, `W`, the number it was trained with,
# and the same nearest $W/2$. They differ only in *where* the other $W/2$ keys are. At the distances
# the model trained on, they change almost nothing; at unseen distances they make the loss much
# worse than having no extra keys at all, and the farther, the worse. So the number of keys is not the problem:
# the distances are. One more picture makes the boundary visible: add a band of 8 keys at distance
# $a \dots a + 7$ to the nearest 32, and move `a` out.

# %%
starts = list(range(half, 2 * W, 8))
sweep = [loss_with_mask(band(0, half) | band(a, a + 8)) for a in starts]
print(
    "extra keys at trained distances (< W) change the loss by less than 0.02:",
    all(
        abs(l - by_mask[f"nearest {half} keys"]) < 0.02 for a, l in zip(starts, sweep)
        if a + 8 <= W))
print(
    "32 extra keys at distances W..W+31 make the loss worse than none:",
    by_mask[f"nearest {half} + {half} at distances {W}..{W + half - 1}"]
    > by_mask[f"nearest {half} keys"] + 0.1)

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(6.6, 3.4), dpi=DPI)
ax.plot(starts, sweep, marker="o", color="#4C72B0",
        label=f"nearest {half} + 8 keys at distance a..a+7")
ax.axhline(by_mask[f"nearest {half} keys"], color="#999999", linestyle=":",
           label=f"nearest {half} keys alone")
ax.axvline(W, color="grey", linestyle="--", lw=1)
ax.text(W + 1, 0.25, "distances never seen in training →", color="grey")
ax.set(xlabel="distance a of the extra keys (tokens)",
       ylabel="held-out loss (nats/char)",
       title="Extra keys hurt once they sit well past the trained distances",
       ylim=(0, max(sweep) * 1.05))
ax.legend(loc="upper left")
ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# In the figure, the loss is flat while the extra keys sit at trained distances and, in this run, a little past `W` too (up to
# about 80); farther out the loss climbs steeply. The explanation of the `2W` row survives a test that
# could have refuted it, with a refinement the table alone could not give: the model tolerates
# distances just past the edge of its window, and fails on keys well beyond it. A model runs well with the window it was trained with, and nothing
# guarantees it runs well with any other; when you need longer context, methods such as position
# interpolation (Chen et al. 2023, arXiv:2306.15595) rescale positions so that distances stay in the
# trained range, and fine-tune briefly.

# %% [markdown]
# ## 8. Batches of different lengths
#
# Everything so far decoded one text at a time. A server batches: several prompts go through one forward,
# as rows of one tensor. Prompts have different lengths, so the short ones are **left-padded**: filler
# tokens in front, so that every row's newest token sits in the last column and the next token of every
# row is written into the same column. Three things then need care:
#
# 1. **an attention mask**: no real query may attend to a pad key;
# 2. **positions per row**: the short row's first real token is at position 0 of *its* text, not at the
#    column it sits in (Hugging Face's `generate` builds `position_ids = attention_mask.long().cumsum(-1) - 1`,
#    `prepare_inputs_for_generation` in `generation/utils.py`; FlashAttention takes `cache_leftpad` and
#    per-row `cache_seqlens`, lessons 6 and 7);
# 3. whatever numbering the keys were cached with, the queries must use the **same** one.
#
# `Decoder.step` knows none of this: it has one position counter for the whole batch (`caches[0].seen`,
# the columns) and no pad mask. Feed it two left-padded prompts and compare each row with the same text
# decoded alone:

# %%
# any id: a correct mask never lets it be read
PAD = 0
# 100 and 70 characters
texts = [heldout[:100], heldout[300:370]]
lens = [len(t) for t in texts]
# leading pad columns per row: [0, 30]
pad = torch.tensor([max(lens) - n for n in lens], device=dev)
batch = torch.tensor([[PAD] * (max(lens) - n) + tok.encode(t)
                      for t, n in zip(texts, lens)], device=dev)
# 24 more tokens each
cont = torch.randint(1, tok.vocab_size, (2, 24),
                     generator=torch.Generator().manual_seed(3)).to(dev)

with torch.no_grad():
    alone = [
        model(torch.cat([torch.tensor([tok.encode(t)], device=dev), cont[b:b + 1]],
                        1))[0, lens[b] - 1:]
        # the oracle, one text at a time: (25, vocab)
        for b, t in enumerate(texts)
    ]


def compare(logits, what):
    """logits (2, 25, vocab) from the last prompt token on; each row against its text
    decoded alone."""
    errs = [(logits[b] - alone[b]).abs().max().item() for b in range(2)]
    verdict = [("exact (< 1e-4)"
                if e < 1e-4 else "wrong (> 0.1)" if e > 0.1 else "close, not exact")
               for e in errs]
    print(f"{what:<46} long row {verdict[0]}\n{'':<46} short row {verdict[1]}")


with torch.no_grad():
    caches = model.new_caches("ring")
    out = [model.step(batch, caches)[:, -1]
           ] + [model.step(cont[:, s:s + 1], caches)[:, -1] for s in range(24)]
compare(torch.stack(out, 1), "Decoder.step, left padding, no pad mask:")

# %% [markdown]
# The long row has no padding and is exact; the short row is wrong from the first token, because its
# queries attend to the 30 pad keys. The fix needs a step that takes a position per row and masks pads.
# Here it is, written out with the model's parts (as in section 7): RoPE by each row's own positions
# (`rotary` of lesson 3 gives `(rows * tokens, head_dim)` angles, reshaped to broadcast over heads), the
# ring cache as before (its write pointer counts columns, shared by the rows), and a mask that is the
# window rule on columns (a row's positions and columns differ by its pad, so distances agree) **and**
# "not a pad key". A pad query sees only itself, so that no row of the softmax is empty.

# %%
from swkv_teach.model import apply_rotary, rotary


@torch.no_grad()
def step_rows(ids, caches, positions, pad, mask_pads=True):
    """Feed ids (B, c); positions (B, c) per row; pad (B,) leading pad columns per row.

    Returns logits (B, c, vocab).
    """
    B, c = ids.shape
    nh, nkv, hd = config.n_heads, config.n_kv_heads, config.head_dim
    # shared columns
    cols = torch.arange(caches[0].seen, caches[0].seen + c, device=ids.device)
    cos, sin = rotary(positions.flatten(), hd, config.rope_theta, torch.float32)
    # per row, all heads
    cos, sin = cos.view(B, 1, c, hd), sin.view(B, 1, c, hd)
    x = model.embed(ids)
    for layer, cache in zip(model.layers, caches):
        qkv = (layer.attn.qkv_proj(layer.attn_norm(x)).view(B, c, nh + 2 * nkv,
                                                            hd).transpose(1, 2))
        # queries and keys
        qk = apply_rotary(qkv[:, :nh + nkv], cos, sin)
        k, v = cache.update(qk[:, nh:], qkv[:, nh + nkv:])
        # columns of the keys
        kcols = cache.positions
        # (1, c, n)
        allowed = window_mask(cols, kcols, W)[None]
        if mask_pads:
            # (B, 1, n)
            real = kcols[None, None, :] >= pad[:, None, None]
            # a pad query: itself
            allowed = allowed & (real | (kcols[None, None, :] == cols[None, :, None]))
        y = F.scaled_dot_product_attention(qk[:, :nh], k, v, attn_mask=allowed[:, None],
                                           enable_gqa=True)
        x = x + layer.attn.o_proj(y.transpose(1, 2).reshape(B, c, nh * hd))
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


def run(prefill_positions, decode_positions, mask_pads=True):
    caches = model.new_caches("ring")
    cols = torch.arange(max(lens), device=dev).expand(2, -1)
    out = [step_rows(batch, caches, prefill_positions(cols), pad, mask_pads)[:, -1]]
    for s in range(24):
        col = torch.full((2, 1), max(lens) + s, device=dev)
        out.append(
            step_rows(cont[:, s:s + 1], caches, decode_positions(col), pad,
                      mask_pads)[:, -1])
    return torch.stack(out, 1)


# position in the row's own text
per_row = lambda col: (col - pad[:, None]).clamp(min=0)
# one counter for the batch: the column
shared = lambda col: col
compare(run(per_row, per_row), "per-row positions, pads masked:")
compare(run(shared, shared), "one shared counter everywhere, pads masked:")
compare(run(per_row, shared), "per-row prefill, then one shared counter:")
compare(run(per_row, per_row, mask_pads=False), "per-row positions, pads not masked:")

# %% [markdown]
# Read the four lines together:
#
# * **Per-row positions and a pad mask** reproduce each text decoded alone: the fix.
# * **One shared counter used everywhere is also exact**, and that is RoPE, not luck: every query and key of
#   the short row is numbered 30 too high, and a RoPE score depends on the distance only (lesson 3). A model
#   with absolute position embeddings (GPT-2's) has no such excuse.
# * **The bug is mixing the two.** Prefill with per-row positions (as `generate` does from the attention
#   mask), then decode on the batch's shared counter, and the short row's new queries sit 30 positions
#   further from its cached keys than they are: its logits are off by more than 0.1 (the verdict printed
#   above) from the first decoded token. The same happens when a request joins a running batch with keys numbered from 0 while the batch
#   counts columns. It is lesson 4's `len(cache)` bug in another form: one number, two meanings.
# * **Without the pad mask** the positions do not help: the short row's queries read 30 keys of filler.
#
# Engines avoid padding altogether. Each row keeps its own length and its own position counter, and its keys
# live in blocks of a shared memory pool that the row finds through a table of its own: **paging**, the
# subject of [lesson 7](07_serving_memory.ipynb), which decodes these same two texts that way, each at its own
# positions, with no pad stored and no pad mask.
#
# ## What to remember
#
# * A decoder drives its caches through one interface: `update` (keys after RoPE in, keys to attend
#   over out), `positions` (for the mask) and `seen` (where the next position starts).
# * Token-by-token decoding through a cache must equal the full forward. Test it with a text
#   longer than the window, with several chunk sizes, and against a reference implementation.
# * Chunked prefill: the cache returns the chunk's first query's $W - 1$ predecessors plus the
#   chunk; `window_mask(q_positions, cache.positions, W)` gives each query its own window.
# * RoPE rotates queries and keys by their positions; their score depends on the distance only. So
#   keys are rotated once, cached after rotation, and may sit in any slot, provided positions come
#   from `seen`. With `len(cache)` the decoder is exact for the first $W + 1$ tokens (positions
#   `0..W`) and wrong after.
# * The window is part of the model. Shrinking it at inference saves memory and costs accuracy;
#   growing it past the trained window shows the model distances it never saw, and costs more.
# * An explanation that fits a table is a hypothesis until an experiment that could refute it
#   doesn't.
# * A batch of different lengths needs a pad mask and one position numbering per row, used by keys and
#   queries alike; with RoPE a shared counter is harmless only if every key and query of a row uses it.
#
# ## Going further
#
# * Run the `len(cache)` bug with chunked prefill (`model.step` on chunks of 16). Which goes wrong
#   first, the rotation or the mask, and what do the logits look like?
# * Position interpolation: in `loss_with_mask`, rotate with `pos / 2` instead of `pos` and measure
#   `band(0, 2 * W)` again: every distance is now inside the trained range. Does the loss come back
#   to the trained window's without fine-tuning? What did halving do to the *near* distances?
#
# Next: [lesson 5](05_eviction_policies.ipynb) looks at other eviction rules (LRU, attention
# sinks), and [lesson 6](06_measuring.ipynb) measures time and memory.
