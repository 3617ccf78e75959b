"""The speculative-decoding bench (swkv_teach.bench.speculative): its formula by hand, its workloads, its rows by a
quick run, its target fed fabricated rows.

Speed is measured there, never judged here: the quick run checks what the rows say (their shape, that every
figure follows from the counts it reports, that every run emitted plain decoding's tokens), not how fast.
"""

from __future__ import annotations

import statistics

import pytest

from swkv_teach.bench.goals import REPETITIVE, TARGETS
from swkv_teach.bench.report import targets
from swkv_teach.bench.speculative import (
    FRESH,
    LOOKUP,
    PLAIN,
    QUOTE,
    expected_speedup,
    section,
    speculative_rows,
    table,
    target_values,
    workloads,
)
from swkv_teach.evaluate import heldout_segments
from swkv_teach.pretrained import load_pretrained


# --------------------------------------------------------------------------- the formula by hand
@pytest.mark.parametrize("alpha,k,c,want", [
    (0.5, 2, 0.0, 1.75),  # (1 - 1/8) / (1/2): 1.75 tokens per round, drafting free
    (0.5, 2, 0.5, 0.875),  # the same rounds, each costing 1 + 0.5 * 2 target steps
    (0.8, 4, 0.1, (1 - 0.8**5) / 0.2 / 1.4),
    (1.0, 4, 0.25, 2.5),  # every draft accepted: k + 1 tokens per round of cost 2
    (0.0, 8, 0.0, 1.0),  # nothing accepted: one token per round
])
def test_expected_speedup_is_leviathan_et_al_theorem_3_8(alpha, k, c, want):
    assert expected_speedup(alpha, k, c) == pytest.approx(want)


def test_a_measured_verify_cost_takes_the_place_of_the_theorems_one_step():
    assert expected_speedup(0.5, 2, 0.0, verify_cost=1.25) == pytest.approx(1.75 / 1.25)
    assert expected_speedup(0.5, 2, 0.5, verify_cost=1.5) == pytest.approx(1.75 / 2.5)


# --------------------------------------------------------------------------- the workloads (lesson 13's too)
def test_the_workloads_are_held_out_prompts_as_they_are_and_each_quoted_back_from_its_own_beginning():
    _, tok = load_pretrained()
    w = workloads(tok, prompts=5, length=40, quote=12)
    fresh, quoted = w[FRESH], w[REPETITIVE]
    pieces = heldout_segments(tok, length=40, max_segments=5)
    assert fresh == [row[:40].tolist() for row in pieces] and len({tuple(p) for p in fresh}) == 5
    quote = tok.encode(QUOTE)
    for p, q in zip(fresh, quoted):
        assert q == p + quote + p[:12]


def test_fewer_than_two_prompts_is_refused_by_name():
    with pytest.raises(ValueError, match=r"prompts must be >= 2.*got 1"):
        speculative_rows(prompts=1)


# --------------------------------------------------------------------------- a quick run: shape and honesty
@pytest.fixture(scope="module")
def quick():
    return section(quick=True)


def test_a_quick_run_gives_a_plain_row_then_one_per_drafter_and_k(quick):
    rows = quick["rows"]
    ks = quick["config"]["ks"]
    assert [(r["workload"], r["k"]) for r in rows] == [
        (w, k) for w in (FRESH, REPETITIVE) for k in [0, *ks, *ks]]
    assert {r["drafter"] for r in rows if r["k"]} == {LOOKUP, "early exit (1 of 3 layers)"}
    assert all(r["drafter"] == PLAIN and r["speedup"] == 1.0 and r["alpha"] is None for r in rows if not r["k"])


def test_every_speculative_run_emits_plain_decodings_tokens(quick):
    assert all(r["same_tokens"] for r in quick["rows"])


def test_every_figure_of_a_row_follows_from_what_it_counts(quick):
    """α from the counts, inside its interval; the formulas from α, k, c and the verify cost; tokens per round
    from the rounds; tokens/s from its samples, one per prompt. Timings are positive, never compared with anything."""
    cfg = quick["config"]
    for r in quick["rows"]:
        tps = r["tokens_per_s"]
        assert len(tps["samples"]) == cfg["prompts"] and tps["median"] == statistics.median(tps["samples"]) > 0
        assert r["speedup"] > 0
        if not r["k"]:
            continue
        lo, hi = r["speedup_interval"]
        assert 0 < lo <= r["speedup"] <= hi
        assert 0 < r["examined"] <= r["drafted"] and r["accepted"] <= r["examined"]
        assert r["alpha"] == r["accepted"] / r["examined"]
        if r["alpha_interval"] is not None:
            lo, hi = r["alpha_interval"]
            assert 0 <= lo <= r["alpha"] <= hi <= 1
        assert r["expected"] == pytest.approx(expected_speedup(r["alpha"], r["k"], r["c"]))
        with_verify = expected_speedup(r["alpha"], r["k"], r["c"], r["verify_cost"])
        assert r["expected_with_verify"] == pytest.approx(with_verify)
        assert r["c"] > 0 and r["verify_cost"] > 0
        assert r["rounds"] < cfg["prompts"] * (cfg["new_tokens"] - 1) or r["accepted"] == 0
        assert r["tokens_per_round"] == cfg["prompts"] * cfg["new_tokens"] / r["rounds"]


