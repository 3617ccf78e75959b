"""The graders are fair and sharp: right answers, however written, pass; each wrong answer in the
catalogue (tests/wrong_answers/) is rejected with a message that points at its bug; nothing a learner
returns or raises makes a grader crash."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

import swkv_teach
from swkv_teach import grading
from swkv_teach.grading import ExerciseFailed
from tests.right_answers import load as load_right
from tests.wrong_answers import load

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = load()
RIGHT = load_right()
HAS_ACCELERATOR = swkv_teach.device().type != "cpu"
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


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
    assert len(CATALOGUE) >= 250, len(CATALOGUE)
    every = {e.check for e in grading.EXERCISES.values()} - ({"check_hf_cache_layer"} if not HAS_TRANSFORMERS else set())
    assert set(per) >= every, sorted(every - set(per))
    assert all(per[c] >= 10 for c in every), per
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
    if not any("shared" in w for w in answer.words):  # blamed on sharing only when that is the bug
        assert "state is shared" not in message, f"{answer.__name__} misdiagnosed as shared state:\n{info.value}"
    assert "✅" not in capsys.readouterr().out


# ------------------------------------------------------------------ right answers, written differently
@pytest.mark.parametrize("answer", RIGHT, ids=lambda r: f"{r.check[6:]}-{getattr(r, '__name__', r)}")
def test_each_right_answer_passes_whatever_its_style(answer, capsys):
    passes(check(answer.check), answer, capsys)


def test_right_answers_cover_every_exercise_in_several_styles():
    per = {}
    for r in RIGHT:
        per[r.check] = per.get(r.check, 0) + 1
    # the cache, mask, ring, decode, LRU and sink exercises (01-03, 05-07) take free-form answers, in any style
    assert set(per) >= {grading.EXERCISES[i].check for i in ("01", "02", "03", "05", "06", "07")}
    assert all(n >= 3 for n in per.values()), per


DECODE_NUMERIC_BUGS = ["decode_len_positions", "decode_ignores_window", "decode_without_cache",
                       "decode_positions_in_loop", "decode_tiles_kv_heads", "decode_rope_from_zero",
                       "decode_truncates_chunk", "decode_shares_attn_norm", "decode_drops_norm_weight",
                       "decode_skips_final_norm", "decode_mlp_without_residual", "decode_swaps_the_norms",
                       "decode_final_norm_twice", "decode_residual_from_the_normed_input"]


@pytest.mark.parametrize("name", DECODE_NUMERIC_BUGS)
def test_each_decode_bug_misses_by_at_least_ten_times_the_tolerance(name):
    """The graded decoder (random norm weights, sharp attention) makes every usual bug obvious, not marginal."""
    from swkv_teach.grading import decode as d
    from tests.wrong_answers import decode as bugs

    fn, worst = getattr(bugs, name), 0.0
    for W, chunks in d.SCENARIOS:
        model, ids = d.make_model(W, torch.device("cpu"))
        caches, start = model.new_caches("ring"), 0
        with torch.no_grad():
            expected = model(ids)
            for c in chunks:
                exp = expected[:, start : start + c]
                got = fn(model, ids[:, start : start + c], caches)
                tol = d.ATOL + d.RTOL * exp.abs().max()
                worst = max(worst, float(((got - exp).abs() / tol).max()))
                start += c
    assert worst >= 10, f"{name} misses by only {worst:.1f}x the tolerance"


def test_the_oracle_hidden_states_are_the_layers_inputs_and_change_nothing():
    from swkv_teach.grading import decode as d
    from swkv_teach.grading._decode_spy import Spy

    model, ids = d.make_model(3, torch.device("cpu"))
    with torch.no_grad():
        before = model(ids)
        hidden = Spy.oracle_hidden(model, ids)
        pos = torch.arange(ids.shape[1])
        x = model.embed(ids)
        for L, layer in enumerate(model.layers):
            assert torch.equal(hidden[L], x), L
            x = layer(x, pos)
        assert torch.equal(hidden["final"], x)
        assert torch.equal(model(ids), before)


def test_the_decode_check_puts_the_decoder_class_back_even_when_the_answer_fails():
    from swkv_teach.model import Decoder
    from tests.wrong_answers import decode as bugs

    before = {name: Decoder.__dict__[name] for name in ("forward", "step", "score", "generate")}
    for answer in (bugs.decode_class_step, bugs.decode_class_forward_on_the_prefix, bugs.decode_stub):
        with pytest.raises(ExerciseFailed):
            grading.check_cached_decode(answer)
        assert {name: Decoder.__dict__[name] for name in before} == before


def test_right_decode_answers_are_well_inside_the_tolerance():
    from swkv_teach.grading import decode as d
    from tests.right_answers import decode as rights

    for fn in (rights.decode_layer_major, rights.decode_token_by_token):
        for W, chunks in d.SCENARIOS:
            model, ids = d.make_model(W, torch.device("cpu"))
            caches, start = model.new_caches("ring"), 0
            with torch.no_grad():
                expected = model(ids)
                for c in chunks:
                    exp = expected[:, start : start + c]
                    err = (fn(model, ids[:, start : start + c], caches) - exp).abs().max()
                    assert err < 0.1 * (d.ATOL + d.RTOL * exp.abs().max()), (fn.__name__, W, start, float(err))
                    start += c


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
            raise NotImplementedError("exercise 02: replace these two lines with your code")

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


def test_the_library_never_imports_grading():
    for path in (ROOT / "swkv_teach").rglob("*.py"):
        if "grading" in path.parts or path.name == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any("grading" in n for n in names), f"{path} imports grading"


# ------------------------------------------------------------------ what "retained memory" counts
def test_retained_counts_each_storage_once_and_finds_memory_wherever_it_is_held():
    import numpy as np

    from swkv_teach.grading._retained import retained

    buf = torch.zeros(2, 3, 8, 4)

    class Node:
        def __init__(self, payload, nxt=None):
            self.payload, self.next = payload, nxt

    class Cache:
        shared = [torch.zeros(10)]  # class-level state counts too

        def __init__(self):
            self.k, self.v = buf[0], buf[1]  # two views of one storage: counted once
            self.log = {"a": [torch.ones(5), (torch.ones(7),)]}
            self.chain = Node(torch.ones(3), Node(torch.ones(2)))  # a linked list, followed to its end
            self.copy = np.zeros(6, dtype=np.float32)
            self.model = torch.nn.Linear(100, 100)  # a model it was handed is not its memory

    r = retained(Cache())
    assert r.float_bytes == 4 * (buf.numel() + 10 + 5 + 7 + 3 + 2 + 6)
    assert r.float_elements == buf.numel() + 10 + 5 + 7 + 3 + 2 + 6
    assert r.containers["self.log['a']"] == 2


def test_retained_survives_odd_objects():
    from swkv_teach.grading._retained import retained

    class Odd:
        __slots__ = ("x", "y")

        def __init__(self):
            self.x = torch.ones(4)

    class Loop:
        def __init__(self):
            self.me, self.odd = self, Odd()

    assert retained(Loop()).float_bytes == 16


# ------------------------------------------------------------------ issue 18: every diagnosis true
CACHE_ARGS = {"check_sliding_window_cache": (3,), "check_ring_buffer_cache": (3,), "check_sink_cache": (1, 3)}


@pytest.mark.parametrize("answer", [r for r in RIGHT if r.check in CACHE_ARGS], ids=lambda r: r.__name__)
def test_sharing_is_never_blamed_on_a_right_cache(answer):
    """Regression (issue 18): shared state is named from evidence, two fresh instances holding one mutable object;
    right answers written in every style hold nothing in common."""
    from swkv_teach.grading._drive import shared_state

    assert shared_state(answer, CACHE_ARGS[answer.check], torch.device("cpu")) is None


def test_shared_state_names_the_mutable_default_argument_and_the_memo():
    """The two sources the issue saw blamed on shape or off-by-one: `def __init__(self, W, ks=[])`, and buffers
    from a memo keyed on the window only."""
    from swkv_teach.grading._drive import shared_state
    from tests.wrong_answers.ring import MemoKeyedOnWindow
    from tests.wrong_answers.sliding import MutableDefaultLists

    found = shared_state(MutableDefaultLists, (3,), torch.device("cpu"))
    assert "self.ks" in found and "`ks`" in found and "mutable default argument" in found
    found = shared_state(MemoKeyedOnWindow, (3,), torch.device("cpu"))
    assert "self.k_buf" in found and "memo" in found


def test_int8_check_sees_nan_reach_the_cast_whatever_the_cast_gives(capsys):
    """Regression (issue 18): an unguarded all-zero row (0 / 0 = NaN, then .to(int8)) was accepted because NaN
    happens to become 0 on x86. A guard applied after the division (nan_to_num) is a guard, and passes."""
    def quantize(x):
        scale = x.float().abs().amax(dim=-1, keepdim=True) / 127
        return torch.nan_to_num(torch.round(x.float() / scale)).clamp(-127, 127).to(torch.int8), scale

    def dequantize(q, scale, dtype):
        return (q.float() * scale).to(dtype)

    grading.check_int8_quantize(quantize, dequantize)
    assert capsys.readouterr().out.startswith("✅")

    def divide_by_inf(x):  # another guard: x / inf is 0, no NaN ever made
        scale = x.float().abs().amax(dim=-1, keepdim=True) / 127
        safe = torch.where(scale > 0, scale, torch.full_like(scale, float("inf")))
        return torch.round(x.float() / safe).to(torch.int8), scale

    grading.check_int8_quantize(divide_by_inf, dequantize)
    assert capsys.readouterr().out.startswith("✅")

    def unguarded(x):
        scale = x.float().abs().amax(dim=-1, keepdim=True) / 127
        return torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8), scale

    with pytest.raises(ExerciseFailed, match="all-zero row"):
        grading.check_int8_quantize(unguarded, dequantize)


def test_the_chunk_check_includes_int32_positions_at_the_limit():
    """Issue 18: int32 positions are allowed, so the check feeds a chunk ending at 2**31 - 1 in int32, where
    `k + W` wraps and `q - W` does not (hand-worked: 2147483647 + 6 wraps to -2147483643)."""
    from swkv_teach.grading.chunk import I32, cases

    top = [c for c in cases() if c.dtypes == (I32, I32)]
    assert top and max(int(c.q.max()) for c in top) == 2**31 - 1
    assert int((torch.tensor([2**31 - 1], dtype=torch.int32) + 6)[0]) == -2147483643


def test_lru_probe_for_promotion_while_not_full_needs_the_full_case_to_be_right():
    """'Promotes only when full' is named only when promotion on a full cache is right: an answer that never
    promotes is told that get must promote, not that it promotes only when full."""
    from swkv_teach.grading._lru_probes import diagnose
    from tests.wrong_answers.lru import GetDoesNotPromote, PromotesOnlyWhenFull

    assert "only when the cache is full" in diagnose(PromotesOnlyWhenFull)
    found = diagnose(GetDoesNotPromote)
    assert "get must promote" in found and "only when" not in found


_SLOTS = torch.arange(64)  # a module-level constant that caches only read


def test_a_constant_two_instances_only_read_is_not_called_shared_state():
    """Shared *state* needs evidence of a write: a ring keeping a view of a module-level constant (read, never
    written) and failing for another reason is not told its state is shared."""
    from swkv_teach.grading._drive import shared_state
    from tests.wrong_answers.ring import _Ring

    class ReadsAConstant(_Ring):
        def __init__(self, window_size):
            super().__init__(window_size)
            self.slots = _SLOTS[:window_size]  # same storage in every instance, never written

    assert shared_state(ReadsAConstant, (3,), torch.device("cpu")) is None

    class WritesAConstant(ReadsAConstant):
        def update(self, k_new, v_new):
            self.slots[self.seen % self.window_size] += 1  # now it is state, and shared
            return super().update(k_new, v_new)

    try:
        assert "self.slots" in shared_state(WritesAConstant, (3,), torch.device("cpu"))
    finally:
        _SLOTS.copy_(torch.arange(64))


def test_the_line_shown_is_the_learners_call_not_a_line_inside_an_installed_package():
    """Regression: a learner's bad argument to transformers (exercise 11) raised deep inside it, and the message
    pointed at a line of transformers' configuration_utils instead of the learner's own call."""
    import nbformat

    from swkv_teach.grading._report import _where

    def learner():
        return nbformat.reads("this is not a notebook", as_version=4)  # raises inside site-packages

    try:
        learner()
    except Exception as e:  # noqa: BLE001 - any error nbformat raises will do
        where = _where(e)
    assert "nbformat.reads(" in where, where


def test_int8_right_answer_that_flattens_with_reshape_passes(capsys):
    """One absmax per row of x.reshape(-1, D): reshape copies a transposed or sliced x where view would raise, so
    the check's non-contiguous inputs must not reject it."""
    def quantize(x):
        rows = x.reshape(-1, x.shape[-1]).float()
        scale = (rows.abs().amax(dim=-1, keepdim=True) / 127).reshape(*x.shape[:-1], 1)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        return torch.round(x.float() / safe).clamp(-127, 127).to(torch.int8), scale

    def dequantize(q, scale, dtype):
        return (q.reshape(-1, q.shape[-1]).float() * scale.reshape(-1, 1)).reshape(q.shape).to(dtype)

    grading.check_int8_quantize(quantize, dequantize)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("✅"), out


@pytest.mark.parametrize("how", ["transposed", "sliced", "expanded", "strided"])
def test_each_layout_keeps_the_numbers_and_is_not_contiguous(how):
    """The checks' non-contiguous inputs: x.view(-1) must raise on each (else the layout tests nothing), and the
    values must be x's (expanded: row 0's, so x is given equal rows here)."""
    from swkv_teach.grading._layout import laid_out

    x = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).view(2, 3, 4, 5)
    if how == "expanded":
        x = x[:1].repeat(2, 1, 1, 1)
    y = laid_out(x, how)
    assert torch.equal(y, x) and not y.is_contiguous()
    with pytest.raises(RuntimeError):
        y.view(-1)
