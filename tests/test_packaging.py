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
    """Colab and GPU machines bring their own torch: a floor for the APIs we use, never a pin or a ceiling."""
    deps = pyproject()["project"]["dependencies"]
    torch = [d for d in deps if requirement_names([d]) == {"torch"}]
    assert len(torch) == 1 and re.fullmatch(r"torch(>=[\d.]+)?", torch[0].replace(" ", "")), torch
    # the floor admits the torch these machines install (CI pins 2.13.0) and the one Colab ships
    floor = re.search(r">=([\d.]+)", torch[0])
    if floor:
        import torch as installed

        have = tuple(int(x) for x in re.findall(r"\d+", installed.__version__)[:2])
        assert have >= tuple(int(x) for x in floor.group(1).split(".")[:2]), (installed.__version__, torch[0])


def test_the_core_dependencies_of_the_design_are_declared():
    names = requirement_names(pyproject()["project"]["dependencies"])
    assert {"torch", "ipywidgets", "matplotlib"} <= names
    # JupyterLab and the test tools are extras: Colab installs only the required list into its runtime
    assert not names & {"jupyterlab", "nbval", "pytest", "notebook", "jupyter"}, names
    extras = pyproject()["project"]["optional-dependencies"]
    assert "jupyterlab" in requirement_names(extras["lab"])
    assert {"pytest", "hypothesis", "nbval", "jupytext"} <= requirement_names(extras["test"])
    assert "transformers" in requirement_names(extras["hf"])
    assert "nbgrader" in requirement_names(extras["nbgrader"]), "the nbgrader export is tested with the real one"
    assert "nbgrader" in (ROOT / ".ci" / "run").read_text(), "CI must install the nbgrader extra"


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
    lab_recipe = re.search(r"^lab:.*\n\t(.+)$", mk, re.M).group(1)
    # rooted at the course folder: a server rooted at notebooks/ cannot open the lessons' ../exercises/ links
    assert "--ServerApp.root_dir=." in lab_recipe and not re.search(r"\snotebooks/?(\s|$)", lab_recipe), lab_recipe


def test_make_lab_installs_what_the_readme_grading_command_needs():
    """README: `pytest --nbval-lax exercises/...` grades one notebook right after `make lab`."""
    lab = requirement_names(pyproject()["project"]["optional-dependencies"]["lab"])
    assert {"jupyterlab", "pytest", "nbval", "jupytext"} <= lab
    assert "--nbval-lax exercises/" in (ROOT / "README.md").read_text()


def test_console_script_and_subcommands_resolve():
    import importlib.util

    from swkv_teach.cli import COMMANDS

    assert pyproject()["project"]["scripts"]["swkv-teach"] == "swkv_teach.cli:main"
    for name, (module, _) in COMMANDS.items():
        assert importlib.util.find_spec(module) is not None, f"swkv-teach {name}: module {module} is missing"


def test_gitignore_keeps_junk_out():
    ignored = (ROOT / ".gitignore").read_text().split()
    for pattern in (".venv/", ".venv-classic/", "__pycache__/", ".ipynb_checkpoints/", ".pytest_cache/", ".hypothesis/"):
        assert pattern in ignored


# ------------------------------------------------------------------ Colab: the set-up cell adds nothing
COLAB_LIST = ROOT / "tests" / "colab_preinstalled.txt"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def colab_preinstalled() -> dict[str, str | None]:
    """{canonical name: version or None} from Colab's published pip freeze (tests/colab_preinstalled.txt)."""
    pins = {}
    for line in COLAB_LIST.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonical(name)] = version or None
    return pins


def test_the_colab_list_is_colabs_runtime_without_a_jupyterlab():
    """Guards the data file itself: the pins the issue quotes, and none of the tools Colab lacks."""
    pins = colab_preinstalled()
    assert len(pins) > 500, "tests/colab_preinstalled.txt should be Colab's whole pip freeze"
    for name, version in {"ipywidgets": "7.7.1", "ipykernel": "6.17.1", "jupyter-server": "2.20.0",
                          "traitlets": "5.7.1", "widgetsnbextension": "3.6.10", "notebook": "6.5.7"}.items():
        assert pins.get(name) == version, (name, pins.get(name))
    assert "torch" in pins
    assert not {"jupyterlab", "nbval", "jupyter-lsp"} & set(pins)


