"""Exercise 14, part 2: verify-and-rollback rounds against the library's ``verify``, watched and diagnosed.

A *run* is one sequence on a tiny random decoder: the learner's ``speculative_caches(model, k)`` and the
reference's rings (``RingBufferKVCache(W, lookahead=k)`` per layer) are fed the same prompt by the check, then
rounds follow. Each round picks ``m <= k`` and a target count ``a`` (the extremes first: none of ``k`` kept,
all kept, no drafts, one rejected; then at random): the first ``a`` drafts are the reference's own greedy
continuation (stepped on a copy of its rings), the next one a token it did not choose, and after it, in two
rounds of three, the target's choices again (a count that does not stop at the first rejection shows), else
random tokens. The learner's ``verify(model, caches, pending, drafts)`` and the library's
:func:`swkv_teach.speculative.verify` run on their own rings; then, in this order:

1. **what was fed** (:class:`Spy`: a hook on ``model.embed`` sees the ids of each forward, a wrapper on each
   learner ring counts its updates and rollbacks): one forward of ``[pending, *drafts]``, every layer updated
   once with ``m + 1`` tokens; named: one forward per token, pending fed apart, pending forgotten, the new token
   fed too, a forward that bypassed the caches;
2. **what was returned**: ``(a, token)`` against the library's, diagnosed from the target's choices at each
   row (:func:`._speculative_slips.explain_answer`): rows misaligned, every agreement counted, ``a`` counting
   pending, the bonus forgotten, the rejected draft returned, the last row's choice after a rejection;
3. **the rings**: every layer's ``seen`` and what it holds of the next query's window (positions, keys and
   values) against the reference's (:func:`._speculative_slips.explain_rings`): never rolled back, ``a``
   rolled back instead of ``m - a``, one too many or too few, ``k - a`` (fewer than ``k`` drafts came), only
   some layers.

Before the rounds, ``speculative_caches`` itself: one fresh ring per layer (not one ring repeated), window ``W``
(not ``W + k``), fresh rings on every call, rings that can take tokens back. The lookahead is judged by what it
does, not by its value: a ring with too little is named when its ``rollback`` refuses, which is exactly when the
verify overwrote a slot the next query needs. (``lookahead=k - 1`` passes: ``pending`` is always kept, so a
round takes back at most ``k`` tokens, and right after a verify's write a ring can take back ``lookahead + 1``;
``tests/test_grading_speculative.py`` pins it.) Rings with more lookahead than ``k`` pass too: only ``seen`` and
the next query's window are compared, keys to a tolerance, since a ring of another size hands one query its
keys in another order and the sums round otherwise.
"""

from __future__ import annotations

import copy
import operator
import random
from dataclasses import dataclass

import torch

from swkv_teach import speculative as lib
from swkv_teach.caches import RingBufferKVCache
from swkv_teach.grading._own import calls_to
from swkv_teach.grading._report import ExerciseFailed, call, fail, show
from swkv_teach.grading._speculative_slips import check_fed, explain_answer, explain_raise, explain_rings
from swkv_teach.model import Decoder, DecoderConfig, LayerCaches

__all__ = ["SCENARIOS", "Scenario", "check_rounds", "make_model"]

VOCAB = 32


@dataclass(frozen=True)
class Scenario:
    W: int
    k: int
    layers: int
    heads: tuple  # (n_heads, n_kv_heads)
    dtype: torch.dtype
    prompt: int
    rounds: int
    seed: int

    def describe(self) -> str:
        return (f"window_size={self.W}, k={self.k}, {self.layers} layer{'s' if self.layers > 1 else ''}, "
                f"{self.heads[0]} heads / {self.heads[1]} kv heads, {str(self.dtype)[6:]}")


F32, BF16 = torch.float32, torch.bfloat16
SCENARIOS = (  # window, k, layers, heads, dtype, prompt tokens, rounds, seed
    Scenario(3, 2, 2, (4, 2), F32, 5, 24, 1),  # a prompt past the window
    Scenario(4, 3, 2, (2, 2), F32, 3, 24, 2),  # a prompt of W - 1 tokens
    Scenario(4, 1, 1, (4, 1), F32, 4, 16, 3),  # a prompt of W; one draft a round
    Scenario(1, 2, 2, (2, 1), F32, 2, 14, 4),  # a window of one token; a prompt of W + 1
    Scenario(6, 4, 3, (4, 2), F32, 1, 24, 5),  # one prompt token: the first rounds come before the ring wraps
    Scenario(3, 3, 2, (4, 2), BF16, 4, 16, 6),
)
LIVE = Scenario(5, 2, 2, (4, 2), F32, 6, 12, 7)  # two sequences at once, rounds alternating


