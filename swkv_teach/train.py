"""Train the shipped checkpoint: a character-level sliding-window Decoder on Python's standard library.

    python -m swkv_teach.train                       # writes swkv_teach/data/ (~7 min of one CPU core)
    python -m swkv_teach.train --attention full      # the second checkpoint, full causal attention
    python -m swkv_teach.train --steps 3 --out /tmp/ck --plot /tmp/ck/loss.png

The corpus is read at train time from the running interpreter's own standard
library (:data:`CORPUS_FILES`, a fixed sorted list; any missing in this Python
version are skipped and the metadata lists what was used), so nothing is
downloaded. :data:`HELDOUT_FILES` are kept out for evaluation.

Training sequences are ``CONTEXT`` = 4 windows long, so the model learns to
work with a window that slides: tokens past the first window never see the
beginning, exactly as during cached generation.

``--attention full`` trains the second checkpoint (``load_pretrained(name="full")``):
the same recipe (tokenizer, corpus, held-out files, shape, steps, seed) with
full causal attention over the whole training sequence, i.e. a window as wide
as ``--context``. Only the mask differs, so the two checkpoints compare the
mask and nothing else. H2O, TOVA and StreamingLLM were made for such models.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import sysconfig
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from swkv_teach._validate import check_nonnegative_int, check_positive_int
from swkv_teach.model import Decoder, DecoderConfig
from swkv_teach.pretrained import CHECKPOINTS, CharTokenizer

CORPUS_FILES = (
    "abc.py", "argparse.py", "bisect.py", "calendar.py", "collections/__init__.py", "contextlib.py", "copy.py",
    "csv.py", "dataclasses.py", "difflib.py", "enum.py", "fractions.py", "functools.py", "graphlib.py", "heapq.py",
    "json/decoder.py", "json/encoder.py", "numbers.py", "operator.py", "pprint.py", "queue.py", "random.py",
    "shlex.py", "statistics.py", "string.py", "textwrap.py", "weakref.py",
)  # fmt: skip
HELDOUT_FILES = ("fnmatch.py", "glob.py", "sched.py")

WINDOW = 64
CONTEXT = 4 * WINDOW  # tokens per training sequence


def model_config(vocab_size: int, window_size: int = WINDOW) -> DecoderConfig:
    """The shipped models' shape: ~0.3 M parameters, small enough to train on 2 CPU cores in minutes.

    ``window_size`` is ``WINDOW`` for the windowed checkpoint; the full-attention one passes its
    training context, so every training query sees every earlier key of its sequence.
    """
    return DecoderConfig(
        vocab_size=vocab_size,
        dim=96,
        n_layers=3,
        n_heads=4,
        n_kv_heads=2,
        head_dim=24,
        hidden_dim=256,
        window_size=window_size,
        rope_theta=10000.0,
        tie_embeddings=False,
    )


def read_stdlib(files=CORPUS_FILES) -> tuple[str, list[str]]:
    """The text of ``files`` from this interpreter's standard library, concatenated; and the files found."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = [f for f in files if (root / f).is_file()]
    if not found:
        raise FileNotFoundError(f"none of {files} found under {root}: this Python ships no stdlib sources")
    text = "".join((root / f).read_text(encoding="utf-8", errors="replace") for f in found)
    return text, found


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model: Decoder, data: torch.Tensor, context: int = CONTEXT, max_batches: int = 8) -> float:
    """Mean next-character cross-entropy (nats) over consecutive ``context``-long pieces of ``data``."""
    n = min(max_batches * 8, (len(data) - 1) // context)
    if n < 1:
        raise ValueError(f"data must hold more than context={context} tokens; got {len(data)}")
    x = data[: n * context].view(n, context)
    y = data[1 : n * context + 1].view(n, context)
    losses = [F.cross_entropy(model(xb).flatten(0, 1), yb.flatten()) for xb, yb in zip(x.split(8), y.split(8))]
    return float(torch.stack(losses).mean())


def main(argv: list[str] | None = None) -> int:
    default_out = Path(__file__).resolve().parent / "data"
    parser = argparse.ArgumentParser(prog="python -m swkv_teach.train", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps (default 1000, as shipped)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--attention",
        choices=tuple(CHECKPOINTS),
        default="window",
        help=f"'window' (W={WINDOW}, the default) or 'full' causal attention over the whole context",
    )
    parser.add_argument("--context", type=int, default=CONTEXT, help=f"tokens per training sequence (default {CONTEXT})")
    # one thread by default: on a shared 2-core machine two threads ran 10x slower (they wait on each other),
    # and one thread gives the same numbers on any CPU count
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--out", type=Path, default=default_out, help=f"output folder (default {default_out})")
    parser.add_argument("--plot", type=Path, default=None, help="write the loss curve PNG here")
    parser.add_argument("--eval-batches", type=int, default=8, help="held-out batches of 8 sequences to score at the end")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    check_positive_int("--steps", args.steps)
    check_positive_int("--batch-size", args.batch_size)
    check_positive_int("--threads", args.threads)
    check_positive_int("--eval-batches", args.eval_batches)
    check_positive_int("--context", args.context)
    if args.attention == "window" and args.context < WINDOW:
        parser.error(f"--context must be at least the window {WINDOW} for --attention window; got {args.context}")
    check_nonnegative_int("--seed", args.seed)
    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return train(args)
    finally:
        torch.set_num_threads(previous)  # called from a test or a notebook, leave the process as it was


def train(args: argparse.Namespace) -> int:
    """The training run ``main`` parsed the arguments for; writes the checkpoint into ``args.out``."""
    from tqdm.auto import tqdm

    torch.manual_seed(args.seed)
    tok = CharTokenizer()
    text, files = read_stdlib()
    heldout_text, heldout_files = read_stdlib(HELDOUT_FILES)
    data = torch.tensor(tok.encode(text), dtype=torch.long)
    heldout = torch.tensor(tok.encode(heldout_text), dtype=torch.long)

    context = args.context
    config = model_config(tok.vocab_size, WINDOW if args.attention == "window" else context)
    model = Decoder(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    batches = torch.Generator().manual_seed(args.seed)  # the data order, apart from the init's RNG
    warmup = max(1, min(100, args.steps // 10))

    losses = []
    start = time.perf_counter()
    bar = tqdm(range(args.steps), desc="train", disable=args.quiet, mininterval=1.0)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, warmup)
        offsets = torch.randint(0, len(data) - context - 1, (args.batch_size,), generator=batches)
        x = torch.stack([data[o : o + context] for o in offsets.tolist()])  # (B, T)
        y = torch.stack([data[o + 1 : o + context + 1] for o in offsets.tolist()])  # (B, T), shifted by one
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    seconds = time.perf_counter() - start

    model.eval()
    final = sum(losses[-50:]) / len(losses[-50:])
    heldout_loss = evaluate(model, heldout, context, max_batches=args.eval_batches)
    checkpoint, metadata_file = CHECKPOINTS[args.attention]
    args.out.mkdir(parents=True, exist_ok=True)
    # float16 halves the file (<= 2 MB shipped); load_pretrained converts back to float32
    torch.save({k: v.detach().to(torch.float16).clone() for k, v in model.state_dict().items()}, args.out / checkpoint)
    metadata = {
        "name": args.attention,
        "attention": "full causal over the training context" if args.attention == "full" else f"sliding window W={WINDOW}",
        "config": asdict(config),
        "tokenizer": {"kind": "char", "chars": tok.chars},
        "corpus": {"stdlib_files": files, "chars": len(text), "heldout_files": heldout_files},
        "python": platform.python_version(),
        "torch": torch.__version__,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "context": context,
        "lr": args.lr,
        "seed": args.seed,
        "threads": args.threads,
        "train_seconds": round(seconds, 1),
        "final_train_loss": round(final, 4),
        "heldout_loss": round(heldout_loss, 4),
        "uniform_loss": round(math.log(tok.vocab_size), 4),
        "parameters": sum(p.numel() for p in model.parameters()),
        "weights_dtype": "float16",
    }
    (args.out / metadata_file).write_text(json.dumps(metadata, indent=1) + "\n")
    if args.plot is not None:
        _plot(losses, args.plot, args.attention)
    print(
        f"{args.steps} steps in {seconds:.0f} s: train loss {final:.3f}, held-out {heldout_loss:.3f} "
        f"(uniform {math.log(tok.vocab_size):.3f}) -> {args.out}"
    )
    return 0


def _plot(losses: list[float], path: Path, name: str = "window") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=90)
    ax.plot(losses, lw=0.8)
    ax.set(xlabel="step", ylabel="cross-entropy (nats/char)", title=f"char decoder ({name} attention) on Python's stdlib")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