def test_required_dependencies_are_all_preinstalled_on_colab_at_versions_they_accept():
    """The set-up cell runs `pip install` of the package in Colab's runtime; with every requirement already
    met there, pip installs the package alone and never upgrades Colab's Jupyter stack."""
    from packaging.requirements import Requirement

    pins = colab_preinstalled()
    for text in pyproject()["project"]["dependencies"]:
        req = Requirement(text)
        name = canonical(req.name)
        assert name in pins, f"{req.name} is a required dependency but Colab does not preinstall it; make it an extra"
        version = pins[name]
        assert version is not None, f"Colab's {req.name} has no version in the list"
        assert req.specifier.contains(version, prereleases=True), (
            f"{text!r} rejects Colab's {req.name}=={version}: the set-up cell would replace Colab's copy")


# ------------------------------------------------------------------ the wheel: every package, the released exercises
def test_every_package_is_listed_and_the_released_exercises_are_mapped_into_the_package():
    """pyproject lists the packages (a package-dir mapping rules out `packages.find`): a new subpackage
    left out of the list would be missing from every wheel, so the list must equal what is on disk."""
    setuptools_cfg = pyproject()["tool"]["setuptools"]
    on_disk = {".".join(p.relative_to(ROOT).parts[:-1]) for p in (ROOT / "swkv_teach").rglob("__init__.py")}
    assert set(setuptools_cfg["packages"]) == on_disk | {"swkv_teach.released"}, on_disk
    assert setuptools_cfg["package-dir"] == {"swkv_teach.released": "exercises"}
    assert setuptools_cfg["package-data"]["swkv_teach.released"] == ["*.ipynb"]
    assert not list((ROOT / "swkv_teach").glob("released")), "no second copy of exercises/ in git"


# ------------------------------------------------------------------ issue 35: the torch a newcomer gets
def planned(tmp_path, **variables) -> str:
    """What `make -n test` would run in a fresh venv under ``tmp_path`` with ``variables`` set."""
    import os
    import subprocess

    # As a newcomer's shell has it: no variable from the make that may be running these tests (MAKEFLAGS
    # passes its command-line variables down to every make started under it).
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "TORCH_SPEC", "PINS",
                                                             "TORCH_INDEX", "EXTRAS", "TESTS", "VENV"}}
    args = [f"{k}={v}" for k, v in {"VENV": str(tmp_path / "venv"), **variables}.items()]
    done = subprocess.run(["make", "-n", "test", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_asking_for_another_torch_or_pins_installs_again(tmp_path):
    """The install stamp used to depend on pyproject.toml alone: `make test TORCH_SPEC=torch==2.11.0` after a
    first install ran the old torch in silence. Each request (torch, index, pins, extras) has its own stamp."""
    stamps = set()
    for variables in ({}, {"TORCH_SPEC": "torch==2.11.0"}, {"PINS": "numpy==2.1.3"}, {"EXTRAS": "test"},
                      {"TORCH_INDEX": "https://download.pytorch.org/whl/cpu"}):
        plan = planned(tmp_path, **variables)
        stamp = re.search(r"touch (\S+/\.installed-test-\d+)", plan)
        assert stamp, plan
        stamps.add(stamp.group(1))
    assert len(stamps) == 5, stamps


def test_the_plan_installs_what_was_asked(tmp_path):
    plan = planned(tmp_path, TORCH_SPEC="torch==2.11.0", PINS="numpy==2.1.3 transformers==5.15.0")
    assert re.search(r'pip install "torch==2\.11\.0" numpy==2\.1\.3 transformers==5\.15\.0 -e "\.\[', plan), plan
    assert "--index-url" not in plan
    cpu = planned(tmp_path, TORCH_INDEX="https://download.pytorch.org/whl/cpu")
    first, then = cpu.index('--index-url "https://download.pytorch.org/whl/cpu"'), cpu.index('-e ".[')
    assert first < then, "the CPU build is installed before the course, which then keeps it"
    assert re.search(r'pip install "torch"\s+-e "\.\[', planned(tmp_path)), "nothing set: pip's own pick"


def test_ci_runs_the_newcomers_path_and_colabs_stack():
    ci = (ROOT / ".ci" / "run").read_text()
    newcomer = next(line for line in ci.splitlines() if "VENV=.venv-default" in line)
    assert newcomer.strip().startswith("make test") and "TORCH_SPEC" not in newcomer and "EXTRAS" not in newcomer
    assert 'TESTS="$TORCH_DEPENDENT"' in newcomer
    assert "SWKV_COLAB_STACK=1 make test VENV=.venv-colab" in ci and "tests/colab_preinstalled.txt" in ci
    listed = [line for line in (ROOT / "tests" / "torch_dependent.txt").read_text().splitlines()
              if line and not line.startswith("#")]
    assert listed and all((ROOT / p).exists() for p in listed), [p for p in listed if not (ROOT / p).exists()]
    assert "tests/test_colab_stack.py" in listed, "the pass checks it runs Colab's versions"
