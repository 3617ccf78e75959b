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
# # Lesson 10 — From demo to service: persistence, telemetry, sharding, fault tolerance
#
# **Time:** about 65 minutes. **You need:** lessons 3 (the ring buffer) and 4 (the decoder); lesson 7's paged
# cache helps for section 2.
#
# **By the end you will be able to**
#
# * save a generation's caches with `state_dict()`, load them in a *new process* and continue bit for bit,
#   and say why a sliding window's state is small next to the weights;
# * read a cache's `stats()` and chart them over a generation: memory flat, evictions climbing one a step;
# * split the KV heads, and so the cache, over two processes started by `torchrun` (Megatron-style tensor
#   parallelism), and check the tokens and the bytes each process holds;
# * kill one of those processes mid-generation and watch every process resume from the last consistent
#   snapshot, not from the prompt.
#
# The LRU guide this course grew from ends on a roadmap: its extensions — *persistence, sharding,
# observability, fault tolerance* — are what turn a toy into a service. Each is small. None needs a
# home-made framework: persistence follows PyTorch's own `state_dict` convention, and the processes are
# started and restarted by PyTorch's launcher, `torchrun`, talking through `torch.distributed`.

# %%
# %matplotlib inline
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from pprint import pprint

import matplotlib.pyplot as plt
import torch

import swkv_teach
from swkv_teach.distributed import check_world_size, shard_state

