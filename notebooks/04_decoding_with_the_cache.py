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
# # Lesson 4 — Decoding with the cache
#
# Lessons 1–3 fed caches with random keys. Here a real model produces them: a small Mistral-style
# decoder (`swkv_teach.model.Decoder`), trained on the characters of Python's standard library
# and shipped with the package. No download, no GPU needed.
#
# This lesson
#
# 1. opens the model: its config, its parameter count, and what one block does with a cache;
# 2. checks that decoding token by token through the caches gives **the same logits** as running
#    the whole sequence at once (the oracle);
# 3. feeds a prompt **longer than the window**, in chunks (chunked prefill), and checks it again;
# 4. checks the decoder against Hugging Face's `MistralForCausalLM` (when `transformers` is installed);
# 5. lets the model write text with the ring cache;
# 6. shrinks the cache's window below the one the model was trained with, and measures what that costs.
#
# Window convention, as everywhere in the course (`swkv_teach.masks`): query `i` attends key `j`
# exactly when `i - W < j <= i`.

# %%
# %matplotlib inline
import torch
import torch.nn.functional as F
import matplotlib.pyplot as plt

import swkv_teach
from swkv_teach import window_mask
from swkv_teach.pretrained import load_pretrained
from swkv_teach.train import HELDOUT_FILES, read_stdlib

torch.manual_seed(0)
# the model is tiny: one CPU thread is as fast as several, and steadier on a busy machine
torch.set_num_threads(1)
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
print(config)
print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
print(f"tokenizer: {tok}, e.g. {tok.encode('def f')}")

# %% [markdown]
# A few of these matter for the cache:
#
# * `window_size=64`: the model was trained with a 64-token sliding window (on sequences of 256
#   characters, so it has seen the window slide). A cache of 64 tokens per layer is all it needs.
# * `n_heads=4`, `n_kv_heads=2`: **grouped-query attention**. Four query heads share two key/value
#   heads, so the cache stores keys and values for 2 heads, not 4: half the memory.
# * `head_dim=24`: per layer and token, the cache holds `2 (k and v) × 2 heads × 24 = 96` numbers.
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
#    back and add to `x` (residual).
# 5. **MLP**: normalise again, SwiGLU, add to `x`.
#
# After the last block: a final RMSNorm and the output head give logits over the 98 characters.
# `Decoder.forward` runs the *same* blocks with no cache: all positions at once, keys at positions
# `0..T-1`, the same `window_mask`. One code path for the mask, so the two can be compared.

# %%
print(model.layers[0])

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
ids = torch.tensor([tok.encode(heldout[:200])], device=dev)        # (1, 200): 200 > W = 64

with torch.no_grad():
    oracle = model(ids)                                            # (1, 200, 98), no cache
    caches = model.new_caches("ring")                              # one RingBufferKVCache per layer
    stepwise = torch.cat([model.step(ids[:, t : t + 1], caches) for t in range(ids.shape[1])], dim=1)

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
# chunk's first query still needs the `W - 1` keys before it, and each later query in the chunk
# has a different window. So `update` returns the stored keys the chunk's first query may see
# followed by the whole chunk, and the mask, built from absolute positions, cuts each query's
# row to its own window.
#
# Feed 100 characters, then a chunk of 16:

# %%
W = config.window_size
with torch.no_grad():
    caches = model.new_caches("ring")
    model.step(ids[:, :100], caches)                               # positions 0..99, one chunk
    model.step(ids[:, 100:116], caches)                            # positions 100..115
pos = caches[0].positions
print(f"keys returned for the chunk: {len(pos)} = (W - 1 = {W - 1} stored) + (16 new)")
print(f"their positions: {pos.min().item()}..{pos.max().item()}")
mask = window_mask(torch.arange(100, 116, device=pos.device), pos, W)
print("mask shape (queries, keys):", tuple(mask.shape))
print("query 100 sees positions", pos[mask[0]].min().item(), "to", pos[mask[0]].max().item())
print("query 115 sees positions", pos[mask[-1]].min().item(), "to", pos[mask[-1]].max().item())

# %% [markdown]
# Query 100 sees `37..100` and query 115 sees `52..115`: 64 keys each, as the convention says. Now
# the whole 200-character text, in chunks of several sizes, including sizes that do not divide 200
# and one chunk of everything. Each must reproduce the oracle:

# %%
for chunk_size in (1, 7, 16, 64, 100, 200):
    for kind in ("ring", "naive"):
        diff = (model.score(ids, cache=kind, chunk_size=chunk_size) - oracle).abs().max().item()
        print(f"chunk_size={chunk_size:>3}, {kind:>5}: max |diff| < 1e-4: {diff < 1e-4}")

# %% [markdown]
# `model.generate` does exactly this: the prompt as one chunk, then one token per step.
#
# ## 4. The same numbers as Hugging Face
#
# `Decoder.from_hf(mistral)` copies the weights of a Hugging Face `MistralForCausalLM` into our
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
    print('transformers is not installed: parity check skipped (pip install -e ".[hf]" to run it)')
