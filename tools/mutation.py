"""Mutation testing over a curated list of single-point bugs: does the test suite catch them?

``make mutation`` (or ``.venv/bin/python tools/mutation.py``) plants each mutant of
``tests/mutants/catalogue.py`` in turn, one at a time, into a *copy* of the project
made in a temporary folder (the working tree is never touched: other people may be
editing it), runs that mutant's own tests against the copy (``pytest -x``, the working
directory and ``PYTHONPATH`` pointing at the copy), and reports which mutants the tests
*killed* (some test failed) and which *survived* (every test passed: a bug the suite
would not notice). Each run is a child forked from this process, which has imported
torch, matplotlib and hypothesis once but never swkv_teach (on a loaded 2-core machine
the imports were most of a run: ~60 s a mutant in fresh interpreters, ~5 s forked);
``--no-fork`` starts a fresh interpreter per run instead (and is used where fork is not).

Statuses:

* ``killed``   a test failed (or the run errored, or ran past ``--timeout``: a hang is caught too);
* ``survived`` every selected test passed with the bug in place;
* ``stale``    the mutant's original snippet is not in the file exactly once (the code moved on:
  update the catalogue); not counted in the kill rate;
* ``unsound``  the mutant's tests fail *without* the mutant (a broken baseline proves nothing);
  not counted either.

Kill rate = killed / (killed + survived). Exit status 0 when every counted mutant
is killed, 1 when some survive, 2 on a usage error.

Usage::

    python tools/mutation.py                 # every mutant, copy of the working tree
    python tools/mutation.py --list          # the catalogue, one line each
    python tools/mutation.py --only ring-slot-positions lru-evict-ge
    python tools/mutation.py --rev HEAD      # copy a commit (git archive) instead of the working tree;
                                             # its missing test files are dropped from each selection
    python tools/mutation.py --json out.json # also write the results as JSON
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "tests" / "mutants" / "catalogue.py"
# Never copied: environments, caches, the git directory, build outputs.
SKIP = {".venv", ".git", ".pytest_cache", ".hypothesis", "__pycache__", "build", "dist", ".ipynb_checkpoints"}


def load_catalogue(path: Path = CATALOGUE) -> list:
    """The ``MUTANTS`` list of ``path`` (loaded by file, so the copy's tests package is not imported here)."""
    spec = importlib.util.spec_from_file_location("_swkv_mutants", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module.MUTANTS


def snapshot(dest: Path, rev: str | None) -> None:
    """Copy the project into ``dest``: the working tree's tracked and untracked (not ignored) files, or ``rev``."""
    if rev:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if not src.is_file() or SKIP & set(Path(rel).parts):
            continue  # deleted in the working tree but still in the index, or junk
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def pytest_command(python: str, tests: list[str]) -> list[str]:
    # -x: the first failure is enough (a mutant names the tests that guard it: slow ones only where needed);
    # -p no:cacheprovider: nothing written beside the copy's tests.
    return [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-o", "addopts=",
            *tests]


def _outcome(rc: int | None, out: str, timeout: float, seconds: float) -> tuple[str, str, float]:
    if rc is None:
        return "timeout", f"ran past {timeout:g} s", seconds
    if rc == 0:
        return "passed", "", seconds
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, flags=re.M)
    detail = failed[0] if failed else (out.strip().splitlines() or [f"exit status {rc}"])[-1]
    if rc == 5:
        detail = "no tests were collected: " + detail
    return "failed", detail, seconds


def run_tests(copy: Path, python: str, tests: list[str], timeout: float) -> tuple[str, str, float]:
    """Run ``tests`` in ``copy`` in a fresh interpreter; return (outcome, detail, seconds), outcome "passed",
    "failed" or "timeout"."""
    env = dict(os.environ, PYTHONPATH=str(copy), OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("SWKV_DEVICE", None)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(pytest_command(python, tests), cwd=copy, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return _outcome(None, "", timeout, time.perf_counter() - t0)
    return _outcome(proc.returncode, proc.stdout + proc.stderr, timeout, time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------- fork mode
# On a loaded machine, importing torch, matplotlib and hypothesis takes most of a mutant's run. In fork
# mode this process imports them once (never swkv_teach or the tests) and each run is a forked child that
# imports the copy's swkv_teach afresh and calls pytest.main: the same tests, a fraction of the start-up.
PRELOAD = ("torch", "numpy", "matplotlib", "matplotlib.pyplot", "hypothesis", "pytest", "nbformat")


def preload() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("MPLBACKEND", "Agg")
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    leaked = [m for m in sys.modules if m == "swkv_teach" or m.startswith(("swkv_teach.", "tests."))]
    if leaked:
        raise SystemExit(f"mutation: preloading imported {leaked[:3]}; fork mode needs a clean parent")


def _forked(copy: Path, body, timeout: float) -> tuple[int | None, str, float]:
    """Run ``body()`` (returns an exit status) in a forked child inside ``copy``; (status or None, output, s)."""
    with tempfile.TemporaryFile() as log:
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            rc = 70
            try:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                os.chdir(copy)
                sys.path.insert(0, str(copy))
                os.environ["PYTHONPATH"] = str(copy)
                os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
                sys.dont_write_bytecode = True
                os.environ.pop("SWKV_DEVICE", None)
                rc = int(body())
            except BaseException as e:  # noqa: BLE001 (report anything, then leave)
                print(f"mutation child: {type(e).__name__}: {e}", flush=True)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc)
        rc = None
        while time.perf_counter() - t0 < timeout:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.2)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        seconds = time.perf_counter() - t0
        log.seek(0)
        return rc, log.read().decode(errors="replace"), seconds


def run_tests_forked(copy: Path, tests: list[str], timeout: float) -> tuple[str, str, float]:
    def body():
        import pytest

        return pytest.main(pytest_command("", tests)[3:])  # the arguments after "python -m pytest"

    rc, out, seconds = _forked(copy, body, timeout)
    return _outcome(rc, out, timeout, seconds)


def check_copy_is_imported_forked(copy: Path) -> None:
    def body():
        import swkv_teach

        return 0 if Path(swkv_teach.__file__).resolve().is_relative_to(copy.resolve()) else 3

    rc, out, _ = _forked(copy, body, 600)
    if rc != 0:
        raise SystemExit(f"mutation: a forked child does not import the copy's swkv_teach (status {rc}): {out}")


def check_copy_is_imported(copy: Path, python: str) -> None:
    """Refuse to run when the copy's swkv_teach is not the one a test would import (an installed copy winning)."""
    env = dict(os.environ, PYTHONPATH=str(copy))
    where = subprocess.run([python, "-c", "import swkv_teach; print(swkv_teach.__file__)"], cwd=copy, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(copy.resolve()):
        raise SystemExit(f"mutation: the tests would import {where}, not the copy in {copy}; nothing was run")


def existing(copy: Path, tests: list[str]) -> list[str] | None:
    """``tests`` without the files the copy lacks (an older revision); None when no test file is left."""
    out, paths, skip = [], 0, False
    for a in tests:
        if skip or a.startswith("-"):
            out.append(a)
            skip = a in ("-k", "-m")
            continue
        if (copy / a.split("::")[0]).exists():
            out.append(a)
            paths += 1
    return out if paths else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="ID", help="run only these mutants")
    ap.add_argument("--list", action="store_true", help="print the catalogue and exit")
    ap.add_argument("--rev", help="copy this git revision instead of the working tree")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mutant's test run (default 600)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that runs pytest (default: this one)")
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    ap.add_argument("--no-fork", action="store_true",
                    help="start a fresh interpreter for every run instead of forking a preloaded one")
    args = ap.parse_args(argv)

    mutants = load_catalogue()
    if args.list:
        for m in mutants:
            print(f"{m.id:<34} {m.file:<36} {m.why}")
        return 0
    if args.only:
        unknown = set(args.only) - {m.id for m in mutants}
        if unknown:
            ap.error(f"no mutant named {', '.join(sorted(unknown))} (see --list)")
        mutants = [m for m in mutants if m.id in args.only]

    results = []
    with tempfile.TemporaryDirectory(prefix="swkv-mutation-") as tmp:
        copy = Path(tmp) / "project"
        copy.mkdir()
        snapshot(copy, args.rev)
        fork = hasattr(os, "fork") and not args.no_fork
        if fork:
            preload()
            check_copy_is_imported_forked(copy)

            def run(tests):
                return run_tests_forked(copy, tests, args.timeout)
        else:
            check_copy_is_imported(copy, args.python)

            def run(tests):
                return run_tests(copy, args.python, tests, args.timeout)
        baseline: dict[tuple, tuple[str, str, float]] = {}
        where = args.rev or "the working tree"
        print(f"mutation: {len(mutants)} mutant(s) on a copy of {where} in {copy}", flush=True)
        for n, m in enumerate(mutants, 1):
            path = copy / m.file
            original = path.read_text() if path.is_file() else ""
            count = original.count(m.original)
            if count != 1:
                status, detail, seconds = "stale", f"the original snippet occurs {count} times in {m.file}", 0.0
            else:
                tests = existing(copy, m.tests)
                key = tuple(tests or ())
                if tests is not None and key not in baseline:  # the same tests without any mutant: they must pass
                    baseline[key] = run(tests)
                base = baseline.get(key)
                if tests is None:  # e.g. --rev of a commit before its tests were written: nothing guards it
                    status, detail, seconds = "survived", "none of its test files exists in this copy", 0.0
                elif base[0] != "passed":
                    status, detail, seconds = "unsound", f"fails without the mutant: {base[1]}", 0.0
                else:
                    path.write_text(original.replace(m.original, m.mutated))
                    try:
                        outcome, detail, seconds = run(tests)
                    finally:
                        path.write_text(original)
                    status = "survived" if outcome == "passed" else "killed"
                    if outcome == "timeout":
                        detail = "timeout: " + detail
            results.append({"id": m.id, "file": m.file, "why": m.why, "status": status, "detail": detail,
                            "seconds": round(seconds, 1)})
            print(f"[{n:>2}/{len(mutants)}] {status:<8} {m.id:<34} {seconds:6.1f} s  {detail}", flush=True)

    counted = [r for r in results if r["status"] in ("killed", "survived")]
    killed = sum(r["status"] == "killed" for r in counted)
    rate = killed / len(counted) if counted else float("nan")
    print()
    print(f"kill rate: {killed}/{len(counted)} = {100 * rate:.0f}%"
          + "".join(f"; {s} {sum(r['status'] == s for r in results)}" for s in ("stale", "unsound")
                    if any(r["status"] == s for r in results)))
    for r in results:
        if r["status"] != "killed":
            print(f"  {r['status']:<8} {r['id']}: {r['why']} ({r['detail'] or 'every selected test passed'})")
    if args.json:
        args.json.write_text(json.dumps({"kill_rate": rate, "killed": killed, "counted": len(counted),
                                         "results": results}, indent=1) + "\n")
    return 0 if killed == len(counted) else 1


if __name__ == "__main__":
    sys.exit(main())
