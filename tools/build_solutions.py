"""Build solutions/*.ipynb, the single source of the graded exercises.

Answer code sits between ``### BEGIN SOLUTION`` / ``### END SOLUTION``;
``swkv-teach make-exercises`` turns each region into a stub for exercises/.
Check cells carry ``{"swkv": {"exercise": id, "points": n, "role": "check"}}``
(from the registry in :mod:`swkv_teach.grading`), which ``swkv-teach grade``
reads. Run: ``python tools/build_solutions.py [01 02 ...]`` then
``swkv-teach make-exercises``.
"""

from __future__ import annotations

import sys

from nbtools import build, code, md

from swkv_teach.grading import EXERCISES


def stars(n: int) -> str:
    return "★" * n + "☆" * (3 - n)


def task(ex_id: str, title: str, difficulty: int, minutes: int, body: str, hints: list[str]) -> object:
    """The markdown above an answer cell: difficulty, time, the task, progressive folded hints."""
    folded = "\n\n".join(
        f"<details><summary>Hint {n}</summary>\n\n{h.strip()}\n\n</details>" for n, h in enumerate(hints, 1)
    )
    return md(
        f"## Exercise {ex_id}: {title}\n\n"
        f"**Difficulty:** {stars(difficulty)} ({difficulty}/3) · **Time:** about {minutes} min · "
        f"**Points:** {EXERCISES[ex_id].points}\n\n{body.strip()}\n\n{folded}"
    )


def answer(ex_id: str, source: str):
    return code(source, swkv={"exercise": ex_id, "role": "answer"})


def check(ex_id: str):
    e = EXERCISES[ex_id]
    return code(e.call, swkv={"exercise": ex_id, "points": e.points, "role": "check"})


def follow_up(question: str, reply: str):
    return md(
        f"### Interview follow-up\n\n{question.strip()}\n\n"
        f"<details><summary>One good answer</summary>\n\n{reply.strip()}\n\n</details>"
    )


def intro(title: str, text: str, check_name: str):
    return md(
        f"# {title}\n\n{text.strip()}\n\n"
        "**How this notebook works.** Write your code where it says `# YOUR CODE HERE` (delete the "
        "`raise NotImplementedError` line), run the cell, then run the check cell below it. "
        f"`{check_name}` prints one line starting with ✅ when your answer is right; otherwise it stops with "
        "an `ExerciseFailed` message naming the first case that went wrong, what was expected, what you "
        "returned, and a hint. Run it as often as you like.\n\n"
        "Window convention, used everywhere in this course: with window `W`, query `i` attends to keys "
        "`i - W < j <= i` (W keys, itself included)."
    )


SETUP = """
import torch

import swkv_teach
from swkv_teach.grading import {check}

torch.manual_seed(0)
DEVICE = swkv_teach.device()  # the GPU when there is one; the checks run there too
"""