def test_the_quick_table_shows_every_row_and_judges_only_the_tokens(quick):
    text = table(quick, judged=False)
    assert text.count("\n" + FRESH + " ") == 1 + 2 * len(quick["config"]["ks"])
    assert "speculative_same_tokens: 1.000 (target >= 1: met)" in text
    assert "speculative_lookup_repetitive" in text and "reported, not judged" in text and "NOT MET" not in text


# --------------------------------------------------------------------------- the target, fed fabricated rows
# the update rows every report needs (its other targets read them); the speculative targets never do
UPDATES = [{"window": 64, "cache": cache, "us": {"median": us}, "bytes_per_step": 0, "bytes_held": 100,
            "bytes_formula": 100} for cache, us in (("floor", 1.0), ("ring", 1.2))]


def _row(workload, drafter, k, speedup, same=True):
    return {"workload": workload, "drafter": drafter, "k": k, "speedup": speedup, "same_tokens": same}


def test_the_target_takes_the_best_k_of_prompt_lookup_on_the_repetitive_workload_only():
    """1.29 at best on the quoted-back prompts with prompt lookup: missed, however fast the other rows (2.0 on fresh
    code, 1.9 with early exit on the quoted-back prompts themselves) and the plain row (1.0) are."""
    rows = [_row(REPETITIVE, PLAIN, 0, 1.0), _row(REPETITIVE, LOOKUP, 2, 1.29), _row(REPETITIVE, LOOKUP, 4, 1.1),
            _row(REPETITIVE, "early exit (1 of 3 layers)", 2, 1.9), _row(FRESH, LOOKUP, 2, 2.0)]
    assert target_values(rows)["speculative_lookup_repetitive"] == 1.29
    t = targets(UPDATES, [], judged=True, speculative={"rows": rows})
    assert t["speculative_lookup_repetitive"]["value"] == 1.29 and t["speculative_lookup_repetitive"]["met"] is False
    met = targets(UPDATES, [], judged=True, speculative={"rows": [*rows, _row(REPETITIVE, LOOKUP, 8, 1.31)]})
    assert met["speculative_lookup_repetitive"]["value"] == 1.31 and met["speculative_lookup_repetitive"]["met"] is True
    quick = targets(UPDATES, [], judged=False, speculative={"rows": rows})
    lookup = quick["speculative_lookup_repetitive"]
    assert lookup["met"] is None and lookup["value"] == 1.29


def test_one_run_with_other_tokens_misses_the_tokens_target_in_any_run():
    rows = [_row(FRESH, PLAIN, 0, 1.0), _row(FRESH, LOOKUP, 2, 1.5), _row(FRESH, LOOKUP, 4, 1.5, same=False)]
    t = targets(UPDATES, [], judged=False, speculative={"rows": rows})["speculative_same_tokens"]
    assert t["value"] == 0.0 and t["met"] is False
    none = targets(UPDATES, [], judged=True)  # no section: not measured, so judged neither way
    assert none["speculative_same_tokens"]["met"] is None and none["speculative_lookup_repetitive"]["value"] is None
    assert "not measured" in table({"config": {"new_tokens": 1, "prompts": 2, "threads": 1}, "rows": []})


def test_the_table_says_not_met_with_the_measured_figure():
    rows = [{**_row(REPETITIVE, LOOKUP, 2, 1.298), "tokens_per_s": {"median": 500.0}, "alpha": 0.4,
             "alpha_interval": (0.3, 0.5), "speedup_interval": (1.2, 1.4), "expected": 1.5,
             "expected_with_verify": 1.3, "c": 0.02, "verify_cost": 1.2, "tokens_per_round": 1.6}]
    text = table({"config": {"new_tokens": 96, "prompts": 8, "threads": 1}, "rows": rows}, judged=True)
    assert "speculative_lookup_repetitive: 1.298 (target >= 1.3: NOT MET)" in text
    assert TARGETS["speculative_lookup_repetitive"][1:3] == (">=", 1.3)
