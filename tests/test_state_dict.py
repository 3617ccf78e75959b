"""Persistence: every cache's state_dict / load_state_dict, and LayerCaches', with PyTorch's conventions.

The specification (issue 23): a state is plain tensors and Python values (``torch.load(weights_only=True)``
reads it); a generation stopped after n tokens, its caches saved, loaded in a *new process* into
``model.new_caches(kind)`` and continued with ``model.step`` gives bit-identical logits to the
uninterrupted run; a state of another kind, window, layer count or layout is refused with a
``ValueError`` naming what differs, and every cache is left as it was.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from swkv_teach import (
    BlockPool,
    Decoder,
    DecoderConfig,
    H2OKVCache,
    LRUKVCache,
    PagedKVCache,
    TOVAKVCache,
    load_pretrained,
    make_cache,
)
from swkv_teach.caches import PoolExhausted
from swkv_teach.model import LayerCaches

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("naive", "ring", "sinks", "lru", "int8", "paged", "h2o", "tova")
WIDE = 10_000  # the mask's window for H2O/TOVA: they choose what to keep, the mask must not hide it


def caches_for(model: Decoder, kind: str, window: int | None = None) -> LayerCaches:
    """Fresh caches of ``kind`` for ``model``; H2O and TOVA are built directly (they are not make_cache kinds)."""
    W = window or model.config.window_size
    if kind == "h2o":
        return LayerCaches([H2OKVCache(W, W // 4) for _ in model.layers], WIDE)
    if kind == "tova":
        return LayerCaches([TOVAKVCache(W) for _ in model.layers], WIDE)
    return model.new_caches(kind, num_sinks=3, window_size=W)


def roundtrip(state):
    """What a state becomes after torch.save and torch.load(weights_only=True)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def same(a, b) -> bool:
    """Deep equality of two states: tensors by torch.equal (dtype and shape included), the rest by ==."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and \
            a.shape == b.shape and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@torch.no_grad()
def greedy(model, caches, first, steps):
    """Feed ``first`` (1, c) then ``steps`` greedy tokens; the logits of every step, stacked."""
    out, ids = [], first
    for _ in range(steps + 1):
        logits = model.step(ids, caches)[:, -1]
        out.append(logits)
        ids = logits.argmax(-1, keepdim=True)
    return torch.stack(out)


# --------------------------------------------------------------------------- across processes
CONTINUE = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, sys.argv[2])
    from tests.test_state_dict import caches_for, greedy, KINDS
    from swkv_teach import load_pretrained
    model, _ = load_pretrained()
    folder = sys.argv[1]
    for kind in KINDS:
        saved = torch.load(f"{folder}/{kind}.pt", weights_only=True)
        caches = caches_for(model, kind)
        caches.load_state_dict(saved["caches"])
        torch.save(greedy(model, caches, saved["next"], 24), f"{folder}/{kind}.out.pt")
""")


