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
