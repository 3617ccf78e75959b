"""Each probe a check makes has a wrong answer that only it catches (tests/wrong_answers/probes.py).

Regression (issue 24): the LRU check's max_size=-1 probe could be deleted and every
test still passed, because every catalogued answer that failed it also failed the
max_size=0 probe. The answers here are right except on one probe each.
"""

from __future__ import annotations

import pytest

from swkv_teach import grading
from swkv_teach.grading import ExerciseFailed
from tests.wrong_answers import CATALOGUE
from tests.wrong_answers import probes

ONLY_ONE_PROBE = [w for w in CATALOGUE if w.__module__ == probes.__name__]


def test_there_is_an_answer_for_each_probe_named_in_issue_24():
    assert {w.__name__ for w in ONLY_ONE_PROBE} >= {"RefusesOnlyZero", "RefusesOnlyNegative"}
    assert len({w.words[0] for w in ONLY_ONE_PROBE}) == len(ONLY_ONE_PROBE), "one answer per probe"


@pytest.mark.parametrize("answer", ONLY_ONE_PROBE, ids=lambda w: w.__name__)
def test_an_answer_wrong_on_one_probe_only_is_rejected_naming_it(answer, capsys):
    with pytest.raises(ExerciseFailed) as info:
        getattr(grading, answer.check)(answer)
    message = str(info.value).lower()
    assert all(w.lower() in message for w in answer.words), info.value
    if not any("shared" in w for w in answer.words):
        assert "state is shared" not in message, info.value
    assert "✅" not in capsys.readouterr().out


@pytest.mark.parametrize("answer", [probes.RefusesOnlyZero, probes.RefusesOnlyNegative], ids=lambda w: w.__name__)
def test_the_size_refusers_are_right_apart_from_that_probe(answer):
    """Right on sizes 1..8 (the LRU scenarios' sizes): only the probe's refusal differs."""
    from swkv_teach.caches.lru import LRUKVCache

    for size in (1, 2, 3, 5, 8):
        mine, ref = answer(size), LRUKVCache(size)
        for i, op in enumerate([0, 1, 2, 0, 3, 4, 1, 0, 5, 2, 6, 0] * 2):
            if i % 3 == 2:
                assert mine.get(op) == ref.get(op), (size, i)
            else:
                mine.put(op, f"k{op}", f"v{op}")
                ref.put(op, f"k{op}", f"v{op}")
