"""``swkv-teach grade PATH... [--out DIR] [--timeout S] [--jobs N] [--memory 4G] [--cpu S]``: grade notebooks.

For each notebook (or every ``*.ipynb`` under a folder) it

1. reads the file once, never writes it (a copy runs, in a scratch folder);
2. finds its exercises: cells tagged ``{"swkv": {"exercise": ...}}``, cells
   calling a ``check_*`` function, or an exercise's name in the file name;
3. runs the copy top to bottom in a fresh kernel (errors do not stop it; a
   cell running past ``--timeout`` seconds is interrupted), then runs the
   *official* check of each exercise (from :data:`~swkv_teach.grading.EXERCISES`,
   not the submission's possibly edited check cell) on what the notebook defined;
   the kernel is capped (:mod:`.limits`: address space ``--memory``, CPU time
   ``--cpu``), and the row says which cap a notebook hit; it talks to the grader
   over Unix sockets, not TCP ports (:mod:`.kernel`), where the platform has them;
4. writes ``gradebook.csv`` (one row per notebook: points per exercise, total,
   max, status, reason) and ``feedback/<notebook>.txt`` with each check's message;
   for folders laid out ``SUBMISSIONS/<student>/*.ipynb`` also ``students.csv``
   (one row per student, flagging cells changed from the release: :mod:`.students`).

Malformed files, crashed kernels, infinite loops and deleted cells each get a
row and a reason. The exit status is 0 whenever grading completed, whatever
the scores.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import secrets
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from swkv_teach.grading import EXERCISES
from swkv_teach.grading.limits import KERNEL_ENV, Limits, hit_memory_limit

__all__ = ["find_exercises", "grade_notebook", "main"]

CHECK_TIMEOUT_ENAME = "CellTimeout"


def find_exercises(nb, filename: str = "") -> list[str]:
    """Exercise ids a notebook attempts, from metadata, check calls and the file name."""
    found = set()
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {}).get("swkv", {})
        if isinstance(meta, dict) and str(meta.get("exercise", "")) in EXERCISES:
            found.add(str(meta["exercise"]))
        if cell.get("cell_type") == "code":
            src = cell.get("source", "")
            src = "".join(src) if isinstance(src, list) else str(src)
            found |= {e.id for e in EXERCISES.values() if re.search(rf"\b{e.check}\s*\(", src)}
    found |= {e.id for e in EXERCISES.values() if e.slug in filename}
    return sorted(found)


def _official_check(ex_id: str, nonce: str):
    import nbformat

    e = EXERCISES[ex_id]
    src = (f"from swkv_teach.grading import {e.check} as _swkv_check\n"
           f"_swkv_check({e.target})\n"
           f"print('{nonce} {ex_id} PASSED')")
    return nbformat.v4.new_code_cell(src, metadata={"swkv_official": ex_id})


def _error_text(cell) -> str | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            ename, evalue = out.get("ename", "Error"), str(out.get("evalue", "")).strip()
            if ename == "ExerciseFailed":
                return evalue
            return f"{ename}: {evalue}" if evalue else ename
    return None


def clip(text: str, limit: int = 240) -> str:
    """``text`` cut to at most ``limit`` characters at a sentence or word boundary, "…" marking the cut."""
    if len(text) <= limit:
        return text
    head = text[:limit - 1]
    sentence = max(head.rfind(mark) for mark in (". ", "; ", ": "))
    if sentence >= limit // 2:
        return head[:sentence + 1] + " …"
    word = head.rfind(" ")
    return (head[:word] if word > 0 else head).rstrip(" ,;:") + "…"


def _first_line(text: str) -> str:
    """A one-line summary: an ExerciseFailed's case and its first detail, or an error's first line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].startswith("❌"):
        return clip(f"{lines[0][2:]}: {lines[1]}")
    return clip(lines[0] if lines else text)