# ---------------------------------------------------------------------------------------------- 01
NB01 = [
    intro(
        "Exercise 01: the sliding-window KV cache, in six steps",
        """
Sliding-window attention never looks further back than `window_size` tokens, so a server has no reason to
keep older keys and values. Here you build the cache from the problem statement: one method,
`update(k_new, v_new)`, that appends this step's key and value (one token, shape
`(batch, heads, 1, head_dim)`), evicts from the front once the cache holds more than `window_size` tokens,
and returns the cached `(k, v)`, shape `(batch, heads, tokens, head_dim)`.
""",
        "check_sliding_window_cache",
    ),
    code(SETUP.format(check="check_sliding_window_cache")),
    task(
        "01",
        "`SlidingWindowKVCache`",
        1,
        15,
        """
Follow the six steps:

1. In `__init__`, store `window_size` and set `self.k` and `self.v` to `None`: nothing is cached yet.
2. On the first `update`, just keep `k_new` and `v_new`: there is nothing to concatenate onto.
3. Afterwards, append along the token axis (dim 2).
4. If the cache now holds more than `window_size` tokens, evict from the front: keep the last `window_size`.
5. Return the cached keys and values.
6. Check that the length never exceeds `window_size`, however long you run (the cell after the check).
""",
        [
            "`torch.cat([self.k, k_new], dim=2)` appends one token: the layout is `(batch, heads, tokens, head_dim)`.",
            "Negative slicing keeps the most recent entries: `self.k[:, :, -self.window_size:]`. Do the same to "
            "`self.v`, or keys and values stop matching.",
            "Return the *updated* tensors (after appending and evicting), as a tuple: `return self.k, self.v`.",
        ],
    ),
    answer(
        "01",
        '''
class SlidingWindowKVCache:
    """Keep the last `window_size` tokens' keys and values, shape (batch, heads, tokens, head_dim)."""

    def __init__(self, window_size: int):
        ### BEGIN SOLUTION
        self.window_size = window_size
        self.k = None
        self.v = None
        ### END SOLUTION

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ### BEGIN SOLUTION
        if self.k is None:
            # first call: nothing to concatenate onto yet
            self.k, self.v = k_new, v_new
        else:
            self.k = torch.cat([self.k, k_new], dim=2)  # (B, H, t, D) -> (B, H, t + 1, D)
            self.v = torch.cat([self.v, v_new], dim=2)
        if self.k.shape[2] > self.window_size:
            # evict from the front: the oldest token is the first along dim 2
            self.k = self.k[:, :, -self.window_size:, :]
            self.v = self.v[:, :, -self.window_size:, :]
        return self.k, self.v
        ### END SOLUTION
''',
    ),
    check("01"),
    md("Step 6: the memory ceiling. However long the run, the cache never holds more than `window_size` tokens."),
    code(
        """
cache = SlidingWindowKVCache(window_size=4)
sizes = []
for _ in range(100):
    k, v = cache.update(torch.randn(1, 2, 1, 8, device=DEVICE), torch.randn(1, 2, 1, 8, device=DEVICE))
    sizes.append(k.shape[2])
print("tokens held after steps 1..6:", sizes[:6], "| most ever held in 100 steps:", max(sizes))
"""
    ),
    follow_up(
        "Your `update` copies the whole window with `torch.cat` at every step. What does that cost per generated "
        "token, and how would a production server avoid it?",
        "Each step allocates a new `(B, H, W, D)` tensor and copies `W` tokens into it: O(W) time and memory "
        "traffic per token per layer, plus an allocation. A ring buffer (exercise 03) preallocates `W` slots and "
        "writes token `p` into slot `p % W`, O(1) per token; attention does not care that the slots are out of "
        "chronological order, because softmax over keys is a sum and RoPE already baked each key's position in.",
    ),
]

# ---------------------------------------------------------------------------------------------- 02
NB02 = [
    intro(
        "Exercise 02: the sliding-window mask",
        """
Before caching, sliding-window attention is just a mask on the scores: `mask[i, j]` is `True` where query `i`
may attend to key `j`. You will build it for a whole sequence; the library's `window_mask` generalises it to
absolute positions (which is how the caches use it).
""",
        "check_sliding_window_mask",
    ),
    code(SETUP.format(check="check_sliding_window_mask")),
    task(
        "02",
        "`sliding_window_mask(seq_len, window_size)`",
        1,
        10,
        """
Return a `(seq_len, seq_len)` **bool** tensor with `mask[i, j] = True` exactly when `i - W < j <= i`.
For `W = 3`, query 5 sees keys 3, 4 and 5; key 2 is just out. Rows are queries, columns are keys.
""",
        [
            "Make a column of query indices and a row of key indices with `torch.arange`, then broadcast: "
            "`i = torch.arange(T)[:, None]`, `j = torch.arange(T)[None, :]`.",
            "Two conditions: causal (`j <= i`) and inside the window (`j > i - window_size`). Combine bool "
            "tensors with `&`.",
        ],
    ),
    answer(
        "02",
        '''
def sliding_window_mask(seq_len: int, window_size: int) -> torch.Tensor:
    """(seq_len, seq_len) bool: True where query i may attend to key j, i.e. i - W < j <= i."""
    ### BEGIN SOLUTION
    i = torch.arange(seq_len)[:, None]  # queries, one per row
    j = torch.arange(seq_len)[None, :]  # keys, one per column
    return (j <= i) & (j > i - window_size)
    ### END SOLUTION
''',
    ),
    check("02"),
    code("print(sliding_window_mask(6, 3).int())"),
    follow_up(
        "With `L` layers and window `W`, how far back can information travel to the last token, even though "
        "each layer only looks `W - 1` tokens back?",
        "About `L × (W - 1)` tokens: each layer moves information up to `W - 1` positions forward, and layers "
        "stack, like the receptive field of stacked convolutions. Mistral 7B (W = 4096, 32 layers) reaches "
        "about 131k tokens in theory, though in practice information fades long before that.",
    ),
]

