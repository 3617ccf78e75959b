"""The graders are fair and sharp: right answers, however written, pass; each wrong answer in the
catalogue (tests/wrong_answers/) is rejected with a message that points at its bug; nothing a learner
returns or raises makes a grader crash."""

from __future__ import annotations

import ast
import time
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

import swkv_teach
from swkv_teach import grading
from swkv_teach.grading import ExerciseFailed
from tests.wrong_answers import load

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = load()
HAS_ACCELERATOR = swkv_teach.device().type != "cpu"


def check(name):
    return getattr(grading, name)


def passes(fn, answer, capsys):
    fn(answer)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("✅"), out


# ------------------------------------------------------------------ the catalogue
def test_catalogue_is_large_and_covers_every_exercise():
    per = {}
    for w in CATALOGUE:
        per[w.check] = per.get(w.check, 0) + 1
    assert len(CATALOGUE) >= 30, len(CATALOGUE)
    assert set(per) == {e.check for e in grading.EXERCISES.values()}, per
    assert all(w.__doc__ and w.__doc__.strip() for w in CATALOGUE), "every wrong answer names its bug"


@pytest.mark.parametrize("answer", CATALOGUE, ids=lambda w: f"{w.check[6:]}-{w.__name__}")
def test_each_wrong_answer_is_rejected_with_a_message_that_names_its_bug(answer, capsys):
    if answer.needs_accelerator and not HAS_ACCELERATOR:
        pytest.skip("this bug (a buffer on the CPU) only shows on a GPU/MPS device")
    with pytest.raises(ExerciseFailed) as info:
        check(answer.check)(answer)
    message = str(info.value).lower()
    missing = [w for w in answer.words if w.lower() not in message]
    assert not missing, f"{answer.__name__}: {answer.__doc__.strip()}\nmessage lacks {missing}:\n{info.value}"
    assert "✅" not in capsys.readouterr().out


# ------------------------------------------------------------------ right answers, written differently
class SeedReference:
    """The problem statement's reference solution, verbatim."""

    def __init__(self, window_size: int):
        self.window_size = window_size
        self.k = None
        self.v = None

    def update(self, k_new, v_new):
        if self.k is None:
            self.k, self.v = k_new, v_new
        else:
            self.k = torch.cat([self.k, k_new], dim=2)
            self.v = torch.cat([self.v, v_new], dim=2)
        if self.k.shape[2] > self.window_size:
            self.k = self.k[:, :, -self.window_size :, :]
            self.v = self.v[:, :, -self.window_size :, :]
        return self.k, self.v


class TokenListRestacked:
    """A list of one-token tensors, re-stacked with torch.cat at every step."""

    def __init__(self, window_size):
        self.window_size, self.ks, self.vs = window_size, [], []

    def update(self, k_new, v_new):
        self.ks.append(k_new)
        self.vs.append(v_new)
        self.ks, self.vs = self.ks[-self.window_size :], self.vs[-self.window_size :]
        return torch.cat(self.ks, dim=-2), torch.cat(self.vs, dim=-2)


class NarrowContiguousCopies:
    """narrow() instead of slicing, and contiguous copies returned."""

    def __init__(self, window_size):
        self.window_size, self.k, self.v = window_size, None, None

    def update(self, k_new, v_new):
        self.k = k_new.clone() if self.k is None else torch.cat((self.k, k_new), 2)
        self.v = v_new.clone() if self.v is None else torch.cat((self.v, v_new), 2)
        n = self.k.size(2)
        if n > self.window_size:
            self.k = self.k.narrow(2, n - self.window_size, self.window_size)
            self.v = self.v.narrow(2, n - self.window_size, self.window_size)
        return self.k.contiguous().clone(), self.v.contiguous().clone()


@pytest.mark.parametrize("answer", [SeedReference, TokenListRestacked, NarrowContiguousCopies,
                                    swkv_teach.SlidingWindowKVCache])
def test_sliding_window_cache_accepts_right_answers(answer, capsys):
    passes(grading.check_sliding_window_cache, answer, capsys)


def mask_with_tril(seq_len, window_size):
    ones = torch.ones(seq_len, seq_len, dtype=torch.bool)
    return torch.tril(ones) & torch.triu(ones, diagonal=-(window_size - 1))


def mask_from_loops(seq_len, window_size):
    m = torch.zeros(seq_len, seq_len, dtype=torch.bool)
    for i in range(seq_len):
        for j in range(max(0, i - window_size + 1), i + 1):
            m[i, j] = True
    return m


@pytest.mark.parametrize("answer", [mask_with_tril, mask_from_loops, swkv_teach.sliding_window_mask])
def test_mask_accepts_right_answers(answer, capsys):
    passes(grading.check_sliding_window_mask, answer, capsys)


class RingWithCopyInto:
    """A ring using copy_ into narrow() views, positions computed in Python."""

    def __init__(self, window_size):
        self.W, self.kb, self.vb, self.n = window_size, None, None, 0

    def update(self, k_new, v_new):
        if self.kb is None:
            shape = (*k_new.shape[:2], self.W, k_new.shape[3])
            self.kb = torch.empty(shape, dtype=k_new.dtype, device=k_new.device)
            self.vb = torch.empty_like(self.kb)
        s = self.n % self.W
        self.kb.narrow(2, s, 1).copy_(k_new)
        self.vb.narrow(2, s, 1).copy_(v_new)
        self.n += 1
        m = min(self.n, self.W)
        return self.kb.narrow(2, 0, m), self.vb.narrow(2, 0, m)

    @property
    def positions(self):
        return torch.tensor([max(p for p in range(self.n) if p % self.W == s) for s in range(min(self.n, self.W))])

    def ordered(self):
        pos = self.positions.tolist()
        order = sorted(range(len(pos)), key=pos.__getitem__)
        idx = torch.tensor(order, device=self.kb.device)
        return self.kb.index_select(2, idx), self.vb.index_select(2, idx)


