"""Watching a learner's decode step, to name its bug (exercise 05).

:class:`Spy` wraps the graded model's parts and hands the learner caches that
record how they are used. Per call it knows, for each layer: the positions
given to ``attn.qkv``, the keys given to ``cache.update`` (and the positions
the cache reported right after), whether ``cache.positions`` was read before
``update``, what ``attn.attend`` received, which norms ran, and the hidden
state entering the layer. :func:`diagnose` turns that into the most specific
hint that is true; :func:`first_difference` says which layer's input first
differs from the oracle's when nothing more specific fits.

Nothing here changes what the learner's code computes: the wrappers call the
real methods and caches and return their results unchanged.
"""

from __future__ import annotations

from collections import defaultdict

import torch

__all__ = ["Spy", "diagnose", "first_difference", "foreign_keys", "keys_misnamed"]


class _Cache:
    """A library cache that records, in the spy's current call, how layer ``L`` uses it."""

    def __init__(self, inner, L: int, spy: "Spy"):
        self._inner, self._L, self._spy = inner, L, spy

    def update(self, k, v):
        out = self._inner.update(k, v)
        self._spy.log(self._L, "update", tokens=int(k.shape[2]), k=out[0], v=out[1], k_in=k, v_in=v,
                      positions=self._inner.positions.tolist())
        return out

    @property
    def positions(self):
        self._spy.log(self._L, "positions")
        return self._inner.positions

    @property
    def seen(self):
        return self._inner.seen

    def __len__(self):
        self._spy.log(self._L, "len")
        return len(self._inner)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class Spy:
    """Wrap ``model``'s parts (once) and give out recording caches, one per layer."""

    def __init__(self, model):
        from swkv_teach.model import LayerCaches

        self.model = model
        self.events: dict = defaultdict(list)  # layer -> [(kind, info)], for the current call
        self.hidden: dict = {}  # layer -> first input of its attn_norm in this call; "final" -> model.norm's
        self.start = self.c = 0
        W = model.config.window_size
        inner = model.new_caches("ring")
        self.caches = LayerCaches([_Cache(x, L, self) for L, x in enumerate(inner)], W, 0)
        for L, layer in enumerate(model.layers):
            layer.attn.qkv = self._wrap_qkv(layer.attn.qkv, L)
            layer.attn.attend = self._wrap_attend(layer.attn.attend, L)
            if hasattr(layer.attn, "attend_with_weights"):
                layer.attn.attend_with_weights = self._wrap_attend(layer.attn.attend_with_weights, L)
            if hasattr(layer.attn, "attend_unmasked"):
                layer.attn.attend_unmasked = self._wrap_unmasked(layer.attn.attend_unmasked, L)
            layer.attn_norm.register_forward_hook(self._norm_hook(L, "attn_norm"))
            layer.mlp_norm.register_forward_hook(self._norm_hook(L, "mlp_norm"))
            layer.mlp.register_forward_hook(self._norm_hook(L, "mlp"))
        model.norm.register_forward_hook(self._norm_hook("final", "norm"))

    # ------------------------------------------------------------------ recording
    def begin(self, start: int, c: int) -> None:
        self.events = defaultdict(list)
        self.hidden = {}
        self.start, self.c = start, c

    def end(self) -> None:
        pass

    def log(self, L, kind: str, **info) -> None:
        self.events[L].append((kind, info))

    def _wrap_qkv(self, qkv, L):
        def spy_qkv(x, positions, *args, **kwargs):
            t = torch.as_tensor(positions)
            out = qkv(x, positions, *args, **kwargs)
            k, v = (out[1], out[2]) if isinstance(out, tuple) and len(out) == 3 else (None, None)
            self.log(L, "qkv", positions=t.flatten().tolist(), integer=not (t.is_floating_point() or t.is_complex()),
                     dtype=str(t.dtype).replace("torch.", ""), k=k, v=v,
                     batch=int(x.shape[0]) if isinstance(x, torch.Tensor) and x.dim() else 1)
            return out

        return spy_qkv

    def _wrap_attend(self, attend, L):
        def spy_attend(q, k, v, q_positions, k_positions, *args, **kwargs):
            window_size = kwargs.get("window_size", args[1] if len(args) > 1 else None)
            qp, kp = torch.as_tensor(q_positions), torch.as_tensor(k_positions)
            self.log(L, "attend", q_positions=qp.flatten().tolist(), k_positions=kp.flatten().tolist(), k=k, v=v,
                     window_size=window_size, integer=not (qp.is_floating_point() or kp.is_floating_point()))
            return attend(q, k, v, q_positions, k_positions, *args, **kwargs)

        return spy_attend

    def _wrap_unmasked(self, attend, L):
        def spy_attend_unmasked(q, k, v, *args, **kwargs):
            self.log(L, "attend_unmasked", k=k)
            return attend(q, k, v, *args, **kwargs)

        return spy_attend_unmasked

    def _norm_hook(self, L, name):
        def hook(module, inputs, output):
            self.log(L, name)
            if name in ("attn_norm", "mlp_norm", "norm") and L not in self.hidden and inputs:
                self.hidden[L] = inputs[0].detach()

        return hook

    @staticmethod
    def oracle_hidden(model, ids) -> dict:
        """The oracle's hidden state entering each layer, and entering the final norm: ``(B, T, dim)`` each.

        (A learner's is the input of the first norm its layer runs, which in a right answer is attn_norm.)"""
        out: dict = {}

        def keep(key):
            def hook(module, inputs, output):
                out.setdefault(key, inputs[0].detach())  # returns None: a hook that returns replaces the output

            return hook

        hooks = [layer.attn_norm.register_forward_hook(keep(L)) for L, layer in enumerate(model.layers)]
        hooks.append(model.norm.register_forward_hook(keep("final")))
        try:
            model(ids)
        finally:
            for h in hooks:
                h.remove()
        return out

    # ------------------------------------------------------------------ reading
    def kinds(self, L, kind: str) -> list:
        return [info for k, info in self.events[L] if k == kind]

    def order(self, L) -> list:
        return [k for k, _ in self.events[L]]


