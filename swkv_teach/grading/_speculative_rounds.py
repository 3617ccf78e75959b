"""Exercise 14, part 2: verify-and-rollback rounds against the library's ``verify``, watched and diagnosed.

A *run* is one sequence on a tiny random decoder: the learner's ``speculative_caches(model, k)`` and the
reference's rings (``RingBufferKVCache(W, lookahead=k)`` per layer) are fed the same prompt by the check, then
rounds follow. Each round picks ``m <= k`` and a target count ``a``: the first ``a`` drafts are the reference's
own greedy continuation (stepped on a copy of its rings), the next one a token it did not choose, the rest
random, so every ``a`` from 0 to ``m`` happens, right after the ring wraps too. The learner's
``verify(model, caches, pending, drafts)`` and the library's :func:`swkv_teach.speculative.verify` run on their
own rings; then, in this order:

1. **what was fed** (:class:`Spy`: a hook on ``model.embed`` sees the ids of each forward, a wrapper on each
   learner ring counts its updates and rollbacks): one forward of ``[pending, *drafts]``, every layer updated
   once with ``m + 1`` tokens; named: one forward per token, pending fed apart, pending forgotten, the new token
   fed too, a forward that bypassed the caches;
2. **what was returned**: ``(a, token)`` against the library's, diagnosed from the target's choices at each row
   (:func:`explain_answer`): rows misaligned, every agreement counted, ``a`` counting pending, the bonus
   forgotten, the rejected draft returned, the last row's choice after a rejection;
3. **the rings**: every layer's ``seen``, held positions, ``rollback_limit`` and keys/values in order against
   the reference's (:func:`explain_rings`): never rolled back, ``a`` rolled back instead of ``m - a``, one too
   many or too few, ``k - a`` (fewer than ``k`` drafts came), only some layers.

Before the rounds, ``speculative_caches`` itself: one fresh ring per layer (not one ring repeated), window ``W``
(not ``W + k``), fresh rings on every call, rings that can take tokens back. The lookahead is judged by what it
does, not by its value: a ring with too little is named when its ``rollback`` refuses, which is exactly when the
verify overwrote a slot the next query needs. (``lookahead=k - 1`` passes: ``pending`` is always kept, so a
rollback takes back at most ``k`` tokens, and a ring can take back ``lookahead + 1`` right after a write.) Rings
with more lookahead than ``k`` pass too: only ``seen`` and the next query's window are compared, to a tolerance,
since a ring of another size returns one query's keys in another order.
"""

from __future__ import annotations

import copy
import operator
import random
from dataclasses import dataclass

import torch

from swkv_teach import speculative as lib
from swkv_teach.caches import RingBufferKVCache
from swkv_teach.grading._report import ExerciseFailed, call, fail, rehint, show
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
                f"{self.heads[0]} query / {self.heads[1]} key-value heads, {str(self.dtype)[6:]}")


