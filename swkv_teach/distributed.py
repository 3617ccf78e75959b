"""Tensor-parallel decoding under ``torchrun``: the KV heads (and their caches) split over processes.

Run it with PyTorch's own launcher (gloo on CPU, nccl on CUDA)::

    torchrun --nproc-per-node 2 -m swkv_teach.distributed --checkpoint shipped \\
        --prompt "def add(a, b):" --max-new-tokens 40 --seed 0 [--json]

It greedily continues the prompt with the shipped checkpoint and prints the
text (``--json``: one line with ``tokens``, ``world_size``,
``cache_bytes_per_rank`` and ``resumed_from``). The tokens are those of
single-process :meth:`~swkv_teach.model.Decoder.generate`.

How the work is split (Megatron-style tensor parallelism)
---------------------------------------------------------
With ``P`` processes, rank ``r`` holds key/value heads ``r * nkv/P .. (r+1) * nkv/P - 1``,
the query heads that read them (grouped-query attention keeps a key head's
``group`` query heads together), and its own ring caches for those heads only,
so each rank holds ``1/P`` of the cache. The q/k/v projection is split by its
output rows (column-parallel), the output projection ``o_proj`` by its input
columns (row-parallel): each rank computes a *partial* ``o_proj`` output from
its heads, and one all-reduce (sum) per layer gives every rank the full
attention output. Everything else (embedding, norms, MLP, head) is replicated.
This is the self-attention split of Megatron-LM (Shoeybi et al. 2019, section 3,
figure 3b: Q, K, V column-parallel, the output linear row-parallel, one
all-reduce); vLLM does the same in ``LlamaAttention`` (vllm/model_executor/models/llama.py
at commit 0035bdf, lines 117-130 divide the KV heads by the tensor-parallel size,
lines 146-151 make ``o_proj`` a ``RowParallelLinear``, whose ``forward`` in
``vllm/model_executor/layers/linear.py`` all-reduces the partial outputs). Unlike
vLLM, a world size larger than the KV heads is refused rather than replicating heads.

The partial sums change the order of one addition, so logits agree with the
single process to rounding, not bit for bit; greedy tokens agree (the tests
check them). The ranks' logits are identical after the all-reduce, and rank 0's
choice is broadcast anyway, so the ranks cannot drift apart.

Fault tolerance
---------------
``--snapshot-dir DIR --snapshot-every K`` saves, every ``K`` new tokens, each
rank's caches (:meth:`~swkv_teach.caches.layers.LayerCaches.state_dict`) and the tokens
so far: each rank writes ``rank{r}-{n}.pt`` (to a temporary name, then renamed),
a barrier, then rank 0 commits ``LATEST`` (again write-then-rename), a barrier,
then old files go. A snapshot is used only once ``LATEST`` names it, so a crash
at any point leaves a complete one. ``--fail-at-token T`` makes rank 1 exit with
an error once, when ``T`` tokens are out (recorded as ``DIR/FAULT``). Under
``torchrun --max-restarts 1`` every rank is restarted and resumes from
``LATEST``, not from the prompt.

Each restart attempt talks through its own prefix of torchrun's store
(``TORCHELASTIC_RESTART_COUNT``): with torch 2.13 a restarted gloo group can
otherwise read the dead attempt's addresses from the shared store.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from swkv_teach.model import Decoder, DecoderConfig
from swkv_teach.pretrained import load_pretrained

__all__ = ["RowParallelLinear", "check_world_size", "main", "shard_decoder", "shard_state"]

FAULT = "FAULT"
LATEST = "LATEST"


# ----------------------------------------------------------------------------- sharding
def check_world_size(config: DecoderConfig, world_size: int) -> None:
    """Refuse a world size that does not divide the key/value heads (each rank needs whole heads)."""
    nkv = config.n_kv_heads
    if world_size < 1 or nkv % world_size:
        fits = [p for p in range(1, nkv + 1) if nkv % p == 0]
        raise ValueError(
            f"world size {world_size} does not divide the checkpoint's n_kv_heads={nkv}: each rank must hold "
            f"whole key/value heads. Run with --nproc-per-node in {fits}."
        )


def _heads(config: DecoderConfig, rank: int, world_size: int) -> tuple[range, range]:
    """Query heads and key/value heads of ``rank``: a key head goes with the query heads that read it."""
    q, kv = config.n_heads // world_size, config.n_kv_heads // world_size
    return range(rank * q, (rank + 1) * q), range(rank * kv, (rank + 1) * kv)


def shard_state(state: dict, config: DecoderConfig, rank: int, world_size: int) -> dict:
    """The weights rank ``rank`` of ``world_size`` holds: its heads' rows of ``qkv_proj``, columns of ``o_proj``.

    ``qkv_proj.weight`` stacks q rows (``n_heads * hd``), then k rows, then v rows
    (``n_kv_heads * hd`` each); the rank keeps its heads' rows of each part, in the
    same order, so the shard is a :class:`Decoder` with fewer heads. Every other
    tensor is the same on every rank.
    """
    check_world_size(config, world_size)
    hd, nh, nkv = config.head_dim, config.n_heads, config.n_kv_heads
    qh, kvh = _heads(config, rank, world_size)

    def rows(heads: range, offset: int) -> torch.Tensor:
        return torch.arange(offset + heads.start * hd, offset + heads.stop * hd)

    qkv_rows = torch.cat([rows(qh, 0), rows(kvh, nh * hd), rows(kvh, (nh + nkv) * hd)])
    out = {}
    for name, t in state.items():
        if name.endswith("attn.qkv_proj.weight"):
            out[name] = t.index_select(0, qkv_rows.to(t.device)).clone()
        elif name.endswith("attn.o_proj.weight"):
            out[name] = t[:, qh.start * hd : qh.stop * hd].clone()  # (dim, this rank's heads * hd)
        else:
            out[name] = t
    return out


class RowParallelLinear(nn.Linear):
    """A ``Linear`` over this rank's slice of the input features, summed over ranks by ``reduce``.

    ``y = x_r @ W_r.T`` is rank ``r``'s share of ``x @ W.T``; ``reduce`` (an
    all-reduce by default) adds the shares in place so every rank holds the sum.
    """

    def __init__(self, in_features: int, out_features: int, reduce=None):
        super().__init__(in_features, out_features, bias=False)
        self.reduce = reduce if reduce is not None else dist.all_reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        self.reduce(y)
        return y


def shard_decoder(decoder: Decoder, rank: int, world_size: int, reduce=None) -> Decoder:
    """A :class:`Decoder` holding rank ``rank``'s heads, whose ``o_proj`` sums partial outputs with ``reduce``.

    The shard *is* the library's decoder with ``n_heads / P`` query and
    ``n_kv_heads / P`` key/value heads: its ``step``, ``new_caches`` and caches are
    the single-process ones, so nothing of the attention math is written twice.
    """
    c = decoder.config
    check_world_size(c, world_size)
    sub = dataclasses.replace(c, n_heads=c.n_heads // world_size, n_kv_heads=c.n_kv_heads // world_size)
    shard = Decoder(sub)
    for layer in shard.layers:
        layer.attn.o_proj = RowParallelLinear(sub.n_heads * sub.head_dim, sub.dim, reduce)
    p = next(decoder.parameters())
    shard.load_state_dict(shard_state(decoder.state_dict(), c, rank, world_size))
    return shard.to(device=p.device, dtype=p.dtype).eval()


# ----------------------------------------------------------------------------- process group
def _init_group(rank: int, world_size: int, device: torch.device) -> None:
    """Join the group through this attempt's own prefix of torchrun's store (see the module docstring)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "MASTER_ADDR" not in os.environ:  # a plain `python -m`: one process, no launcher
        store = dist.HashStore()
    else:
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's agent hosts the store
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                              is_master=rank == 0 and not agent)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    store = dist.PrefixStore(f"swkv_teach/attempt-{attempt}", store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)