def test_a_generation_resumed_in_a_new_process_gives_bit_identical_logits(tmp_path):
    """Every kind: prompt + 10 tokens here, caches saved; a new process loads them and goes on 24 more."""
    model, tok = load_pretrained()
    prompt = torch.tensor([tok.encode("class Counter:\n    def __init__(self, items):\n        self.items = list(")])
    assert prompt.shape[1] > model.config.window_size // 2
    expected = {}
    for kind in KINDS:
        caches = caches_for(model, kind)
        logits = greedy(model, caches, prompt, 10)  # the window is full by now for every kind
        nxt = logits[-1].argmax(-1, keepdim=True)
        torch.save({"caches": caches.state_dict(), "next": nxt}, tmp_path / f"{kind}.pt")
        expected[kind] = greedy(model, caches, nxt, 24)  # the uninterrupted run
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    done = subprocess.run([sys.executable, "-c", CONTINUE, str(tmp_path), str(ROOT)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    for kind in KINDS:
        got = torch.load(tmp_path / f"{kind}.out.pt", weights_only=True)
        assert torch.equal(got, expected[kind]), (
            f"{kind}: resumed logits differ from the uninterrupted run's at steps "
            f"{torch.nonzero((got != expected[kind]).any(-1).flatten()).flatten().tolist()[:5]}"
        )


# --------------------------------------------------------------------------- in one process, varied
SETTINGS = [(1, torch.float32, [7, 1, 1, 5, 1]), (2, torch.float64, [1, 1, 13, 2]), (1, torch.bfloat16, [3, 9, 1, 1, 1])]


@pytest.mark.parametrize("kind,batch,dtype,chunks", [
    (kind, *setting) for kind in KINDS for setting in SETTINGS
    if not (kind == "paged" and setting[0] > 1)  # a paged cache holds one sequence
])
def test_round_trip_at_every_step_with_chunks_batches_and_dtypes(kind, batch, dtype, chunks):
    """Save after every chunk, reload into fresh caches, and both go on identically (logits and states)."""
    torch.manual_seed(1)
    model = Decoder(DecoderConfig(vocab_size=50, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                                  hidden_dim=48, window_size=6)).to(dtype).eval()
    ids = torch.randint(0, 50, (batch, sum(chunks) + 6))
    live = caches_for(model, kind)
    start = 0
    for c in chunks:
        model.step(ids[:, start : start + c], live)
        start += c
        state = roundtrip(live.state_dict())
        restored = caches_for(model, kind)
        restored.load_state_dict(state)
        assert same(restored.state_dict(), live.state_dict()), f"{kind}: the restored state differs after {start} tokens"
        assert restored.stats() == live.stats()
        nxt = ids[:, start : start + 3]
        probe_live, probe_restored = caches_for(model, kind), caches_for(model, kind)
        probe_live.load_state_dict(state)
        probe_restored.load_state_dict(restored.state_dict())
        assert torch.equal(model.step(nxt, probe_live), model.step(nxt, probe_restored))
    # and the restored one continues as the live one does
    rest = ids[:, start:]
    for t in range(rest.shape[1]):
        a = model.step(rest[:, t : t + 1], live)
        b = model.step(rest[:, t : t + 1], restored)
        assert torch.equal(a, b), f"{kind}: step {t} after the last reload differs"


def test_every_cache_class_of_the_library_can_be_saved():
    """A new policy added to swkv_teach.caches without persistence fails here, not in a user's service."""
    from swkv_teach.caches import KVCache, ScoredKVCache

    def concrete(cls):
        for sub in cls.__subclasses__():
            yield from concrete(sub)
            if sub.__module__.startswith("swkv_teach.caches") and sub is not ScoredKVCache:
                yield sub

    classes = set(concrete(KVCache))
    assert len(classes) >= 8
    for cls in classes:
        assert cls._state is not KVCache._state and cls._load_state is not KVCache._load_state, cls.__name__
        assert cls._config is not KVCache._config, f"{cls.__name__} has settings a state must match"


def test_a_state_is_a_snapshot_not_a_view_of_the_live_buffers():
    """The ring writes into its buffers in place: a state taken earlier must not change with them."""
    cache = make_cache("ring", 3)
    for _ in range(4):
        cache.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
    state = cache.state_dict()
    frozen = roundtrip(state)
    cache.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
    assert same(state, frozen)


def test_the_naive_cache_saves_its_window_not_the_storage_behind_the_view():
    """Regression: self.k is a W-token view of a W + 1 token tensor; torch.save of the view writes both."""
    W, D = 4, 64
    cache = make_cache("naive", W)
    for _ in range(10):
        cache.update(torch.randn(1, 1, 1, D), torch.randn(1, 1, 1, D))
    k = cache.state_dict()["k"]
    assert k.untyped_storage().nbytes() == W * D * 4


def test_the_lru_order_after_reads_survives_the_round_trip():
    """LRU's future evictions depend on the recency order that get() changed, not on positions."""
    a, b = make_cache("lru", 3), make_cache("lru", 3)
    for _ in range(3):
        a.update(torch.randn(1, 1, 1, 2), torch.randn(1, 1, 1, 2))
    a.get(0)  # 0 is now most recently used: 1 goes next
    b.load_state_dict(roundtrip(a.state_dict()))
    for cache in (a, b):
        cache.update(torch.randn(1, 1, 1, 2), torch.randn(1, 1, 1, 2))
    assert a.ids() == b.ids() == [2, 0, 3]
    assert (b.hits, b.misses) == (1, 0)


def test_h2o_scores_survive_and_decide_the_next_eviction():
    """Two H2O caches that differ only in the scores their observe() saw must evict differently after loading."""
    made = []
    for favourite in (0, 1):
        cache = H2OKVCache(3, 1)
        for _ in range(3):
            cache.update(torch.randn(1, 1, 1, 2), torch.randn(1, 1, 1, 2))
            w = torch.zeros(1, 1, 1, len(cache.positions))
            w[..., list(cache.positions).index(min(favourite, len(cache.positions) - 1))] = 1.0
            cache.observe(w)
        copy = H2OKVCache(3, 1)
        copy.load_state_dict(roundtrip(cache.state_dict()))
        copy.update(torch.randn(1, 1, 1, 2), torch.randn(1, 1, 1, 2))
        made.append(copy.stored_positions().tolist())
    # favourite 0: scores {0: 3, 1: 0, 2: 0}, evict 1 (lowest, oldest among ties);
    # favourite 1: scores {0: 1, 1: 2, 2: 0}, evict 2; position 3 (the recent window) is protected in both
    assert made == [[0, 2, 3], [0, 1, 3]]


def test_a_scored_cache_waiting_for_observe_refuses_to_be_saved():
    cache = TOVAKVCache(2)
    cache.update(torch.randn(1, 1, 5, 2), torch.randn(1, 1, 5, 2))  # longer than the budget: observe() decides
    with pytest.raises(RuntimeError, match="observe"):
        cache.state_dict()


def test_an_empty_cache_round_trips_for_every_kind():
    for kind in ("naive", "ring", "sinks", "lru", "int8", "paged"):
        cache = make_cache(kind, 4)
        state = roundtrip(cache.state_dict())
        fresh = make_cache(kind, 4)
        fresh.load_state_dict(state)
        assert fresh.seen == 0 and len(fresh) == 0 and fresh.nbytes == 0, kind


def test_a_window_state_is_small_next_to_the_weights():
    """The lesson's claim, measured: the shipped model's whole cache state is a few percent of its weights."""
    model, tok = load_pretrained()
    caches = model.new_caches("ring")
    model.step(torch.tensor([tok.encode("x = 1\n" * 30)]), caches)
    buf = io.BytesIO()
    torch.save(caches.state_dict(), buf)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = 2 * model.config.n_layers * model.config.n_kv_heads * model.config.window_size * model.config.head_dim * 4
    assert kv <= len(buf.getvalue()) < kv + 16_384  # the buffers plus a little framing
    assert len(buf.getvalue()) < weights / 5


# --------------------------------------------------------------------------- refusals
def small_model(n_kv_heads=2, layers=3):
    torch.manual_seed(0)
    return Decoder(DecoderConfig(vocab_size=40, dim=32, n_layers=layers, n_heads=4, n_kv_heads=n_kv_heads,
                                 head_dim=8, hidden_dim=32, window_size=5)).eval()


def filled(model, kind, window=None, tokens=8):
    caches = caches_for(model, kind, window)
    model.step(torch.randint(0, 40, (1, tokens)), caches)
    return caches


def refuse(target: LayerCaches, state, match: str):
    """Loading ``state`` into ``target`` raises ValueError matching ``match`` and changes no cache."""
    before = target.state_dict()
    with pytest.raises(ValueError, match=match) as err:
        target.load_state_dict(state)
    assert same(target.state_dict(), before), "a refused load changed the caches"
    return str(err.value)


@pytest.mark.parametrize("kind,other", [("ring", "int8"), ("naive", "ring"), ("sinks", "ring"), ("lru", "naive"),
                                        ("paged", "ring"), ("h2o", "tova")])
def test_a_state_of_another_kind_is_refused(kind, other):
    model = small_model()
    msg = refuse(filled(model, other), filled(model, kind).state_dict(), "kind differs")
    assert "layer 0" in msg


@pytest.mark.parametrize("kind", KINDS)
def test_a_state_of_another_window_is_refused(kind):
    model = small_model()
    state = filled(model, kind, window=4).state_dict()
    target = filled(model, kind, window=6)
    msg = refuse(target, state, "budget" if kind in ("h2o", "tova") else "max_size" if kind == "lru" else "window_size")
    assert "4" in msg and "6" in msg


def test_a_single_cache_refuses_a_state_of_another_kind_and_stays_as_it_was():
    ring = make_cache("ring", 4)
    for _ in range(6):
        ring.update(torch.randn(1, 2, 1, 3), torch.randn(1, 2, 1, 3))
    before = ring.state_dict()
    with pytest.raises(ValueError, match="^kind differs: the state is of a 'SlidingWindowKVCache', "
                                         "this cache is a 'RingBufferKVCache'$"):
        ring.load_state_dict(make_cache("naive", 4).state_dict())
    assert same(ring.state_dict(), before)


def test_a_state_of_another_layer_count_is_refused():
    state = filled(small_model(layers=3), "ring").state_dict()
    msg = refuse(filled(small_model(layers=2), "ring"), state, "layer count")
    assert "3" in msg and "2" in msg


def test_a_state_of_another_sink_count_is_refused():
    model = small_model()
    state = filled(model, "sinks").state_dict()
    target = model.new_caches("sinks", num_sinks=2)
    refuse(target, state, "num_sinks")


@pytest.mark.parametrize("kind", ("naive", "ring", "int8", "lru", "paged", "h2o"))
def test_a_state_of_another_layout_is_refused_by_caches_holding_a_layout(kind):
    """Heads differ (2 vs 1 KV heads): caches already holding one layout refuse the other; fresh ones take it."""
    state = filled(small_model(n_kv_heads=2), kind).state_dict()
    one_head = small_model(n_kv_heads=1)
    msg = refuse(filled(one_head, kind), state, "layout differs")
    assert "heads=2" in msg and "heads=1" in msg
    fresh = caches_for(one_head, kind)
    fresh.load_state_dict(state)  # empty caches take the state's layout
    assert fresh.stats()["tokens_seen"] == 3 * 8


def test_a_bad_last_layer_leaves_the_first_layers_untouched():
    """All or nothing: layer 2 is refused after layers 0 and 1 passed their checks; none of them changed."""
    model = small_model()
    bad = filled(model, "ring", tokens=9).state_dict()
    bad["layers"][2] = make_cache("naive", 5).state_dict()
    msg = refuse(filled(model, "ring", tokens=6), bad, "layer 2")
    assert "kind differs" in msg


@pytest.mark.parametrize("corrupt,match", [
    (lambda s: s["layers"][1].pop("k"), "lacks keys \\['k'\\]"),
    (lambda s: s["layers"][1].update(extra=1), "unexpected keys \\['extra'\\]"),
    (lambda s: s["layers"][1].update(k=s["layers"][1]["k"][:, :, :2]), "state\\['k'\\] has shape"),
    (lambda s: s["layers"][1].update(seen=-1), "seen"),
    (lambda s: s.update(window_size=7), "window_size is 7"),
    (lambda s: s.update(kind="dict"), "kind differs"),
])
def test_a_damaged_state_is_refused_naming_what_is_wrong(corrupt, match):
    model = small_model()
    state = filled(model, "ring").state_dict()
    corrupt(state)
    refuse(filled(model, "ring", tokens=2), state, match)


# --------------------------------------------------------------------------- paged: the pool's room
def test_a_paged_state_restores_into_another_pool_with_enough_blocks():
    src_pool = BlockPool(8, 2)
    src = PagedKVCache(src_pool, 5)
    PagedKVCache(src_pool, 5).update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))  # someone else's blocks
    src.update(torch.randn(1, 2, 7, 4), torch.randn(1, 2, 7, 4))
    dst = PagedKVCache(BlockPool(3, 2), 5)
    dst.load_state_dict(roundtrip(src.state_dict()))
    assert dst.block_table != src.block_table  # other ids, same tokens
    assert torch.equal(dst.ordered()[0], src.ordered()[0]) and torch.equal(dst.ordered()[1], src.ordered()[1])
    k, v = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)
    assert torch.equal(dst.update(k, v)[0], src.update(k, v)[0])


