"""Exercise 11: the learner's ring as a ``transformers`` cache layer (``RingLayer``) and ``ring_cache(model)``.

The statement (solutions/11_hf_cache_layer.py) asks, with ``n`` tokens seen before ``q`` new ones and window
``W`` (query ``i`` sees keys ``i - W < j <= i``), for what transformers' own ``DynamicSlidingWindowLayer``
reports (:func:`swkv_teach.hf_cache.mask_sizes` is the oracle)::

    get_seq_length()  = n                                   tokens seen, not stored
    get_mask_sizes(q) = (min(n, W - 1) + q, max(n - W + 1, 0))   asked before update, read-only
    update(k, v)      -> the keys of positions kv_offset .. kv_offset + kv_length - 1:
                         any order for one token (slot order is fine), oldest first for a chunk

Two parts, each with the messages it can give:

1. **The layer alone** (:func:`_drive`), on the device the library picks: keys and values *labelled* by
   their position (and by batch row and head, so a mixed-up dim shows), fed in chunks of 1, 2, 5, W - 1,
   W + 3 tokens over at least ``8 W + 16`` tokens, windows 1 to 8, four dtypes, batch 1 and 2, prompts
   shorter and longer than W, some chunks transposed in memory as a model's projections give them. At
   every update: the seen count, the mask sizes (read twice, and they must
   change nothing), the positions, order, dtype and device of the keys and values returned; at the end of
   a run, the memory the object keeps (at most about the window). Then three runs with no get_mask_sizes
   before update (transformers asks the first sliding layer only), and three layers alive at once.
2. **Inside transformers** (:mod:`._hf_models`): tiny random Mistral (every layer slides, windows 1, 2, 3,
   5 with 1, 3, 2 and 5 layers), Gemma 2 (sliding and full in turn, 2 and 3 layers) and Gemma 3 (two sliding,
   one full) built on the CPU from
   a config; ``ring_cache(model)`` must give the learner's layer to sliding layers only; chunked
   ``model(...)`` calls (batch 2 with a prompt shorter than W, batch 1 with one longer) give each chunk's
   logits within 1e-4 of one forward of the whole sequence, and so does every step of greedy ``generate``
   (the reference is that forward, not transformers' default cache, which is wrong for ``sliding_window =
   1``: see ``_hf_models._generate``). Last, ``ring_cache`` on an image-text Gemma 3, whose layers are described
   in ``config.text_config`` (layer types only: its forward needs images).

transformers is imported only when the check runs: without it the check fails with the install line.
"""

from __future__ import annotations

import warnings

import torch

from swkv_teach.device import device as pick_device
from swkv_teach.grading._drive import _supports, in_turn
from swkv_teach.grading._hf_models import ATOL, models, signature_hint
from swkv_teach.grading._layout import LAYOUTS, laid_out, name_layout
from swkv_teach.grading._own import is_own, library_inside
from swkv_teach.grading._report import ExerciseFailed, call, fail, passed, rehint, show
from swkv_teach.grading._report import learner_name as _name
from swkv_teach.grading._retained import retained
from swkv_teach.grading._shared import two_fresh

__all__ = ["check_hf_cache_layer"]

CHECK = "check_hf_cache_layer"
F32, F64, F16, BF16 = torch.float32, torch.float64, torch.float16, torch.bfloat16
# (window, first chunk = the prompt, token shape (batch, heads, head_dim), dtype)
RUNS = [(W, W + 3, (2, 3, 4), F32) for W in (1, 2, 3, 5, 8)] + [
    (1, 1, (1, 1, 4), F32), (3, 2, (1, 1, 4), F32), (8, 5, (2, 3, 4), F32),
    (3, 2, (1, 2, 4), F64), (3, 5, (2, 2, 4), BF16), (4, 1, (2, 1, 6), F16)]
# three of RUNS again, with no get_mask_sizes before update: what a model's second sliding layer gets
UNASKED = [(1, 4, (2, 3, 4), F32), (3, 2, (1, 1, 4), F32), (5, 8, (2, 3, 4), F32)]
INSTALL = 'this exercise runs your layer inside Hugging Face transformers (5.15 or newer), which is not installed here'
INSTALL_HINT = ('install it with: pip install "transformers>=5.15" (on Colab it is preinstalled), then restart '
                'the kernel.')


