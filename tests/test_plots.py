"""What the figures mark is what a real cache holds: each test feeds its own cache and reads the drawn artists."""

from __future__ import annotations

import matplotlib
import pytest
import torch
from matplotlib.colors import to_hex

from swkv_teach.caches import LRUKVCache, SlidingWindowKVCache, make_cache
from swkv_teach.plots import (
    STATE_COLORS,
    plot_attention_band,
    plot_comparison,
    plot_memory,
    plot_slots,
    plot_step,
    plot_timeline,
    plot_token_stream,
)
from swkv_teach.trace import memory_over_steps, parse_access_pattern, record

matplotlib.use("Agg")
COLOR_STATE = {to_hex(v): k for k, v in STATE_COLORS.items()}
W, STEPS, SINKS = 4, 14, 2


def feed(policy: str, steps: int, window_size: int = W, reads=None):
    """Our own cache, fed one token per step (key = position), with LRU reads after each write."""
    cache = make_cache(policy, window_size, num_sinks=SINKS)
    held = []
    for t in range(steps):
        x = torch.full((1, 1, 1, 1), float(t))
        cache.update(x, x)
        for i in (reads or {}).get(t, ()):
            cache.get(i)
        if isinstance(cache, LRUKVCache):
            held.append(set(cache.ids()))
        elif policy in ("ring", "sinks"):
            held.append(set(cache.stored_positions().tolist()))
        else:
            held.append(set(range(cache.seen - len(cache), cache.seen)))
    return cache, held


def drawn_states(fig, prefix: str, n: int) -> dict[int, str]:
    """State of each drawn cell, read back from its face colour."""
    patches = {p.get_gid(): p for ax in fig.get_axes() for p in ax.patches if p.get_gid()}
    return {i: COLOR_STATE[to_hex(patches[f"{prefix}-{i}"].get_facecolor())] for i in range(n)}


@pytest.mark.parametrize("policy", ["sliding", "ring", "sinks", "lru"])
@pytest.mark.parametrize("step", [W - 2, W - 1, W, W + 1, STEPS - 1])
def test_token_stream_marks_exactly_what_the_cache_holds(policy, step):
    reads = {t: (0,) for t in range(STEPS)} if policy == "lru" else None
    _, held = feed(policy, step + 1, reads=reads)
    fig = plot_token_stream(record(policy, W, STEPS, num_sinks=SINKS, access_pattern=reads), step)
    states = drawn_states(fig, "token", STEPS)
    assert {p for p, s in states.items() if s in ("cached", "sink")} == held[step]
    assert {p for p, s in states.items() if s == "unseen"} == set(range(step + 1, STEPS))
    assert {p for p, s in states.items() if s == "evicted"} == set(range(step + 1)) - held[step]
    assert {p for p, s in states.items() if s == "sink"} == ({0, 1} if policy == "sinks" else set())


def test_lru_reads_keep_token_zero_that_the_window_evicts():
    fig = plot_token_stream(record("lru", W, STEPS, access_pattern="0"), STEPS - 1)
    assert drawn_states(fig, "token", STEPS)[0] == "cached"
    assert any(line.get_gid() == "read-0" for line in fig.axes[0].lines), "the promoted read is not marked"
    fig = plot_token_stream(record("sliding", W, STEPS), STEPS - 1)
    assert drawn_states(fig, "token", STEPS)[0] == "evicted"


@pytest.mark.parametrize("policy", ["ring", "sinks"])
def test_slots_show_what_each_ring_slot_holds_and_where_the_next_token_goes(policy):
    step = 9
    cache, _ = feed(policy, step + 1)
    fig = plot_slots(record(policy, W, STEPS, num_sinks=SINKS), step)
    labels = {t.get_text() for t in fig.axes[0].texts}
    slot_positions = cache.positions.tolist()  # one-token update: filled slots in slot order
    for s, p in enumerate(slot_positions):
        assert f"t{p}" in labels and f"age {step - p}" in labels
    assert len([p for p in fig.axes[0].patches if (p.get_gid() or "").startswith("slot-")]) == cache.capacity
    # the write pointer: after one more token, exactly the slot it points at has changed
    arrow = [a for a in fig.axes[0].texts if a.get_text() == "next write"][0]
    x = torch.full((1, 1, 1, 1), float(step + 1))
    cache.update(x, x)
    changed = [s for s, (a, b) in enumerate(zip(slot_positions, cache.positions.tolist())) if a != b]
    assert changed == [round(arrow.xy[0])]


# The bands drawn, written out by hand (issue 24: comparing with sliding_window_mask / window_mask, which the plot
# itself calls, passed with the window rule broken). Row i = query i, column j = key j; W = 4: i - 4 < j <= i.
BAND_W4 = [
    "1.............",
    "11............",
    "111...........",
    "1111..........",
    ".1111.........",
    "..1111........",
    "...1111.......",
    "....1111......",
    ".....1111.....",
    "......1111....",
    ".......1111...",
    "........1111..",
    ".........1111.",
    "..........1111",
]
# and with 2 sinks: columns 0 and 1 stay open to every later query
BAND_W4_SINKS2 = [
    "1.............",
    "11............",
    "111...........",
    "1111..........",
    "11111.........",
    "111111........",
    "11.1111.......",
    "11..1111......",
    "11...1111.....",
    "11....1111....",
    "11.....1111...",
    "11......1111..",
    "11.......1111.",
    "11........1111",
]


def band(rows):
    assert len(rows) == STEPS and all(len(r) == STEPS for r in rows)
    return torch.tensor([[c == "1" for c in r] for r in rows])


