"""A scheduler with a block store on a real redis-server: two processes share it, and Redis dies and comes back
in the middle of a run. Tokens always equal serving without prefix caching (the oracle: nothing from a store may
change a token). The server is started by tests/redis_fixture.py; skipped without redis-server unless
SWKV_REQUIRE_REDIS=1."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from swkv_teach.pretrained import load_pretrained
from swkv_teach.serving import Scheduler, serve_chat
from tests.redis_fixture import redis_server  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parent.parent
CHAT = {"conversations": 8, "turns": 3, "max_new_tokens": 24}
SMALL, LARGE = 40, 160  # blocks of 16: SMALL evicts (so blocks reach the store), LARGE never does

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return load_pretrained()


@pytest.fixture(scope="module")
def reference(model):
    """The chat served without prefix caching: its requests per turn and their outputs."""
    decoder, tokenizer = model
    return serve_chat(Scheduler(decoder, num_blocks=LARGE, block_size=16), tokenizer, **CHAT)


def _run(script: str, url: str) -> dict:
    """Run ``script`` in a fresh Python process (url and CHAT given); its last line of output, as JSON."""
    prelude = f"URL = {url!r}\nCHAT = {CHAT!r}\nSMALL, LARGE = {SMALL}, {LARGE}\n"
    out = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(script)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                                      "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


SERVE = """
    import json, torch
    torch.set_num_threads(1)
    from swkv_teach.pretrained import load_pretrained
    from swkv_teach.serving import Scheduler, serve_chat
    from swkv_teach.store import RedisStore
    decoder, tokenizer = load_pretrained()
    s = Scheduler(decoder, num_blocks={blocks}, block_size=16, prefix_caching=True, store=RedisStore(URL))
    out = serve_chat(s, tokenizer, **CHAT)
    print(json.dumps({{"outputs": out["outputs"], "stats": s.stats()}}))
"""


def test_a_second_process_hits_the_blocks_the_first_one_served(redis_server, reference):
    first = _run(SERVE.format(blocks=SMALL), redis_server.url)  # a small pool: evicted blocks go to Redis
    assert first["stats"]["store_put_blocks"] > 0 and first["stats"]["store_errors"] == 0
    second = _run(SERVE.format(blocks=LARGE), redis_server.url)  # a fresh process whose pool never evicts
    s = second["stats"]
    assert s["cached_blocks_evicted"] == 0 and s["store_put_blocks"] == 0  # so every store hit is the first's
    assert s["store_hit_blocks"] > 0 and s["hits"] == s["store_hit_blocks"] and s["store_rejected"] == 0, s
    alone = _run(SERVE.format(blocks=LARGE).replace("RedisStore(URL)", "RedisStore(URL, namespace='other')"),
                 redis_server.url)  # the same, in an empty namespace: what the second would compute without hits
    assert s["prefill_tokens_computed"] < alone["stats"]["prefill_tokens_computed"]
    assert first["outputs"] == second["outputs"] == alone["outputs"] == reference["outputs"]


def _serve_turn(scheduler, turn: list[dict], stop_after_steps=None, server=None) -> list[list[int]]:
    ids = [scheduler.submit(**r) for r in turn]
    steps = 0
    while scheduler.waiting or scheduler.running:
        scheduler.step()
        steps += 1
        if steps == stop_after_steps:
            server.stop()  # Redis dies in the middle of the run
    return [scheduler.finished[i].output for i in ids]


def test_redis_stopped_mid_run_then_restarted(model, reference, redis_server):
    from swkv_teach.store import RedisStore

    decoder, _ = model
    store = RedisStore(redis_server.url)
    s = Scheduler(decoder, num_blocks=SMALL, block_size=16, prefix_caching=True, store=store)
    turns, outputs = reference["requests"], reference["outputs"]
    assert _serve_turn(s, turns[0]) == outputs[0]
    assert _serve_turn(s, turns[1], stop_after_steps=3, server=redis_server) == outputs[1]  # no exception escapes
    assert _serve_turn(s, turns[2]) == outputs[2]
    down = s.stats()
    assert down["store_errors"] > 0 and down["bytes_held"] is None, down

    redis_server.start()  # same port, empty: no persistence
    deadline, hit = time.monotonic() + 10.0, False
    while not hit and time.monotonic() < deadline:
        writer = Scheduler(decoder, num_blocks=SMALL, block_size=16, prefix_caching=True, store=store)
        assert _serve_turn(writer, turns[2]) == outputs[2]  # a small pool evicts: blocks reach Redis again
        reader = Scheduler(decoder, num_blocks=LARGE, block_size=16, prefix_caching=True, store=store)
        assert _serve_turn(reader, turns[2]) == outputs[2]
        hit = reader.stats()["store_hit_blocks"] > 0
    assert hit, f"no store hit within 10 s of Redis's restart; last error: {store.last_error}"
    assert store.stats()["bytes_held"] > 0