# ---------------------------------------------------------------------------------------------- 03
NB03 = [
    intro(
        "Exercise 03: a ring buffer cache",
        """
The cache of exercise 01 copies the whole window at every step. A ring buffer allocates `W` slots once and
writes token `p` into slot `p % W`, overwriting the token that just left the window: no copy, no allocation.
The catch: its slots are not in chronological order, so it also reports each slot's absolute position.
""",
        "check_ring_buffer_cache",
    ),
    code(SETUP.format(check="check_ring_buffer_cache")),
    task(
        "03",
        "`RingBufferKVCache`",
        2,
        25,
        """
One token per `update`, shape `(batch, heads, 1, head_dim)`.

* `update(k_new, v_new)` writes the token into slot `p % W` (`p` = tokens seen before it) and returns the
  **filled** slots **in slot order**: before the buffer is full, only the first `p + 1` slots; once full, the
  buffer itself, the same memory every step (no `torch.cat`, no `.clone()`).
* `positions` (a property): a 1-D tensor with the absolute position of each key `update` returned, in that order.
* `ordered()`: a chronological copy `(k, v)` of what is stored, oldest first.

Allocate the buffers on the first update, with that token's batch, heads, head_dim, **dtype and device**.
Worked example, `W = 3`: after 4 tokens the slots hold positions `[3, 1, 2]`.
""",
        [
            "`k_new.new_zeros(B, H, W, D)` makes a buffer with `k_new`'s dtype and device. Write a token with "
            "`self.k_buf[:, :, slot] = k_new[:, :, 0]`.",
            "Slot `s` holds the latest position `p < seen` with `p % W == s`, that is "
            "`s + W * ((seen - 1 - s) // W)`.",
            "For `ordered()`, sort the slots by their positions: `order = torch.argsort(self.positions)`, then "
            "`index_select(2, order)` (move `order` to the buffer's device).",
        ],
    ),
    answer(
        "03",
        '''
class RingBufferKVCache:
    """Sliding-window cache in a preallocated ring: token p lives in slot p % window_size."""

    def __init__(self, window_size: int):
        ### BEGIN SOLUTION
        self.window_size = window_size
        self.k_buf = self.v_buf = None  # (B, H, W, D), allocated on the first update
        self.seen = 0  # tokens written so far
        ### END SOLUTION

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One token (B, H, 1, D) in; the filled slots out, in slot order."""
        ### BEGIN SOLUTION
        if self.k_buf is None:
            B, H, _, D = k_new.shape
            self.k_buf = k_new.new_zeros(B, H, self.window_size, D)
            self.v_buf = v_new.new_zeros(B, H, self.window_size, D)
        slot = self.seen % self.window_size
        self.k_buf[:, :, slot] = k_new[:, :, 0]  # in place: overwrites the token that left the window
        self.v_buf[:, :, slot] = v_new[:, :, 0]
        self.seen += 1
        filled = min(self.seen, self.window_size)
        return self.k_buf[:, :, :filled], self.v_buf[:, :, :filled]
        ### END SOLUTION

    @property
    def positions(self) -> torch.Tensor:
        """Absolute position of each key the last update returned, in slot order."""
        ### BEGIN SOLUTION
        W = self.window_size
        slots = torch.arange(min(self.seen, W))
        return slots + W * torch.div(self.seen - 1 - slots, W, rounding_mode="floor")
        ### END SOLUTION

    def ordered(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A chronological copy (k, v) of the stored tokens, oldest first."""
        ### BEGIN SOLUTION
        order = torch.argsort(self.positions).to(self.k_buf.device)
        return self.k_buf.index_select(2, order), self.v_buf.index_select(2, order)
        ### END SOLUTION
''',
    ),
    check("03"),
    code(
        """
ring = RingBufferKVCache(window_size=3)
for p in range(5):
    k, v = ring.update(torch.full((1, 1, 1, 1), float(p), device=DEVICE), torch.zeros(1, 1, 1, 1, device=DEVICE))
    print(f"after token {p}: slots hold positions {ring.positions.tolist()}")
"""
    ),
    follow_up(
        "The ring returns keys out of chronological order. Why is single-token decoding still correct, and "
        "when does the order start to matter?",
        "Attention for one query is a softmax-weighted *sum* over keys, and a sum does not depend on order; "
        "each key already carries its position because RoPE was applied before caching. Order matters when "
        "something indexes keys by position: a mask for a multi-token chunk (use `positions` to build it), "
        "displaying the cache, or a kernel that assumes contiguous chronological keys (then unrotate, as "
        "mistral-inference does).",
    ),
]