def chunks_for(W: int, first: int) -> list[int]:
    """The prompt, then chunks of 1, 2, 5, W - 1, W + 3, 1, 1, 3 tokens in turn until ``8 W + 16`` tokens were fed."""
    out, i = [first], 0
    pattern = [c for c in (1, 2, 5, W - 1, W + 3, 1, 1, 3) if c > 0]
    while sum(out) < 8 * W + 16:
        out.append(pattern[i % len(pattern)])
        i += 1
    return out


def _label(positions, shape, dtype, dev, stream: int = 0):
    """Keys and values for ``positions``: element 0 is ``p + 1``, element 1 tags (batch row, head, stream).

    Every other element repeats ``p + 1`` with alternating sign, values are minus the keys. All are small
    integers, exact in every dtype, so a returned tensor is decoded back to positions without rounding; in float64
    element 2 is off by 0.1, which float32 cannot hold exactly (a float32 buffer shows there).
    """
    B, H, D = shape
    p = torch.as_tensor(list(positions), dtype=torch.float64).view(1, 1, -1, 1) + 1
    sign = torch.tensor([(-1.0) ** d for d in range(D)], dtype=torch.float64)
    k = (p * sign).expand(B, H, p.shape[2], D).clone()
    k[..., 1] = (torch.arange(B * H, dtype=torch.float64).view(B, H, 1) + 1 + 8 * stream)
    if dtype == torch.float64 and D > 2:
        k[..., 2] += 0.1  # exact to float64's last bit, not float32's: a buffer kept in float32 shows here
    return k.to(dtype=dtype, device=dev), (-k).to(dtype=dtype, device=dev)


def _decode(k: torch.Tensor) -> list[int]:
    """Positions held by a returned key tensor (row 0, head 0); -1 for a slot never written (zeros)."""
    return [int(x) - 1 for x in k[0, 0, :, 0].detach().double().cpu().round().tolist()]


def _sizes(case: str, got) -> tuple[int, int]:
    try:
        a, b = got
        return int(a), int(b)
    except Exception:
        raise fail(case, f"get_mask_sizes returned {show(got)}, not a pair.",
                   hint="return a tuple (kv_length, kv_offset) of two ints.") from None


def _mask_hint(n: int, W: int, q: int, got: tuple, exp: tuple) -> str:
    """What a wrong (kv_length, kv_offset) most likely comes from."""
    from swkv_teach.hf_cache import mask_sizes

    if got == exp[::-1]:
        return "the two numbers are swapped: transformers unpacks kv_length, kv_offset = get_mask_sizes(q)."
    if n > 0 and got == (q, n):
        return (f"these describe the chunk alone (its {q} keys, from position {n}): but the chunk's first query "
                f"(position {n}) also sees the stored keys j > n - W, the last min(n, W - 1) = {min(n, W - 1)}, "
                "however "
                "long the chunk (q >= W too): kv_length = min(n, W - 1) + q, kv_offset = max(n - W + 1, 0), and update "
                "returns those stored keys in front of the chunk.")
    if got == mask_sizes(n + q, W, q) or got == (min(n + q, W), max(n + q - W, 0)):
        return ("these describe the window after the update (counted with the q new tokens), but get_mask_sizes "
                "is asked BEFORE update: with n seen, the first new query (position n) sees stored keys j > n - W, "
                "then the q new ones.")
    parts = []
    if got[0] != exp[0]:
        parts.append(f"kv_length is the stored keys the first new query can see, at most W - 1 = {W - 1} (the query "
                     f"itself is one of its W), plus the q new ones: min(n, W - 1) + q = {exp[0]}")
    if got[1] != exp[1]:
        parts.append(f"kv_offset is the oldest position returned: the first new query (position n) sees j > n - W, so "
                     f"max(n - W + 1, 0) = {exp[1]}")
    return "; ".join(parts) + "."