def grade_notebook(path: Path, timeout: float = 60, display: str | None = None, memory: str | int | None = "4G",
                   cpu: float | None = 600) -> dict:
    """Grade one notebook; never raises. Returns the gradebook row plus ``feedback`` text.

    ``memory`` (e.g. ``"2G"``) and ``cpu`` (seconds) cap the notebook's kernel; ``None`` leaves it uncapped.
    """
    display = display or str(path)
    row = {"notebook": display, "exercises": {}, "status": "", "reason": "", "feedback": []}
    try:
        return _grade(path, timeout, row, Limits(memory, cpu))
    except Exception as e:  # the grader's own safety net: a row, never a traceback
        row["status"], row["reason"] = "grader error", clip(f"{type(e).__name__}: {e}", 300)
        return row


def _kernel_process(client):
    provisioner = getattr(client.km, "provisioner", None)
    return getattr(provisioner, "process", None)


def _preload(client, nb, ids: list[str], timeout: float) -> str | None:
    """Load torch and the checks in the kernel before it is capped (:func:`.limits.preload`); None, or what failed.

    Run as a cell at index 0 that is taken out again, so the notebook's own cells keep their numbers and
    the student's namespace gets no name from it. Its time limit is the larger of ``timeout`` and 300 s:
    importing transformers or Triton on a slow machine is not the student's time.
    """
    import nbformat
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    cell = nbformat.v4.new_code_cell(f"__import__('swkv_teach.grading.limits', fromlist=['preload']).preload({ids!r})")
    nb.cells.insert(0, cell)
    saved, client.timeout = client.timeout, max(timeout, 300)
    try:
        client.execute_cell(cell, 0)
    except (CellTimeoutError, DeadKernelError) as e:
        return f"{type(e).__name__}: {_first_line(str(e))}"
    finally:
        client.timeout = saved
        nb.cells.pop(0)
    error = _error_text(cell)
    return _first_line(error) if error else None