# ----------------------------------------------------------------------------- snapshots
class Snapshots:
    """Consistent per-rank snapshots in ``directory``: ``rank{r}-{n}.pt`` files, committed by ``LATEST``."""

    def __init__(self, directory: str | Path, every: int, rank: int, world_size: int):
        self.dir, self.every, self.rank, self.world_size = Path(directory), every, rank, world_size
        self.dir.mkdir(parents=True, exist_ok=True)

    def _file(self, n: int, rank: int | None = None) -> Path:
        return self.dir / f"rank{self.rank if rank is None else rank}-{n}.pt"

    def latest(self) -> int | None:
        """New tokens in the last committed snapshot (rank 0 reads, every rank gets its answer)."""
        found = [None]
        if self.rank == 0 and (self.dir / LATEST).is_file():
            meta = json.loads((self.dir / LATEST).read_text())
            if meta["world_size"] != self.world_size:
                raise ValueError(f"{self.dir} holds a snapshot of {meta['world_size']} ranks; this run has "
                                 f"{self.world_size}: resume with the same --nproc-per-node or use a new directory")
            found = [meta["token"]]
        dist.broadcast_object_list(found, src=0)
        return found[0]

    def load(self, n: int, prompt: torch.Tensor) -> dict:
        snap = torch.load(self._file(n), map_location=prompt.device, weights_only=True)  # fresh caches take it
        tokens = snap["tokens"]
        if tokens.shape[1] != prompt.shape[1] + n or not torch.equal(tokens[:, : prompt.shape[1]], prompt.cpu()):
            raise ValueError(f"{self._file(n)} is a snapshot of another prompt or length; use a new --snapshot-dir")
        return snap

    def save(self, n: int, tokens: torch.Tensor, caches) -> None:
        """Write this rank's file, wait for every rank's, commit, wait, then drop the older files."""
        tmp = self.dir / f".{self._file(n).name}.tmp"
        torch.save({"token": n, "rank": self.rank, "tokens": tokens.cpu(), "caches": caches.state_dict()}, tmp)
        os.replace(tmp, self._file(n))  # atomic: the file is whole or absent
        dist.barrier()  # every rank's file for token n is on disk
        if self.rank == 0:
            tmp = self.dir / f".{LATEST}.tmp"
            tmp.write_text(json.dumps({"token": n, "world_size": self.world_size}))
            os.replace(tmp, self.dir / LATEST)
        dist.barrier()  # committed: no rank needs an older snapshot now
        for old in self.dir.glob(f"rank{self.rank}-*.pt"):
            if int(old.stem.split("-")[1]) < n:
                old.unlink()