class _Ctx:
    """One layer being driven: its class, window, token shape/dtype/device, stream tag and title."""

    def __init__(self, cls, W, shape, dtype, dev, stream=0, label="", ask=True):
        self.cls, self.W, self.shape, self.dtype, self.dev, self.stream = cls, W, shape, dtype, dev, stream
        self.ask = ask
        B, H, D = shape
        self.title = (f"{_name(cls)}({W})" + (f" [layer {label}]" if label else "") +
                      f", keys (batch={B}, heads={H}, q, head_dim={D}) {str(dtype).replace('torch.', '')}")


def _step(c: _Ctx, layer, n: int, q: int, before: int) -> None:
    """One update of ``q`` tokens after ``n`` seen; ``before`` is the previous chunk's length (0: none).

    ``c.ask``: get_mask_sizes is asked before update (transformers asks the first sliding layer only).
    """
    from swkv_teach.hf_cache import mask_sizes

    W = c.W
    case = f"{c.title}, update of {q} token{'s' if q > 1 else ''} (positions {n}..{n + q - 1}) after {n} seen"
    if not c.ask:
        case += ", with no get_mask_sizes call before it (as for every sliding layer after the first)"
    seen = call(case, "get_seq_length()", layer.get_seq_length)
    if seen != n:
        raise fail(case, "get_seq_length() before this update:", expected=n, got=seen, hint=_seen_hint(n, W, seen))
    exp = mask_sizes(n, W, q)
    got = _read_sizes(case, layer, q, n) if c.ask else exp
    if got != exp:
        raise fail(case, f"get_mask_sizes({q}) (asked before update, with n = {n} seen, W = {W}) gives "
                   "(kv_length, kv_offset):", expected=exp, got=got, hint=_mask_hint(n, W, q, got, exp))
    k_new, v_new = _label(range(n, n + q), c.shape, c.dtype, c.dev, c.stream)
    laid = q > 1 and c.shape[1] > 1 and n % 2 == 1  # as a model's projections give them: (B, q, H, D) transposed
    if laid:
        k_new, v_new = laid_out(k_new, "transposed"), laid_out(v_new, "transposed")
        case += f", key_states and value_states {LAYOUTS['transposed']} (not contiguous)"
    keep = (k_new.clone(), v_new.clone())
    try:
        out = signature_hint(lambda: call(case, "update()", layer.update, k_new, v_new, kwargs={}))
    except ExerciseFailed as e:
        if laid and " raised " in str(e) and "TypeError" not in str(e):
            raise name_layout(e, "key_states", "transposed") from None
        raise
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
        raise fail(case, f"update() returned {show(out)}.", hint="return a tuple (keys, values) of two tensors.")
    k, v = out
    if not (torch.equal(k_new, keep[0]) and torch.equal(v_new, keep[1])):
        raise fail(case, "update() wrote into the key_states/value_states tensors it was given.",
                   hint="they belong to the model: copy them into your buffers, never the other way round.")
    for name, t in (("keys", k), ("values", v)):
        if t.dtype != c.dtype or t.device != k_new.device:
            raise fail(case, f"update() returned {name} of dtype {t.dtype} on {t.device} for new {name} of dtype "
                       f"{c.dtype} on {k_new.device}.", hint="lazy_initialization must allocate the buffers like "
                       "key_states: its dtype and device (key_states.new_zeros(B, H, W, D)); torch.zeros(...) alone is "
                       "float32 on the CPU.")
        if t.dim() != 4 or (t.shape[0], t.shape[1], t.shape[3]) != (k_new.shape[0], k_new.shape[1], k_new.shape[3]):
            raise fail(case, f"update() returned {name} of shape {tuple(t.shape)} for new ones of shape "
                       f"{tuple(k_new.shape)}.", hint="keep (batch, heads, tokens, head_dim): buffers "
                       "(B, H, W, D) from key_states.shape, tokens on dim 2.")
    want = list(range(exp[1], exp[1] + exp[0]))
    pos = _decode(k)
    if (sorted(pos) if q == 1 else pos) != want:
        raise fail(case, "update() returned the keys of positions (in the order returned)", expected=want, got=pos,
                   what="got", hint=_positions_hint(n, W, q, pos, want, before, layer))
    order = sorted(range(len(pos)), key=pos.__getitem__)
    ek, ev = _label(want, c.shape, c.dtype, c.dev, c.stream)
    if not torch.equal(k[:, :, order], ek):
        if torch.allclose(k[:, :, order], ek, rtol=1e-6, atol=0) and k.dtype == torch.float64:
            off = float((k[:, :, order] - ek).abs().max())
            raise fail(case, f"the keys returned are float64 but off by up to {off:.1e} (a key holding p + 1.1 cannot "
                       "come back exactly): they went through float32 on the way.", hint="allocate the buffers with key_states' "
                       "dtype (key_states.new_zeros(B, H, W, D)), not float32, and convert nothing.")
        raise fail(case, "the keys returned hold the right positions for batch row 0, head 0, but not for every "
                   "row, head and element.", hint="batch and heads are mixed up, or a row was written to the wrong "
                   "place: write a token with buf[:, :, slot] = key_states[:, :, i], dims (B, H, tokens, D).")
    if not torch.equal(v[:, :, order], ev):
        vp = _decode(-v)
        raise fail(case, "update() returned the right keys, but values of other positions (or not values):",
                   expected=want, got=[vp[i] for i in order], hint="keep values beside keys, slot for slot, and "
                   "return (keys, values) in that order with the same order of tokens.")
    seen = call(case, "get_seq_length()", layer.get_seq_length)
    if seen != n + q:
        raise fail(case, "get_seq_length() after this update:", expected=n + q, got=seen,
                   hint=_seen_hint(n + q, W, seen))


