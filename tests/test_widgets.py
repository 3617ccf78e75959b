"""EvictionExplorer driven from Python: controls change state, each change redraws once, nothing leaks."""

from __future__ import annotations

import io

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

from swkv_teach.caches import make_cache
from swkv_teach.widgets import EvictionExplorer, compare_policies

matplotlib.use("Agg")
ipywidgets = pytest.importorskip("ipywidgets")


def held_by_real_cache(policy: str, window_size: int, step: int, reads=None) -> tuple[int, ...]:
    """What our own cache holds after ``step``; ``reads`` maps a step to the ids read (promoted) then."""
    cache = make_cache(policy, window_size, num_sinks=2)
    for t in range(step + 1):
        x = torch.full((1, 1, 1, 1), float(t))
        cache.update(x, x)
        for i in (reads or {}).get(t, ()):
            cache.get(i)
    if policy == "lru":
        return tuple(sorted(cache.ids()))
    if policy in ("ring", "sinks"):
        return tuple(cache.stored_positions().tolist())
    return tuple(range(cache.seen - len(cache), cache.seen))


@pytest.fixture
def explorer(capsys):
    # outside a kernel IPython's display() prints reprs; capsys keeps the log clean
    return EvictionExplorer(window_size=4, steps=12, policy="sliding")


def test_is_a_box_with_a_play_button_linked_to_the_step_slider(explorer):
    assert isinstance(explorer, ipywidgets.VBox)
    assert explorer.step_slider.description == "step"
    explorer.play.value = 9  # the Python-side link moves the slider, which redraws
    assert explorer.step_slider.value == 9 and explorer.step == 9
    assert explorer.cached_positions == held_by_real_cache("sliding", 4, 9)


@pytest.mark.parametrize("step", [3, 4, 11])  # last step before any eviction, the first one, the end
def test_setting_the_step_slider_shows_what_the_cache_holds_then(explorer, step):
    start = explorer.step
    explorer.step_slider.value = step
    assert explorer.step == step
    assert explorer.cached_positions == held_by_real_cache("sliding", 4, step)
    assert explorer.redraws == (1 if step == start else 2)


def test_each_change_redraws_once_with_a_different_picture(explorer):
    pictures = [explorer.last_png]
    for control, value in ((explorer.step_slider, 10), (explorer.window_slider, 6), (explorer.policy_dropdown, "sinks")):
        redraws = explorer.redraws
        control.value = value
        assert explorer.redraws == redraws + 1, f"{control.description}: expected one redraw"
        assert explorer.last_png != pictures[-1], f"{control.description}: the picture did not change"
        pictures.append(explorer.last_png)
    assert Image.open(io.BytesIO(pictures[-1])).format == "PNG"
    assert (explorer.window_size, explorer.policy, explorer.step) == (6, "sinks", 10)
    assert explorer.cached_positions == held_by_real_cache("sinks", 6, 10)


def test_lru_reads_typed_by_the_learner_promote_token_zero(explorer):
    explorer.policy_dropdown.value = "lru"
    explorer.step_slider.value = 10
    assert 0 not in explorer.cached_positions  # no reads: LRU is the window
    explorer.access_text.value = "0"
    assert explorer.cached_positions == held_by_real_cache("lru", 4, 10, reads={t: (0,) for t in range(11)})
    assert 0 in explorer.cached_positions
    assert explorer.access_text.layout.display != "none"
    explorer.policy_dropdown.value = "ring"
    assert explorer.access_text.layout.display == "none" and 0 not in explorer.cached_positions


def test_a_typo_in_the_reads_box_shows_a_message_and_keeps_the_picture(explorer):
    explorer.policy_dropdown.value = "lru"
    png, redraws = explorer.last_png, explorer.redraws
    explorer.access_text.value = "0, x"
    assert "access_pattern" in explorer.message.value and "'x'" in explorer.message.value
    assert (explorer.last_png, explorer.redraws) == (png, redraws)
    explorer.access_text.value = "0"
    assert explorer.message.value == "" and explorer.redraws == redraws + 1