def _inject_fault(directory: Path | None, rank: int, n: int) -> None:
    """Rank 1 exits with an error on the first attempt, once per snapshot directory (``FAULT`` records it)."""
    marker = None if directory is None else directory / FAULT
    first_attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) == 0
    if rank != 1 or not first_attempt or (marker is not None and marker.exists()):
        return
    if marker is not None:
        marker.write_text(f"rank 1 stopped after {n} new tokens, attempt 0\n")
    raise SystemExit(f"fault injected: rank 1 stops after {n} new tokens (--fail-at-token {n})")


# ----------------------------------------------------------------------------- decoding
@torch.no_grad()
def decode(shard: Decoder, prompt: torch.Tensor, max_new_tokens: int, rank: int,
           snapshots: Snapshots | None = None, fail_at: int | None = None) -> tuple[torch.Tensor, object, int | None]:
    """Greedy decoding on this rank, as :meth:`Decoder.generate` does it: the prompt as one chunk, then a token a step.

    Returns ``(tokens (1, Tp + max_new_tokens), caches, resumed_from)``. A snapshot
    after ``n`` new tokens holds the caches *before* the ``n``-th token is fed, so a
    resume feeds that token and goes on.
    """
    caches = shard.new_caches("ring")
    resumed = snapshots.latest() if snapshots is not None else None
    if resumed is not None:
        if resumed > max_new_tokens:
            raise ValueError(f"the snapshot in {snapshots.dir} is after {resumed} new tokens, more than "
                             f"--max-new-tokens {max_new_tokens}; use a new --snapshot-dir")
        snap = snapshots.load(resumed, prompt)
        caches.load_state_dict(snap["caches"])
        tokens = snap["tokens"].to(prompt.device)
        logits = shard.step(tokens[:, -1:], caches)[:, -1]
    else:
        tokens = prompt
        logits = shard.step(prompt, caches)[:, -1]
    for n in range((resumed or 0) + 1, max_new_tokens + 1):
        next_id = logits.argmax(dim=-1, keepdim=True)  # (1, 1)
        dist.broadcast(next_id, src=0)  # identical on every rank already; rank 0's choice keeps them in step
        tokens = torch.cat([tokens, next_id], dim=1)
        if n == max_new_tokens:
            break
        if snapshots is not None and snapshots.every and n % snapshots.every == 0:
            snapshots.save(n, tokens, caches)
        if fail_at == n:
            _inject_fault(snapshots.dir if snapshots is not None else None, rank, n)
        logits = shard.step(next_id, caches)[:, -1]
    return tokens, caches, resumed