def _read_sizes(case: str, layer, q: int, n: int) -> tuple[int, int]:
    """``get_mask_sizes(q)`` asked twice, as transformers may: both answers equal, the seen count unchanged."""
    got = _sizes(case, call(case, f"get_mask_sizes({q})", layer.get_mask_sizes, q))
    again = _sizes(case, call(case, f"get_mask_sizes({q})", layer.get_mask_sizes, q))
    seen_after = call(case, "get_seq_length()", layer.get_seq_length)
    if again != got or seen_after != n:
        raise fail(case, f"calling get_mask_sizes({q}) twice gave {got}, then {again}; get_seq_length() went from {n} "
                   f"to {seen_after}.", hint="get_mask_sizes must only read: transformers asks it for the first "
                   "sliding layer alone, maybe more than once, before update. Count the tokens in update.")
    return got


def _seen_hint(n: int, W: int, got) -> str:
    if n > W and got == W:
        return (f"it returned the tokens stored, min(n, W) = {W}; transformers needs the tokens SEEN (it takes the new "
                "tokens' positions, RoPE and mask, from it): count every token update was given.")
    return "count every token update was given (all q of each update), from 0 for a new layer; nothing else counts."


def _positions_hint(n, W, q, pos, want, before, layer) -> str:
    if getattr(layer, "is_initialized", None) is False and -1 in pos:
        return ("is_initialized is still False after update, so the next update allocates fresh (zero) buffers "
                "again: lazy_initialization must end with self.is_initialized = True.")
    if sorted(pos) == want:
        return ("the right keys in slot order: fine for one token, but a chunk's mask differs from row to row and "
                "transformers lays it out by position. For q > 1 return the stored keys oldest first, then the chunk.")
    if pos == list(range(n, n + q)) and want != pos:
        return ("only the new keys: the new queries must also see the stored keys still in their window "
                "(positions > n - W), in front of the new ones.")
    if q > 1 and sorted(pos) == list(range(max(n + q - W, 0), n + q)):
        return ("these are the last W tokens, what the ring holds AFTER writing the chunk (as if the chunk were q "
                "one-token updates); but the chunk's first query (position n) still sees keys the chunk evicts. "
                "Gather the stored keys with positions > n - W before writing the chunk, then cat the chunk.")
    if -1 in pos:
        return ("some keys returned are slots never written (all zeros): return only filled slots, "
                "and before the ring is full only the first n + 1 of them.")
    if before > W and n > 0:
        return (f"the update before was a chunk of {before} tokens, more than W = {W}: the ring must keep that "
                f"chunk's LAST {W} tokens (positions {n - W}..{n - 1}), each in slot p % W.")
    if len(pos) > len(want):
        return (f"{len(pos) - len(want)} key(s) too many: return only what the first new query can see "
                "(positions > n - W), then the new ones; kv_length says how many.")
    return "return the stored keys with positions max(n - W + 1, 0) .. n - 1, then the q new ones."