def test_constructor_access_pattern_per_step(capsys):
    explorer = EvictionExplorer(window_size=3, steps=8, policy="lru", access_pattern={3: (1,)})
    explorer.step_slider.value = 5  # the window would hold 3, 4, 5; the read at step 3 saved token 1
    assert explorer.cached_positions == held_by_real_cache("lru", 3, 5, reads={3: (1,)}) == (1, 4, 5)


def widget_tree(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from widget_tree(child)


def test_the_picture_is_an_image_widget_holding_the_png_and_no_output_widget_is_used(explorer):
    """Colab's ipywidgets 7.7.1 / widgetsnbextension 3.6.10 cannot create an Output in classic Notebook 6.5:
    an explorer needing one shows no controls there. The picture travels as the Image's value instead."""
    assert not [w for w in widget_tree(explorer) if isinstance(w, ipywidgets.Output)]
    assert explorer.image in list(widget_tree(explorer))
    assert explorer.image.format == "png" and explorer.image.value == explorer.last_png
    explorer.step_slider.value = 0
    assert explorer.image.value == explorer.last_png and Image.open(io.BytesIO(explorer.image.value)).format == "PNG"
    state = explorer.image.get_state()  # what is sent to the browser: the PNG bytes themselves
    assert bytes(state["value"]) == explorer.last_png


def test_no_figures_pile_up(explorer):
    before = len(plt.get_fignums())
    for step in (0, 5, 11):
        explorer.step_slider.value = step
    assert len(plt.get_fignums()) == before


def test_compare_policies_returns_one_figure_with_a_panel_per_policy():
    fig = compare_policies(12, 4, policies=("sliding", "ring", "lru"), access_pattern="0")
    assert isinstance(fig, Figure)
    assert [ax.get_title() for ax in fig.get_axes()] == ["sliding (W=4)", "ring (W=4)", "lru (max_size=4)"]


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(window_size=0), ValueError, "window_size"),
        (dict(window_size="4"), TypeError, "window_size must be a positive int; got str"),
        (dict(steps=200), ValueError, "steps must be between 2 and 64"),
        (dict(window_size=30, steps=10), ValueError, "window_size must be <= steps=10"),
        (dict(policy="fifo"), ValueError, "policy must be one of"),
        (dict(num_sinks=0), ValueError, "num_sinks"),
        (dict(access_pattern={2: 7}), ValueError, "reads token 7"),
    ],
)
def test_bad_explorer_arguments(kwargs, error, words):
    with pytest.raises(error) as info:
        EvictionExplorer(**kwargs)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "args, kwargs, error, words",
    [
        ((12, 4), dict(policies=("sliding",)), ValueError, "at least two"),
        ((12, 4), dict(policies="lru"), TypeError, "policies"),
        ((12, 4), dict(policies=("sliding", "mru")), ValueError, "'mru'"),
        ((0, 4), {}, ValueError, "stream_len"),
    ],
)
def test_bad_compare_arguments(args, kwargs, error, words):
    with pytest.raises(error) as info:
        compare_policies(*args, **kwargs)
    assert words in str(info.value)


# ------------------------------------------------------------------ H2O and TOVA on the full-attention model
from swkv_teach.caches import H2OKVCache, TOVAKVCache  # noqa: E402
from swkv_teach.widgets import DEFAULT_TEXT  # noqa: E402


@pytest.fixture(scope="module")
def full_model():
    from swkv_teach.pretrained import load_pretrained

    return load_pretrained(name="full")


def real_attention_caches(model, tok, make, text, step):
    """The library's own caches, one per layer, driven by Decoder.step over text[: step + 1] (the second method)."""
    caches = [make() for _ in model.layers]
    for ch in text[: step + 1]:
        model.step(torch.tensor([tok.encode(ch)]), caches)
    return caches