def _device(choice: str) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` when every local rank gets a GPU (or when asked), else the CPU."""
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    enough = torch.cuda.is_available() and torch.cuda.device_count() >= local_world
    if choice == "cuda" and not enough:
        raise ValueError(f"--device cuda needs {local_world} GPUs (one per local rank); "
                         f"{torch.cuda.device_count()} are visible")
    return torch.device(f"cuda:{local_rank}") if choice == "cuda" or (choice == "auto" and enough) else torch.device("cpu")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="torchrun --nproc-per-node P -m swkv_teach.distributed",
                                description="Tensor-parallel greedy decoding of the shipped checkpoint.")
    p.add_argument("--checkpoint", default="shipped", help="'shipped' or a folder written by swkv_teach.train --out")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--seed", type=int, default=0, help="seeds torch on every rank (greedy decoding draws nothing)")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of the text")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: one GPU per local rank (nccl) when there are enough, else the CPU (gloo)")
    p.add_argument("--snapshot-dir", default=None)
    p.add_argument("--snapshot-every", type=int, default=0, help="snapshot every K new tokens (needs --snapshot-dir)")
    p.add_argument("--fail-at-token", type=int, default=None, help="fault injection: rank 1 exits once after T tokens")
    args = p.parse_args(argv)
    if args.max_new_tokens < 0 or args.snapshot_every < 0:
        p.error("--max-new-tokens and --snapshot-every must be >= 0")
    if args.snapshot_every and not args.snapshot_dir:
        p.error("--snapshot-every needs --snapshot-dir")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = _device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    directory = None if args.checkpoint == "shipped" else args.checkpoint
    decoder, tokenizer = load_pretrained(device, directory=directory)
    check_world_size(decoder.config, world_size)  # before any process group: a clear error, no hang
    _init_group(rank, world_size, device)
    try:
        shard = shard_decoder(decoder, rank, world_size)
        prompt = torch.tensor([tokenizer.encode(args.prompt)], device=device)
        snapshots = (Snapshots(args.snapshot_dir, args.snapshot_every, rank, world_size)
                     if args.snapshot_dir else None)
        tokens, caches, resumed = decode(shard, prompt, args.max_new_tokens, rank, snapshots, args.fail_at_token)
        per_rank = [None] * world_size
        dist.all_gather_object(per_rank, caches.stats()["bytes_held"])
        if rank == 0:
            ids = tokens[0].tolist()
            if args.json:
                print(json.dumps({"tokens": ids, "world_size": world_size, "cache_bytes_per_rank": per_rank,
                                  "resumed_from": resumed}), flush=True)
            else:
                if resumed is not None:
                    print(f"[resumed from the snapshot after {resumed} new tokens]")
                print(tokenizer.decode(ids), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