def _drive(c: _Ctx, layer, chunks):
    """Feed ``chunks`` to ``layer`` (a generator: one yield per update, so layers can be interleaved)."""
    n, before = 0, 0
    for q in chunks:
        _step(c, layer, n, q, before)
        n, before = n + q, q
        yield
    r = retained(layer)
    per_token = 2 * c.shape[0] * c.shape[1] * c.shape[2]  # keys and values of one token
    held = r.float_elements / per_token
    if held > 2 * c.W + max(chunks) + 2:  # W slots, and a copy of what the last update returned
        raise fail(f"{c.title}, after {n} tokens in chunks of {sorted(set(chunks))}",
                   f"the layer keeps {held:g} tokens' keys and values; a window of {c.W} needs {c.W} (plus what the "
                   "last update returned).", hint="evict: a ring keeps W slots, whatever it is fed; do not keep "
                   "every token (a growing torch.cat, a list) behind the ring.")


def _new(case: str, cls, W: int):
    layer = call(case, f"{_name(cls)}({W})", cls, W)
    for m in ("update", "get_mask_sizes", "get_seq_length"):
        if not callable(getattr(layer, m, None)):
            raise fail(case, f"{_name(cls)}({W}) has no {m}() method.",
                       hint="pass the RingLayer class itself, with the methods of the statement.")
    inside = library_inside(layer)
    if inside:
        raise fail(case, f"{inside}: the check compares with the library's ring, so it shows nothing about your code.",
                   hint="keep the keys and values in your own two (B, H, W, D) buffers.")
    return layer


def _fresh(cls) -> None:
    for W in (1, 3):
        case = f"{_name(cls)}({W}), new, before any update"
        layer = _new(case, cls, W)
        if getattr(layer, "is_sliding", None) is not True:
            raise fail(case, f"is_sliding is {getattr(layer, 'is_sliding', None)!r}.",
                       hint="set is_sliding = True on the class: transformers sizes the sliding mask from the "
                       "first layer with is_sliding and the full mask from the first without (Cache.is_sliding).")
        seen = call(case, "get_seq_length()", layer.get_seq_length)
        if seen != 0:
            raise fail(case, "get_seq_length():", expected=0, got=seen, hint="a new layer has seen no token.")
        for q in (1, W + 2):
            got = _read_sizes(case, layer, q, 0)
            if got != (q, 0):
                raise fail(case, f"get_mask_sizes({q}) before the first update (transformers asks before lazy "
                           "initialisation):", expected=(q, 0), got=got,
                           hint="nothing stored yet, n = 0: " + _mask_hint(0, W, q, got, (q, 0)))


def _layers(cls, dev) -> int:
    """Part 1; returns the number of updates checked."""
    _fresh(cls)
    steps = 0
    for W, first, shape, dtype in RUNS:
        chunks = chunks_for(W, first)
        c = _Ctx(cls, W, shape, dtype, dev if _supports(str(dev), dtype) else torch.device("cpu"))  # MPS: no f64
        for _ in _drive(c, _new(c.title, cls, W), chunks):
            steps += 1
    for W, first, shape, dtype in UNASKED:
        c = _Ctx(cls, W, shape, dtype, dev, ask=False)
        try:
            for _ in _drive(c, _new(c.title, cls, W), chunks_for(W, first)):
                steps += 1
        except ExerciseFailed as e:
            raise rehint(e, "update depends on get_mask_sizes having been called before it (a value it records, "
                         "the offset or a length): transformers asks get_mask_sizes of the first sliding layer only "
                         "(the mask is the same for every layer), so every other layer's update runs without it. "
                         "The same run with get_mask_sizes asked before each update passed. Keep get_mask_sizes "
                         "read-only and compute in update what it needs from self.seen and the window.") from None
    specs = [(3, 4), (5, 1), (3, 2)]  # (window, prompt); the third made after the others took 5 updates
    ctxs = [_Ctx(cls, W, (2, 3, 4), F32, dev, stream=i, label="ABC"[i]) for i, (W, _) in enumerate(specs)]
    gens = [_drive(c, _new(c.title, cls, c.W), chunks_for(c.W, f)) for c, (_, f) in zip(ctxs[:2], specs)]
    try:
        steps += in_turn(gens, 5, lambda: _drive(ctxs[2], _new(ctxs[2].title, cls, 3), chunks_for(3, specs[2][1])))
    except ExerciseFailed as e:
        def use(layer, i):
            for n, q in ((0, 2), (2, 1)):
                layer.update(*_label(range(n, n + q), (2, 3, 4), F32, dev, i))
        shared = two_fresh(cls, (3,), use)
        raise rehint(e, "each layer alone passed every run above, but with three alive at once (C made after A and "
                     "B had taken 5 updates) one's answers changed: state is shared between instances. "
                     + (shared or "Keep it on self, assigned in __init__, not in class attributes or module "
                        "variables.")) from None
    return steps