def _expected(spy: Spy) -> list:
    return list(range(spy.start, spy.start + spy.c))


def _qkv_positions(spy: Spy, L) -> list:
    return [p for info in spy.kinds(L, "qkv") for p in info["positions"]]


def diagnose(spy: Spy, model, completed: bool = True) -> str | None:
    """The most specific true finding about the current call, as a hint (None if nothing fits).

    ``completed``: the learner's call returned (False when it raised: what never ran is not a finding).
    """
    cfg = model.config
    layers = range(len(model.layers))
    exp = _expected(spy)
    # 0. positions of a float dtype
    for L in layers:
        if any(not info["integer"] for info in spy.kinds(L, "qkv") + spy.kinds(L, "attend")):
            return ("positions must be an integer tensor: torch.arange(start, start + c) (no dtype=float, no float "
                    "arithmetic); window_mask refuses float positions.")
    # 1. cache.positions read before update (and not after): stale positions for the mask
    for L in layers:
        order = spy.order(L)
        if "positions" in order and "update" in order:
            first_update = order.index("update")
            if order.index("positions") < first_update and "positions" not in order[first_update + 1:]:
                return ("you read cache.positions before cache.update: at that moment it still describes the keys of "
                        "the previous call (and is empty on the first). Call k, v = cache.update(k, v) first, then "
                        "pass cache.positions, which now matches the k that update returned, as k_positions.")
    # 2. a layer that updates another layer's cache
    fed = {L: sum(info["tokens"] for info in spy.kinds(L, "update")) for L in layers}
    for L in layers:
        if spy.kinds(L, "qkv") and not spy.kinds(L, "update") and any(n > spy.c for n in fed.values()):
            other = next(M for M in layers if fed[M] > spy.c)
            return (f"layer {L} never updated its own cache, while cache {other} was given {fed[other]} keys in one "
                    f"call of {spy.c} new token{'s' if spy.c > 1 else ''}: each layer has its own cache (its keys "
                    "are different): "
                    "for layer, cache in zip(model.layers, caches).")
    # 2b. fewer keys given to update than new tokens: the chunk was cut
    for L in layers:
        given = sum(info["tokens"] for info in spy.kinds(L, "update"))
        if spy.kinds(L, "update") and given < spy.c:
            return (f"layer {L} passed {given} of the {spy.c} new keys to cache.update: the chunk was cut (to the "
                    f"window, k[:, :, -W:]?) before caching. Pass all c new keys and values: the cache keeps what the "
                    "window needs and counts every token as seen, and the chunk's first queries need keys the last "
                    "W drop.")
    # 2c. a post-norm block: qkv ran on the un-normalised stream, the norms afterwards
    for L in layers:
        order = [k for k in spy.order(L) if k in ("attn_norm", "mlp_norm", "qkv", "mlp")]
        if "qkv" in order and "attn_norm" in order and "mlp" in order and "mlp_norm" in order \
                and order.index("qkv") < order.index("attn_norm") and order.index("mlp") < order.index("mlp_norm") \
                and "mlp_norm" not in order[: order.index("qkv")]:
            return (f"layer {L} ran attn.qkv before attn_norm and mlp before mlp_norm: a post-norm block "
                    "(x = norm(x + sublayer(x)), the original Transformer's). This model is pre-norm, each sub-layer "
                    "reads a normalised copy and adds to the un-normalised stream: x = x + attn(attn_norm(x)), then "
                    "x = x + mlp(mlp_norm(x)).")
    if completed and not any(spy.kinds(L, "update") for L in layers) and any(spy.kinds(L, "qkv") for L in layers):
        return ("the caches were never updated: each call then sees only its own tokens, from position 0. In every "
                "layer, k, v = cache.update(k, v) and attend over what it returns; the new tokens' positions start "
                "at caches[0].seen (no RoPE offset otherwise).")
    # 3. RoPE positions given to qkv
    got = {L: _qkv_positions(spy, L) for L in layers}
    batch = next((info["batch"] for L in layers for info in spy.kinds(L, "qkv")), 1)
    if got[0] and len(got[0]) == batch * spy.c != spy.c and got[0] == list(range(spy.start, spy.start + batch * spy.c)):
        return (f"the new tokens were given {len(got[0])} positions {got[0]}, but this call has {spy.c} new token"
                f"{'s' if spy.c > 1 else ''} per sequence ({batch} sequences): the count came from "
                "input_ids.numel() (batch x tokens). The number of new tokens is input_ids.shape[1].")
    if got[0] == exp and any(got[L] != exp for L in layers if got[L]):
        bad = next(L for L in layers if got[L] and got[L] != exp)
        return (f"positions are recomputed inside the layer loop: layer 0 used {exp}, layer {bad} used {got[bad]}. "
                "After layer 0's update, caches[0].seen has already moved on; compute the positions once, before the "
                "loop, from caches[0].seen (every layer's new tokens sit at the same positions).")
    if all(got[L] == got[0] for L in layers if got[L]) and got[0] and got[0] != exp:
        g = got[0]
        stored = min(spy.start, cfg.window_size)
        if spy.start > 0 and g == list(range(0, spy.c)):
            return (f"no RoPE offset: the new tokens were rotated at positions {g}, as if each call started the "
                    f"sequence; they sit at {exp}. Start at caches[0].seen, read before the update.")
        before = _before_update(spy, 0)
        if g == list(range(stored, stored + spy.c)) and "len" in before:
            return (f"RoPE positions from len(cache): {g} instead of {exp}. Once the window is full len(cache) "
                    "stops at W while positions keep growing; use caches[0].seen (tokens seen), read before the "
                    "update.")
        if "positions" in before:
            return (f"the new tokens were rotated at positions {g}; they sit at {exp}. You derived them from "
                    "cache.positions read before the update (its last entry + 1, or its length?): once a ring has "
                    "wrapped, positions lists the keys in slot order, so its last entry is not the newest, and it "
                    "never holds more than W. Use caches[0].seen, the number of tokens seen.")
        return f"the positions given to attn.qkv were {g}; the new tokens sit at {exp} (caches[0].seen onwards)."
    # 4. what attend was given
    for L in layers:
        ups, attends = spy.kinds(L, "update"), spy.kinds(L, "attend")
        for i, info in enumerate(attends):
            up = ups[i] if len(ups) == len(attends) else (ups[-1] if ups else None)
            if info["window_size"] is not None and info["window_size"] != cfg.window_size:
                wider = ("your queries attend to keys outside the window. "
                         if info["window_size"] > cfg.window_size else "")
                return (f"{wider}Layer {L} called attend with window_size={info['window_size']}: the model's window "
                        f"is {cfg.window_size}; leave window_size out and attend masks with the model's own.")
            if info["q_positions"] != exp and sorted(set(info["q_positions"]) - set(exp)) and \
                    len(info["q_positions"]) == spy.c:
                return (f"layer {L} gave attend q_positions {info['q_positions']}; the new queries sit at {exp}: pass "
                        "the same positions you gave attn.qkv.")
            k = info["k"]
            if k.shape[1] != cfg.n_kv_heads and k.shape[1] == cfg.n_heads and up:
                g = cfg.n_heads // cfg.n_kv_heads
                ck = up["k"]
                if ck.shape[1] == cfg.n_kv_heads and not torch.equal(k, ck.repeat_interleave(g, dim=1)):
                    return (f"KV heads tiled wrongly: layer {L} expanded its {cfg.n_kv_heads} key/value heads to "
                            f"{cfg.n_heads} in another order than grouped-query attention's. Key/value head h serves "
                            f"query heads h*{g} .. h*{g}+{g - 1} (repeat_interleave(g, dim=1), as Hugging Face's "
                            "repeat_kv; .repeat tiles them h, h + n_kv, ...). Simplest: pass the cache's keys as they "
                            "are; attend does the grouping.")
            if len(info["k_positions"]) != k.shape[2]:
                return (f"layer {L} gave attend {len(info['k_positions'])} k_positions for {k.shape[2]} keys: "
                        "k_positions is cache.positions, read after the update (one position per key update "
                        "returned), not the new tokens' positions.")
            found = key_order(L, info, up, _read_after_update(spy, L))
            if found:
                return found
    # 5. norms
    for L in layers:
        order = spy.order(L)
        if "mlp_norm" in order and "qkv" in order and order.index("mlp_norm") < order.index("qkv"):
            return (f"layer {L} normalised the attention's input with mlp_norm: each sub-layer has its own norm, "
                    "q, k, v = layer.attn.qkv(layer.attn_norm(x), positions), then "
                    "x + layer.mlp(layer.mlp_norm(x)).")
    for L in layers if completed else ():
        n_attn, n_mlp = spy.order(L).count("attn_norm"), spy.order(L).count("mlp_norm")
        n_qkv, n_ff = len(spy.kinds(L, "qkv")), spy.order(L).count("mlp")
        if n_mlp == 0 and n_attn >= n_qkv + n_ff and n_ff:
            return (f"one norm shared by attention and MLP: layer {L} ran attn_norm {n_attn} times and mlp_norm never. "
                    "Each sub-layer has its own RMSNorm with its own weight: x + mlp(layer.mlp_norm(x)).")
        if n_mlp == 0 and n_ff:
            return (f"layer {L}'s MLP did not read layer.mlp_norm(x): a norm without its weight (or none) was used. "
                    "Pre-norm blocks: x = x + layer.mlp(layer.mlp_norm(x)).")
        if n_attn == 0 and n_qkv:
            return (f"layer {L}'s attention did not read layer.attn_norm(x): q, k, v = "
                    "layer.attn.qkv(layer.attn_norm(x), positions).")
    if completed and not spy.order("final").count("norm"):
        return "model.norm was not applied: the logits are model.lm_head(model.norm(x))."
    return None