def _grade(path: Path, timeout: float, row: dict, limits: Limits) -> dict:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError
    from traitlets.config import Config

    from swkv_teach.grading.kernel import ipc_config

    try:
        data = path.read_bytes()
        nb = nbformat.reads(data.decode("utf-8"), as_version=4)
        nbformat.validate(nb)
    except Exception as e:
        row["status"] = "unreadable"
        row["reason"] = f"not a valid notebook ({type(e).__name__}: {_first_line(str(e))})"
        return row

    ids = find_exercises(nb, path.name)
    if not ids:
        row["status"], row["reason"] = "no exercises", "no check_* call, no exercise metadata, no exercise in the file name"
        return row
    row["exercises"] = {i: None for i in ids}

    nonce = secrets.token_hex(8)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    learner_cells = len(nb.cells)
    nb.cells += [_official_check(i, nonce) for i in ids]

    sockets = tempfile.TemporaryDirectory(prefix="swkv-ipc-")  # private (0700), apart from the notebook's cwd
    config = Config()
    config.KernelManager.update(ipc_config(sockets.name))
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", allow_errors=True, interrupt_on_timeout=True,
        error_on_timeout={"ename": CHECK_TIMEOUT_ENAME, "evalue": f"the cell ran longer than {timeout:g} s and was "
                          "interrupted (an infinite loop?)", "traceback": []},
        record_timing=False, startup_timeout=120, config=config,
    )
    timed_out: set[int] = set()

    def note_timeout(cell=None, cell_index=None, execute_reply=None, **_):
        if (execute_reply or {}).get("content", {}).get("ename") == CHECK_TIMEOUT_ENAME:
            timed_out.add(cell_index)

    died_at, death, uncapped = None, None, None
    with sockets, tempfile.TemporaryDirectory(prefix="swkv-grade-") as scratch:
        client.resources = {"metadata": {"path": scratch}}
        try:
            with client.setup_kernel(env={**os.environ, **KERNEL_ENV}):
                process = _kernel_process(client)
                failed = _preload(client, nb, ids, timeout)
                if failed:
                    row["status"] = "grader error"
                    row["reason"] = clip(f"the grading kernel could not load torch and the checks ({failed}), so no "
                                         "cell of the notebook ran: fix the grader's Python environment", 300)
                    return row
                uncapped = limits.apply(process.pid) if process else "no local kernel process to cap"
                client.on_cell_executed = note_timeout
                for index, cell in enumerate(nb.cells):
                    if cell.cell_type != "code":
                        continue
                    try:
                        client.execute_cell(cell, index)
                    except DeadKernelError:
                        died_at = index
                        try:
                            death = limits.death(process.wait(timeout=10) if process else None)
                        except Exception:
                            death = None
                        break
        except DeadKernelError:
            died_at = died_at if died_at is not None else 0
        except RuntimeError as e:
            if died_at is None:
                row["status"], row["reason"] = "kernel error", clip(f"the kernel could not run the notebook: {e}", 300)
                return row

    timeouts = sorted(i for i in timed_out if i < learner_cells)
    raised = [(i, _error_text(c)) for i, c in enumerate(nb.cells[:learner_cells])
              if c.cell_type == "code" and _error_text(c) and i not in timeouts]

    fb = row["feedback"]
    for n, ex_id in enumerate(ids):
        e = EXERCISES[ex_id]
        cell = nb.cells[learner_cells + n]
        text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        ok = f"{nonce} {ex_id} PASSED" in text and not _error_text(cell)
        row["exercises"][ex_id] = e.points if ok else 0
        if ok:
            msg = next((ln for ln in text.splitlines() if ln.startswith("✅")), "passed")
            fb.append(f"[{ex_id}] {e.check}({e.target}): passed, {e.points}/{e.points} points\n    {msg}")
        elif died_at is not None:
            fb.append(f"[{ex_id}] {e.check}({e.target}): not run (the kernel died), 0/{e.points} points")
        else:
            why = _error_text(cell) or "the check did not finish"
            if learner_cells + n in timed_out:
                why = f"the check ran longer than {timeout:g} s (does your code loop forever?)"
            fb.append(f"[{ex_id}] {e.check}({e.target}): failed, 0/{e.points} points\n" +
                      "\n".join("    " + ln for ln in why.splitlines()))

    out_of_memory = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and limits.memory_capped
                     and hit_memory_limit(_error_text(c) or "")]
    if died_at is not None:
        where = f"cell {died_at + 1} of {learner_cells}" if died_at < learner_cells else "an exercise check"
        if death:
            row["status"], why = death.split(": ", 1)
            row["reason"] = f"{why}, while running {where}"
        else:
            row["status"] = "kernel died"
            row["reason"] = f"the kernel died while running {where} (os._exit, a crash, or out of memory)"
    elif out_of_memory:
        first = out_of_memory[0]
        where = f"cell {first + 1} of {learner_cells}" if first < learner_cells else "an exercise check"
        row["status"] = "memory limit"
        row["reason"] = (f"{where} hit the memory limit ({limits.describe().split(' and ')[0]}) and was stopped; "
                         f"{sum(1 for pts in row['exercises'].values() if pts)} of {len(ids)} exercise(s) passed")
    elif timeouts:
        row["status"] = "timeout"
        row["reason"] = f"cell {timeouts[0] + 1} of {learner_cells} ran longer than {timeout:g} s and was interrupted"
    else:
        failed = [i for i, pts in row["exercises"].items() if not pts]
        # The official checks ran: one that did not pass is "failed" whatever the notebook's own cells showed
        # (a check cell replaced by a fake "✅" raises nothing); "errors" is left for right answers beside
        # cells that raised.
        row["status"] = "failed" if failed else "errors" if raised else "ok"
        entries = [next(f for f in fb if f.startswith(f"[{ex_id}]")) for ex_id in failed]
        verdicts = [_first_line(e.split("\n", 1)[1].strip() if "\n" in e else e) for e in entries]
        reasons = [f"exercise {failed[0]} failed: {verdicts[0]}"] if failed else []
        # A learner's own check cell raises the verdict the official check just gave: say it once.
        others = [(i, t) for i, t in raised if _first_line(t) not in verdicts]
        if others:
            n = len(others)
            reasons.append(f"{n} {'other ' if failed else ''}cell{'s' * (n > 1)} raised, first: cell "
                           f"{others[0][0] + 1}: {_first_line(others[0][1])}")
        row["reason"] = "; ".join(reasons) or "all checks passed"
    if uncapped:
        fb.append(f"Note: {uncapped}.")
    if raised:
        fb.append("Cells that raised an error:\n" + "\n".join(f"    cell {i + 1}: {_first_line(t)}" for i, t in raised))
    return row