def make_model(sc: Scenario, dev) -> Decoder:
    """The graded decoder: random, its head scaled up (greedy choices far from ties) and its attention sharp (a
    position off by one changes the logits). Seeded; the learner's random state is left alone."""
    n_heads, n_kv = sc.heads
    cfg = DecoderConfig(vocab_size=VOCAB, dim=32, n_layers=sc.layers, n_heads=n_heads, n_kv_heads=n_kv, head_dim=8,
                        hidden_dim=64, window_size=sc.W)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4000 + sc.seed)
        model = Decoder(cfg)
        with torch.no_grad():
            qk_rows = (n_heads + n_kv) * cfg.head_dim
            for name, w in model.named_parameters():
                if name.endswith("qkv_proj.weight"):
                    w[:qk_rows].mul_(4.0)
                elif name.endswith("lm_head.weight"):
                    w.mul_(8.0)
    return model.to(device=dev, dtype=sc.dtype).eval()


# ============================================================================ watching the learner's calls
class _Watched:
    """A learner's ring that records, for the current round, its updates (tokens each) and rollbacks."""

    def __init__(self, inner, spy: "Spy", L: int):
        self._inner, self._spy, self._L = inner, spy, L

    def update(self, k, v):
        self._spy.updates[self._L].append(int(k.shape[2]))
        return self._inner.update(k, v)

    def update_in_place(self, k, v):  # the decoder's way on a ring with lookahead (a verify of up to k + 1 tokens)
        self._spy.updates[self._L].append(int(k.shape[2]))
        return self._inner.update_in_place(k, v)

    def rollback(self, r):
        self._spy.rollbacks[self._L].append(r)
        return self._inner.rollback(r)

    def __len__(self):
        return len(self._inner)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class Spy:
    """The learner's rings, wrapped, and the ids of every forward of ``model`` while a round runs."""

    def __init__(self, model, rings):
        self.rings = rings
        self.fed: list = []
        self.updates: list = [[] for _ in rings]
        self.rollbacks: list = [[] for _ in rings]
        watched = [_Watched(r, self, L) for L, r in enumerate(rings)]
        W = getattr(rings, "window_size", None)
        self.caches = LayerCaches(watched, W, getattr(rings, "num_sinks", 0)) if W is not None else watched
        self.active = False  # only the learner's forwards are recorded, not the reference's
        self._hook = model.embed.register_forward_hook(self._record)

    def _record(self, module, args, out):
        if self.active:
            self.fed.append(args[0].tolist())

    def begin(self):
        self.active = True
        self.fed.clear()
        for x in (*self.updates, *self.rollbacks):
            x.clear()

    def close(self):
        self._hook.remove()


# ============================================================================ speculative_caches
def _caches(case: str, make, model, k: int):
    got = call(case, "speculative_caches(model, k)", make, model, k)
    W, n = model.config.window_size, len(model.layers)
    if not isinstance(got, (list, tuple)):
        raise fail(case, f"speculative_caches returned {show(got, 80)} ({type(got).__name__}); expected one ring "
                   "per layer, in a LayerCaches (a list).",
                   hint="return LayerCaches([RingBufferKVCache(W, lookahead=k) for _ in model.layers], W).")
    if len(got) != n:
        raise fail(case, f"speculative_caches returned {len(got)} caches for a model of {n} layers.",
                   hint="one ring per layer: for _ in model.layers.")
    if len({id(c) for c in got}) < n:
        raise fail(case, "speculative_caches returned the same ring object for several layers ([ring] * n repeats "
                   "one object): every layer would write its keys into one ring.",
                   hint="build a new ring for each layer: [RingBufferKVCache(W, lookahead=k) for _ in model.layers].")
    for L, c in enumerate(got):
        if not isinstance(c, RingBufferKVCache) or not callable(getattr(c, "rollback", None)):
            raise fail(case, f"layer {L}'s cache is a {type(c).__name__}, which cannot take tokens back: a rejected "
                       "draft would stay in it.", hint="speculative decoding needs rings that can roll back: "
                       "RingBufferKVCache(W, lookahead=k) from swkv_teach.caches.")
        if getattr(c, "num_sinks", 0):
            raise fail(case, f"layer {L}'s ring keeps {c.num_sinks} sink tokens: the model attends to its window "
                       "alone.", hint="RingBufferKVCache(W, lookahead=k), no sinks.")
        if c.window_size != W:
            extra = (f": the k = {k} spare slots went into the window, so every query would see {k} keys beyond its "
                     "own. They are lookahead: slots kept for a rollback, masked out of every window"
                     if c.window_size == W + k else "")
            raise fail(case, f"layer {L}'s ring has window_size={c.window_size}; the model's window is {W}{extra}.",
                       hint="RingBufferKVCache(model.config.window_size, lookahead=k).")
        if c.seen:
            raise fail(case, f"speculative_caches returned a ring that has already seen {c.seen} tokens: a new "
                       "sequence starts from empty rings.",
                       hint="build new rings on every call (no module-level list, no cache of built rings).")
    W_list = getattr(got, "window_size", W)
    if W_list != W:
        raise fail(case, f"speculative_caches returned a LayerCaches whose window_size is {W_list}; the model's is "
                   f"{W}: model.step masks with it.", hint="LayerCaches(rings, model.config.window_size).")
    return got