def _before_update(spy: Spy, L) -> list:
    """What layer ``L``'s cache was asked (``len``, ``positions``) before its first update in this call."""
    order = spy.order(L)
    return order[: order.index("update")] if "update" in order else order


def _read_after_update(spy: Spy, L) -> bool:
    order = spy.order(L)
    return "update" in order and "positions" in order[order.index("update") + 1 :]


def keys_misnamed(spy: Spy, n_layers: int) -> str | None:
    """A layer whose attend k_positions do not name, in order, the keys its cache.update returned."""
    for L in range(n_layers):
        ups, attends = spy.kinds(L, "update"), spy.kinds(L, "attend")
        for i, info in enumerate(attends):
            up = ups[i] if len(ups) == len(attends) else (ups[-1] if ups else None)
            found = key_order(L, info, up, _read_after_update(spy, L))
            if found:
                return found
    return None


def _within(t: torch.Tensor, outs: list) -> bool:
    """``t`` ``(B, H, n, D)`` equals ``n`` consecutive tokens of one of ``outs`` (what qkv returned)."""
    n = t.shape[2]
    for o in outs:
        if o is None or o.dim() != 4 or o.shape[:2] != t.shape[:2] or o.shape[3] != t.shape[3] or o.shape[2] < n:
            continue
        for s in range(o.shape[2] - n + 1):
            if torch.allclose(o[:, :, s : s + n].float(), t.float().to(o.device), atol=1e-6, rtol=1e-5):
                return True
    return False


