"""Block stores (swkv_teach.store): round trips, LRU by bytes, bad values are counted misses, namespacing, and a
real redis-server stopped and restarted under a RedisStore.

Redis tests start their own server (tests/redis_fixture.py) and skip without redis-server unless
SWKV_REQUIRE_REDIS=1.
"""

from __future__ import annotations

import hashlib
import time

import pytest
import torch

from swkv_teach.model import Decoder, DecoderConfig
from swkv_teach.store import LocalStore, block_layout, decode_block, encode_block, model_fingerprint, store_key
from tests.redis_fixture import redis_server  # noqa: F401 (a fixture)

CONFIG = DecoderConfig(vocab_size=32, dim=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, hidden_dim=32,
                       window_size=4)


def decoder(seed: int = 0, **change) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(DecoderConfig(**{**CONFIG.__dict__, **change}))


MODEL = decoder()
BS = 4
LAYOUT = block_layout(MODEL, BS)  # (2 layers, 4 tokens, 1 head, 8) float32


def block(seed: int, layout: dict = LAYOUT):
    g = torch.Generator().manual_seed(seed)
    shape = (layout["num_layers"], layout["block_size"], layout["n_kv_heads"], layout["head_dim"])
    dtype = getattr(torch, layout["dtype"])
    return torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)


def h(i: int) -> bytes:
    return hashlib.sha256(f"block {i}".encode()).digest()


def make_store(kind: str, server=None, **kw):
    if kind == "local":
        return LocalStore(kw.pop("max_bytes", 1 << 20))
    from swkv_teach.store import RedisStore

    return RedisStore(server.url, **kw)


def raw_put(store, key: str, data: bytes) -> None:
    """Write bytes under ``key`` behind the store's back (what another writer, or a fault, could leave there)."""
    if isinstance(store, LocalStore):
        store.data[key] = data
    else:
        store.client.set(key, data)


@pytest.fixture(params=["local", "redis"])
def store(request):
    if request.param == "local":
        return make_store("local")
    server = request.getfixturevalue("redis_server")
    return make_store("redis", server)


# ------------------------------------------------------------------ the layout and the value
def test_the_fingerprint_follows_the_weights_and_the_config():
    assert model_fingerprint(decoder(0)) == model_fingerprint(decoder(0))  # same seed, same weights
    assert model_fingerprint(decoder(0)) != model_fingerprint(decoder(1))
    nudged = decoder(0)
    with torch.no_grad():
        list(nudged.parameters())[-1].view(-1)[3] += 1e-3  # one weight of the last tensor
    assert model_fingerprint(nudged) != model_fingerprint(decoder(0))
    assert model_fingerprint(decoder(0, rope_theta=5000.0)) != model_fingerprint(decoder(0))  # no weight differs