# ---------------------------------------------------------------------------------------------- 04
NB04 = [
    intro(
        "Exercise 04: an LRU cache keyed by token id",
        """
A popular blog post builds its "sliding-window" cache as an LRU cache: `put(token_id, key, value)` inserts
and evicts the least recently used entry once over `max_size`; `get(token_id)` returns `(key, value)` and
*promotes* the entry. Build it correctly, then think about whether it is really a sliding window.
""",
        "check_lru_cache",
    ),
    code(SETUP.format(check="check_lru_cache")),
    task(
        "04",
        "`LRUCache`",
        2,
        20,
        """
* `LRUCache(max_size)` raises `ValueError` when `max_size <= 0`.
* `put(token_id, key, value)`: insert, or replace and refresh an existing id; it becomes the most recently
  used. If the cache now holds more than `max_size` entries, evict the least recently used.
* `get(token_id)`: `(key, value)` and the entry becomes the most recently used; `None` if absent.

Both operations should be O(1). An `OrderedDict` or a plain `dict` (insertion-ordered) both work.
""",
        [
            "`collections.OrderedDict` keeps insertion order; `move_to_end(id)` makes an entry the most recent, "
            "`popitem(last=False)` removes the oldest.",
            "A re-`put` of an existing id must move it to the end as well: assigning `d[id] = ...` to an existing "
            "key keeps its old place.",
            "Validate in `__init__` before storing anything: `if max_size <= 0: raise ValueError(...)`.",
        ],
    ),
    answer(
        "04",
        '''
from collections import OrderedDict


class LRUCache:
    """At most max_size (key, value) entries by token id; the least recently used is evicted."""

    def __init__(self, max_size: int):
        ### BEGIN SOLUTION
        if max_size <= 0:
            raise ValueError(f"max_size must be a positive integer; got {max_size}")
        self.max_size = max_size
        self.cache = OrderedDict()  # least recently used first
        ### END SOLUTION

    def put(self, token_id, key, value) -> None:
        ### BEGIN SOLUTION
        if token_id in self.cache:
            self.cache.move_to_end(token_id)
        self.cache[token_id] = (key, value)
        while len(self.cache) > self.max_size:
            self.cache.popitem(last=False)
        ### END SOLUTION

    def get(self, token_id):
        ### BEGIN SOLUTION
        if token_id not in self.cache:
            return None
        self.cache.move_to_end(token_id)
        return self.cache[token_id]
        ### END SOLUTION
''',
    ),
    check("04"),
    follow_up(
        "Is an LRU cache of size `W` the same as a sliding window of `W` tokens? When do they differ, and which "
        "one does Mistral's attention need?",
        "Only while nobody calls `get`: then LRU evicts in insertion order, exactly like the window. As soon as "
        "something reads an old entry (a lookup, a debug print, an attention loop that calls `get`), it is "
        "promoted and survives although it is outside the window, and a newer token is evicted instead. "
        "Sliding-window attention evicts by *age*, not by use: a key more than `W - 1` positions back must never "
        "be attended again, so the cache must be FIFO by position (a ring buffer), and reads must not reorder it.",
    ),
]

