"""The speculative-decoding bench (swkv_teach.bench.speculative): its formula by hand, its rows by a quick run.

Speed is measured there, never judged here: the quick run checks what the rows say, not how fast.
"""

from __future__ import annotations

import pytest

from swkv_teach.bench.speculative import expected_speedup, format_rows, speculative_rows


@pytest.mark.parametrize("alpha,k,c,want", [
    (0.5, 2, 0.0, 1.75),  # (1 - 1/8) / (1/2): 1.75 tokens per round, drafting free
    (0.5, 2, 0.5, 0.875),  # the same rounds, each costing 1 + 0.5 * 2 target steps
    (0.8, 4, 0.1, (1 - 0.8**5) / 0.2 / 1.4),
    (1.0, 4, 0.25, 2.5),  # every draft accepted: k + 1 tokens per round of cost 2
    (0.0, 8, 0.0, 1.0),  # nothing accepted: one token per round
])
def test_expected_speedup_is_leviathan_et_al_theorem_3_8(alpha, k, c, want):
    assert expected_speedup(alpha, k, c) == pytest.approx(want)


def test_a_quick_run_gives_a_row_per_drafter_and_k_with_plain_tokens():
    rows = speculative_rows(ks=(2,), new_tokens=12, repeats=1)
    assert [(r["workload"], r["k"]) for r in rows] == [("code", 0), ("code", 2), ("code", 2),
                                                       ("quoted passage", 0), ("quoted passage", 2),
                                                       ("quoted passage", 2)]
    assert all(r["same_tokens"] for r in rows)
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["verify_cost"] > 0
        if r["k"]:
            assert 0 <= r["alpha"] <= 1 and r["expected"] == pytest.approx(expected_speedup(r["alpha"], 2, r["c"]))
            assert r["rounds"] < 12
    assert "prompt lookup" in format_rows(rows)
