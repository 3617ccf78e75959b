"""The step driver shared by the cache checks (exercises 02, 03, 07): runs, live instances, memory.

A *run* feeds labelled tokens (:mod:`._tokens`) one per ``update`` to one learner
cache and to the library's cache of the same kind (the oracle), and hands each
step to the exercise's :class:`Judge`. Every run is at least ``4 * capacity + 3``
steps long. The runs vary one thing at a time from a first, plain run
(``batch != heads`` tokens ``(2, 3, 1, 4)``, float32): the window, the token shape
(one head, batch 1, head_dim apart), the dtype (float64, float16, bfloat16) and
keys and values that are all zeros. After every run alone has passed, four
live instances (two of them with the same window) are updated in turn
(:func:`interleave`): a cache whose state lives on its class, or in a memo keyed on
the window, passes alone and fails there.

Two runs feed tokens that are not contiguous (sliced from a fused projection, expanded over the
batch), as a model's keys are. A cache with a ``positions`` property (rings, sinks) must report none
before its first update: a new cache holds no token; and it must not keep them in a float tensor
narrower than float64 (:func:`float_positions`: ``k_new.new_zeros(W)`` takes the keys' dtype, exact
only to 256 in bfloat16), which a 300-token bfloat16 run also shows where no such tensor is kept.
Also checked at every step: the caller's tensors are never written to, and the
cache keeps at most ``capacity`` tokens of keys and values, counted over
everything the object keeps alive (:mod:`._retained`), and nothing it holds
grows once the window is full.

When a run fails with a message that names no bug, :func:`isolate` reruns the
same window changing one thing at a time (shape, dtype, zeros; a fresh copy of
the class for shared state) and names the variable that breaks it. Before anything else it
looks at two fresh instances side by side (:mod:`._shared`): an attribute that is one mutable
object in both (a mutable default argument, a class attribute, a memo) is named as shared
state, so sharing is never reported as a shape or off-by-one bug.
"""

from __future__ import annotations

import copy
import functools
import re
from collections import deque
from dataclasses import dataclass

import torch

from swkv_teach.grading._layout import LAYOUTS, laid_out
from swkv_teach.grading._report import ExerciseFailed, call, fail, rehint
from swkv_teach.grading._report import learner_name as _name
from swkv_teach.grading._own import library_inside
from swkv_teach.grading._retained import growth, retained
from swkv_teach.grading._shared import two_fresh
from swkv_teach.grading._tokens import INSTANCES, STREAM, Inputs, as_positions, check_kind, describe, token, unpack_kv

SHAPE0 = (2, 3, 4)  # batch != heads != head_dim
F32, F64, F16, BF16 = torch.float32, torch.float64, torch.float16, torch.bfloat16