else:
    from transformers import MistralConfig, MistralForCausalLM

    from swkv_teach.model import Decoder

    torch.manual_seed(0)
    hf_config = MistralConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=8, max_position_embeddings=512,
        initializer_range=0.1, attn_implementation="eager", bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    mistral = MistralForCausalLM(hf_config).to(dev).eval()
    ours = Decoder.from_hf(mistral)
    x = torch.randint(0, 100, (2, 45), generator=torch.Generator().manual_seed(1)).to(dev)  # > 5 windows
    with torch.no_grad():
        reference = mistral(x).logits
        new = 30
        hf_tokens = mistral.generate(x[:1, :20], max_new_tokens=new, min_new_tokens=new, do_sample=False)
    worst = max((ours.score(x, cache="ring", chunk_size=c) - reference).abs().max().item() for c in (1, 3, 45))
    worst = max(worst, (ours(x) - reference).abs().max().item())
    assert worst < 1e-4, f"logits differ from Hugging Face's by {worst:.2e}"
    assert torch.equal(ours.generate(x[:1, :20], new, cache="ring"), hf_tokens), "greedy tokens differ"
    print("parity holds: logits within 1e-4 of Hugging Face's (forward and ring cache, chunks 1, 3, 45),")
    print(f"and greedy generation gives the same {new} tokens")

# %% [markdown]
# ## 5. The model writes
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
sampled = model.generate(prompt, max_new_tokens=160, cache="ring", temperature=0.7, top_k=10, seed=0)
print("greedy:\n" + tok.decode(greedy[0]).rstrip())
print("\nsampled (temperature 0.7, top 10, seed 0):\n" + tok.decode(sampled[0]).rstrip())

# %% [markdown]
# Whatever the text, the cache kind must not change it: ring and naive caches hold the same keys,
# so greedy decoding picks the same characters.

# %%
naive_greedy = model.generate(prompt, max_new_tokens=160, cache="naive")
print("ring and naive caches write the same 160 characters:", torch.equal(greedy, naive_greedy))

# %% [markdown]
# ## 6. A cache window smaller than the training window
#
# Memory is the reason for a window, so it is tempting to shrink it further at inference time: a
# cache of 16 tokens costs a quarter of one of 64. The model is unchanged; only what it may look
# at changes. `score(..., window_size=w)` makes caches of `w` tokens and masks with `w`.
#
# We measure the next-character loss (cross-entropy, nats per character; lower is better) on the
# held-out files, 8 pieces of 256 characters each, with the window the model was trained with
# (`W = 64`), `W/2`, `W/4`, `W/8`, and, out of curiosity, **larger** than trained: `2W`.

# %%
T, N = 256, 8
data = torch.tensor(tok.encode(heldout[: N * T + 1]), device=dev)
x, y = data[:-1].view(N, T), data[1:].view(N, T)                   # y: the next character


def loss_of(logits):
    return F.cross_entropy(logits.flatten(0, 1), y.flatten()).item()


windows = [W // 8, W // 4, W // 2, W, 2 * W]
losses = {w: loss_of(model.score(x, cache="ring", chunk_size=64, window_size=w)) for w in windows}

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'window':>8} {'cache memory':>13} {'loss (nats/char)':>17}")
for w in windows:
    note = "  <- trained with this" if w == W else ""
    print(f"{w:>8} {w / W:>12.3g}x {losses[w]:>17.3f}{note}")
print(f"(uniform guessing over {tok.vocab_size} characters: {torch.tensor(tok.vocab_size).log().item():.3f})")

# %% [markdown]
# The exact numbers depend on your Python's standard library (the held-out files change between
# versions), so they are not compared by the tests; the shape is, below. Read the table from the
# trained window downward: the loss rises as the window shrinks, slowly at first, then faster. A
# character model leans mostly on the last few dozen characters (the current identifier, the
# indentation of this line), so halving the window costs little. At `W/8` the model cannot see the
# start of a longer identifier or the previous line, and every prediction gets a little worse.
#
# The last row is the surprise: a window **larger** than trained is much *worse*, although the
# model sees strictly more. Its queries now meet keys at distances 64 to 127, which it never saw in
# training: the rotary angles for those distances are new to it, and attention weight leaks onto
# keys it has no idea how to use. A model runs well with the window it was trained with, and
# nothing guarantees it runs well with any other.

# %%
print("loss rises as the window shrinks below W:", losses[W // 8] > losses[W // 4] > losses[W])
print("a window 2W is worse than W:", losses[2 * W] > losses[W])

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(6, 3.2), dpi=90)
ax.plot(windows, [losses[w] for w in windows], marker="o")
ax.axvline(W, color="grey", linestyle="--", lw=1)
ax.annotate(f"trained window W={W}", xy=(W, losses[W]), xytext=(-60, 40), textcoords="offset points", fontsize=8,
            arrowprops=dict(arrowstyle="->", color="grey"))
ax.set_xscale("log", base=2)
ax.set_xticks(windows, [str(w) for w in windows])
ax.set(xlabel="cache window at inference (tokens per layer)", ylabel="held-out loss (nats/char)",
       title="Same weights, different cache windows")
ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# ## What to remember
#
# * A decoder drives its caches through one interface: `update` (keys after RoPE in, keys to attend
#   over out), `positions` (for the mask) and `seen` (where the next position starts).
# * Token-by-token decoding through a cache must equal the full forward. Test it with a text
#   longer than the window, with several chunk sizes, and against a reference implementation.
# * Chunked prefill: the cache returns the chunk's first query's `W - 1` predecessors plus the
#   chunk; `window_mask(q_positions, cache.positions, W)` gives each query its own window.
# * The window is part of the model. Shrinking it at inference saves memory and costs accuracy;
#   growing it past the trained window can cost even more.
#
# Next: [lesson 5](05_eviction_policies.ipynb) looks at other eviction rules (LRU, attention
# sinks), and [lesson 6](06_measuring.ipynb) measures time and memory.
# **Your turn:** [exercises/06_cached_decode.ipynb](../exercises/06_cached_decode.ipynb) has you write
# the decode loop yourself.
