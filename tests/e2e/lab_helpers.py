"""Helpers for the browser tests: throw-away JupyterLab and classic Notebook servers, and when to skip.

Each server runs from a temporary folder with its own config, runtime, data,
workspace, settings and IPython dirs, so a learner's own Jupyter set-up
neither affects the test nor is touched by it.

The classic frontend runs from a second venv, ``.venv-classic/``, holding
Colab's widget pins (tests/colab_preinstalled.txt) and reaching the course's
own venv (torch, matplotlib, swkv_teach) through a ``.pth`` file placed
after its own packages, so its kernel imports ipywidgets 7.7.1, not 8.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
REQUIRE_ENV = "SWKV_REQUIRE_E2E"


def skip_or_fail(reason: str) -> None:
    """Skip with ``reason``; fail instead when CI demands the browser test (SWKV_REQUIRE_E2E=1)."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason}, and {REQUIRE_ENV}=1 says this test must run")
    pytest.skip(reason)


@contextmanager
def launched_chromium(artifacts: Path):
    """Headless Chromium through playwright, closed afterwards; ``artifacts`` made for screenshots. Skips (or
    fails, under SWKV_REQUIRE_E2E=1) when Chromium or playwright is missing."""
    if not os.path.exists(CHROMIUM):
        skip_or_fail(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip_or_fail("the playwright package is not installed (pip install -e '.[test]')")
    artifacts.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def jupyter_lab(root: Path, tmp: Path, timeout: float = 90):
    """Start JupyterLab serving ``root``; yield its base URL and token; always shut it down."""
    port, token = free_port(), secrets.token_hex(16)
    dirs = {name: tmp / name for name in ("config", "runtime", "data", "workspaces", "settings", "ipython")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    # no news/update toast over the page
    notif = dirs["settings"] / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True, exist_ok=True)
    (notif / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(dirs["config"]), JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
               JUPYTER_DATA_DIR=str(dirs["data"]), JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]),
               JUPYTERLAB_SETTINGS_DIR=str(dirs["settings"]), IPYTHONDIR=str(dirs["ipython"]), MPLBACKEND="agg")
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
           "--ServerApp.port_retries=0"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--ServerApp.allow_root=True")
    log = open(tmp / "jupyterlab.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {proc.returncode}; log:\n{(tmp / 'jupyterlab.log').read_text()}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not answer within {timeout} s")
            time.sleep(0.5)
        yield base, token
    finally:
        _stop(proc, base, token)
        log.close()


def _wait_until_up(proc, url: str, log_path: Path, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; log:\n{log_path.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer within {timeout} s; log:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.5)


# Colab's pins (googlecolab/backend-info pip-freeze.txt, see tests/colab_preinstalled.txt)
CLASSIC_PINS = ["notebook==6.5.7", "ipywidgets==7.7.1", "widgetsnbextension==3.6.10", "ipykernel==6.17.1",
                "traitlets==5.7.1", "ipython==7.34.0"]


def classic_python(root: Path) -> Path:
    """``root/.venv-classic``'s python, creating the venv (about 30 s, from PyPI) when missing or stale."""
    venv = root / ".venv-classic"
    python, marker = venv / "bin" / "python", venv / ".swkv-pins"
    if not (python.exists() and marker.exists() and marker.read_text() == " ".join(CLASSIC_PINS)):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True)
        pip = subprocess.run([str(python), "-m", "pip", "install", "-q", *CLASSIC_PINS], capture_output=True, text=True)
        if pip.returncode:
            raise RuntimeError(f"pip could not install {CLASSIC_PINS} into {venv}:\n{pip.stderr[-2000:]}")
        marker.write_text(" ".join(CLASSIC_PINS))
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    ours = next(p for p in sys.path if p.endswith("site-packages"))
    # 'zz': .pth files are read in name order, so this path comes after the classic venv's own packages
    (Path(site) / "zz_swkv_course_venv.pth").write_text(ours + "\n" + str(root) + "\n")
    return python


@contextmanager
def classic_notebook(root: Path, tmp: Path, python: Path, timeout: float = 90):
    """Start the classic Notebook (6.5) from ``python``'s venv serving ``root``; yield base URL and token."""
    port, token = free_port(), secrets.token_hex(16)
    dirs = {name: tmp / f"classic-{name}" for name in ("config", "runtime", "data", "ipython")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(dirs["config"]), JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
               JUPYTER_DATA_DIR=str(dirs["data"]), IPYTHONDIR=str(dirs["ipython"]), MPLBACKEND="agg",
               PYDEVD_DISABLE_FILE_VALIDATION="1")
    cmd = [str(python), "-m", "notebook", "--no-browser", f"--port={port}", "--NotebookApp.ip=127.0.0.1",
           f"--NotebookApp.token={token}", f"--NotebookApp.notebook_dir={root}", "--NotebookApp.port_retries=0"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log_path = tmp / "classic-notebook.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(proc, f"{base}/api/status?token={token}", log_path, "the classic Notebook", timeout)
        yield base, token
    finally:
        _stop(proc, base, token)
        log.close()


def _stop(proc: subprocess.Popen, base: str, token: str) -> None:
    # kernels run in sessions of their own: ask the server to shut them down with itself first
    try:
        req = urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST")
        urllib.request.urlopen(req, timeout=5).close()
        proc.wait(timeout=15)
    except Exception:
        pass
    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue


def copy_notebook(src: Path, dest_dir: Path) -> Path:
    """A copy to open, without outputs or execution counts, so the lab's autosave can never rewrite the stored
    lesson, and "every code cell has an execution count" means this run reached it (the stored lesson has counts)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    nb = json.loads(src.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    dest = dest_dir / src.name
    dest.write_text(json.dumps(nb, indent=1))
    return dest