def test_band_is_the_hand_worked_band_with_the_current_row_and_held_keys():
    step = 7
    fig = plot_attention_band(record("ring", W, STEPS), step)
    ax = fig.axes[0]
    image = [im for im in ax.images if im.get_gid() == "mask"][0]
    assert torch.equal(torch.as_tensor(image.get_array() > 0), band(BAND_W4))
    row = [p for p in ax.patches if p.get_gid() == "query-row"][0]
    assert row.get_y() == pytest.approx(step - 0.5)
    held = [line for line in ax.lines if line.get_gid() == "held"][0]
    assert set(held.get_xdata()) == set(range(step - W + 1, step + 1))


def test_band_with_sinks_opens_the_sink_columns_by_hand_and_flags_lru_keys_outside_the_window():
    fig = plot_attention_band(record("sinks", W, STEPS, num_sinks=SINKS), 10)
    grid = [im for im in fig.axes[0].images if im.get_gid() == "mask"][0].get_array()
    assert torch.equal(torch.as_tensor(grid > 0), band(BAND_W4_SINKS2))
    fig = plot_attention_band(record("lru", W, STEPS, access_pattern="0"), 10)
    outside = [line for line in fig.axes[0].lines if line.get_gid() == "held-outside"][0]
    assert list(outside.get_xdata()) == [0]


@pytest.mark.parametrize("window_size", [3, 5])
def test_memory_curves_match_real_caches_nbytes(window_size):
    layers, heads, head_dim, steps = 2, 3, 4, 9
    mem = memory_over_steps(steps, window_size, layers, heads, head_dim, torch.float16)
    windowed = [SlidingWindowKVCache(window_size) for _ in range(layers)]
    unbounded = [SlidingWindowKVCache(steps) for _ in range(layers)]  # W >= stream: never evicts
    for t in range(steps):
        x = torch.zeros(1, heads, 1, head_dim, dtype=torch.float16)
        for c in windowed + unbounded:
            c.update(x, x)
        assert mem["window_bytes"][t] == sum(c.nbytes for c in windowed)
        assert mem["unbounded_bytes"][t] == sum(c.nbytes for c in unbounded)
    fig = plot_memory(steps, window_size, layers, heads, head_dim, torch.float16)
    lines = {line.get_gid(): line for line in fig.axes[0].lines}
    assert list(lines["window"].get_ydata()) == [min(n, window_size) for n in range(1, steps + 1)]
    assert list(lines["unbounded"].get_ydata()) == list(range(1, steps + 1))


def test_memory_of_a_7b_class_shape_is_128_kib_per_token_and_flat_after_the_window():
    mem = memory_over_steps(8192, 4096)
    assert mem["bytes_per_token"] == 128 * 1024
    assert mem["window_bytes"][4095] == mem["window_bytes"][-1] == 512 * 2**20
    assert mem["unbounded_bytes"][-1] == 2 * mem["window_bytes"][-1]


def test_timeline_and_comparison_outline_where_lru_with_reads_leaves_the_window():
    lru = record("lru", W, STEPS, access_pattern="0")
    sliding = record("sliding", W, STEPS)
    fig = plot_timeline(lru)
    grid = fig.axes[0].images[0].get_array()
    for t in range(STEPS):
        cached_drawn = {p for p in range(STEPS) if grid[t, p] in (0, 1)}
        assert cached_drawn == set(feed("lru", t + 1, reads={s: (0,) for s in range(t + 1)})[1][t])
    outlined = lambda f: sum(1 for ax in f.get_axes() for p in ax.patches if p.get_edgecolor()[0] > 0.8)  # noqa: E731
    assert outlined(plot_comparison([sliding, record("lru", W, STEPS)])) == 0
    assert outlined(plot_comparison([sliding, lru])) > 0


def test_figures_have_titles_labels_and_stay_out_of_pyplot():
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    trace = record("sinks", W, STEPS, num_sinks=SINKS)
    for fig in (plot_token_stream(trace, 5), plot_slots(trace, 5), plot_attention_band(trace, 5),
                plot_memory(100, 10), plot_timeline(trace)):
        ax = fig.axes[0]
        assert ax.get_title() and ax.get_xlabel()
        assert fig.legends or ax.get_legend(), "colours mean something: a legend is needed"
        assert fig.dpi <= 100
    assert len(plot_step(trace, 5).axes) == 3
    assert plt.get_fignums() == before


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: record("fifo", 4, 8), ValueError, "policy"),
        (lambda: record("ring", 0, 8), ValueError, "window_size"),
        (lambda: record("ring", 4, 8.0), TypeError, "steps"),
        (lambda: record("ring", 4, 8, access_pattern="0"), ValueError, "access_pattern"),
        (lambda: parse_access_pattern({3: 5}, 8), ValueError, "reads token 5"),
        (lambda: parse_access_pattern([0] * 9, 8), ValueError, "at most steps=8"),
        (lambda: parse_access_pattern("0, a", 8), ValueError, "'a'"),
        (lambda: parse_access_pattern(3.5, 8), TypeError, "float"),
        (lambda: plot_token_stream(record("ring", 4, 8), 8), ValueError, "step must be an int in [0, 7]"),
        (lambda: plot_slots("trace", 1), TypeError, "Trace"),
        (lambda: memory_over_steps(10, 4, dtype="fp16"), TypeError, "dtype"),
    ],
)
def test_bad_arguments_name_the_argument_and_what_came(call, error, words):
    with pytest.raises(error, match=None) as info:
        call()
    assert words in str(info.value)