def foreign_keys(spy: Spy, n_layers: int) -> str | None:
    """A cache handed keys or values that no layer's ``attn.qkv`` returned in this call.

    (Any layer's: a decoder that always pairs layer i with another fixed cache computes the same logits.)"""
    made = [info for L in range(n_layers) for info in spy.kinds(L, "qkv")]
    for L in range(n_layers):
        for up in spy.kinds(L, "update"):
            for name, word in (("k", "keys"), ("v", "values")):
                t = up[f"{name}_in"]
                if not isinstance(t, torch.Tensor) or t.dim() != 4 or _within(t, [m[name] for m in made]):
                    continue
                what = "all zeros" if not t.any() else "not the ones it returned"
                return (f"cache {L} was handed {word} that no layer's attn.qkv returned in this call ({what}): "
                        "the caches must hold the model's real keys and values, since later calls attend over "
                        "them. In every layer: q, k, v = layer.attn.qkv(layer.attn_norm(x), positions); "
                        "k, v = cache.update(k, v); then attend over what update returned.")
    return None


def key_order(L, attend: dict, up: dict | None, read_after: bool = True) -> str | None:
    """``attend``'s k_positions do not name the keys it was given (``up``: the update that returned them).

    ``read_after``: the layer read ``cache.positions`` after its update (False: it made k_positions itself)."""
    if not up:
        return None
    kp, pos = attend["k_positions"], up["positions"]
    if kp == pos:
        return None
    k, k_in = attend.get("k"), up.get("k_in")
    if isinstance(k, torch.Tensor) and isinstance(k_in, torch.Tensor) and k.shape == k_in.shape \
            and len(pos) != k_in.shape[2] and torch.equal(k, k_in):
        return (f"layer {L} attended over the {k_in.shape[2]} new key(s) it gave cache.update, not over what update "
                f"returned ({len(pos)} keys, the window): k, v = cache.update(k, v), then attend over that k and v with "
                "k_positions = cache.positions.")
    if sorted(kp) == sorted(pos) and len(set(pos)) == len(pos):
        k, ck = attend["k"], up["k"]
        if k.dim() == 4 and ck.dim() == 4 and k.shape[1] != ck.shape[1] and k.shape[1] % max(ck.shape[1], 1) == 0:
            ck = ck.repeat_interleave(k.shape[1] // ck.shape[1], dim=1)
        perm = torch.tensor([pos.index(p) for p in kp], device=ck.device)
        if k.shape == ck.shape and torch.equal(k, ck.index_select(2, perm)):
            return None  # keys and their positions re-ordered together: consistent
        if not read_after:
            why = ("built by hand, not read from the cache: torch.arange(end - n, end) assumes the keys come back "
                   "chronologically")
        elif kp == sorted(pos):
            why = "cache.positions sorted chronologically"
        else:
            why = "cache.positions re-ordered"
        return (f"layer {L} gave attend k_positions {kp} ({why}), but the keys update returned sit at {pos}, in "
                "that order: a ring that has wrapped returns its slots as they lie, so position i must name key i. "
                "Pass cache.positions as it is, read after the update.")
    return (f"layer {L} gave attend k_positions {kp}, but the keys update returned sit at {pos}: pass "
            "cache.positions, read after the update.")


def first_difference(spy: Spy, oracle: dict) -> str:
    """Which layer's input first differs from the oracle's in this call (what differs, when no bug is named)."""
    s, tol = spy.start, 1e-4
    for L in [*sorted(k for k in spy.hidden if k != "final"), "final"]:
        mine = spy.hidden.get(L)
        if mine is None:
            continue
        n = mine.shape[1]
        ref = oracle[L][:, s : s + n]
        if mine.shape != ref.shape or not torch.allclose(mine.float(), ref.float(), atol=tol, rtol=1e-3):
            diff = "shapes differ" if mine.shape != ref.shape else \
                f"max abs difference {float((mine.float() - ref.float()).abs().max()):.3g}"
            if L == 0:
                first = next((k for k in spy.order(0) if k in ("attn_norm", "mlp_norm", "qkv", "mlp")), None)
                if first not in ("attn_norm", None):
                    return (f"what layer 0's first norm received differs from model.forward's ({diff}), and layer 0 "
                            f"ran {first} before attn_norm: in this pre-norm model each layer starts with "
                            "attn_norm(x) on the embedding, x = model.embed(input_ids).")
                return (f"the hidden state entering layer 0 already differs from model.forward's ({diff}): it is "
                        "the embedding, x = model.embed(input_ids).")
            where = "model.norm (after the last layer)" if L == "final" else f"layer {L} (the input of its first norm)"
            before = "the last layer" if L == "final" else f"layer {L - 1}"
            return (f"the hidden state entering {where} already differs from model.forward's ({diff}), while every "
                    f"earlier one matched: look at {before}: its attention (positions, cache.update, attend), its "
                    "MLP, its norms and its two residual additions (x = x + ...).")
    return ("the hidden states entering each layer match model.forward's; the difference comes from the end: "
            "logits = model.lm_head(model.norm(x)).")
