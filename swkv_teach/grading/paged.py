"""Check for exercise 08: a paged window's block bookkeeping, ``PagedWindow(pool, window_size)``.

The learner's class takes blocks from a shared :class:`~swkv_teach.BlockPool` with
``pool.take()``, returns them with ``pool.give(block)``, and after each ``append()``
(one token) holds exactly the blocks the last ``W`` tokens occupy, oldest first.
The oracle is the library's :class:`~swkv_teach.PagedKVCache` fed one-element
tokens: its block count and stored positions are the expected ones.

The check writes a label ``(sequence, position)`` into every slot ``append()``
returns and, after every step, reads each live sequence's window back through
its block table, so a block handed out again while still in use, a table in the
wrong order or a wrong offset shows up as the token it clobbered. Windows and
block sizes cross every alignment (``bs = 1``, ``bs > W``, ``bs = W``,
``W % bs = 1``), pools hold exactly the blocks the windows need (so a step must
return a block before it takes one), and three sequences of different lengths
run interleaved on one pool, one of them reset and restarted.

The block ``append()`` names must be the one its token went into: the block just taken when the token
opens one, else the previous token's (the pool records what it hands out); a return of
``block_table[0]`` (the oldest block) or of ``block_table[0]`` plus an offset (ids assumed consecutive,
told apart from the logical block number on a pool whose ids come out scrambled) is named.

A new instance holds nothing: right after construction it has taken no block from the pool and its
``block_table`` and ``positions`` are empty (a block reserved in ``__init__`` is named).
``block_table`` must be a new list (or a tuple) each time: the check appends to what it got
and reads the property again, so a table handed out by reference is named. A failure that
a fresh instance does not show, after a ``reset()``, is blamed on ``reset()``. The library's
own :class:`~swkv_teach.PagedKVCache` (passed in, subclassed, or kept in an attribute to do the
work) is refused: the check compares with it.
"""

from __future__ import annotations

import random

import torch

from swkv_teach.caches.paged import BlockPool, PagedKVCache
from swkv_teach.grading._own import kept_inside
from swkv_teach.grading._shared import two_fresh
from swkv_teach.grading._report import ExerciseFailed, call, fail, passed, rehint, show, learner_name as _name

CASES = ((3, 2), (5, 4), (4, 4), (1, 1), (7, 3), (2, 5), (9, 4), (6, 1))  # (window_size, block_size)


def _n(k: int, noun: str) -> str:
    return f"{k} {noun}{'s' * (k != 1)}"


class _Pool(BlockPool):
    """A BlockPool that remembers the last block it handed out: where a token that opens a block is written."""

    last_taken: int | None = None

    def take(self, *args, **kwargs) -> int:
        block = super().take(*args, **kwargs)
        self.last_taken = block
        return block