def test_a_paged_state_into_a_pool_like_its_own_takes_the_same_blocks_and_free_queue():
    """Regression: restored into other block ids, attention reading the pool in place summed the window
    in another order and the logits moved by ~1e-6; the same ids and free queue keep them bit-identical."""
    src = make_cache("paged", 40)  # a pool of its own, 4 blocks of 16
    for _ in range(70):  # blocks taken and returned: the free queue is no longer 0, 1, 2, ...
        src.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
    dst = make_cache("paged", 40)
    dst.load_state_dict(roundtrip(src.state_dict()))
    assert dst.block_table == src.block_table
    assert list(dst.pool._free) == list(src.pool._free)
    for _ in range(20):  # the blocks they take and return from now on are the same ones
        k, v = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)
        assert all(torch.equal(a, b) for a, b in zip(src.update(k, v), dst.update(k, v)))
        assert dst.block_table == src.block_table and list(dst.pool._free) == list(src.pool._free)


def test_a_paged_state_into_a_pool_without_room_raises_and_changes_nothing():
    src = PagedKVCache(BlockPool(8, 2), 5)
    src.update(torch.randn(1, 2, 7, 4), torch.randn(1, 2, 7, 4))  # tokens 2..6: logical blocks 1..3, 3 blocks
    pool = BlockPool(3, 2)
    squatter = PagedKVCache(pool, 5)
    squatter.update(torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4))  # holds 1 block: 2 free
    dst = PagedKVCache(pool, 5)
    with pytest.raises(PoolExhausted, match="needs 3 blocks"):
        dst.load_state_dict(src.state_dict())
    assert pool.free_blocks == 2 and dst.seen == 0 and dst.block_table == []