# ---------------------------------------------------------------------------------------------- 05
NB05 = [
    intro(
        "Exercise 05: attention sinks",
        """
StreamingLLM (Xiao et al., 2023) noticed that models park a lot of attention on the very first tokens,
whatever they say. Evict those and quality drops once the window slides past them. The fix: keep the first
`num_sinks` tokens forever, plus the last `window_size`.
""",
        "check_sink_cache",
    ),
    code(SETUP.format(check="check_sink_cache")),
    task(
        "05",
        "`SinkCache`",
        3,
        25,
        """
`SinkCache(num_sinks, window_size)`, one token per `update(k_new, v_new)`:

* after `update`, the cache holds positions `0 .. num_sinks - 1` (the sinks, forever) and the last
  `window_size` positions, nothing else, and `update` returns their keys and values;
* `positions` (a property): the absolute position of each key `update` returned, in the order returned.

Any order is accepted, as long as `positions` says which key is which (a chronological `torch.cat` cache or
a ring with pinned slots both pass). Example, `num_sinks=2, window_size=3`, after 7 tokens:
positions `{0, 1, 4, 5, 6}`.
""",
        [
            "Keep a Python list of the stored positions next to the tensors. After appending the new token, a "
            "stored position `p` survives if `p < num_sinks` or `p >= seen - window_size`.",
            "Build an index tensor of the survivors and `index_select(2, idx)` keys and values with it (put the "
            "index on the tensors' device).",
            "`positions` can simply be `torch.tensor(self.pos)`.",
        ],
    ),
    answer(
        "05",
        '''
class SinkCache:
    """The first num_sinks tokens forever, plus the last window_size; chronological order."""

    def __init__(self, num_sinks: int, window_size: int):
        ### BEGIN SOLUTION
        self.num_sinks = num_sinks
        self.window_size = window_size
        self.k = self.v = None  # (B, H, stored, D)
        self.pos = []  # absolute position of each stored token
        self.seen = 0
        ### END SOLUTION

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ### BEGIN SOLUTION
        if self.k is None:
            self.k, self.v = k_new, v_new
        else:
            self.k = torch.cat([self.k, k_new], dim=2)
            self.v = torch.cat([self.v, v_new], dim=2)
        self.pos.append(self.seen)
        self.seen += 1
        keep = [i for i, p in enumerate(self.pos) if p < self.num_sinks or p >= self.seen - self.window_size]
        if len(keep) < len(self.pos):
            idx = torch.tensor(keep, device=self.k.device)
            self.k, self.v = self.k.index_select(2, idx), self.v.index_select(2, idx)
            self.pos = [self.pos[i] for i in keep]
        return self.k, self.v
        ### END SOLUTION

    @property
    def positions(self) -> torch.Tensor:
        ### BEGIN SOLUTION
        return torch.tensor(self.pos, dtype=torch.long)
        ### END SOLUTION
''',
    ),
    check("05"),
    code(
        """
sinks = SinkCache(num_sinks=2, window_size=3)
for p in range(7):
    sinks.update(torch.randn(1, 1, 1, 4, device=DEVICE), torch.randn(1, 1, 1, 4, device=DEVICE))
print("after 7 tokens the cache holds positions", sinks.positions.tolist())
"""
    ),
    follow_up(
        "The sink keys were rotated by RoPE at positions 0..3. At position 10 000, the query sees them 10 000 "
        "positions away, further than anything in training. StreamingLLM does something different; what, and "
        "what does it cost?",
        "StreamingLLM caches keys *before* RoPE and rotates them with their position *inside the cache* "
        "(0 .. S + W - 1) at every step, so distances never exceed the cache size. The model then sees a "
        "sequence that never existed, which changes its outputs (usually for the better at long lengths), and "
        "the cache must re-rotate all keys each step. This course caches keys after RoPE at their true positions: "
        "exactly sliding-window attention with sinks, cheap, but long distances to the sinks are "
        "out of distribution.",
    ),
]

