"""The website's home page, written for a learner (the README stays the repository's front page).

What the course is and for whom, what you will be able to do, where to start (in the browser, on Colab, on your
own machine), the path as a table made from the lessons' own headers (site/course.py: titles, minutes,
exercises and their times; nothing retyped here), and the teachers' route in one paragraph.
"""

from __future__ import annotations

import posixpath

from course import Lesson, title_of


RULES = r"""One rule holds everywhere in the course: with a window of $W$ keys, query $i$ attends key $j$ exactly when
$i - W < j \le i$. And one floor on speed, which lesson 0 derives: a decode step of a batch of $B$ sequences
cannot be faster than

$$
t_{\text{step}} \;\ge\; \frac{\text{weights} + B \times \text{KV cache}}{\text{bandwidth}},
$$

in bytes for one sequence's cache, and bytes per second for the GPU's memory bandwidth.

"""


def _minutes(lo: int, hi: int) -> str:
    return f"{lo}–{hi}\u00a0min"  # no break before "min"


def _hours(minutes: int) -> str:
    return f"{minutes / 60:.0f}"


def path_table(lessons: list[Lesson]) -> str:
    rows = ["| # | Lesson | Time | Exercises, done where the lesson reaches them |", "|---|---|---|---|"]
    for lesson in lessons:
        name = lesson.title.split("—", 1)[-1].strip()
        exercises = [f"[{title_of(ex)}]({ex}) ({_minutes(lo, hi)})" for ex, lo, hi in lesson.exercises]
        if lesson.answer:
            exercises.append(f"the questions, answered aloud ({_minutes(*lesson.answer)})")
        rows.append(f"| {lesson.number} | [{name}]({lesson.path}) | {lesson.minutes}\u00a0min | "
                    f"{'; '.join(exercises) or '—'} |")
    return "\n".join(rows)


def landing_page(lessons: list[Lesson], repo: str) -> str:
    read = sum(lesson.minutes for lesson in lessons)
    lo = sum(lo for lesson in lessons for _, lo, _ in lesson.exercises)
    hi = sum(hi for lesson in lessons for _, _, hi in lesson.exercises)
    drill = next((lesson.answer for lesson in lessons if lesson.answer), (0, 0))
    first = lessons[0]
    return f"""# The sliding-window KV cache: a hands-on course

**Build the memory trick that lets a sliding-window model decode forever in flat memory**, from a six-line
cache to a ring buffer, a real (tiny) Mistral-style decoder, paged blocks, a fused decode kernel, prefix
caching and speculative decoding, checking every step against a reference. {len(lessons)} notebooks you read and run, and
{sum(len(lesson.exercises) for lesson in lessons)} graded exercises that check your answers.

**For whom.** You know Python and PyTorch, and what attention computes (queries, keys, values, softmax); you
want to understand what an inference server does with its KV cache, or you are preparing for an ML-systems
interview. No GPU is needed: every notebook runs on a laptop CPU (a GPU, on Colab, adds timings).

{RULES}## What you will be able to do

- write a sliding-window KV cache, then a ring buffer that never copies, and prove both equal to full attention;
- count a model's cache in bytes and turn bytes into milliseconds per token on a real GPU;
- decode with a real model through your cache, prefill prompts longer than the window in chunks, and batch
  prompts of different lengths;
- compare eviction policies (LRU, attention sinks, H2O, TOVA) on measured loss, not on claims;
- lay a cache out the way serving engines do (paged blocks, int8, prefix caching) and write a split-KV decode
  kernel in Triton;
- verify a drafter's guesses in one forward and take the rejected ones back from a ring by moving a counter,
  with sampling kept exact (speculative decoding);
- plug your cache into Hugging Face `transformers`, and answer the interview questions on all of it.

## Start here

<div class="swkv-cards">
<a class="swkv-card" href="{posixpath.splitext(first.path)[0]}.html">
<strong>Read in the browser</strong>
<span>Every lesson is on this site with its figures and outputs. Start with lesson 0, then follow "Next".</span>
</a>
<a class="swkv-card" href="https://colab.research.google.com/github/{repo.replace('https://github.com/', '')}/blob/main/{first.path}">
<strong>Run on Colab</strong>
<span>Each page's "Open in Colab" button opens its notebook; the first cell installs the course library.</span>
</a>
<a class="swkv-card" href="readme.html#set-up-two-commands">
<strong>Run on your machine</strong>
<span>Clone the repository, then <code>make lab</code> opens JupyterLab and <code>make test</code> checks everything.</span>
</a>
</div>

On your own machine (Linux or macOS, Python ≥ 3.10 and `make`):

```bash
make lab     # installs the course in .venv and opens JupyterLab in notebooks/ (exercises/ beside it)
make test    # runs every test and notebook
```

Do each exercise where its lesson reaches it: the lesson links it, and the exercise's last cells grade your
answer. Stuck on a formula? The [cheat sheet](docs/cheatsheet.md) has them all, the [glossary](docs/glossary.md) the
words.

## The path

About {_hours(read)} hours of lessons ({read} minutes, as their headers add up), {_hours(lo)} to {_hours(hi)} of
exercises ({lo} to {hi} minutes), and {_minutes(*drill)} to answer the drill aloud. Each lesson's header says what
you need before it.

{path_table(lessons)}

The [lessons' index](notebooks/README.md) says what each lesson teaches, and how the times are estimated.

## For teachers

The course runs as a class on Colab (collected on Gradescope), on JupyterHub with nbgrader, or on one machine:
every route grades with the same checks, and a fork changes one line to point every Colab button at itself.
The README's [section for teachers](readme.md#for-teachers-colab-jupyterhub-or-one-machine) says how, and the
[repository's README](readme.md) is the reference for the library, the tests and the layout.
"""