# ------------------------------------------------------------------------------------ the command
def _collect(paths: list[str]) -> list[Path]:
    found = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(q for q in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in q.parts)
        else:
            found.append(p)
    seen, out = set(), []
    for p in found:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            out.append(p)
    return out


def _feedback_name(display: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "__", display.strip("./")) + ".txt"


def _write(rows: list[dict], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "feedback").mkdir(exist_ok=True)
    ex_ids = sorted(EXERCISES)
    book = out / "gradebook.csv"
    with book.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["notebook"] + [f"ex{i}" for i in ex_ids] + ["total", "max", "status", "reason"])
        for r in rows:
            pts = r["exercises"]
            total = sum(v or 0 for v in pts.values())
            most = sum(EXERCISES[i].points for i in pts)
            w.writerow([r["notebook"]] + ["" if pts.get(i) is None else pts[i] for i in ex_ids]
                       + [total, most, r["status"], r["reason"]])
    for r in rows:
        pts = r["exercises"]
        total, most = sum(v or 0 for v in pts.values()), sum(EXERCISES[i].points for i in pts)
        text = [f"Notebook: {r['notebook']}", f"Status:   {r['status']} ({r['reason']})", f"Score:    {total}/{most}"]
        text += [""] + r["feedback"] if r["feedback"] else []
        (out / "feedback" / _feedback_name(r["notebook"])).write_text("\n".join(text).rstrip("\n") + "\n")
    return book


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="swkv-teach grade", description="Grade notebooks into a CSV gradebook.")
    ap.add_argument("paths", nargs="+", help="notebooks, or folders searched for *.ipynb")
    ap.add_argument("--out", type=Path, default=Path("gradebook"), help="output folder (default: gradebook)")
    ap.add_argument("--timeout", type=float, default=60, help="seconds per cell before it is interrupted (default 60)")
    ap.add_argument("--jobs", type=int, default=1, help="notebooks graded at once (default 1)")
    ap.add_argument("--memory", default="4G", help="address-space cap per notebook kernel, e.g. 2G (default 4G; none: no cap)")
    ap.add_argument("--cpu", type=float, default=600, help="CPU seconds per notebook kernel (default 600)")
    ap.add_argument("--released", type=Path, default=None,
                    help="the released exercise notebooks, to flag changed cells in students.csv (default: ./exercises "
                         "if it exists, else the exercises shipped with the package)")
    args = ap.parse_args(argv)
    if args.jobs < 1 or args.timeout <= 0:
        ap.error("--jobs must be >= 1 and --timeout > 0")
    memory = None if str(args.memory).lower() == "none" else args.memory
    try:
        Limits(memory, args.cpu)
    except ValueError as e:
        ap.error(str(e))

    from tqdm import tqdm

    notebooks = _collect(args.paths)
    if not notebooks:
        print("swkv-teach grade: no notebooks found in " + " ".join(args.paths), file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows: dict[int, dict] = {}
    with ThreadPoolExecutor(max_workers=args.jobs) as pool, tqdm(total=len(notebooks), unit="nb", desc="grading") as bar:
        futures = {pool.submit(grade_notebook, p, args.timeout, str(p), memory, args.cpu): n for n, p in enumerate(notebooks)}
        for fut in as_completed(futures):
            rows[futures[fut]] = fut.result()
            bar.update(1)
    from swkv_teach.grading.students import default_released, write_students

    ordered = [rows[n] for n in range(len(notebooks))]
    book = _write(ordered, args.out)
    folders = [Path(p) for p in args.paths if Path(p).is_dir()]
    released = args.released if args.released is not None else default_released()
    students = write_students(ordered, notebooks, folders, released, args.out)
    print(f"swkv-teach grade: {len(notebooks)} notebook(s) in {time.perf_counter() - t0:.0f} s -> {book}"
          + (f", {students}" if students else "") + f" and {args.out / 'feedback'}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
