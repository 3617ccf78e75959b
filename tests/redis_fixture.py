"""A real redis-server for the tests: 127.0.0.1, a free port, no persistence; stopped at the end.

Skipped, with the reason, when ``redis-server`` or the ``redis`` client is missing, unless
``SWKV_REQUIRE_REDIS=1`` (``.ci/run`` sets it and installs Debian's redis-server): then it fails.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

REQUIRE = os.environ.get("SWKV_REQUIRE_REDIS", "").strip() not in ("", "0")


def missing() -> str | None:
    """Why a real Redis cannot be used here, or None."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (apt-get install redis-server)"
    if importlib.util.find_spec("redis") is None:
        return "the redis client is not installed (pip install redis, or the test extra)"
    return None


def require_redis() -> None:
    why = missing()
    if why and REQUIRE:
        pytest.fail(f"SWKV_REQUIRE_REDIS=1 but {why}")
    if why:
        pytest.skip(why)


@pytest.fixture
def redis_server():
    """A fresh, empty redis-server for one test (``.url``, ``.stop()``, ``.start()`` restarts on the same port)."""
    require_redis()
    from swkv_teach.store import RedisServer

    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()