torch.manual_seed(0)
torch.set_num_threads(1)
plt.rcParams.update({"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 10})
DPI = 110
# scratch files; never printed (the name is random)
WORK = Path(tempfile.mkdtemp(prefix="swkv_lesson10_"))

model, tok = swkv_teach.load_pretrained()
cfg = model.config
PROMPT = "class Counter:\n    def __init__(self"
prompt = torch.tensor([tok.encode(PROMPT)])
print(
    f"window W = {cfg.window_size}, {cfg.n_layers} layers, {cfg.n_kv_heads} KV heads of"
    f" {cfg.head_dim} dims, {cfg.n_heads} query heads"
)

# %% [markdown]
# ## 1. Save a generation, resume it somewhere else
#
# Every cache in the library, and the per-layer list `model.new_caches(kind)` returns, has PyTorch's pair
# `state_dict()` / `load_state_dict(sd)`. A state is a plain dict of tensors and Python values, so
# `torch.save` writes it and `torch.load(path, weights_only=True)` reads it back without running any code
# from the file. It holds everything that decides what the cache returns next: tokens seen (rotary
# positions come from it), the buffers *in slot order* (a ring returns keys in slot order, and attention
# adds them up in that order, so the order is part of the bits), and, for other policies, their own
# bookkeeping (an LRU's recency order, H2O's scores, a paged cache's block table).
#
# We generate 20 tokens, stopping with the 20th chosen but not yet fed, and save the caches.


# %%
@torch.no_grad()
def continue_greedy(caches, first, steps):
    """Feed ``first`` (1, c), then ``steps`` greedy tokens; return tokens and logits."""
    ids, out, logits_seen = first, [], []
    for _ in range(steps):
        logits = model.step(ids, caches)[:, -1]
        ids = logits.argmax(-1, keepdim=True)
        out.append(ids.item())
        logits_seen.append(logits)
    return out, torch.stack(logits_seen)


caches = model.new_caches("ring")
first20, _ = continue_greedy(caches, prompt, 20)
torch.save(
    {"caches": caches.state_dict(), "next": torch.tensor([[first20[-1]]])},
    WORK / "paused.pt",
)

layer0 = caches.state_dict()["layers"][0]
for key, value in layer0.items():
    shown = (
        f"tensor {tuple(value.shape)} {value.dtype}"
        if isinstance(value, torch.Tensor)
        else repr(value)
    )
    print(f"{key:12s} {shown}")

# %% [markdown]
# `seen` is 55: the prompt's 36 characters plus the 19 tokens fed since (the 20th is chosen, not yet fed).
# `positions` are the positions of the keys the last update returned. The buffers are
# `(batch, heads, W, head_dim)` whatever the length: that is the window.
#
# The uninterrupted run goes on here. A **new Python process** (a subprocess: nothing shared with this
# kernel but the file) loads the state into fresh caches and continues for 25 tokens; we compare every
# logit, bit for bit.

# %%
uninterrupted, logits_here = continue_greedy(caches, torch.tensor([[first20[-1]]]), 25)

RESUME = """
import sys, torch, swkv_teach
model, tok = swkv_teach.load_pretrained()
saved = torch.load(sys.argv[1], weights_only=True)
caches = model.new_caches("ring")
caches.load_state_dict(saved["caches"])
ids, out = saved["next"], []
with torch.no_grad():
    for _ in range(25):
        logits = model.step(ids, caches)[:, -1]
        out.append(logits)
        ids = logits.argmax(-1, keepdim=True)
torch.save(torch.stack(out), sys.argv[2])
"""
env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
done = subprocess.run(
    [sys.executable, "-c", RESUME, str(WORK / "paused.pt"), str(WORK / "resumed.pt")],
    capture_output=True,
    text=True,
    env=env,
    timeout=300,
)
assert done.returncode == 0, done.stderr
logits_there = torch.load(WORK / "resumed.pt", weights_only=True)
print("the 45 tokens after the prompt:", repr(tok.decode(first20 + uninterrupted)))
print(
    "resumed in a new process, logits bit-identical at all 25 steps:",
    torch.equal(logits_here, logits_there),
)

# %% [markdown]
# A state of the wrong shape is refused before anything changes, and the message says what differs. Here the
# target caches were made for a window of 32:

# %%
wrong = model.new_caches("ring", window_size=32)
try:
    wrong.load_state_dict(torch.load(WORK / "paused.pt", weights_only=True)["caches"])
except ValueError as err:
    print(textwrap.fill(f"ValueError: {err}", 88, subsequent_indent="  "))
print("the target is untouched: seen =", wrong[0].seen)

# %% [markdown]
# ### Why a window's state is small
#
# The saved state holds $2\,(k, v) \times \text{layers} \times \text{KV heads} \times W \times \text{head\_dim}$ numbers, whatever the length of the
# generation. A full-attention cache grows by the same amount *per token*, forever. Next to the weights:

# %%
weights = sum(p.numel() * p.element_size() for p in model.parameters())
state_bytes = (WORK / "paused.pt").stat().st_size
per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4
print(f"weights (float32):                 {weights / 1024:8.0f} KiB")
print(
    f"saved window state (W = {cfg.window_size}):     {state_bytes / 1024:8.0f} KiB "
    f" ({state_bytes / weights:.0%} of the weights,\n{'':35}after"
    f" {layer0['seen']} tokens or after a million)"
)
for T in (1_000, 10_000, 100_000):
    full = per_token * T
    print(
        f"a full cache after {T:>7,} tokens:   {full / 1024:8.0f} KiB "
        f" ({full / weights:.1f}x the weights)"
    )

# %% [markdown]
# The same arithmetic for Mistral 7B (32 layers, 8 KV heads of 128 dims, float16: 128 KiB per token, lesson 0)
# with its window of 4096: 512 MiB per sequence, against 14.5 GB of weights. A snapshot of a paused sequence
# is a few percent of a model load; with full attention over a 32k context it would be 4 GiB. That is what
# makes pausing, migrating and resuming sequences cheap for a window model.

# %% [markdown]
# ## 2. Telemetry: `stats()`
#
# Every cache reports integer counts: `tokens_seen`, `tokens_stored` (its `len`), `tokens_evicted`,
# `bytes_held` (its `nbytes`), plus what its policy adds — a paged cache its blocks and its pool's free
# blocks, an LRU cache its hits and misses, H2O and TOVA their evictions. `caches.stats()` sums the layers
# and keeps each layer's own dict under `"layers"`. We record them at every step of a 200-token generation
# for three caches that keep the same tokens: the naive cat-and-slice, the ring, and the paged cache.


# %%
@torch.no_grad()
def record(kind, steps=200):
    cs = model.new_caches(kind)
    history, ids = [], prompt
    for _ in range(steps):
        logits = model.step(ids, cs)[:, -1]
        history.append(cs.stats())
        ids = logits.argmax(-1, keepdim=True)
    return history


histories = {kind: record(kind) for kind in ("naive", "ring", "paged")}
last = histories["paged"][-1]
pprint({k: v for k, v in last.items() if k != "layers"}, width=88, sort_dicts=False)
print("layer 0 alone:")
pprint(last["layers"][0], width=88, sort_dicts=False)

# %%
fig, (ax_mem, ax_ev) = plt.subplots(1, 2, figsize=(11, 3.8), dpi=DPI)
styles = {
    "naive": ("#4C72B0", "-"),
    "ring": ("#DD8452", "--"),
    "paged": ("#55A868", ":"),
}
for kind, history in histories.items():
    seen = [s["tokens_seen"] // cfg.n_layers for s in history]
    color, ls = styles[kind]
    ax_mem.plot(
        seen,
        [s["bytes_held"] / 1024 for s in history],
        color=color,
        ls=ls,
        lw=2.2,
        label=kind,
        drawstyle="steps-post",
    )
    ax_ev.plot(
        seen,
        [s["tokens_evicted"] // cfg.n_layers for s in history],
        color=color,
        ls=ls,
        lw=2.2,
        label=kind,
    )
for ax in (ax_mem, ax_ev):
    ax.axvline(cfg.window_size, color="grey", lw=1)
    ax.set_xlabel("tokens seen")
    ax.grid(alpha=0.3)
ax_mem.text(cfg.window_size + 3, 5, f"W = {cfg.window_size}", color="grey")
ax_mem.set_ylabel("KiB held (all layers)")
ax_mem.set_ylim(bottom=0)
ax_mem.set_title("Memory: flat once the window is full")
ax_ev.set_ylabel("tokens evicted per layer")
ax_ev.set_title("Evictions: one per step after W")
ax_ev.text(
    cfg.window_size + 10, 150, "all three caches:\nevicted = seen - W", color="#333333"
)
ax_mem.legend(loc="lower right")
fig.tight_layout()
plt.show()

# %% [markdown]
# The ring allocates its `W` slots at the first token and is flat from there; the naive cache grows to `W`
# then stays; the paged cache grows a block (16 tokens) at a time and, once the window slides, returns a
# block each time it takes one — it holds $\lceil (W - 1) / 16 \rceil + 1 = 5$ blocks, one more than the window's
# 64 tokens strictly need, except at the steps where the window lines up with block boundaries (lesson 7).
# Evictions are the same line for all three: $\text{seen} - W$ once full.
# These are the numbers a serving dashboard would scrape per request.

# %% [markdown]
# ## 3. Sharding: two processes, half the cache each
#
# One process holds all `n_kv_heads = 2` KV heads. With `P` processes, rank `r` keeps KV heads
# $r \cdot n_{kv}/P, \dots, (r+1) \cdot n_{kv}/P - 1$ (with $n_{kv}$ = `n_kv_heads`) and the query heads that read them (grouped-query attention keeps them together), and its own
# ring caches for those heads only. That is Megatron-LM's split of self-attention (Shoeybi et al. 2019,
# section 3): the query/key/value projection is cut by its output rows, the output projection `o_proj` by its input
# columns, so each rank computes a *partial* `o_proj` output from its heads, and one all-reduce (a sum over
# processes) per layer gives every rank the full result. The embedding, norms, MLP and head are replicated.
# vLLM splits Llama/Mistral attention the same way (`LlamaAttention`: `QKVParallelLinear` and a
# `RowParallelLinear` for `o_proj`).
#
# `swkv_teach.distributed` builds each rank's model as an ordinary `Decoder` with fewer heads, whose
# `o_proj` sums over processes; everything else is the code of the previous lessons. The rows each rank keeps:

# %%
state = model.state_dict()
for rank in range(2):
    mine = shard_state(state, cfg, rank, 2)
    print(
        f"rank {rank}: qkv_proj {tuple(mine['layers.0.attn.qkv_proj.weight'].shape)} "
        f"(of {tuple(state['layers.0.attn.qkv_proj.weight'].shape)}), "
        f"o_proj {tuple(mine['layers.0.attn.o_proj.weight'].shape)} "
        f"(of {tuple(state['layers.0.attn.o_proj.weight'].shape)})"
    )
try:
    check_world_size(cfg, 3)
except ValueError as err:
    print("\n" + textwrap.fill(f"3 processes: {err}", 88, subsequent_indent="  "))

# %% [markdown]
# Now for real: `torchrun` starts two Python processes, each joins a process group (gloo, over loopback on
# the CPU; nccl on GPUs), and they decode together. The cell runs the same command you would type in a
# terminal; rank 0 prints one JSON line.


# %%
def torchrun(*extra, restarts=0):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        str(restarts),
        "-m",
        "swkv_teach.distributed",
        "--checkpoint",
        "shipped",
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        "40",
        "--seed",
        "0",
        "--device",
        "cpu",
        "--json",
        *extra,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return (
        json.loads(
            [line for line in done.stdout.splitlines() if line.startswith("{")][0]
        ),
        done.stderr,
    )


single = model.generate(prompt, 40)[0].tolist()
single_bytes = model.new_caches("ring")
model.step(prompt, single_bytes)
sharded, _ = torchrun()
print("text:", repr(tok.decode(sharded["tokens"])))
print("same tokens as one process:", sharded["tokens"] == single)
print(
    "cache bytes per rank:",
    sharded["cache_bytes_per_rank"],
    "| one process:",
    single_bytes.stats()["bytes_held"],
)

# %% [markdown]
# Each rank holds half the cache: that is the point of sharding the KV heads. The logits are not bit-identical
# to one process (the two partial sums are added in another order), but agree to rounding, and the greedy
# tokens are the same.

# %% [markdown]
# ## 4. A rank dies; everyone resumes from the last snapshot
#
# `--snapshot-dir DIR --snapshot-every 8` makes every rank save its caches (`state_dict`) and the tokens so
# far every 8 new tokens. Consistency across ranks is the whole difficulty: each rank writes its file under
# a temporary name and renames it (a rename is atomic: the file is whole or absent), all ranks meet at a
# barrier, and only then does rank 0 commit the snapshot by renaming a small `LATEST` file that names it; a
# second barrier, and older files go. A crash at any moment leaves a complete snapshot that `LATEST` names.
#
# `--fail-at-token 20` is fault injection: rank 1 exits with an error after 20 new tokens, once (it records
# that in `DIR/FAULT`). `torchrun --max-restarts 1` sees the failure, stops the other rank and starts both
# again; they read `LATEST` and go on from token 16, not from the prompt.
#
# (A restarted attempt joins the process group through its own prefix of torchrun's key-value store,
# `TORCHELASTIC_RESTART_COUNT`; otherwise a restarted gloo group can read the dead attempt's addresses.)

# %%
snap = WORK / "snapshots"
resumed, log = torchrun(
    "--snapshot-dir",
    str(snap),
    "--snapshot-every",
    "8",
    "--fail-at-token",
    "20",
    restarts=1,
)
print(
    "rank 1's error:",
    next(line for line in log.splitlines() if "fault injected" in line).strip(),
)
print("FAULT says:", (snap / "FAULT").read_text().strip())
print("resumed from the snapshot after", resumed["resumed_from"], "new tokens")
print("same tokens as the uninterrupted run:", resumed["tokens"] == sharded["tokens"])
print("files left in the snapshot folder:", sorted(p.name for p in snap.iterdir()))
print("LATEST:", (snap / "LATEST").read_text())

# %% [markdown]
# The snapshot after 32 tokens is still there: a job killed now and started again with the same command
# would resume from it. What a production system adds on top — asynchronous checkpointing so decoding does
# not wait for the disk, snapshots on shared storage so a *different* machine can resume, elastic world sizes
# (re-sharding a state saved by 2 ranks onto 4) — builds on the same two pieces: a state that is plain
# tensors, and a commit that all ranks agree on.
#
# ## Summary
#
# * `state_dict()` / `load_state_dict()` on every cache and on `LayerCaches`: plain tensors, `weights_only`
#   loading, checks before changes, bit-identical continuation in another process. A window's state is
#   bounded by `W`, so it stays a few percent of the weights.
# * `stats()`: the counts a dashboard needs; with a window, memory is flat and evictions climb one a step.
# * Tensor parallelism splits the KV heads, and the cache, across processes; one all-reduce per layer.
# * Snapshots committed after a barrier turn a crash into a resume from the last common token.
#
# Next: [lesson 11](11_fused_decode_kernel.ipynb) writes the fused paged decode kernel that lessons 6 and 7 read
# about; [lesson 12](12_prefix_caching.ipynb) shares cached prefixes between requests; then
# [lesson 14, the interview drill](14_interview_drill.ipynb), which asks about every lesson before it.
