"""Interactive views of eviction: :class:`EvictionExplorer` and :func:`compare_policies`.

The only module that imports ipywidgets. It draws with :mod:`swkv_teach.plots`
from a :class:`~swkv_teach.trace.Trace` recorded from a real cache, and uses
only APIs that ipywidgets 7 (Colab) and 8 (JupyterLab 4) share: ``Play``
linked to an ``IntSlider`` on the Python side (``widgets.link``), ``Dropdown``,
``Text``, ``HTML`` and one ``Image`` whose PNG bytes are replaced per change.

No ``Output`` widget: the widgetsnbextension 3.6.10 that Colab pins (with
ipywidgets 7.7.1) cannot create one in the classic Notebook 6.5 frontend (its
OutputModel lacks ``_deserialize_state``), and an explorer drawn into one shows
no controls at all there. An ``Image`` works in both generations and redraws
without flicker, since the browser swaps the picture only once it has arrived.

Usage in a notebook::

    from swkv_teach.widgets import EvictionExplorer
    EvictionExplorer(window_size=4, steps=24, policy="ring")

    # H2O and TOVA evict by a model's attention: give it a model, its tokenizer and a text
    model, tok = swkv_teach.load_pretrained(name="full")
    EvictionExplorer(window_size=8, steps=32, policy="h2o", model=model, tokenizer=tok)
"""

from __future__ import annotations

import io

import ipywidgets as widgets

from swkv_teach._validate import check_positive_int
from swkv_teach.plots import plot_comparison, plot_scored_step, plot_step
from swkv_teach.trace import ATTENTION_POLICIES, POLICIES, check_policy, parse_access_pattern, record, record_attention

__all__ = ["EvictionExplorer", "compare_policies"]

MAX_STEPS = 64  # beyond this the cells of the token stream become unreadable
# the stream H2O and TOVA read when no text is given: Python, where names come back (heavy hitters to find)
DEFAULT_TEXT = "def area(width, height):\n    return width * height\n\n\ndef volume(width, height, depth):\n"


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