@pytest.mark.parametrize("policy,budget,recent,step", [
    ("h2o", 8, 4, 20), ("h2o", 6, 0, 30), ("h2o", 5, 2, 5), ("tova", 8, None, 20), ("tova", 4, None, 31),
])
def test_attention_explorer_shows_what_the_real_cache_holds_and_its_scores(full_model, capsys, policy, budget, recent,
                                                                           step):
    model, tok = full_model
    explorer = EvictionExplorer(window_size=budget, steps=32, policy=policy, model=model, tokenizer=tok,
                                recent=recent)
    explorer.step_slider.value = step
    make = (lambda: H2OKVCache(budget, recent)) if policy == "h2o" else (lambda: TOVAKVCache(budget))
    cache = real_attention_caches(model, tok, make, DEFAULT_TEXT, step)[0]
    assert explorer.cached_positions == tuple(cache.stored_positions().tolist())
    expected = dict(zip(cache.stored_positions().tolist(), cache.scores().tolist()))
    assert explorer.scores.keys() == expected.keys()
    assert all(explorer.scores[p] == pytest.approx(expected[p], abs=1e-6) for p in expected)


def test_the_token_marked_next_out_is_the_one_the_next_step_evicts(full_model, capsys):
    model, tok = full_model
    explorer = EvictionExplorer(window_size=6, steps=40, policy="h2o", model=model, tokenizer=tok)
    checked = 0
    for step in range(6, 39):  # full from step 5 on: every later step evicts exactly one token
        now, after = explorer.trace[step], explorer.trace[step + 1]
        assert after.evicted == (now.next_out,), f"step {step}: marked {now.next_out}, evicted {after.evicted}"
        assert now.protected == tuple(range(step + 2 - 3, step + 1))  # recent 3 = the new token + the 2 newest held
        checked += 1
    assert checked == 33


def test_tova_scores_are_the_newest_querys_attention_so_they_sum_to_one(full_model, capsys):
    """The full model's window covers the whole stream, so the newest query's weights over the stored keys sum to 1."""
    model, tok = full_model
    explorer = EvictionExplorer(window_size=8, steps=32, policy="tova", model=model, tokenizer=tok)
    for step in (0, 7, 8, 31):
        explorer.step_slider.value = step
        assert sum(explorer.scores.values()) == pytest.approx(1.0, abs=1e-5)


def test_h2o_with_every_slot_recent_is_the_window_beside_it(full_model, capsys):
    model, tok = full_model
    explorer = EvictionExplorer(window_size=6, steps=24, policy="h2o", model=model, tokenizer=tok, recent=2)
    explorer.recent_slider.value = 6  # recent = budget: nothing left for heavy hitters
    assert explorer.recent == 6
    for step in (5, 6, 23):
        explorer.step_slider.value = step
        assert explorer.cached_positions == explorer.window_trace[step].cached == held_by_real_cache("ring", 6, step)


def test_attention_explorer_controls_redraw_once_and_switch_policies(full_model, capsys):
    model, tok = full_model
    explorer = EvictionExplorer(window_size=8, steps=24, policy="h2o", model=model, tokenizer=tok)
    assert {"h2o", "tova"} <= set(explorer.policy_dropdown.options)
    assert explorer.recent_slider.layout.display != "none"
    for control, value in ((explorer.step_slider, 20), (explorer.policy_dropdown, "tova"),
                           (explorer.window_slider, 6), (explorer.policy_dropdown, "ring")):
        png, redraws = explorer.last_png, explorer.redraws
        control.value = value
        assert explorer.redraws == redraws + 1 and explorer.last_png != png, control.description
    assert explorer.scores == {} and explorer.cached_positions == held_by_real_cache("ring", 6, 20)
    assert explorer.recent_slider.layout.display == "none"


def test_without_a_model_h2o_is_not_offered_and_asking_for_it_says_what_to_pass(explorer):
    assert "h2o" not in explorer.policy_dropdown.options
    with pytest.raises(ValueError, match=r"pass model= and tokenizer=.*load_pretrained\(name='full'\)"):
        EvictionExplorer(policy="h2o")


@pytest.mark.parametrize("kwargs, words", [
    (dict(text="short"), "text must be a str of at least steps=24 characters; got 5"),
    (dict(recent=9), "recent must be an int in [0, window_size=8]"),
    (dict(layer=3), "layer must be an int in [0, 2]"),
])
def test_bad_attention_explorer_arguments(full_model, kwargs, words):
    model, tok = full_model
    with pytest.raises(ValueError) as info:
        EvictionExplorer(window_size=8, policy="h2o", model=model, tokenizer=tok, **kwargs)
    assert words in str(info.value)