def _fresh_every_call(case: str, make, model, k: int, first) -> None:
    again = call(case, "speculative_caches(model, k)", make, model, k)
    if any(a is b for a in again for b in first) or again is first:
        raise fail(case, "two calls of speculative_caches returned the same ring objects: two sequences would "
                   "decode through one set of rings, each overwriting the other's keys.",
                   hint="build new rings on every call (no module-level list, no functools.cache).")


# ============================================================================ a run
def _ints(case: str, got) -> tuple[int, int]:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise fail(case, f"verify returned {show(got, 80)} ({type(got).__name__}); expected a tuple (a, token).",
                   hint="return a, token: the number of drafts accepted, then the target's next token.")
    out = []
    for name, x in zip(("a", "token"), got):
        try:
            out.append(operator.index(x))
        except TypeError:
            if x is None and name == "token":
                raise fail(case, "verify returned token = None; when every draft is accepted the token is the "
                           "bonus, the choice of the last row (row m).",
                           hint="token = best[a] covers both cases: the correction after a rejection, the bonus "
                           "when a == m.") from None
            raise fail(case, f"verify returned {name} = {show(x, 60)} ({type(x).__name__}); expected a Python int.",
                       hint="return int(a), int(token).") from None
    return out[0], out[1]


class Run:
    """One sequence: the learner's rings (watched) and the reference's, the same prompt fed to both."""

    def __init__(self, sc: Scenario, make, verify, dev, label: str = "", model=None, stream: int = 0):
        self.sc, self.verify, self.label = sc, verify, label
        self.model = make_model(sc, dev) if model is None else model
        self.title = f"a tiny decoder ({sc.describe()}){label}"
        rings = _caches(f"speculative_caches(model, k={sc.k}) on {self.title}", make, self.model, sc.k)
        self.rings = rings
        W = sc.W
        self.ref = LayerCaches([RingBufferKVCache(W, lookahead=sc.k) for _ in self.model.layers], W)
        self.rng = random.Random(sc.seed * 7919 + stream)
        dev = next(self.model.parameters()).device
        prompt = torch.tensor([[self.rng.randrange(VOCAB) for _ in range(sc.prompt)]], device=dev)
        with torch.no_grad():
            self.model.step(prompt, rings)
            self.pending = int(self.model.step(prompt, self.ref)[0, -1].argmax())
        self.seen = sc.prompt
        self.spy = Spy(self.model, rings)
        self.done = 0

    def plan(self, r: int) -> tuple[int, int]:
        """Round ``r``'s ``(m, a)``: first the extremes (``a = 0`` of ``k`` drafts, all ``k`` kept, no drafts, one
        draft rejected, all but one kept), then random rounds between them."""
        k = self.sc.k
        scripted = [(k, 0), (k, k), (0, 0), (1, 0), (k, k - 1)]
        if r < len(scripted) or r % 2 == 0:
            return scripted[r % len(scripted)]
        m = self.rng.randint(0, k)
        return m, self.rng.randint(0, m)

    def drafts(self, m: int, a: int, trap: bool) -> tuple[list, object]:
        """``m`` drafts whose first ``a`` are the reference's greedy choices, the next one not; after it, the
        target's own choices again (``trap``: a count that does not stop at the first rejection shows) or random
        tokens. Returns them with the copy of the reference's rings they were stepped on, rolled back to before
        the round (for a diagnosis)."""
        scratch = copy.deepcopy(self.ref)
        dev = next(self.model.parameters()).device
        out, token = [], self.pending
        with torch.no_grad():
            while len(out) < m:
                choice = int(self.model.step(torch.tensor([[token]], device=dev), scratch)[0, -1].argmax())
                if len(out) == a:
                    token = (choice + 1 + self.rng.randrange(VOCAB - 1)) % VOCAB  # anything but the choice
                elif len(out) < a or trap:
                    token = choice
                else:
                    break
                out.append(token)
        for c in scratch:
            c.rollback(len(out))
        return out + [self.rng.randrange(VOCAB) for _ in range(m - len(out))], scratch

    def round(self) -> None:
        m, a_plan = self.plan(self.done)
        self.done += 1
        drafts, scratch = self.drafts(m, a_plan, trap=self.done % 3 != 0)
        case = f"verify(model, caches, pending={self.pending}, drafts={drafts}), round {self.done} on {self.title}"
        given = list(drafts)
        self.spy.begin()
        watch = [lib.verify, lib.accept_greedy, lib.accept_sampled, lib.speculative_generate]
        try:
            with calls_to(*watch) as hits:
                got = call(case, "verify()", self.verify, self.model, self.spy.caches, self.pending, given)
        except ExerciseFailed as e:
            raise explain_raise(e, self) from None
        finally:
            self.spy.active = False
        if hits:
            raise fail(case, f"your verify called the library's swkv_teach.speculative.{hits[0]}, the check's "
                       "answer key: it shows nothing about your code.",
                       hint="write the step yourself: one model.step over [pending, *drafts], the greedy count, "
                       "cache.rollback(m - a) on every layer.")
        if given != drafts:
            raise fail(case, f"your verify changed the caller's drafts list: it is now {given}.",
                       hint="leave drafts as it was (the caller emits drafts[:a] after the verify); compute with "
                       "len(drafts) before any change, or work on a copy.")
        with torch.no_grad():
            want = lib.verify(self.model, self.ref, self.pending, drafts)
        check_fed(case, self, drafts)
        a, token = _ints(case, got)
        if (a, token) != tuple(want):
            raise fail(case, f"verify returned (a, token) = ({a}, {token}); the library's verify returns "
                       f"{tuple(want)}.", expected=tuple(want), got=(a, token), what="got",
                       hint=explain_answer(self, scratch, drafts, (a, token), want))
        _check_rings(case, self, m, want[0])
        self.pending = want[1]
        self.seen += want[0] + 1


