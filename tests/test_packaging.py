"""The set-up a newcomer runs: pyproject, environment.yml, Makefile, README and CI agree."""

import re
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent


def requirement_names(reqs):
    return {re.split(r"[<>=!~\[ ;@]", r.strip(), maxsplit=1)[0].lower() for r in reqs}


def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_environment_yml_lists_the_same_dependencies_as_pyproject():
    text = (ROOT / "environment.yml").read_text()
    # the entries nested under "- pip:" (indented deeper than the conda ones)
    pip_block = text.split("- pip:", 1)[1]
    pip_lines = [m.group(1) for m in re.finditer(r"^\s{6,}- (.+)$", pip_block, re.M)]
    deps = [p for p in pip_lines if not p.startswith("-e")]
    assert requirement_names(deps) == requirement_names(pyproject()["project"]["dependencies"])
    assert any(p.startswith("-e .") for p in pip_lines), "environment.yml must install the package itself"
    assert re.search(r"^\s+- python=3\.\d+$", text, re.M), "environment.yml must pin the Python version"
    assert re.search(r"^name: \S+", text, re.M)


def test_torch_is_required_but_not_pinned():
    deps = pyproject()["project"]["dependencies"]
    torch = [d for d in deps if requirement_names([d]) == {"torch"}]
    assert torch == ["torch"], f"Colab and GPU machines bring their own torch; got {torch}"


def test_the_core_dependencies_of_the_design_are_declared():
    names = requirement_names(pyproject()["project"]["dependencies"])
    assert {"torch", "ipywidgets", "matplotlib"} <= names
    # JupyterLab and the test tools are extras: Colab installs only the required list into its runtime
    assert not names & {"jupyterlab", "nbval", "pytest", "notebook", "jupyter"}, names
    extras = pyproject()["project"]["optional-dependencies"]
    assert "jupyterlab" in requirement_names(extras["lab"])
    assert {"pytest", "hypothesis", "nbval", "jupytext"} <= requirement_names(extras["test"])
    assert "transformers" in requirement_names(extras["hf"])


def test_readme_shows_the_two_commands_and_ci_calls_make_test():
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci and "TORCH_SPEC=" in ci


def test_makefile_targets_and_root_flag():
    mk = (ROOT / "Makefile").read_text()
    for target in ("lab:", "test:", "gpu-check:"):
        assert re.search(rf"^{target}", mk, re.M), target
    assert "--allow-root" in mk, "JupyterLab refuses to start as root without it"
    assert "TORCH_SPEC ?=" in mk


def test_console_script_and_subcommands_resolve():
    import importlib.util

    from swkv_teach.cli import COMMANDS

    assert pyproject()["project"]["scripts"]["swkv-teach"] == "swkv_teach.cli:main"
    for name, (module, _) in COMMANDS.items():
        assert importlib.util.find_spec(module) is not None, f"swkv-teach {name}: module {module} is missing"


def test_gitignore_keeps_junk_out():
    ignored = (ROOT / ".gitignore").read_text().split()
    for pattern in (".venv/", "__pycache__/", ".ipynb_checkpoints/", ".pytest_cache/", ".hypothesis/"):
        assert pattern in ignored