class _Seq:
    """One learner instance, its oracle, and what it has written where."""

    def __init__(self, cls, pool: BlockPool, W: int, name: str, title: str):
        self.cls, self.pool, self.W, self.name = cls, pool, W, name
        self.title = title
        used = pool.used_blocks
        self.mine = call(title, f"{_name(cls)}(pool, {W})", cls, pool, W)
        if pool.used_blocks != used:
            raise fail(title, f"{_name(cls)}(pool, {W}) took {pool.used_blocks - used} block(s) from the pool before "
                       "any append(): a new sequence holds nothing.",
                       hint="take a block only when a token needs it (the first append opens block 0): a block "
                       "reserved in __init__ is one the pool cannot lend while this sequence may never use it.")
        self.resets = 0
        self.block = None  # the block the last append() wrote into (judged right)
        inside = _library_inside(self.mine)
        if inside:
            raise fail(title, f"{inside}: the check compares with that very class, so it shows nothing about your "
                       "bookkeeping.", hint="keep the block table yourself: a list of the ids pool.take() gave you.")
        for m in ("append", "reset"):
            if not callable(getattr(self.mine, m, None)):
                raise fail(title, f"{_name(cls)}(pool, {W}) gave a {type(self.mine).__name__} with no {m}() method.",
                           hint="pass the class itself, with append(), reset() and the properties block_table "
                           "and positions.")
        self.oracle = PagedKVCache(BlockPool(PagedKVCache.max_blocks(W, pool.block_size), pool.block_size), W)
        table, positions = self.table(title), self.positions(title)
        if table or positions:
            raise fail(title, f"right after {_name(cls)}(pool, {W}), before any append(): block_table is {table} and "
                       f"positions {positions}; a new sequence holds nothing, so both must be empty.",
                       hint="take a block only when a token needs it (the first append opens block 0): a block "
                       "reserved in __init__ is one the pool cannot lend while this sequence may never use it."
                       if table else "positions are the last window_size positions seen, none yet: "
                       "range(max(0, seen - W), seen), which is empty while seen is 0.")

    @property
    def seen(self) -> int:
        return self.oracle.seen

    def table(self, case: str) -> list[int]:
        t = call(case, f"{self.name}.block_table", lambda: self.mine.block_table)
        if not isinstance(t, (list, tuple)) or not all(isinstance(b, int) and not isinstance(b, bool) for b in t):
            raise fail(case, f"{self.name}.block_table is {show(t)}; expected a list of pool block ids (ints).",
                       hint="keep a list of the ints pool.take() returned, oldest first.")
        return list(t)

    def check_copy(self, case: str) -> None:
        """block_table must not hand out the sequence's own list: change what it returned, read it again."""
        t = call(case, f"{self.name}.block_table", lambda: self.mine.block_table)
        if not isinstance(t, list):
            return  # a tuple cannot be changed; anything else was refused by table()
        t.append(-1)
        again = call(case, f"{self.name}.block_table", lambda: self.mine.block_table)
        leaked = again is t or (isinstance(again, list) and again[-1:] == [-1])
        t.pop()
        if leaked:
            raise fail(case, f"{self.name}.block_table handed out your own list: the check appended -1 to what it "
                       "got, and the next read of block_table had the -1 too.",
                       hint="a caller (a scheduler, an attention kernel's launcher) may keep or change the table it "
                       "reads: return a copy, list(self.table), and keep your list to yourself.")

    def positions(self, case: str) -> list[int]:
        p = call(case, f"{self.name}.positions", lambda: self.mine.positions)
        if isinstance(p, torch.Tensor):
            p = p.tolist()
        if not isinstance(p, (list, tuple, range)):
            raise fail(case, f"{self.name}.positions is {show(p)}; expected a list of ints.")
        return list(p)