@pytest.mark.parametrize("answer", [RingWithCopyInto, swkv_teach.RingBufferKVCache])
def test_ring_accepts_right_answers(answer, capsys):
    passes(grading.check_ring_buffer_cache, answer, capsys)


class PlainDictLRU:
    """A plain dict (insertion-ordered): pop and re-insert to promote."""

    def __init__(self, max_size):
        if max_size <= 0:
            raise ValueError("max_size must be positive")
        self.max_size, self.d = max_size, {}

    def put(self, token_id, key, value):
        self.d.pop(token_id, None)
        self.d[token_id] = [key, value]  # a list pair is fine
        if len(self.d) > self.max_size:
            del self.d[next(iter(self.d))]

    def get(self, token_id):
        if token_id not in self.d:
            return None
        self.d[token_id] = self.d.pop(token_id)
        return self.d[token_id]


class SeedLRU:
    """The blog's OrderedDict LRU, verbatim API."""

    def __init__(self, max_size):
        if max_size <= 0:
            raise ValueError("max_size must be a positive integer")
        self.max_size, self.cache = max_size, OrderedDict()

    def put(self, token_id, key, value):
        if token_id in self.cache:
            self.cache.move_to_end(token_id)
        self.cache[token_id] = (key, value)
        while len(self.cache) > self.max_size:
            self.cache.popitem(last=False)

    def get(self, token_id):
        if token_id not in self.cache:
            return None
        self.cache.move_to_end(token_id)
        return self.cache[token_id]


@pytest.mark.parametrize("answer", [PlainDictLRU, SeedLRU, swkv_teach.LRUKVCache])
def test_lru_accepts_right_answers(answer, capsys):
    passes(grading.check_lru_cache, answer, capsys)


@pytest.mark.parametrize("answer", [swkv_teach.SinkKVCache])
def test_sinks_accept_slot_order_as_well_as_chronological(answer, capsys):
    """The library returns slot order; the solution notebook returns chronological order: both pass."""
    passes(grading.check_sink_cache, answer, capsys)


def decode_with_block_forward(model, input_ids, caches):
    """Uses each Block's own forward with the cache (a right answer from the parts one level up)."""
    start = caches[0].seen
    pos = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        x = layer(x, pos, cache)
    return model.lm_head(model.norm(x))


def test_decode_accepts_a_right_answer(capsys):
    passes(grading.check_cached_decode, decode_with_block_forward, capsys)


# ------------------------------------------------------------------ the grader never crashes
class Returns:
    """Answers of the wrong kind: None, one tensor, three items, strings, a raise."""

    def __init__(self, *args):
        pass

    positions = property(lambda self: "nope")

    def ordered(self):
        return None


def garbage_answers():
    def make(ret):
        return type("Garbage", (Returns,), {"update": lambda self, k, v: ret(k, v), "put": lambda self, *a: None,
                                            "get": lambda self, i: ret(None, None)})

    rets = [lambda k, v: None, lambda k, v: k, lambda k, v: (k, v, k), lambda k, v: "kv", lambda k, v: ([1], [2]),
            lambda k, v: (k[0], v[0]), lambda k, v: 1 / 0, lambda k, v: (k, v)]
    return [make(r) for r in rets] + [42, None, "SlidingWindowKVCache", lambda *a: None, lambda *a: 1 / 0]


@pytest.mark.parametrize("name", [e.check for e in grading.EXERCISES.values()])
def test_no_learner_answer_crashes_a_grader(name):
    for answer in garbage_answers():
        with pytest.raises(ExerciseFailed) as info:
            check(name)(answer)
        assert str(info.value).startswith("❌")


def test_not_implemented_is_reported_kindly():
    class Stub:
        def __init__(self, window_size):
            raise NotImplementedError("exercise 01: replace these two lines with your code")

    with pytest.raises(ExerciseFailed, match="not implemented yet"):
        grading.check_sliding_window_cache(Stub)


def test_failures_show_expected_and_got_for_the_first_failing_case():
    from tests.wrong_answers.sliding import NoEviction

    with pytest.raises(ExerciseFailed) as info:
        grading.check_sliding_window_cache(NoEviction)
    msg = str(info.value)
    assert "window_size=3" in msg and "step 4" in msg
    assert "expected: [1, 2, 3]" in msg and "got     : [0, 1, 2, 3]" in msg


def test_exercise_failed_is_an_assertion_error():
    assert issubclass(ExerciseFailed, AssertionError)


@pytest.mark.parametrize("name,answer", [
    ("check_sliding_window_cache", swkv_teach.SlidingWindowKVCache),
    ("check_ring_buffer_cache", swkv_teach.RingBufferKVCache),
    ("check_sink_cache", swkv_teach.SinkKVCache),
    ("check_lru_cache", swkv_teach.LRUKVCache),
    ("check_sliding_window_mask", swkv_teach.sliding_window_mask),
])
def test_each_check_is_fast(name, answer, capsys):
    t0 = time.perf_counter()
    check(name)(answer)
    assert time.perf_counter() - t0 < 2.0


def test_the_library_never_imports_grading():
    for path in (ROOT / "swkv_teach").rglob("*.py"):
        if "grading" in path.parts or path.name == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any("grading" in n for n in names), f"{path} imports grading"