def _transformers():
    try:
        import transformers
        import transformers.cache_utils  # noqa: F401
        from swkv_teach import hf_cache  # noqa: F401  (the oracle's mask_sizes)
    except ImportError:
        raise fail(CHECK, INSTALL + ".", hint=INSTALL_HINT) from None
    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        raise fail(CHECK, f"transformers {transformers.__version__} is installed; this exercise's interface "
                   "(get_mask_sizes(q) with an int, Cache(layers=...)) is transformers 5.15 or newer.",
                   hint='upgrade: pip install -U "transformers>=5.15", then restart the kernel.')
    return transformers


def check_hf_cache_layer(RingLayer, ring_cache=None) -> None:
    """Exercise 11: ``RingLayer(sliding_window)``, a ``CacheLayerMixin``, and ``ring_cache(model) -> Cache``.

    Pass the two, or one object (a module, a namespace) holding both as ``.RingLayer`` and ``.ring_cache``.
    """
    if ring_cache is None:
        RingLayer, ring_cache = getattr(RingLayer, "RingLayer", RingLayer), getattr(RingLayer, "ring_cache", None)
    title = f"{CHECK}({_name(RingLayer)}, {_name(ring_cache)})"
    if not isinstance(RingLayer, type) or not callable(ring_cache):
        raise fail(title, "expected your RingLayer class and your ring_cache function.",
                   hint="call check_hf_cache_layer(RingLayer, ring_cache) with the class and the function themselves.")
    tf = _transformers()
    from swkv_teach.hf_cache import WindowLayer, hf_cache

    for answer, own, what in ((RingLayer, WindowLayer, "class"), (ring_cache, hf_cache, "function")):
        if is_own(answer, own):
            raise fail(title, f"{_name(answer)} is the library's own swkv_teach.hf_cache.{own.__name__} (or built on "
                       f"it), the very {what} the check compares with: it shows nothing about your code.",
                       hint="pass the RingLayer and ring_cache you wrote. If you did write them, an import run after "
                       "them replaced them: run your cell again.")
    # transformers' own layers, the sliding ones first (they subclass the others)
    for name in ("DynamicSlidingWindowLayer", "StaticSlidingWindowLayer", "DynamicLayer", "StaticLayer"):
        theirs = getattr(tf.cache_utils, name, None)
        if isinstance(theirs, type) and is_own(RingLayer, theirs):
            raise fail(title, f"{_name(RingLayer)} is built on transformers' own {name}: its update and "
                       "get_mask_sizes are transformers', not yours, and they copy the window every step.",
                       hint="subclass CacheLayerMixin and keep the keys and values in your own ring of W slots.")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verbosity = tf.logging.get_verbosity()
        tf.logging.set_verbosity_error()
        try:
            steps = _layers(RingLayer, pick_device())
            calls, gen = models(tf, RingLayer, ring_cache)
        finally:
            tf.logging.set_verbosity(verbosity)
    passed(f"{_name(RingLayer)} / {_name(ring_cache)}: seen counts, mask sizes and keys exact on {steps} updates "
           f"(windows 1-8, chunks of 1 to W + 3, 4 dtypes, 3 layers alive at once); inside tiny Mistral, Gemma 2 and "
           f"Gemma 3, logits within {ATOL:g} of transformers' on {calls} chunked calls and {gen} greedy generate "
           "steps, full layers left unwindowed (an image-text Gemma 3's too).")