def short(dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class Run:
    """One cache alone: constructor ``args``, token ``shape`` (batch, heads, head_dim), dtype, zero tokens."""

    args: tuple
    shape: tuple = SHAPE0
    dtype: torch.dtype = F32
    zeros: bool | str = False  # True: odd tokens all zeros; "runs": runs of zero tokens longer than the window
    steps: int | None = None  # None: steps_for(capacity); more to reach positions past 127 (int8 positions wrap)
    layout: str | None = None  # tokens not contiguous (see _layout.LAYOUTS): "sliced" or "expanded"

    def tokens(self) -> str:
        b, h, d = self.shape
        zeros = ""
        if self.zeros == "runs":
            zeros = ", zero tokens in runs longer than the window, the first token included"
        elif self.zeros:
            zeros = ", odd tokens all zeros"
        laid = f", each token {LAYOUTS[self.layout]} (not contiguous)" if self.layout else ""
        return f"tokens (batch={b}, heads={h}, 1, head_dim={d}) {short(self.dtype)}{zeros}{laid}"

    def plain(self, **change) -> "Run":
        return Run(self.args, **{"shape": SHAPE0, "dtype": F32, "zeros": False, "steps": self.steps, **change})


def zero_token(zeros, p: int, capacity: int) -> bool:
    """Is token ``p`` all zeros in a run with this ``zeros`` setting?

    ``True``: the odd tokens. ``"runs"``: tokens ``0 .. capacity`` (the first token, then a whole window of
    zeros and one more), then two ordinary tokens, and so on: a cache that takes an all-zero window, or an
    all-zero first token, for an empty one shows it there (with ``W = 1`` too).
    """
    if not zeros:
        return False
    if zeros == "runs":
        return p % (capacity + 3) <= capacity
    return p % 2 == 1


class Judge:
    """One exercise's per-step comparison; subclasses implement :meth:`step`.

    ``capacity``: tokens the cache may keep; ``title``: how messages name the cache.
    """

    oracle_cls = None
    fresh_positions = False  # the cache has a positions property, which must be empty before any update

    def __init__(self, cls, args: tuple):
        self.cls, self.args = cls, args
        self.oracle = self.oracle_cls(*args)

    @property
    def capacity(self) -> int:
        return self.oracle.capacity if hasattr(self.oracle, "capacity") else self.oracle.window_size

    def title(self) -> str:
        names = self.arg_names
        return f"{_name(self.cls)}({', '.join(f'{n}={a}' for n, a in zip(names, self.args))})"

    def step(self, s: "Step") -> None:
        raise NotImplementedError


@dataclass
class Step:
    p: int
    case: str
    k_new: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    ek: torch.Tensor
    ev: torch.Tensor
    base: int
    zeros: bool | str
    cache: object


def make(case: str, cls, *args, methods=("update",)):
    """``cls(*args)``, with a message if that fails or gives something without ``methods``."""
    obj = call(case, f"{_name(cls)}({', '.join(map(str, args))})", cls, *args)
    for m in methods:
        if not callable(getattr(obj, m, None)):
            raise fail(case, f"{_name(cls)}({', '.join(map(str, args))}) gave {describe(obj)} with no {m}() method.",
                       hint=f"pass the class itself to the check, and give it a {m}(...) method.")
    return obj


def steps_for(capacity: int) -> int:
    return 4 * capacity + 3


def _bounded(case: str, cache, capacity: int, k_new: torch.Tensor):
    """At most twice ``capacity`` tokens of keys and values, whatever holds them.

    Twice, not once: a cache may keep a spare copy (the chronological copy it last handed out, a double
    buffer that trims every W steps) and still be flat. What must not happen is growth, which
    :func:`_flat` checks over many steps; this bound only names a cache that stores everything early.
    Counted in numbers held, so a cache may keep 16-bit tokens in float32.
    """
    r = retained(cache)
    tokens = r.float_elements / _token_elements(k_new)
    if tokens > 4 * capacity + 2:  # + 2: the seed's slice is a view of a W + 1 token cat
        raise fail(case, f"the cache holds {tokens:g} tokens' worth of keys and values (all it keeps alive); a window "
                   f"of {capacity} needs {2 * capacity} (keys and values), and more than twice that means it is "
                   f"not evicting. Most of it is in {_biggest(r)}.",
                   hint="evict: the memory must stay flat however many tokens arrive. Returning the last W is "
                   "not enough if the cache still stores everything (in any attribute, list or dict).")
    return r


def _token_elements(k_new: torch.Tensor) -> int:
    """Numbers one token takes in memory: its own, or all of the storage it is a slice of (a cache may keep the
    caller's sliced token itself, and with it the fused projection it came from)."""
    return max(k_new.numel(), k_new.untyped_storage().nbytes() // k_new.element_size())


def _biggest(r) -> str:
    """The attribute (``self.x`` or ``Class.x``) under which most floating-point bytes are kept."""
    per: dict = {}
    for nbytes, is_float, path, _ in r.storages.values():
        if is_float:
            top = re.match(r"[^.\[]+(?:\.[A-Za-z_0-9]+)?", path).group(0)
            per[top] = per.get(top, 0) + nbytes
    top, n = max(per.items(), key=lambda kv: kv[1])
    return f"{top} ({n} bytes)"


def _flat(case: str, before, after, k_new: torch.Tensor, first: int, last: int) -> None:
    """Nothing the cache keeps grows between step ``first`` and ``last``, both after the window filled."""
    per_token = _token_elements(k_new) * k_new.element_size()
    grew_items = after.items - before.items
    grew_bytes = after.all_bytes - before.all_bytes
    if grew_items > 2 or grew_bytes > 2 * per_token:
        what = growth(before, after) or f"tensor memory grew by {grew_bytes} bytes"
        raise fail(case, f"between updates {first} and {last}, long after the window was full, what the cache keeps "
                   f"grew: {what} ({grew_items:+d} items, {grew_bytes:+d} tensor bytes).",
                   hint="a sliding-window cache must stay the same size once full: evict from every list, dict or "
                   "tensor you append to (a log or history of past tokens or positions grows forever).")


@functools.lru_cache(maxsize=None)
def _supports(dev: str, dtype: torch.dtype) -> bool:
    try:
        torch.zeros(2, dtype=dtype, device=dev).index_select(0, torch.zeros(1, dtype=torch.long, device=dev))
        return True
    except (RuntimeError, TypeError):
        return False


def _fresh(title: str, cache) -> None:
    """A new cache holds nothing: its positions, when it can report them before any update, are empty."""
    try:
        held = as_positions(title, cache.positions)
    except Exception:
        return  # reading positions before the first update is not graded
    if held:
        raise fail(f"{title}, right after construction, before any update()",
                   f"positions is {held}; a new cache holds no token, so it must be empty.",
                   hint="start empty: count the tokens written (seen = 0) and report positions only of slots written "
                   "so far; a preallocated buffer of zeros holds no token.")


# The largest integer each float dtype holds exactly (every integer up to it; past it, neighbours merge).
EXACT_UP_TO = {torch.bfloat16: 2**8, torch.float16: 2**11, torch.float32: 2**24}


def _tensors(cache):
    """``(path, tensor)`` for every tensor the cache keeps in an attribute, or one level down in a container."""
    try:
        attrs = dict(vars(cache))
    except TypeError:
        return
    for name, value in attrs.items():
        if isinstance(value, torch.Tensor):
            yield f"self.{name}", value
        elif isinstance(value, (list, tuple, deque)):
            yield from ((f"self.{name}[{i}]", v) for i, v in enumerate(value) if isinstance(v, torch.Tensor))
        elif isinstance(value, dict):
            yield from ((f"self.{name}[{k!r}]", v) for k, v in value.items() if isinstance(v, torch.Tensor))


def float_positions(case: str, cache, held: list) -> None:
    """Positions kept in a float tensor narrower than float64 (``k_new.new_zeros(W)`` inherits the keys' dtype).

    Judged once three distinct positions are held (so a 0/1 mask cannot look like them): a 1-D float tensor whose
    values, all integers, include every position held is the cache's record of positions. float32 loses them past
    2**24, which no run reaches, so the record itself is named; bfloat16 past 256 is also run (see the runs).
    """
    if len(set(held)) < 3:
        return
    for path, t in _tensors(cache):
        if t.dtype not in EXACT_UP_TO or t.dim() != 1 or t.numel() > 4 * len(held) + 4:
            continue
        vals = t.detach().cpu().double()
        if bool((vals == vals.round()).all()) and set(held) <= set(int(x) for x in vals.tolist()):
            raise fail(case, f"your cache keeps its positions in {path}, a {short(t.dtype)} tensor: {short(t.dtype)} "
                       f"holds integers exactly only up to {EXACT_UP_TO[t.dtype]:,}, so past that position "
                       "neighbouring "
                       "positions merge and the mask shows a key at the wrong position (a long conversation gets "
                       "there).", hint=POSITIONS_DTYPE_HINT)


def labelled(s: "Step") -> bool:
    """Whether the tokens fed so far read back as their labels (:func:`._tokens.labels`): every label ``p + 1`` is
    held exactly by the dtype, and below ``STREAM`` (where a label would read as another instance's token)."""
    newest = s.base + s.p + 1
    return s.p + 1 < STREAM and newest <= EXACT_UP_TO.get(s.k_new.dtype, 2**53)


def rounded_positions(got: list, exp: list, dtype: torch.dtype) -> str | None:
    """The message when ``got`` is ``exp`` rounded to the keys' ``dtype`` (positions stored in it); else None."""
    if dtype not in EXACT_UP_TO or got == exp or len(got) != len(exp):
        return None
    if torch.tensor(exp, dtype=torch.float64).to(dtype).long().tolist() != got:
        return None
    return (f"positions {got} are the right ones rounded to {short(dtype)}, the keys' dtype: your cache stores "
            f"positions in a {short(dtype)} tensor, which holds integers exactly only up to "
            f"{EXACT_UP_TO[dtype]:,}. " + POSITIONS_DTYPE_HINT)


POSITIONS_DTYPE_HINT = ("positions are integers: keep them in torch.long, torch.zeros(W, dtype=torch.long, "
                        "device=k_new.device) or torch.tensor(..., dtype=torch.long). k_new.new_zeros(W), "
                        "k_new.new_tensor(...) and torch.zeros_like(k_new) take the keys' dtype (float32, float16, "
                        "bfloat16), and .long() on the way out cannot bring back a position already rounded.")


def drive(judge: Judge, run: Run, dev, base: int = 0, cache=None, label: str = ""):
    """Yield once per step, after the judge has seen it (a generator, so runs can be interleaved).

    A dtype the device cannot hold (float64 on Apple's MPS) runs on the CPU instead.
    """
    if not _supports(str(dev), run.dtype):
        dev = torch.device("cpu")
    title = judge.title() + (f" [instance {label}]" if label else "")
    if cache is None:
        cache = make(title, judge.cls, *judge.args)
    if judge.fresh_positions:
        _fresh(title, cache)
    cap = judge.capacity
    n = run.steps or steps_for(cap)
    first = 2 * cap + 1
    inputs = Inputs()
    snap = None
    for p in range(n):
        zero = zero_token(run.zeros, p, cap)
        case = f"{title}, {run.tokens()}, step {p + 1} (tokens 0..{p} fed so far)"
        k_new, v_new = token(p, run.dtype, dev, run.shape, base, zero)
        if run.layout:
            k_new, v_new = laid_out(k_new, run.layout), laid_out(v_new, run.layout)
        inputs.add(p, k_new, v_new)
        k, v = unpack_kv(case, call(case, "update()", cache.update, k_new, v_new))
        # the recent tokens at every step, all of them every 32 steps and at the end (a long run is O(n^2) else)
        recent = None if p % 32 == 31 or p + 1 == n else 4 * cap + 8
        inputs.check_untouched(case, recent)  # first: a k_new changed in place (squeeze_) must not be judged
        ek, ev = judge.oracle.update(k_new.clone(), v_new.clone())  # unchanged (checked): the same numbers
        check_kind(case, k, v, k_new)
        if p == 0 and library_inside(cache):
            raise fail(case, f"{library_inside(cache)}: the check compares with that very class, so it shows "
                       "nothing about your code.", hint="store and evict the keys and values yourself.")
        judge.step(Step(p, case, k_new, k, v, ek, ev, base, run.zeros, cache))
        if judge.fresh_positions:
            float_positions(case, cache, judge.oracle.positions.tolist())
        inputs.check_untouched(case, recent)
        r = _bounded(case, cache, cap, k_new)
        if p + 1 == first:
            snap = r
        elif p + 1 == n and snap is not None:
            _flat(case, snap, r, k_new, first, n)
        yield


def run_alone(judge_cls, cls, run: Run, dev) -> None:
    for _ in drive(judge_cls(cls, run.args), run, dev):
        pass


def _passes(judge_cls, cls, run: Run, dev) -> bool:
    try:
        run_alone(judge_cls, cls, run, dev)
        return True
    except ExerciseFailed:
        return False
    except Exception:
        return False


def pristine(cls):
    """A copy of ``cls`` whose mutable class attributes are fresh copies (None if it cannot be made)."""
    try:
        ns = {k: copy.deepcopy(v) if isinstance(v, (list, dict, set, deque, torch.Tensor)) else v
              for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
        return type(cls)(cls.__name__, cls.__bases__, ns)
    except Exception:
        return None


def shared_state(cls, args: tuple, dev) -> str | None:
    """What two fresh instances of ``cls``, each given two tokens, hold in common (None if nothing)."""
    def use(cache, i):
        for p in range(2):
            cache.update(*token(p, F32, dev, SHAPE0, STREAM * i, False))

    return two_fresh(cls, args, use)


def isolate(e: ExerciseFailed, judge_cls, cls, run: Run, dev, snapshot=None) -> ExerciseFailed:
    """Name what breaks a failing run by changing one thing at a time; ``e`` unchanged if nothing fits.

    ``snapshot``: :func:`pristine` of ``cls`` taken before any instance was used, when some instance of
    ``cls`` already ran in this check (so shared state is possible).
    """
    if snapshot is not None:
        fresh = pristine(snapshot)
        if fresh is not None and _passes(judge_cls, fresh, run, dev):
            return rehint(e, "state is shared between instances: this run passes on a fresh copy of your class, "
                          "but fails after earlier instances were used. Keep all state on self, assigned in "
                          "__init__, not in class attributes such as `k = []` or `store = {}` at class level.",
                          "(run alone on a fresh copy of your class, this case passes)")
    shared = shared_state(cls, run.args, dev)
    if shared:
        return rehint(e, "state is shared between instances. " + shared,
                      "(two fresh instances, each given two tokens, were looked at side by side)")
    if not getattr(e, "generic", False):
        return e
    plain = run.plain()
    if not _passes(judge_cls, cls, plain, dev):
        b, h, d = run.shape
        if b != h and _passes(judge_cls, cls, run.plain(shape=(2, 2, 4)), dev):
            return rehint(e, f"batch and heads are mixed up somewhere: with tokens (2, 2, 1, 4) (batch == heads) "
                          f"this passes, with (batch={b}, heads={h}) it does not. Is a buffer allocated as "
                          "(heads, batch, W, head_dim), or are dims 0 and 1 swapped? Take B, H, _, D = k_new.shape.")
        return e
    if plain == run:
        return e
    found = []
    if run.shape != SHAPE0 and not _passes(judge_cls, cls, run.plain(shape=run.shape), dev):
        b, h, d = run.shape
        found.append(f"with tokens of shape ({b}, {h}, 1, {d}) it fails, with (2, 3, 1, 4) it passes: something "
                     "assumes a shape. squeeze() drops batch 1 or a single head; a buffer must be "
                     "(batch, heads, W, head_dim) taken from k_new.shape, and a token is written with [:, :, slot].")
    long = run.dtype in EXACT_UP_TO and (run.steps or 0) > EXACT_UP_TO[run.dtype]
    if long and _passes(judge_cls, cls, run.plain(dtype=run.dtype, steps=None), dev):
        limit = EXACT_UP_TO[run.dtype]
        found.append(f"short {short(run.dtype)} runs pass and this one fails past position {limit}: something counts "
                     f"or records positions in the keys' dtype, and {short(run.dtype)} holds integers exactly only up "
                     f"to {limit} (a counter made with k_new.new_zeros(()), a position with k_new.new_tensor(p)). "
                     "Count tokens with a Python int and keep positions in torch.long.")
    elif run.dtype != F32 and not _passes(judge_cls, cls, run.plain(dtype=run.dtype), dev):
        found.append(f"with {short(run.dtype)} tokens it fails, with float32 it passes: keep k_new's dtype "
                     "throughout. torch.empty(0) and torch.zeros(...) default to float32 (use dtype=k_new.dtype or "
                     "k_new.new_zeros), .float() converts, and numpy has no bfloat16.")
    if run.layout and not _passes(judge_cls, cls, run.plain(shape=run.shape, layout=run.layout), dev):
        found.append(f"with tokens {LAYOUTS[run.layout]}, it fails; with the same numbers in contiguous memory it "
                     "passes: a model's keys are rarely contiguous (a slice of a fused projection, a transposed or "
                     "expanded view). .view() needs contiguous memory: use .reshape(), or keep the 4-D layout and "
                     "index with [:, :, slot].")
    if run.zeros and not _passes(judge_cls, cls, run.plain(zeros=run.zeros), dev):
        found.append("when some keys and values are all zeros it fails: zero is a legitimate key; never find "
                     "empty slots by looking for zeros, count the tokens written instead.")
    return rehint(e, " Also: ".join(found)) if found else e


def check_runs(judge_cls, cls, runs, dev, snapshot=None, earlier: bool = False) -> None:
    """Each run alone, in order; the first failure is raised, after :func:`isolate` had a look.

    ``snapshot``: :func:`pristine` of ``cls`` taken before the check used it; ``earlier``: instances of
    ``cls`` were already used before these runs.
    """
    for n, run in enumerate(runs):
        try:
            run_alone(judge_cls, cls, run, dev)
        except ExerciseFailed as e:
            raise isolate(e, judge_cls, cls, run, dev, snapshot if (earlier or n > 0) else None) from None


def in_turn(gens: list, late: int, join) -> int:
    """Advance the generators ``gens`` in turn, ``late`` steps each; then add ``join()`` (a generator made only now,
    so its instance is created while the others are mid-stream) and go on in turn until every one is exhausted.

    Returns how many steps were taken after ``join`` (every generator's, the late one's included). Whatever a
    step raises (an ``ExerciseFailed``) goes to the caller, which knows what the instances were.
    """
    for _ in range(late):
        for g in gens:
            next(g, None)
    live = [*gens, join()]
    steps = 0
    while live:
        for g in list(live):
            try:
                next(g)
                steps += 1
            except StopIteration:
                live.remove(g)
    return steps


def interleave(judge_cls, cls, argsets, dev, late: int = 5) -> None:
    """Live instances with different windows, updated in turn; each was right alone (checked before).

    The last instance is created only after the others have taken ``late`` updates each, as a model
    making caches for a new sequence while another is still decoding: a cache whose ``__init__`` resets
    state shared through the class (or a module-level variable) breaks the ones already running.
    """
    judges = [judge_cls(cls, args) for args in argsets]
    names = ", ".join(f"{INSTANCES[i]} = {j.title()}" for i, j in enumerate(judges))
    first = [make(f"{names}, created side by side", cls, *j.args) for j in judges[:-1]]
    gens = [drive(j, Run(j.args), dev, base=STREAM * i, cache=c, label=INSTANCES[i])
            for i, (j, c) in enumerate(zip(judges, first))]
    last = len(judges) - 1
    try:
        in_turn(gens, late, lambda: drive(judges[last], Run(judges[last].args), dev, base=STREAM * last,
                                          label=INSTANCES[last]))
    except ExerciseFailed as e:
        shared = shared_state(cls, argsets[-1], dev)
        if shared:
            raise rehint(e, "state is shared between instances. " + shared,
                         f"(several instances alive at once: {names}; labels like A3 are token 3 fed to instance A)"
                         ) from None
        raise rehint(e, "each instance alone passed every run above, but with several alive at once (" + names +
                     f"; {INSTANCES[last]} created after the others had taken {late} updates) one's answers changed: "
                     "state is shared between instances. Keep it on self, assigned in __init__; a class attribute "
                     "(a buffer or list defined in the class body, or reset in __init__ through the class) or a "
                     "module-level variable is one object for every instance.",
                     "(labels like A3 are token 3 fed to instance A)") from None