def test_layers_sharing_one_pool_are_checked_together():
    """Each layer alone fits the pool; together they do not: refused before any layer takes a block."""
    src_pool = BlockPool(12, 2)
    state = LayerCaches([PagedKVCache(src_pool, 5) for _ in range(2)], 5)
    for cache in state:
        cache.update(torch.randn(1, 1, 7, 2), torch.randn(1, 1, 7, 2))
    pool = BlockPool(4, 2)  # 3 blocks each, 6 together
    target = LayerCaches([PagedKVCache(pool, 5) for _ in range(2)], 5)
    with pytest.raises(PoolExhausted, match="needs 6 blocks"):
        target.load_state_dict(state.state_dict())
    assert pool.free_blocks == 4 and all(c.seen == 0 for c in target)


def test_a_cache_reloading_into_its_own_full_pool_counts_the_blocks_it_gives_back():
    """Guards the room check's "blocks the cache holds now and would return": a cache that holds every block of
    its pool can load a state needing as many (its own, taken earlier), since loading returns its blocks first."""
    pool = BlockPool(3, 2)
    cache = PagedKVCache(pool, 5)
    cache.update(torch.randn(1, 2, 7, 4), torch.randn(1, 2, 7, 4))  # tokens 2..6: 3 blocks, the whole pool
    state = roundtrip(cache.state_dict())
    cache.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
    assert pool.free_blocks == 0
    cache.load_state_dict(state)  # needs 3, 0 free, gives back 3
    assert cache.seen == 7 and len(cache.block_table) == 3


def test_a_paged_state_puts_a_shuffled_free_queue_back_in_order():
    """Guards the restored free queue (``pool_free``): after blocks are taken and returned the pool's queue is no
    longer in id order; a state loaded into a fresh pool of the same size must put it back as it was, so both
    take the same blocks from then on."""
    src_pool = BlockPool(8, 2)
    src = PagedKVCache(src_pool, 5)
    for _ in range(23):  # 3 blocks held, 5 free in the order they were returned
        src.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
    assert src_pool.free_order() != sorted(src_pool.free_order())  # the case is not the trivial one
    dst_pool = BlockPool(8, 2)
    dst = PagedKVCache(dst_pool, 5)
    dst.load_state_dict(roundtrip(src.state_dict()))
    assert dst_pool.free_order() == src_pool.free_order()
    for _ in range(12):
        k, v = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)
        src.update(k, v)
        dst.update(k, v)
        assert dst.block_table == src.block_table