class _Run:
    """Several sequences on one pool, with the slots they wrote, checked after every step."""

    def __init__(self, cls, W: int, bs: int, n_seq: int, extra_blocks: int = 0):
        """``extra_blocks`` beyond what the windows need: room to see a late return as a long table, not a dry pool."""
        self.cls, self.W, self.bs = cls, W, bs
        self.pool = _Pool(n_seq * PagedKVCache.max_blocks(W, bs) + extra_blocks, bs)
        self.title = (f"{_name(cls)}(pool, window_size={W}) on BlockPool(num_blocks={self.pool.num_blocks}, "
                      f"block_size={bs})")
        names = ["seq"] if n_seq == 1 else [f"seq {c}" for c in "ABC"[:n_seq]]
        self.seqs = [_Seq(cls, self.pool, W, n, self.title) for n in names]
        self.written: dict[tuple[int, int], tuple[str, int]] = {}  # (block, offset) -> (sequence, position)
        self.log: list[str] = []

    def case(self, s: _Seq) -> str:
        steps = self.log if len(self.log) <= 8 else ["..."] + self.log[-8:]
        return f"{self.title}, {s.name} after {_n(s.seen, 'token')}\n   steps: " + "; ".join(steps)

    # ------------------------------------------------------------------ one token
    def append(self, s: _Seq) -> None:
        try:
            self._append(s)
        except ExerciseFailed as e:
            msg = str(e)
            if s.resets and "share state" not in msg and _fresh_is_right(self.cls, self.W, self.bs, s.seen):
                raise rehint(e, f"right on a fresh instance, wrong after reset(): a fresh {_name(self.cls)} gets these "
                             f"{_n(s.seen, 'token')} right. reset() must put back everything __init__ sets: the "
                             "table, the token count, and the logical number of block_table[0] (a first-block "
                             "counter left as it was makes blocks go back late).") from None
            raise

    def _append(self, s: _Seq) -> None:
        p, W, bs = s.seen, self.W, self.bs
        before = {o.name: (o.table(self.title), o.positions(self.title)) for o in self.seqs if o is not s}
        self.log.append(f"{s.name}.append()")
        case = self.case(s)
        self.pool.last_taken = None
        try:
            got = call(case, f"{s.name}.append()", s.mine.append)
        except ExerciseFailed as e:
            if "PoolExhausted" not in str(e):
                raise
            tables = {o.name: o.table(case) for o in self.seqs}
            raise fail(case, f"append() found the pool empty: all {self.pool.num_blocks} blocks are taken "
                       f"(block tables: {tables}).",
                       hint="the pool holds exactly the blocks the windows need: in a step that returns a block and "
                       "takes one, pool.give() the old block before you pool.take() the new one.") from None
        s.oracle.update(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))
        case = self.case(s)
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(x, int) for x in got)):
            raise fail(case, f"append() returned {show(got)}; expected (block, offset), two ints: where token {p} "
                       "is written.", hint="return self.block_table[-1] and the token's offset in it, p % block_size.")
        block, offset = got
        if offset != p % bs:
            hint = _offset_hint(self.cls) or f"token p sits at offset p % block_size = {p % bs} of its block."
            raise fail(case, f"append() put token {p} at offset {offset}.", expected=p % bs, got=offset,
                       what="offset", hint=hint)
        self._check_block(s, case, block)
        if not self.pool.is_held(block):
            n = self.pool.num_blocks
            logical = (f" {block} is token {p}'s logical block number, p // block_size = {p} // {bs}: return the "
                       "pool's id for it, the one pool.take() gave you (block_table[-1])." if block == p // bs else "")
            if not 0 <= block < n:
                raise fail(case, f"append() says token {p} went into block {block}, but the pool's blocks are "
                           f"numbered 0..{n - 1}: there is no block {block}.{logical}",
                           hint="return (block, offset) with block an id pool.take() returned: the pool numbers its "
                           "own blocks, and a sequence's logical blocks are not its ids.")
            if logical and _held_by(self.pool, s.table(case)):
                raise fail(case, f"append() says token {p} went into block {block}, which the pool says is free; your "
                           f"block_table is {s.table(case)}.{logical}",
                           hint="a sequence's logical block numbers and the pool's block ids differ as soon as a "
                           "block has gone back to the pool: map one to the other through block_table.")
            raise fail(case, f"append() wrote token {p} into block {block}, which the pool says is free "
                       f"(free blocks: {sorted(self.pool.free_order())}).",
                       hint="take every block with block = pool.take(), and write only into blocks you hold: "
                       "one given back with pool.give() may be handed to another sequence.")
        if offset == 0:  # a fresh block: whatever an earlier holder wrote there is gone
            self.written = {k: v for k, v in self.written.items() if k[0] != block}
        self.written[(block, offset)] = (s.name, p)
        self._check_others_unchanged(s, before, case)
        s.check_copy(case)
        self._check_table(s, case)
        self._check_integrity(case)
        s.block = block

    def _check_block(self, s: _Seq, case: str, block: int) -> None:
        """The block append() names must be the one token p went into: the block just taken when p opens a block,
        else the block of the previous token. Named here only when the learner's own table shows the slip."""
        p, bs = s.seen - 1, self.bs
        expected = self.pool.last_taken if p % bs == 0 else s.block
        if expected is None or block == expected:
            return
        table = s.table(case)
        if not table or table[-1] != expected:
            return  # the table itself is off: _check_table names it
        if len(table) > 1 and block == table[0]:
            raise fail(case, f"append() says token {p} went into block {block}, block_table[0]: the OLDEST block of "
                       f"the window. Token {p} is written into the newest block, {expected} (block_table[-1]), the one "
                       f"taken when token {p - p % bs} opened it.",
                       hint="return self.block_table[-1], p % block_size: the new token always goes into the last "
                       "block taken; block_table[0] holds the window's oldest tokens.")
        if block == table[0] + len(table) - 1 and (block != p // bs or _block_slip(self.cls, bs) == "consecutive"):
            raise fail(case, f"append() says token {p} went into block {block} = block_table[0] + {len(table) - 1}, "
                       f"as if a sequence's blocks had consecutive ids; your block_table is {table} and token {p} "
                       f"went into block {expected} (block_table[-1]).",
                       hint="block ids are not consecutive: the pool hands out whichever block is free (a block "
                       "given back comes out again later, to any sequence). Read the id from block_table[-1]; never "
                       "compute it from block_table[0] plus an offset.")

    def _check_table(self, s: _Seq, case: str) -> None:
        W, bs, seen = self.W, self.bs, s.seen
        table, positions = s.table(case), s.positions(case)
        given_back = [b for b in table if not self.pool.is_held(b) or table.count(b) > 1]
        if given_back:
            raise fail(case, f"block_table {table} still lists block {given_back[0]}, which you gave back to the pool"
                       f"{' (and took again)' if table.count(given_back[0]) > 1 else ''}.",
                       hint="when you pool.give(block), remove it from block_table too (block_table.pop(0)): the "
                       "pool may hand it to another sequence.")
        exp_pos = s.oracle.stored_positions().tolist()
        exp_n = len(s.oracle.block_table)
        held = {(b, o): v for (b, o), v in self.written.items() if v[0] == s.name}
        logical = {b: v[1] // bs for (b, _), v in held.items()}  # block -> logical block it holds
        newest = (seen - 1) // bs
        window = f"the last W = {W} tokens are {exp_pos[0]}..{exp_pos[-1]}"
        if len(table) > exp_n:
            oldest = min((logical.get(b, newest) for b in table), default=newest)
            first, last = oldest * bs, oldest * bs + bs - 1
            unwritten = [b for b in table if b not in logical]
            twice = sorted({logical[b] for b in table if b in logical and
                            [logical.get(o) for o in table].count(logical[b]) > 1})
            if twice:
                same = [b for b in table if logical.get(b) == twice[0]]
                hint = (f"blocks {same} both hold tokens of logical block {twice[0]} (tokens {twice[0] * bs}.."
                        f"{twice[0] * bs + bs - 1}): a new block was taken while the current one still had room. "
                        "Take one only when a token opens a block, p % block_size == 0" + (
                            ". Block id 0 is the one at fault: with block 0 lent to another sequence first, a fresh "
                            f"{_name(self.cls)} gets these {_n(seen, 'token')} right, so a test like `if not block` or "
                            "`if not self.current` treats block 0 as no block; test `is None`."
                            if 0 in same and _right_without_block_zero(self.cls, W, bs, seen) else "."))
            elif table and table[-1] in unwritten and len(table) == exp_n + 1:
                hint = (f"a block was taken before a token needed it: block {table[-1]}, the last in block_table, "
                        f"holds no token yet (token {seen - 1} went into block {table[-2] if len(table) > 1 else '?'}"
                        f"). Take a new block when a token opens one, p % block_size == 0, not when the previous "
                        "block's last slot is written.")
            elif len(table) == newest + 1 and _never_returns(self.cls, W, bs):
                hint = "you never return a block: once all of a block's tokens have left the window, pool.give() it."
            elif last == seen - W - 1:
                hint = (f"a block is returned one token too late: block {table[0]} holds tokens {first}..{last}, and "
                        f"token {last} left the window at this step ({window}); give it back now.")
            elif last < exp_pos[0]:
                hint = (f"a block is returned too late: block {table[0]} holds tokens {first}..{last}, all out of the "
                        f"window ({window}).")
            else:
                hint = (f"block_table holds {len(table) - exp_n} block(s) more than the window's tokens occupy "
                        f"(the blocks hold tokens of logical blocks {[logical.get(b) for b in table]}); each block "
                        "must hold a token of the window.")
            raise fail(case, f"block_table holds {_n(len(table), 'block')}; {window}, which occupy {exp_n}.",
                       expected=exp_n, got=len(table), what="blocks", hint=hint)
        if len(table) < exp_n:
            oldest_needed = exp_pos[0] // bs
            last = oldest_needed * bs + bs - 1
            if exp_pos[0] == last:
                hint = (f"a block is returned one token too early: token {last}, the last of its block "
                        f"(tokens {oldest_needed * bs}..{last}), is still in the window ({window}).")
            else:
                hint = (f"a block is returned too early: block of tokens {oldest_needed * bs}..{last} still holds "
                        f"tokens in the window ({window}).")
            raise fail(case, f"block_table holds {_n(len(table), 'block')}; {window}, which occupy {exp_n}.",
                       expected=exp_n, got=len(table), what="blocks", hint=hint)
        order = [logical.get(b) for b in table]
        if None not in order and order != sorted(order):
            if table == sorted(table) and len(table) > 1:
                hint = ("block_table is sorted by block id, but ids say nothing about age: the pool hands out "
                        "whichever block is free (a returned one comes back later). Keep the table in the order the "
                        "blocks were taken: append each new block at the end, return from the front.")
            elif order == sorted(order, reverse=True):
                hint = ("block_table is newest first: append new blocks at the end and return from the front (oldest "
                        "first).")
            else:
                hint = "block_table must list the blocks oldest first: the newest block last."
            raise fail(case, f"block_table {table} holds logical blocks {order}.", hint=hint)
        if table and logical.get(table[0]) is not None and logical[table[0]] != exp_pos[0] // bs:
            raise fail(case, f"block_table {table} starts with the block of tokens {logical[table[0]] * bs}.."
                       f"{logical[table[0]] * bs + bs - 1}; {window}.",
                       hint="you gave the newest block back to the pool instead of the oldest: give back "
                       "block_table[0] (pop(0)), not block_table[-1].")
        if positions != exp_pos:
            held = list(range(exp_pos[0] // bs * bs, exp_pos[-1] + 1)) if exp_pos else []
            if positions == held and len(held) == len(exp_pos) + 1:
                hint = (f"positions keeps W + 1 = {W + 1} tokens ({held[0]}..{held[-1]}, also every token of the "
                        f"blocks held: is it one too many, or read off the blocks?); the window holds exactly W = {W}, "
                        "range(max(0, seen - W), seen), whatever the blocks hold.")
            elif positions == held and len(held) > len(exp_pos):
                hint = (f"positions lists every token in the blocks held ({held[0]}..{held[-1]}), but the oldest "
                        f"block also holds tokens that left the window: positions are the last W = {W} tokens, "
                        "range(max(0, seen - W), seen), whatever the blocks hold.")
            elif len(positions) == len(exp_pos) - 1:
                hint = f"positions keeps W - 1 = {W - 1} tokens; the window holds W = {W}, the newest included."
            elif len(positions) == len(exp_pos) + 1:
                hint = f"positions keeps W + 1 = {W + 1} tokens; the window holds exactly W = {W}."
            else:
                hint = "positions are the last window_size positions seen, oldest first: range(max(0, seen - W), seen)."
            raise fail(case, "positions is not the window.", expected=exp_pos, got=positions, what="positions",
                       hint=hint)
        in_use = sum(len(o.table(case)) for o in self.seqs)
        if self.pool.used_blocks != in_use:
            raise fail(case, f"the pool has {self.pool.used_blocks} blocks in use but the block tables hold {in_use}.",
                       hint="every block you take must be in block_table until you pool.give() it back: "
                       "no block taken and dropped, none given back while still listed.")

    def _check_others_unchanged(self, s: _Seq, before: dict, case: str) -> None:
        for o in self.seqs:
            if o is not s and (o.table(case), o.positions(case)) != before[o.name]:
                def use(seq, i):
                    for _ in range(2 + i):
                        seq.append()

                found = two_fresh(self.cls, (BlockPool(8, self.bs), self.W), use)
                raise fail(case, f"appending to {s.name} changed {o.name}'s block_table or positions.",
                           hint="the instances share state. " + (found or "Create the lists in __init__ "
                           "(self.table = []), not as class attributes or module-level variables."))

    def _check_integrity(self, case: str) -> None:
        bs = self.bs
        for o in self.seqs:
            table, positions = o.table(case), o.positions(case)
            if not positions:
                continue
            first = positions[0] // bs
            for p in positions:
                i = p // bs - first
                slot = (table[i], p % bs) if 0 <= i < len(table) else None
                owner = self.written.get(slot) if slot else None
                if owner != (o.name, p):
                    where = f"block {slot[0]} offset {slot[1]}" if slot else "no block"
                    hint = ("a block was handed out again while a sequence still used it: return a block only when "
                            "all its tokens have left the window, and drop it from block_table when you do."
                            if owner else "block_table[i] must hold logical block first + i: the tokens "
                            "i * block_size .. i * block_size + block_size - 1 of the window's first block onwards.")
                    raise fail(case, f"{o.name}'s token {p} should be in {where} (found through block_table "
                               f"{table}); that slot holds {'token %d of %s' % (owner[1], owner[0]) if owner else 'nothing'}.",
                               hint=hint)

    def reset(self, s: _Seq) -> None:
        self.log.append(f"{s.name}.reset()")
        case = self.case(s)
        held = len(s.table(case))
        used = self.pool.used_blocks
        call(case, f"{s.name}.reset()", s.mine.reset)
        s.oracle.reset()
        s.resets += 1
        if s.table(case) or s.positions(case):
            raise fail(case, f"after reset(), block_table is {s.table(case)} and positions {s.positions(case)}; "
                       "expected both empty.", hint="reset() forgets the sequence: give back every block, clear "
                       "the table, start counting tokens from 0.")
        if self.pool.used_blocks != used - held:
            raise fail(case, f"reset() returned {used - self.pool.used_blocks} of the {held} blocks {s.name} held: "
                       "the rest leaked from the pool.", hint="in reset(), pool.give(block) for every block in "
                       "block_table before clearing it.")
        self.written = {k: v for k, v in self.written.items() if v[0] != s.name}


def _held_by(pool: BlockPool, table: list[int]) -> bool:
    """Whether every block of ``table`` (at least one) is held in ``pool``: the sequence does take its blocks."""
    return bool(table) and all(pool.is_held(b) for b in table)


def _library_inside(obj) -> str | None:
    """How ``obj`` is, or keeps (one attribute deep), the library's PagedKVCache; None if it does not."""
    if isinstance(obj, PagedKVCache):
        return f"{type(obj).__name__} is the library's own PagedKVCache" + (
            "" if type(obj) is PagedKVCache else " (a subclass of it)")
    kept = kept_inside(obj, lambda x: isinstance(x, PagedKVCache))
    if kept is None:
        return None
    return f"your class keeps the library's own PagedKVCache in self.{kept[0]} and hands it the work"


def _fresh_is_right(cls, W: int, bs: int, n: int) -> bool:
    """Whether a fresh instance, alone on a roomy pool, holds the right blocks and positions for ``n`` tokens."""
    try:
        pool = BlockPool(PagedKVCache.max_blocks(W, bs) + 4, bs)
        probe = cls(pool, W)
        oracle = PagedKVCache(BlockPool(PagedKVCache.max_blocks(W, bs), bs), W)
        for p in range(n):
            block, offset = probe.append()
            oracle.update(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))
            table = list(probe.block_table)
            if (offset != p % bs or not pool.is_held(block) or table[-1:] != [block]
                    or len(table) != len(oracle.block_table)
                    or list(probe.positions) != oracle.stored_positions().tolist()):
                return False
        return True
    except Exception:
        return False


def _right_without_block_zero(cls, W: int, bs: int, n: int) -> bool:
    """Whether a fresh instance holds the right number of blocks for ``n`` tokens when block 0 is never its own."""
    try:
        pool = BlockPool(PagedKVCache.max_blocks(W, bs) + 4, bs)
        if pool.take() != 0:
            return False
        probe = cls(pool, W)
        oracle = PagedKVCache(BlockPool(PagedKVCache.max_blocks(W, bs), bs), W)
        for _ in range(n):
            probe.append()
            oracle.update(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))
            if len(list(probe.block_table)) != len(oracle.block_table):
                return False
        return True
    except Exception:
        return False


def _block_slip(cls, bs: int) -> str | None:
    """Which wrong block a fresh ``cls`` returns from a pool whose ids come out scrambled (7, 2, 9, 4, ...): its
    logical block number (``"logical"``), block_table[0] plus an offset (``"consecutive"``), or None."""
    try:
        pool = BlockPool(12, bs)
        pool.reorder_free([7, 2, 9, 4, 0, 11, 5, 1, 3, 6, 8, 10])
        seq = cls(pool, 2 * bs + 1)
        for p in range(6 * bs):
            block, _ = seq.append()
            table = list(seq.block_table)
            if block != table[-1]:
                return ("logical" if block == p // bs else
                        "consecutive" if block == table[0] + len(table) - 1 else None)
    except Exception:
        return None
    return None


def _offset_hint(cls) -> str | None:
    """Name an offset bug from a fresh instance with window 5 and block size 3, where p % 5, p % 16 and p % 3 differ."""
    try:
        probe = cls(BlockPool(64, 3), 5)
        offsets = [probe.append()[1] for _ in range(8)]
    except Exception:
        return None
    if offsets == [p % 5 for p in range(8)]:
        return "the offset uses window_size: a token's place in its block is p % block_size (seen with W=5, block_size=3)."
    if offsets == [p % 16 for p in range(8)]:
        return "the block size looks hard-coded to 16 (vLLM's default): use pool.block_size (seen with block_size=3)."
    return None


def _never_returns(cls, W: int, bs: int) -> bool:
    """Whether a fresh instance still holds every block it took after the window has slid past several blocks."""
    try:
        pool = BlockPool(64, bs)
        probe = cls(pool, W)
        T = W + 3 * bs + 1
        for _ in range(T):
            probe.append()
        return len(list(probe.block_table)) == (T - 1) // bs + 1
    except Exception:
        return False


def check_paged_window(cls) -> None:
    """Exercise 08: ``cls(pool, window_size)`` keeps a sliding window's block table on a shared BlockPool."""
    if isinstance(cls, type) and issubclass(cls, PagedKVCache):
        raise fail(f"check_paged_window({_name(cls)})", f"{_name(cls)} is the library's own PagedKVCache"
                   f"{'' if cls is PagedKVCache else ' (a subclass of it)'}: the check compares with that very class, "
                   "so it shows nothing about your bookkeeping.",
                   hint="pass the PagedWindow class you wrote. If you did write one, something run after it (an "
                   "import of the same name) replaced it: run your cell again.")
    steps = 0
    for W, bs in CASES:
        run = _Run(cls, W, bs, 1, extra_blocks=3)  # the exact pool comes with the interleaved runs below
        (s,) = run.seqs
        for _ in range(3 * W + 3 * bs + 2):
            run.append(s)
            steps += 1
        run.reset(s)
        for _ in range(W + bs + 1):  # a second sequence on the same instance
            run.append(s)
            steps += 1
        run.reset(s)
        if run.pool.free_blocks != run.pool.num_blocks:
            raise fail(run.title, f"after reset() the pool has {run.pool.used_blocks} blocks in use; expected 0.",
                       hint="reset() gives every block back: the block was leaked.")
    rng = random.Random(0)
    for W, bs in ((5, 2), (4, 3), (3, 4)):
        run = _Run(cls, W, bs, 3)
        lengths = {"seq A": 5 * W, "seq B": 2 * W + 1, "seq C": 8 * W}
        restarted = False
        while live := [s for s in run.seqs if s.seen < lengths[s.name]]:
            s = rng.choice(live)
            run.append(s)
            steps += 1
            if s.name == "seq B" and s.seen == lengths["seq B"] and not restarted:
                run.reset(s)  # B finishes first; the same instance starts a new sequence among the others
                lengths["seq B"], restarted = 3 * W, True
        for s in run.seqs:
            run.reset(s)
    passed(f"{_name(cls)} holds exactly the blocks of the last W tokens, oldest first, on {len(CASES)} "
           f"window/block sizes and 3 interleaved sequences on one pool ({steps} appends, resets included).")


__all__ = ["check_paged_window"]