# ---------------------------------------------------------------------------------------------- 06
NB06 = [
    intro(
        "Exercise 06: decoding through the caches",
        """
Now plug a cache into a model. `swkv_teach.model.Decoder` is a small Mistral-style decoder. Its
`forward(input_ids)` computes all logits at once with the sliding-window mask (the oracle). You will write
the step a server runs instead: feed only the *new* tokens, with one KV cache per layer.
""",
        "check_cached_decode",
    ),
    code(SETUP.format(check="check_cached_decode") + "from swkv_teach.model import Decoder, DecoderConfig\n"),
    task(
        "06",
        "`decode_step(model, input_ids, caches)`",
        3,
        30,
        """
`input_ids` is `(B, c)`: the `c` new tokens. `caches` holds one cache per layer (`model.new_caches()`).
Return the logits `(B, c, vocab)` of the new tokens, using only the model's parts:

* `model.embed`, then for each `layer, cache` in `zip(model.layers, caches)`:
  `layer.attn.qkv(layer.attn_norm(x), positions)` (projects and applies RoPE), `cache.update(k, v)`,
  `layer.attn.attend(q, k, v, q_positions, k_positions)` (GQA, the window mask and `o_proj`: it returns
  `(B, c, dim)`, ready to add to the residual), the residual,
  `layer.mlp_norm`, `layer.mlp`, the residual;
* then `model.norm` and `model.lm_head`.

Not allowed: `model.step`, `model.score`, `model.generate` (the library's own answers). The check compares
your logits with `model.forward` on the whole sequence, one token at a time and with a prompt chunk.
Decoding is inference: the check (and the demo below) run it under `torch.no_grad()`.
""",
        [
            "The new tokens' absolute positions are `torch.arange(start, start + c, device=input_ids.device)` with "
            "`start = caches[0].seen`, read *before* any `update` (every layer has seen the same tokens).",
            "Pre-norm blocks: `x = x + attn(...)` where attention reads `layer.attn_norm(x)`, then "
            "`x = x + layer.mlp(layer.mlp_norm(x))`.",
            "After `k, v = cache.update(k, v)`, the keys' positions are `cache.positions` (move them to `x.device`); "
            "pass them as `k_positions` so the mask is right for chunks too.",
        ],
    ),
    answer(
        "06",
        '''
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
''',
    ),
    check("06"),
    code(
        """
model = Decoder(DecoderConfig(window_size=4)).to(DEVICE).eval()
ids = torch.randint(0, model.config.vocab_size, (1, 12), device=DEVICE)
caches = model.new_caches("ring")
with torch.no_grad():
    steps = torch.cat([decode_step(model, ids[:, t : t + 1], caches) for t in range(ids.shape[1])], dim=1)
    full = model(ids)
print("one token at a time == whole sequence:", torch.allclose(steps, full, atol=1e-4))
print("tokens held per layer:", [len(c) for c in caches], "after", caches[0].seen, "tokens")
"""
    ),
    follow_up(
        "A colleague computes the RoPE positions as `torch.arange(len(cache), len(cache) + c)`. The first "
        "`W` tokens come out right. What goes wrong after that, and why do tests at short lengths miss it?",
        "`len(cache)` counts tokens *stored*, which stops at `W` once the window is full, while the true position "
        "keeps growing. From then on every new token is rotated as if it sat at position `W`, and the query "
        "positions given to the mask are wrong too, so logits drift from the oracle. Any test with fewer than "
        "`W + 1` tokens cannot see it: always test past the window, and name the two counts apart "
        "(`seen` vs stored), as the library's caches do.",
    ),
]

NOTEBOOKS = {
    "01": NB01,
    "02": NB02,
    "03": NB03,
    "04": NB04,
    "05": NB05,
    "06": NB06,
}


def main(which: list[str]) -> None:
    for ex_id, cells in NOTEBOOKS.items():
        if which and ex_id not in which:
            continue
        build(f"solutions/{ex_id}_{EXERCISES[ex_id].slug}.ipynb", cells, gpu=True)


if __name__ == "__main__":
    main(sys.argv[1:])