def test_the_layout_names_what_a_block_holds():
    assert {k: v for k, v in LAYOUT.items() if k != "model"} == {
        "format": 1, "dtype": "float32", "block_size": 4, "num_layers": 2, "n_kv_heads": 1, "head_dim": 8}
    assert block_layout(MODEL, 4, torch.bfloat16)["dtype"] == "bfloat16"
    with pytest.raises(ValueError, match="block_size"):
        block_layout(MODEL, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_value_round_trips_bit_for_bit(dtype):
    layout = block_layout(MODEL, BS, dtype)
    k, v = block(3, layout)
    out = decode_block(encode_block(h(3), layout, k, v), h(3), layout)
    assert out[0].dtype == dtype and torch.equal(out[0], k) and torch.equal(out[1], v)


def test_a_put_with_the_wrong_shape_or_dtype_says_which_argument():
    k, v = block(0)
    with pytest.raises(ValueError, match=r"keys must be .*\(2, 4, 1, 8\)"):
        encode_block(h(0), LAYOUT, k[:, :3], v)
    with pytest.raises(ValueError, match="values must be"):
        encode_block(h(0), LAYOUT, k, v.half())
    with pytest.raises(ValueError, match="block_hash"):
        encode_block("abc", LAYOUT, k, v)


# ------------------------------------------------------------------ both stores
def test_put_then_get_returns_the_same_tensors_and_counts(store):
    k, v = block(1)
    assert store.get_block(h(1), LAYOUT) is None
    store.put_block(h(1), LAYOUT, k, v)
    got = store.get_block(h(1), LAYOUT)
    assert torch.equal(got[0], k) and torch.equal(got[1], v)
    s = store.stats()
    assert (s["hits"], s["misses"], s["puts"], s["store_rejected"], s["store_errors"]) == (1, 1, 1, 0, 0)
    assert s["bytes_held"] == len(encode_block(h(1), LAYOUT, k, v))


def _other_layouts():
    other_model = block_layout(decoder(1), BS)
    return {
        "another model": other_model,
        "another dtype": block_layout(MODEL, BS, torch.float16),
        "another block size": block_layout(MODEL, 2),
        "another format": {**LAYOUT, "format": 0},
    }


@pytest.mark.parametrize("why", list(_other_layouts()))
def test_a_value_of_another_layout_under_our_key_is_a_counted_miss(store, why):
    """What a deployment with another model or dtype would leave if keys ever collided: read, checked, refused."""
    other = _other_layouts()[why]
    k, v = block(2, other)
    raw_put(store, store.key(h(2), LAYOUT), encode_block(h(2), other, k, v))
    assert store.get_block(h(2), LAYOUT) is None
    s = store.stats()
    assert (s["hits"], s["misses"], s["store_rejected"]) == (0, 1, 1), s
    assert "another layout" in store.last_rejection


def _damaged():
    k, v = block(4)
    good = encode_block(h(4), LAYOUT, k, v)
    flips = {f"byte {i} flipped": i for i in (0, 9, 20, len(good) // 2, len(good) - 40, len(good) - 1)}
    out = {name: good[:i] + bytes([good[i] ^ 0x01]) + good[i + 1 :] for name, i in flips.items()}
    out |= {"truncated by one byte": good[:-1], "truncated to half": good[: len(good) // 2], "empty": b"",
            "the checksum only": good[-32:], "not a block at all": b"hello world" * 10,
            "filed under another hash": encode_block(h(5), LAYOUT, k, v)}
    return out


@pytest.mark.parametrize("damage", list(_damaged()))
def test_a_truncated_or_corrupted_value_is_a_counted_miss(store, damage):
    raw_put(store, store.key(h(4), LAYOUT), _damaged()[damage])
    assert store.get_block(h(4), LAYOUT) is None
    s = store.stats()
    assert (s["hits"], s["misses"], s["store_rejected"]) == (0, 1, 1), s


def test_a_missing_key_is_a_miss_not_a_rejection(store):
    assert store.get_block(h(9), LAYOUT) is None
    s = store.stats()
    assert (s["misses"], s["store_rejected"], s["store_errors"]) == (1, 0, 0)


def test_two_models_sharing_a_store_never_read_each_others_blocks(store):
    other = block_layout(decoder(1), BS)
    store.put_block(h(6), LAYOUT, *block(6))
    assert store.get_block(h(6), other) is None  # a plain miss: another key altogether
    assert store.stats()["store_rejected"] == 0
    assert store.key(h(6), LAYOUT) != store.key(h(6), other)
    assert LAYOUT["model"][:16] in store.key(h(6), LAYOUT) and other["model"][:16] in store.key(h(6), other)


# ------------------------------------------------------------------ LocalStore: LRU by bytes
def test_the_local_store_evicts_the_least_recently_used_by_bytes():
    size = len(encode_block(h(0), LAYOUT, *block(0)))
    s = LocalStore(max_bytes=2 * size + size // 2)  # room for two blocks
    s.put_block(h(0), LAYOUT, *block(0))
    s.put_block(h(1), LAYOUT, *block(1))
    assert s.get_block(h(0), LAYOUT) is not None  # 0 is now the most recent: 1 goes next
    s.put_block(h(2), LAYOUT, *block(2))
    assert s.get_block(h(1), LAYOUT) is None
    assert s.get_block(h(0), LAYOUT) is not None and s.get_block(h(2), LAYOUT) is not None
    assert s.stats()["bytes_held"] == 2 * size and s.stats()["evicted"] == 1
    s.put_block(h(2), LAYOUT, *block(2))  # a re-put replaces, it does not count twice
    assert s.stats()["bytes_held"] == 2 * size
    with pytest.raises(ValueError, match="max_bytes"):
        LocalStore(0)


# ------------------------------------------------------------------ RedisStore: namespaces, faults
def test_namespaces_separate_deployments_on_one_redis(redis_server):
    a = make_store("redis", redis_server, namespace="a")
    b = make_store("redis", redis_server, namespace="b")
    plain = make_store("redis", redis_server)
    a.put_block(h(7), LAYOUT, *block(7))
    assert b.get_block(h(7), LAYOUT) is None and plain.get_block(h(7), LAYOUT) is None
    assert a.get_block(h(7), LAYOUT) is not None
    assert a.stats()["bytes_held"] > 0 and b.stats()["bytes_held"] == 0 and plain.stats()["bytes_held"] == 0
    assert sorted(a.client.keys()) == [store_key(h(7), LAYOUT, "a").encode()]
    with pytest.raises(ValueError, match="namespace"):
        make_store("redis", redis_server, namespace="x:y")


def test_a_second_client_reads_what_the_first_wrote(redis_server):
    make_store("redis", redis_server).put_block(h(8), LAYOUT, *block(8))
    got = make_store("redis", redis_server).get_block(h(8), LAYOUT)
    assert got is not None and torch.equal(got[0], block(8)[0])


def _until(fn, seconds: float):
    """Call ``fn`` until it returns something true or ``seconds`` pass; (result, calls)."""
    deadline, calls = time.monotonic() + seconds, 0
    while True:
        calls += 1
        out = fn()
        if out or time.monotonic() > deadline:
            return out, calls
        time.sleep(0.05)


def test_redis_down_is_misses_and_errors_then_hits_resume_after_a_restart(redis_server):
    store = make_store("redis", redis_server)
    store.put_block(h(1), LAYOUT, *block(1))
    assert store.get_block(h(1), LAYOUT) is not None
    redis_server.stop()
    for i in range(5):  # nothing raises; every get is a miss, every operation an error
        assert store.get_block(h(1), LAYOUT) is None
        store.put_block(h(2), LAYOUT, *block(2))
    s = store.stats()
    assert s["store_errors"] == 10 and s["hits"] == 1 and s["puts"] == 1 and s["bytes_held"] is None, s
    _until(lambda: store.get_block(h(1), LAYOUT), seconds=3.0)  # down for 3 s of retries: the backoff grows...
    redis_server.start()  # same port, empty (no persistence)

    def put_and_get():
        store.put_block(h(3), LAYOUT, *block(3))
        return store.get_block(h(3), LAYOUT)

    # ... but only up to max_backoff (1 s): hits resume within a few seconds of the restart
    got, _ = _until(put_and_get, seconds=store.max_backoff + 2.0)
    assert got is not None and torch.equal(got[1], block(3)[1]), store.last_error
    assert store.stats()["hits"] == 2


def test_a_full_redis_that_refuses_writes_is_an_error_not_an_exception(redis_server):
    """maxmemory with the noeviction policy: SET answers OOM (a ResponseError, not a connection error)."""
    store = make_store("redis", redis_server)
    store.client.config_set("maxmemory-policy", "noeviction")
    store.client.config_set("maxmemory", store.client.info("memory")["used_memory"] + 1000)
    for i in range(3):
        store.put_block(h(i), LAYOUT, *block(i))
    s = store.stats()
    assert s["puts"] == 0 and s["store_errors"] >= 1, s
    store.client.config_set("maxmemory", 0)
    time.sleep(store.max_backoff)  # the backoff after the refusal
    store.put_block(h(0), LAYOUT, *block(0))
    assert store.get_block(h(0), LAYOUT) is not None
