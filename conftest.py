"""Root conftest: how nbval compares the stored notebooks in notebooks/ and solutions/.

Figures (image/png) are already skipped by nbval; widget views carry random
model ids and HTML reprs carry object ids, so those are skipped too. Text
outputs, which carry the lessons' numbers, are compared strictly.
"""


def pytest_collectstart(collector):
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += (
            "text/html",
            "application/vnd.jupyter.widget-view+json",
        )


# Lesson 12 runs a real redis-server (swkv_teach.store.RedisServer): without one its stored outputs cannot be
# reproduced, so its cells are skipped with the reason, unless SWKV_REQUIRE_REDIS=1 (CI), where that fails instead.
def pytest_collection_modifyitems(config, items):
    import importlib.util
    import os
    import shutil

    import pytest

    lessons = [i for i in items if str(getattr(i, "fspath", "")).endswith("12_prefix_caching.ipynb")]
    if not lessons or os.environ.get("SWKV_REQUIRE_REDIS", "").strip() not in ("", "0"):
        return
    why = ("redis-server is not installed (apt-get install redis-server)" if shutil.which("redis-server") is None
           else "the redis client is not installed (pip install redis)" if importlib.util.find_spec("redis") is None
           else None)
    if why:
        for item in lessons:
            item.add_marker(pytest.mark.skip(reason=f"lesson 12 needs a real Redis: {why}"))
