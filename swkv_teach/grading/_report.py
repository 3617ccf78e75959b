"""How a check talks to a learner: one ✅ line on success, one actionable message on failure.

Every check runs the learner's code through :func:`call`, so whatever it does
(raise, return None, return a tuple of the wrong length) becomes an
:class:`ExerciseFailed` that names the case, never a traceback from inside the
grader. Messages follow one shape::

    ❌ SlidingWindowKVCache(window_size=3), step 5 (tokens 0..4 fed so far)
       update() returned the keys of positions [0, 1, 2, 3, 4]
       expected                                [2, 3, 4]
       hint: nothing is evicted: after appending, keep only the last window_size tokens.
"""

from __future__ import annotations

import os
import sysconfig
import traceback

import torch

__all__ = ["TRACEBACK_ENV", "ExerciseFailed", "call", "fail", "grid", "passed", "rehint", "show"]

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the swkv_teach package
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))
_INSTALLED = tuple({p for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]) if p})


TRACEBACK_ENV = "SWKV_TRACEBACK"
TRACEBACK_TIP = f"   (to see the full traceback: run `%env {TRACEBACK_ENV}=1` in a cell, then this check again)"


class ExerciseFailed(AssertionError):
    """A learner's answer is not right yet; the message says which case, what was expected, and a hint.

    A subclass of AssertionError so test runners (nbval, pytest) report it as a failed check.

    In a notebook the learner sees the message alone, not a traceback through ``swkv_teach/grading``:
    IPython asks an exception for ``_render_traceback_()`` before formatting one (IPython 7.34.0,
    ``IPython/core/interactiveshell.py`` line 2099, inside ``try``/``except Exception``; IPython 9,
    line 2276, behind ``hasattr``). With the environment variable ``SWKV_TRACEBACK=1`` the attribute is
    absent, so IPython prints its usual full traceback, the learner's own error included.
    """

    @property
    def _render_traceback_(self):
        if os.environ.get(TRACEBACK_ENV, "").strip() not in ("", "0"):
            self._unsuppress_chain()
            raise AttributeError("_render_traceback_")  # IPython falls back to the full traceback
        return self._message_lines

    def _chain(self) -> list[BaseException]:
        seen, e = [], self
        while e is not None and all(e is not s for s in seen):
            seen.append(e)
            e = e.__cause__ or e.__context__
        return seen

    def _unsuppress_chain(self) -> None:
        # the checks raise ``... from None`` so a learner never sees the grader's plumbing; debugging wants it
        for e in self._chain():
            e.__suppress_context__ = False

    def _message_lines(self) -> list[str]:
        lines = str(self).splitlines() or [type(self).__name__]
        if any(not isinstance(e, ExerciseFailed) for e in self._chain()):
            lines.append(TRACEBACK_TIP)  # something raised underneath: say how to see where
        return lines


def passed(text: str) -> None:
    """The one line a passing check prints (kept deterministic: nbval compares it)."""
    print(f"✅ {text}")


def fail(case: str, *lines: str, expected=None, got=None, hint: str | None = None, what: str = "got",
         generic: bool = False) -> ExerciseFailed:
    """Build the failure for ``case``: free ``lines``, then expected vs got aligned, then a hint.

    ``generic``: the hint does not name a specific bug, so a check may replace it with what a
    targeted probe finds (:func:`rehint`).
    """
    out = [f"❌ {case}"]
    out += [f"   {line}" for line in lines if line]
    if expected is not None or got is not None:
        label = max(len("expected"), len(what))
        out.append(f"   {'expected'.ljust(label)}: {show(expected)}")
        out.append(f"   {what.ljust(label)}: {show(got)}")
    if hint:
        out.append(f"   hint: {hint}")
    e = ExerciseFailed("\n".join(out))
    e.generic = generic
    return e


def rehint(e: ExerciseFailed, hint: str, *lines: str) -> ExerciseFailed:
    """``e`` with its hint replaced by ``hint`` (and ``lines`` added before it): a probe found the bug."""
    kept = [line for line in str(e).splitlines() if not line.startswith("   hint: ")]
    kept += [f"   {line}" for line in lines if line]
    new = ExerciseFailed("\n".join(kept + [f"   hint: {hint}"]))
    new.generic = False
    return new


def show(x, limit: int = 240) -> str:
    """A short, readable rendering of a value: small tensors in full, big ones by shape."""
    if isinstance(x, torch.Tensor):
        if x.numel() <= 24:
            vals = x.detach().cpu().tolist()
            text = f"tensor({vals}, shape={tuple(x.shape)}, dtype={str(x.dtype).replace('torch.', '')})"
        else:
            text = f"tensor of shape {tuple(x.shape)}, dtype={str(x.dtype).replace('torch.', '')}"
    elif isinstance(x, str):
        text = x
    else:
        text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def grid(mask, title: str) -> list[str]:
    """A small bool matrix as rows of 1/0 under a title (for side-by-side mask messages)."""
    rows = [title]
    try:
        rows += [" ".join("1" if bool(x) else "0" for x in row) for row in mask.tolist()]
    except Exception:
        rows.append(show(mask))
    return rows


def _where(exc: BaseException) -> str:
    """The learner's line that raised: the last frame outside torch, swkv_teach and installed packages
    (a learner's bad argument to transformers raises deep inside it; the line to show is the learner's call)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if not f.filename.startswith((_HERE, _TORCH, *_INSTALLED))]
    if not mine:
        return ""
    f = mine[-1]
    code = (f.line or "").strip()
    return f"at line {f.lineno}: {code}" if code else f"at line {f.lineno}"


def call(case: str, what: str, fn, *args, **kwargs):
    """Run learner code ``fn(*args)``; turn anything it raises into an :class:`ExerciseFailed` naming ``case``.

    ``what`` is how the message names the call, e.g. ``"update()"``.
    KeyboardInterrupt and SystemExit pass through, so a stuck answer can still be interrupted.
    """
    try:
        return fn(*args, **kwargs)
    except ExerciseFailed:
        raise
    except NotImplementedError:
        raise fail(
            case,
            f"{what} is not implemented yet (it raised NotImplementedError).",
            hint="replace the `# YOUR CODE HERE` / `raise NotImplementedError(...)` lines with your code, "
            "run that cell, then run this check again.",
        ) from None
    except Exception as e:
        where = _where(e)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise fail(
            case,
            f"{what} raised {type(e).__name__}{': ' + msg if msg else ''}",
            where,
            hint="the check calls your code exactly as in the exercise text; read the error above, "
            "fix that line and run both cells again.",
            generic=True,
        ) from None


def learner_name(obj) -> str:
    """How a message names the learner's class or function."""
    return getattr(obj, "__name__", "your class")
