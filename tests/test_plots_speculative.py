"""record_round and plot_ring_round: lesson 13's picture of a verify and a rollback on a ring.

The expectations are worked by hand from the ring's rule (token p in slot p mod (W + k)) and the
window convention (query i sees i - W < j <= i); record_round reads them from a real cache's keys.
"""

from __future__ import annotations

import matplotlib
import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from swkv_teach.plots_speculative import RING_COLORS, RingState, plot_ring_round, record_round

matplotlib.use("Agg")


def test_a_verify_writes_the_slots_of_the_oldest_tokens_and_a_rollback_moves_only_the_count():
    """W = 6, k = 3: 9 slots. 14 seen: slots hold p9..p13 in 0..4 and p5..p8 in 5..8; the verify of p14..p17
    writes slots 5..8 (p5..p8, outside every verified query's window); rollback(2) leaves every slot as it was."""
    before, verified, rolled = record_round(6, 3, 14, drafts=3, accepted=1)
    assert before.slots == (9, 10, 11, 12, 13, 5, 6, 7, 8) and before.seen == 14
    assert verified.slots == (9, 10, 11, 12, 13, 14, 15, 16, 17) and verified.written == (5, 6, 7, 8)
    assert rolled.slots == verified.slots and rolled.seen == 16 and rolled.refused is None
    assert rolled.stale == (7, 8)  # p16, p17 rejected: still there, outside query 16's window 11..16
    assert rolled.needed == (11, 12, 13, 14, 15) and rolled.lost == ()
    assert rolled.next_slot == 7  # p16's successor goes where the rejected p16 was


def test_without_lookahead_a_rejected_token_overwrites_a_key_the_next_query_needs():
    """W = 6 slots: the verify writes p14..p17 into slots 2..5, and p17 lands on p11 (slot 5), which query 16
    (one draft kept, two rejected) still needs: the ring refuses rollback(2), and the state says which key is gone."""
    before, verified, refused = record_round(6, 0, 14, drafts=3, accepted=1)
    assert before.slots == (12, 13, 8, 9, 10, 11)
    assert verified.slots == (12, 13, 14, 15, 16, 17) and verified.written == (2, 3, 4, 5)
    assert refused.refused is not None and "rollback" in refused.refused
    assert refused.seen == 16 and refused.lost == (11,)
    assert refused.kind(5) == "clobbered" and refused.kind(4) == "stale"  # p16 overwrote p10: not needed


@pytest.mark.parametrize("W, k", [(4, 2), (5, 3), (6, 3), (7, 1)])
@pytest.mark.parametrize("accepted", [0, 1])
def test_with_lookahead_k_no_rollback_of_a_k_draft_verify_loses_a_key(W, k, accepted):
    """The rule the lookahead exists for, across the wrap (seen from W - 1 to 3 (W + k)): nothing needed is lost."""
    for seen in range(W - 1, 3 * (W + k)):
        last = record_round(W, k, seen, drafts=k, accepted=accepted)[-1]
        assert last.refused is None and last.lost == (), (seen, last)


def test_each_slot_is_coloured_by_what_the_next_query_needs():
    states = record_round(6, 0, 14, drafts=3, accepted=1)
    fig = plot_ring_round(states)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    boxes = {p.get_gid(): p for p in ax.patches if p.get_gid()}
    assert len(boxes) == 3 * 6
    expected = {  # row 0: query 14 sees 9..14 (p8 outside); row 2: query 16 needs 11..15, p17 overwrote p11
        (0, 2): "outside", (0, 3): "window", (1, 0): "outside", (1, 5): "window",
        (2, 0): "window", (2, 4): "stale", (2, 5): "clobbered",
    }
    for (row, slot), kind in expected.items():
        assert to_hex(boxes[f"row{row}-slot{slot}"].get_facecolor()) == RING_COLORS[kind].lower(), (row, slot)
    thick = sorted(int(g.split("slot")[1]) for g, p in boxes.items() if g.startswith("row1-") and p.get_linewidth() > 2)
    assert thick == [2, 3, 4, 5]  # the slots the verify wrote
    texts = [t.get_text() for t in ax.texts]
    assert "p17" in texts and any("p17 overwrote p11" in t for t in texts)
    (arrow,) = [ln for ln in ax.get_lines() if ln.get_gid() == "row2-next"]
    assert list(arrow.get_xdata()) == [4]  # the write pointer after the (asked-for) rollback: 16 mod 6


def test_figures_stay_out_of_pyplot_and_bad_input_is_named():
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    plot_ring_round(record_round(4, 2, 9, drafts=2, accepted=2), title="t")
    assert plt.get_fignums() == before
    with pytest.raises(ValueError, match="accepted must be at most drafts=2"):
        record_round(4, 2, 9, drafts=2, accepted=3)
    with pytest.raises(ValueError, match="seen must be at least 1"):
        record_round(4, 2, 0, drafts=1, accepted=0)
    with pytest.raises(TypeError, match="window must be a positive int"):
        record_round(4.0, 2, 9, drafts=1, accepted=0)
    with pytest.raises(ValueError, match="states must be a non-empty list of RingState"):
        plot_ring_round([])
    a = RingState("a", 4, 0, (0, 1, 2, 3), 4)
    b = RingState("b", 4, 1, (0, 1, 2, 3, 4), 5)
    with pytest.raises(ValueError, match="one ring"):
        plot_ring_round([a, b])