F32, BF16 = torch.float32, torch.bfloat16
SCENARIOS = (
    Scenario(3, 2, 2, (4, 2), F32, 5, 24, 1),  # a prompt past the window
    Scenario(4, 3, 2, (2, 2), F32, 3, 24, 2),  # W - 1
    Scenario(4, 1, 1, (4, 1), F32, 4, 16, 3),  # W: one draft, a plain ring's worth of rollback
    Scenario(1, 2, 2, (2, 1), F32, 2, 14, 4),  # a window of one token, W + 1
    Scenario(6, 4, 3, (4, 2), F32, 1, 24, 5),  # one token of prompt: the first rounds before the wrap
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
def _ints(case: str, got, m: int) -> tuple[int, int]:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise fail(case, f"verify returned {show(got, 80)} ({type(got).__name__}); expected a tuple (a, token).",
                   hint="return a, token: the number of drafts accepted, then the target's next token.")
    out = []
    for name, x in zip(("a", "token"), got):
        try:
            out.append(operator.index(x))
        except TypeError:
            what = ("None: when every draft is accepted, the token is the bonus, the choice of the last row "
                    "(row m)" if x is None else f"{show(x, 60)} ({type(x).__name__})")
            raise fail(case, f"verify returned {name} = {what}; expected a Python int.",
                       hint="return int(a), int(token)." if x is not None else
                       "token = best[a] covers both cases: the correction after a rejection, the bonus when a == m."
                       ) from None
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
        case = (f"verify(model, caches, pending={self.pending}, drafts={drafts}) on {self.title}, round "
                f"{self.done}: pending at position {self.seen}, the rings having seen {self.seen} tokens")
        given = list(drafts)
        self.spy.begin()
        watch = [lib.verify, lib.accept_greedy, lib.accept_sampled, lib.speculative_generate]
        from swkv_teach.grading._own import calls_to

        try:
            with calls_to(*watch) as hits:
                got = call(case, "verify()", self.verify, self.model, self.spy.caches, self.pending, given)
        except ExerciseFailed as e:
            raise _explain_raise(e, self, m) from None
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
        _check_fed(case, self, drafts)
        a, token = _ints(case, got, m)
        if (a, token) != tuple(want):
            raise fail(case, f"verify returned (a, token) = ({a}, {token}); the library's verify returns "
                       f"{tuple(want)}.", expected=tuple(want), got=(a, token), what="got",
                       hint=explain_answer(self, scratch, drafts, (a, token), want))
        _check_rings(case, self, m, want[0])
        self.pending = want[1]
        self.seen += want[0] + 1


# ============================================================================ 1. what was fed
def _check_fed(case: str, run: Run, drafts: list) -> None:
    spy, chunk = run.spy, [run.pending, *drafts]
    fed = [ids[0] if ids and isinstance(ids[0], list) else ids for ids in spy.fed]
    ups = spy.updates
    m = len(drafts)
    if not fed:
        raise fail(case, "your verify did not run the model: the drafts were never checked by the target.",
                   hint="logits = model.step(torch.tensor([[pending, *drafts]], device=...), caches).")
    if len(fed) > 1 and all(len(f) == 1 for f in fed) and [f[0] for f in fed[: m + 1]] == chunk:
        raise fail(case, f"your verify ran {len(fed)} forwards of one token each ({fed}): verifying the drafts one "
                   "at a time costs m + 1 decode steps, the very cost speculative decoding exists to avoid.",
                   hint="one forward for the whole chunk: model.step(ids, caches) with ids of shape (1, m + 1); the "
                   "chunk's queries are masked to their own windows, so row i is what a one-token step gives.")
    if len(fed) == 2 and fed[0] == [run.pending] and fed[1] == drafts:
        raise fail(case, f"your verify ran two forwards, [pending] then the drafts ({fed}): one forward of "
                   "[pending, *drafts] does both for the price of one.",
                   hint="ids = [[pending, *drafts]], one model.step.")
    if fed[0] == drafts and m:
        raise fail(case, f"your verify fed the drafts {drafts} without pending = {run.pending}: pending is not yet "
                   "in the caches, so every draft is placed one position too early and row 0 is not the target's "
                   "verdict on d_0.", hint="the chunk is [pending, *drafts]: pending first, at position "
                   "caches[0].seen.")
    if fed[0] != chunk:
        raise fail(case, f"your verify's first forward fed {fed[0]}; expected [pending, *drafts] = {chunk}.",
                   hint="ids = torch.tensor([[pending, *drafts]], device=...).")
    if len(fed) > 1:
        extra = fed[1:]
        raise fail(case, f"after the verify's forward of {chunk} yours ran {len(extra)} more ({extra}): the new "
                   "token must not be fed yet.",
                   hint="return (a, token) without feeding token: like pending, it goes first in the next round's "
                   "verify, which computes its keys together with the next drafts.")
    for L, u in enumerate(ups):
        if u != [m + 1]:
            raise fail(case, f"layer {L}'s ring got {u or 'no'} update{'s' if len(u) != 1 else ''} of tokens during "
                       f"your verify; one forward of {m + 1} tokens through the caches gives one update of {m + 1}.",
                       hint="run the chunk through the caches (model.step(ids, caches)), not model(ids), which "
                       "ignores them.")


# ============================================================================ 2. what was returned
def explain_answer(run: Run, scratch, drafts: list, got: tuple, want: tuple) -> str:
    """Name the slip from the target's choice at each row (recomputed on the reference's rings before the round)."""
    dev = next(run.model.parameters()).device
    with torch.no_grad():
        best = run.model.step(torch.tensor([[run.pending, *drafts]], device=dev), scratch)[0].argmax(-1).tolist()
    m, (a, token), (a_exp, t_exp) = len(drafts), got, want
    rows = f"the target's choices, rows 0..{m}: {best}; drafts: {drafts}"
    shifted = 0
    while shifted < m and drafts[shifted] == best[shifted + 1]:
        shifted += 1
    agree = sum(d == b for d, b in zip(drafts, best))
    if a == a_exp + 1 and token == t_exp:
        return (f"{rows}. Your a is one more than the drafts accepted: pending is not a draft. a counts the "
                "leading drafts equal to their row's choice.")
    if a == shifted != a_exp:
        return (f"{rows}. Your a compares draft i with row i + 1. Row i predicts the token AFTER position i of the "
                "chunk [pending, *drafts]: row 0 (after pending) is where d_0 should be, so d_i is checked against "
                "row i.")
    if a == agree != a_exp:
        return (f"{rows}. Your a counts every draft that agrees with its row ({agree}), also after a disagreement. "
                "The first rejected draft ends the round: what follows it was drafted after a token the target "
                "did not choose. Stop counting at the first draft that differs.")
    if a == a_exp == m and token != t_exp:
        if m and token == drafts[-1]:
            return (f"{rows}. Every draft was accepted and your token is the last draft again: the bonus is "
                    f"missing. The last row, row m = {m}, predicted one more token: token = best[m] = {t_exp}.")
        return (f"{rows}. Every draft was accepted; the token is then the bonus, the choice of the last row "
                f"(row m = {m}): {t_exp}.")
    if a == a_exp < m and token != t_exp:
        if token == drafts[a]:
            return (f"{rows}. Your token is the draft the target rejected (d_{a} = {drafts[a]}); it is the "
                    f"target's own choice at that row, the correction: best[{a}] = {t_exp}.")
        if token == best[a + 1] and a + 1 < m:
            return (f"{rows}. Your token is the choice of row a + 1; the rows are misaligned. Row i predicts the "
                    "token after position i of [pending, *drafts]: the correction is row a's choice, "
                    f"best[{a}] = {t_exp}.")
        if token == best[m]:
            return (f"{rows}. After a rejection your token is the last row's choice; the rows after the rejected "
                    f"draft were computed after a token that will not be kept. The correction is row a's choice: "
                    f"best[{a}] = {t_exp}.")
        return f"{rows}. The token is the choice at row a: best[{a}] = {t_exp}."
    return f"{rows}. a is the number of leading drafts equal to their row's choice; token is best[a]."


# ============================================================================ 3. the rings
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
            raise fail(case, f"after your verify (which returned a = {a} of m = {m} drafts accepted), layer {L}'s "
                       f"ring has seen {s} tokens and holds {pos} of the next query's window.",
                       f"the library's verify leaves it at seen {s_exp}, holding {pos_exp} (the next query, at "
                       f"position {s_exp}, attends to {s_exp - W} < j <= {s_exp}).", hint=explain_rings(run, m, a))
        tol = TOL[run.sc.dtype]  # more lookahead orders a ring's keys otherwise: sums round otherwise
        if not (_close(k1, k2, tol) and _close(v1, v2, tol)):
            raise fail(case, f"after your verify, layer {L}'s ring holds the right positions but other keys or "
                       "values than the library's.",
                       hint="feed the chunk once through model.step and change the rings only with rollback.")


def explain_rings(run: Run, m: int, a: int) -> str:
    r = m - a
    calls = run.spy.rollbacks
    got = [sum(int(x) for x in rs) if all(isinstance(x, int) for x in rs) else None for rs in calls]
    k = run.sc.k
    why = (f"The m - a = {r} rejected drafts must be forgotten by every layer's ring, pending and the accepted "
           "drafts kept: for cache in caches: cache.rollback(len(drafts) - a).")
    if not any(calls) and r:
        return f"your verify never rolled back: the rejected drafts stay in the rings. {why}"
    if all(g == got[0] for g in got):
        g = got[0]
        if g == k - a != r and m < k:
            return (f"your verify rolled back k - a = {g} with k = {k} (the rings' lookahead), but this round had "
                    f"m = {m} drafts: m is len(drafts), which may be less than k. {why}")
        if g == a != r:
            return f"your verify rolled back a = {a} (the accepted drafts) instead of m - a = {r}. {why}"
        if g == r + 1:
            return (f"your verify rolled back {g}, one more than the {r} rejected drafts: the last kept token "
                    f"(pending or an accepted draft) went too. {why}")
        if g == r - 1:
            return f"your verify rolled back {g}, one fewer than the {r} rejected drafts. {why}"
        return f"your verify rolled back {g} tokens per layer. {why}"
    rolled = [L for L, g in enumerate(got) if g]
    return (f"your verify rolled back layers {rolled} only (by {[g for g in got]}): every layer's ring saw the "
            f"chunk, so every one must forget the rejected drafts. {why}")


def _explain_raise(e: ExerciseFailed, run: Run, m: int) -> ExerciseFailed:
    """A verify that raised: rings too small for the rollback, a tensor handed to rollback, ids on the CPU."""
    text = str(e)
    k = run.sc.k
    looks = [getattr(c, "lookahead", 0) for c in run.rings]
    if "rollback" in text and "got tensor" in text:
        return rehint(e, "cache.rollback takes a Python int: a count kept as a tensor (a vectorised sum) must be "
                      "turned into one, a = int(...), before m - a is handed to rollback (and returned).")
    if "rollback" in text and min(looks) < k:
        return rehint(e, f"your rings were built with lookahead={min(looks)} for rounds of up to k = {k} drafts. A "
                      "verify writes m + 1 tokens into each ring; without spare slots the newest of them overwrite "
                      "the slots of the oldest tokens the next query's window still needs, so once more than "
                      "lookahead + 1 drafts are rejected the ring cannot take them back (the library's rollback "
                      "refuses rather than leave a hole in the window). speculative_caches must build "
                      "RingBufferKVCache(W, lookahead=k).")
    if "device" in text.lower() and ("cpu" in text.lower() or "cuda" in text.lower()):
        return rehint(e, "the ids must be on the model's device: torch.tensor([[pending, *drafts]], "
                      "device=next(model.parameters()).device).")
    return e


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