# ============================================================================ the rings after a round
TOL = {F32: 1e-4, BF16: 5e-2}


def _close(x: torch.Tensor, y: torch.Tensor, tol: float) -> bool:
    return x.shape == y.shape and torch.allclose(x.float(), y.float(), atol=tol, rtol=tol)


def _window(c, W: int) -> tuple[int, list, torch.Tensor, torch.Tensor]:
    """``seen``, and the positions, keys and values a ring holds of the next query's window ``seen - W < j < seen``:
    all the next forward reads. (More lookahead than ``k`` keeps more past tokens: right, and not compared.)"""
    seen = c.seen
    pos = c.stored_positions()
    keep = torch.nonzero(pos > seen - W).flatten()
    k, v = c.ordered()
    keep_dev = keep.to(k.device)
    return seen, pos[keep].tolist(), k.index_select(2, keep_dev), v.index_select(2, keep_dev)


def _check_rings(case: str, run: Run, m: int, a: int) -> None:
    W = run.sc.W
    for L, (mine, ref) in enumerate(zip(run.rings, run.ref)):
        s, pos, k1, v1 = _window(mine, W)
        s_exp, pos_exp, k2, v2 = _window(ref, W)
        if (s, pos) != (s_exp, pos_exp):
            raise fail(case, f"after your verify (which returned a = {a} of m = {m} drafts accepted; pending sat at "
                       f"position {run.seen}), layer {L}'s ring has seen {s} tokens and holds {pos} of the next "
                       "query's window.",
                       f"the library's verify leaves it at seen {s_exp}, holding {pos_exp} (the next query, at "
                       f"position {s_exp}, attends to {s_exp - W} < j <= {s_exp}).", hint=explain_rings(run, m, a))
        tol = TOL[run.sc.dtype]  # more lookahead orders a ring's keys otherwise: sums round otherwise
        if not (_close(k1, k2, tol) and _close(v1, v2, tol)):
            raise fail(case, f"after your verify, layer {L}'s ring holds the right positions but other keys or "
                       "values than the library's.",
                       hint="feed the chunk once through model.step and change the rings only with rollback.")


# ============================================================================ the driver
def check_rounds(make, verify, dev) -> int:
    """Every scenario's rounds, then two live sequences in turn; returns the number of rounds run."""
    total = 0
    for sc in SCENARIOS:
        run = Run(sc, make, verify, dev)
        _fresh_every_call(f"speculative_caches(model, k={sc.k}) called twice", make, run.model, sc.k, run.rings)
        try:
            for _ in range(sc.rounds):
                run.round()
        finally:
            run.spy.close()
        total += sc.rounds
    model = make_model(LIVE, dev)
    runs = [Run(LIVE, make, verify, dev, f", sequence {i + 1} of 2 decoded in turn", model, stream=i) for i in range(2)]
    try:
        for _ in range(LIVE.rounds):
            for run in runs:
                run.round()
    finally:
        for run in runs:
            run.spy.close()
    return total + 2 * LIVE.rounds