class EvictionExplorer(widgets.VBox):
    """Step through a token stream and watch a cache evict: token stream, storage slots, window mask.

    Controls (public attributes, so a test or a lesson can drive them):
    ``play`` (linked to) ``step_slider``, ``window_slider``, ``policy_dropdown``
    and, for LRU, ``access_text`` (ids read at every step, e.g. ``"0"``: each
    read promotes the token, so it survives eviction). The picture is the
    ``image`` widget (PNG bytes), redrawn once per change.

    State, kept in plain attributes: ``step``, ``window_size``, ``policy``,
    ``access_pattern``, ``trace`` (the recorded cache states),
    ``cached_positions`` (what the cache holds at ``step``), ``redraws`` and
    ``last_png`` (the PNG last put in ``image``).

    H2O and TOVA (``policy="h2o"`` / ``"tova"``, offered once a ``model`` is given) evict by
    attention, so they run a real model over a real text: the picture shows the policy's
    token stream, the window's (a ring of the same size) beside it, and the score of every
    stored token, the protected recent ones hatched (H2O) and the next one out in red.
    ``window_size`` is then the budget; ``recent_slider`` sets H2O's recent window;
    ``scores`` maps each stored position to its score at ``step``.

    Args:
        window_size: ``W`` (for LRU, its ``max_size``; for H2O/TOVA, the budget).
        steps: tokens in the stream, 2 .. 64.
        policy: one of ``"sliding"``, ``"ring"``, ``"sinks"``, ``"lru"``, and with a model ``"h2o"``, ``"tova"``.
        num_sinks: pinned first tokens when the policy is ``"sinks"``.
        access_pattern: LRU reads; a str of ids read every step, or a per-step
            list / ``{step: ids}`` (see :func:`swkv_teach.trace.parse_access_pattern`).
        model, tokenizer: the decoder whose attention H2O and TOVA follow, and its tokenizer
            (``load_pretrained(name="full")``, trained with full attention, is the one they were made for).
        text: the stream they read, at least ``steps`` characters (default :data:`DEFAULT_TEXT`).
        recent: H2O's recent window (default half the budget).
        layer: which layer's cache is shown.
    """

    def __init__(self, window_size: int = 4, steps: int = 24, policy: str = "sliding", num_sinks: int = 2,
                 access_pattern=None, model=None, tokenizer=None, text: str | None = None, recent: int | None = None,
                 layer: int = 0):
        check_positive_int("window_size", window_size)
        check_positive_int("steps", steps)
        if not 2 <= steps <= MAX_STEPS:
            raise ValueError(f"steps must be between 2 and {MAX_STEPS} (readable cells); got {steps}")
        if window_size > steps:
            raise ValueError(f"window_size must be <= steps={steps} to see any eviction; got {window_size}")
        check_positive_int("num_sinks", num_sinks)
        if policy not in ATTENTION_POLICIES:
            check_policy(policy)
        elif model is None or tokenizer is None:
            raise ValueError(
                f"policy {policy!r} evicts by a model's attention: pass model= and tokenizer=, e.g. "
                f"model, tokenizer = swkv_teach.load_pretrained(name='full')"
            )
        parse_access_pattern(access_pattern, steps)  # fail here, not in a callback
        text = DEFAULT_TEXT if text is None else text
        if model is not None:
            if not isinstance(text, str) or len(text) < steps:
                got = f"{len(text)} characters" if isinstance(text, str) else type(text).__name__
                raise ValueError(f"text must be a str of at least steps={steps} characters; got {got}")
            if recent is not None and not (isinstance(recent, int) and 0 <= recent <= window_size):
                raise ValueError(f"recent must be an int in [0, window_size={window_size}]; got {recent!r}")
            if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(model.layers):
                raise ValueError(f"layer must be an int in [0, {len(model.layers) - 1}]; got {layer!r}")
        self.model, self.tokenizer, self.text, self.layer = model, tokenizer, text, layer
        self.recent = window_size // 2 if recent is None else recent
        self.window_trace = None  # the ring beside H2O/TOVA

        self.steps, self.num_sinks = steps, num_sinks
        self.window_size, self.policy, self.access_pattern = window_size, policy, access_pattern
        self.step = min(steps - 1, window_size + 2)  # open on a step where something was evicted
        self.redraws, self.last_png = 0, b""

        self.play = widgets.Play(value=self.step, min=0, max=steps - 1, step=1, interval=700, description="play")
        self.step_slider = widgets.IntSlider(value=self.step, min=0, max=steps - 1, description="step")
        widgets.link((self.play, "value"), (self.step_slider, "value"))  # Python side: works in Colab too
        self.window_slider = widgets.IntSlider(value=window_size, min=1, max=max(window_size, min(12, steps)),
                                               description="window")
        options = list(POLICIES) + (list(ATTENTION_POLICIES) if model is not None else [])
        self.policy_dropdown = widgets.Dropdown(options=options, value=policy, description="policy")
        self.recent_slider = widgets.IntSlider(value=self.recent, min=0, max=self.window_slider.max,
                                               description="recent")
        self.access_text = widgets.Text(
            value=access_pattern if isinstance(access_pattern, str) else "",
            placeholder="custom per-step reads" if access_pattern else "e.g. 0",
            description="LRU reads",
        )
        self.message = widgets.HTML(value="")
        self.image = widgets.Image(format="png")

        self.step_slider.observe(self._on_step, names="value")
        self.window_slider.observe(self._on_settings, names="value")
        self.policy_dropdown.observe(self._on_settings, names="value")
        self.access_text.observe(self._on_settings, names="value")
        self.recent_slider.observe(self._on_settings, names="value")

        super().__init__(children=[
            widgets.HBox([self.play, self.step_slider]),
            widgets.HBox([self.policy_dropdown, self.window_slider, self.access_text, self.recent_slider]),
            self.message,
            self.image,
        ])
        self._record()
        self._redraw()

    # ------------------------------------------------------------------ state
    @property
    def cached_positions(self) -> tuple[int, ...]:
        """Token positions the cache holds at the current step, sorted."""
        return self.trace[self.step].cached

    @property
    def scores(self) -> dict[int, float]:
        """H2O/TOVA: ``{position: score}`` of the tokens stored at the current step (empty for other policies)."""
        snap = self.trace[self.step]
        if snap.scores is None:
            return {}
        return {p: s for p, s in zip(snap.slots, snap.scores) if p is not None}

    def _record(self) -> None:
        if self.policy in ATTENTION_POLICIES:
            text = self.text[: self.steps]
            self.trace = record_attention(self.policy, self.window_size, self.model, self.tokenizer.encode(text),
                                          self.recent if self.policy == "h2o" else None, self.layer, tuple(text))
            self.window_trace = record("ring", self.window_size, self.steps)
        else:
            reads = self.access_pattern if self.policy == "lru" else None
            self.trace = record(self.policy, self.window_size, self.steps, self.num_sinks, reads)
            self.window_trace = None
        self.access_text.layout.display = "" if self.policy == "lru" else "none"
        self.recent_slider.layout.display = "" if self.policy == "h2o" else "none"

    def _redraw(self) -> None:
        if self.window_trace is not None:
            fig = plot_scored_step(self.trace, self.window_trace, self.step)
        else:
            fig = plot_step(self.trace, self.step)
        # a pyplot-free Figure: nothing to close, nothing for the inline backend to show a second time
        self.last_png = _png(fig)
        self.redraws += 1
        self.image.value = self.last_png

    # -------------------------------------------------------------- callbacks
    def _on_step(self, change) -> None:
        self.step = change["new"]
        self._redraw()

    def _on_settings(self, change) -> None:
        window_size, policy = self.window_slider.value, self.policy_dropdown.value
        access = self.access_pattern
        if change["owner"] is self.access_text:
            access = change["new"]
        try:
            parse_access_pattern(access, self.steps)
        except (TypeError, ValueError) as err:
            self.message.value = f"<span style='color:#D62728'>{err}</span>"
            return
        self.message.value = ""
        self.window_size, self.policy, self.access_pattern = window_size, policy, access
        self.recent = min(self.recent_slider.value, window_size)  # H2O's recent window is part of the budget
        self._record()
        self._redraw()


def compare_policies(stream_len: int, window_size: int, policies=("sliding", "lru"), access_pattern=None,
                     num_sinks: int = 2):
    """The same token stream under several policies, side by side (a matplotlib Figure).

    Each panel is a timeline (row = step, column = token); cells where a policy
    holds something different from the first policy are outlined in red.
    ``access_pattern`` is given to ``"lru"`` only (other policies ignore
    reads); with none, LRU is exactly the sliding window.
    """
    check_positive_int("stream_len", stream_len)
    if stream_len > MAX_STEPS:
        raise ValueError(f"stream_len must be <= {MAX_STEPS} (readable cells); got {stream_len}")
    check_positive_int("window_size", window_size)
    if isinstance(policies, str) or not hasattr(policies, "__iter__"):
        raise TypeError(f"policies must be a tuple of policy names such as ('sliding', 'lru'); got {policies!r}")
    policies = tuple(check_policy(p) for p in policies)
    if len(policies) < 2:
        raise ValueError(f"policies must name at least two policies to compare; got {policies}")
    traces = [record(p, window_size, stream_len, num_sinks, access_pattern if p == "lru" else None)
              for p in policies]
    return plot_comparison(traces)
