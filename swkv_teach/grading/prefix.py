"""Check for exercise 13: the block hash chain and the LRU free queue of prefix caching.

The learner writes ``hash_block_tokens(parent_hash, token_ids) -> bytes``, ``block_hashes(token_ids, block_size)``
and ``PrefixCache(num_blocks)`` with ``lookup``, ``acquire``, ``allocate``, ``cache`` and ``release``; the library's
:mod:`swkv_teach.caches.prefix` is the oracle.

* **The hash** is judged by what a chain needs, not by its bytes (any encoding and digest will do): bytes, the same
  for the same block (a list or a tuple of the same ids), different when the parent differs, when the ids are
  reordered or split differently (``[1, 23]`` against ``[12, 3]``), for ids past 255, for ids equal in their low
  8, 16 or 32 bits (a fixed-width pack wraps), without collisions over thousands of random blocks, and the same in
  **another Python process** with another ``PYTHONHASHSEED`` (run last: Python's ``hash()`` of bytes and str is
  salted per process). A notebook's constants are made there by their own assignments run again (an
  ``os.urandom`` parent differs, as on a second server), not copied by value; a hash that cannot be rebuilt in that
  process fails, saying why: nothing passes unchecked.
* **The chain**: one hash per *full* block, each chained to the previous one, the first to None; the same for the
  ids given as a tuple.
* **The cache**: scripted request flows, then long random ones (requests sharing a system prompt that arrive, hit,
  allocate and finish; pools of 1 to 12 blocks, block sizes 1 to 4), each operation mirrored on the library's
  ``PrefixCache``, and several live instances driven in turn. Block numbers are the learner's own: the check maps
  them onto the oracle's, so *which* empty block ``allocate`` hands out is free, but an evicted block must be the
  one holding the least recently freed hash. After every operation the whole state is compared through ``lookup``
  of every hash so far, asked of a deep copy. A full pool must raise ``RuntimeError`` (a ``KeyError`` from an empty
  dict is a crash, not the statement's answer), and ``cache()`` on a block that already holds that hash changes
  nothing.

When something differs, probes on fresh instances (:mod:`._prefix_probes`) name the bug: a block in use handed out or evicted, references
not counted, a hash kept after its block was evicted, the most recently freed evicted, a cached block evicted while
an empty one was free, a request's blocks freed head first, a hit not moved to the most recent on its next release,
``lookup`` that does not stop at the first miss or that touches, state shared between instances.
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
import os
import random
import subprocess
import sys
import textwrap
import types

from swkv_teach.caches import prefix as lib
from swkv_teach.caches.pool import PoolExhausted
from swkv_teach.grading._own import is_own, kept_inside
from swkv_teach.grading._prefix_probes import H, diagnose
from swkv_teach.grading._report import ExerciseFailed, call, fail, passed, rehint
from swkv_teach.grading._report import learner_name as _name

__all__ = ["check_prefix_cache_lru"]

CHECK = "check_prefix_cache_lru"
METHODS = ("lookup", "acquire", "allocate", "cache", "release")


# ============================================================================ the hash and the chain
def _hash(fn, parent, ids, case: str):
    got = call(case, f"hash_block_tokens({'None' if parent is None else 'parent'}, {list(ids)[:6]}...)", fn,
               parent, ids)
    if not isinstance(got, (bytes, bytearray)) or not got:
        extra = (" Python's hash() returns an int, salted per process for the bytes of a parent (str and bytes "
                 "hashes are; a tuple of ints is not): use hashlib.sha256(...).digest()."
                 if isinstance(got, int) else "")
        raise fail(case, f"hash_block_tokens returned {type(got).__name__} {got!r:.60}; expected non-empty bytes."
                   + extra, hint="return hashlib.sha256(data).digest(), data being the parent's bytes and the ids.")
    return bytes(got)


def _check_hash(fn) -> None:
    case = "hash_block_tokens"
    a = _hash(fn, None, [1, 2, 3, 4], case)
    if _hash(fn, None, [1, 2, 3, 4], case) != a or _hash(fn, None, (1, 2, 3, 4), case) != a:
        raise fail(case, "the same block gave two different hashes (called twice, or as a list and as a tuple).",
                   hint="the hash must depend only on the parent's hash and the ids: no counter, no random, no id(); "
                   "turn token_ids into one canonical form (tuple(...) or a packed bytes) before hashing.")
    p1, p2 = _hash(fn, None, [5, 6, 7, 8], case), _hash(fn, None, [9, 10, 11, 12], case)
    if _hash(fn, p1, [1, 2, 3, 4], case) == _hash(fn, p2, [1, 2, 3, 4], case) or _hash(fn, p1, [1, 2, 3, 4], case) == a:
        raise fail(case, "the same ids under two different parents (or under a parent and under None) got the same "
                   "hash: the hash is not chained to its parent.",
                   hint="hash the parent's hash together with the ids: a block's keys depend on every token before "
                   "it, so two prompts may share a block only if they share everything up to its end.")
    pairs = [([1, 2, 3, 4], [4, 3, 2, 1], "the ids reversed"), ([1, 23], [12, 3], "[1, 23] and [12, 3]"),
             ([1, 2], [3, 0], "[1, 2] and [3, 0] (same sum)"), ([256, 1], [0, 2], "ids past 255"),
             ([70000, 5], [4464, 6], "ids past 65535")]
    # ids equal in their low k bits, in one block: an encoding that keeps k bits per id (bytes, 'H', 'i', a numpy
    # int32 array) maps both to the same bytes, whatever digest follows
    wraps = [([7 + (1 << k), 1, 150_000], [7, 1, 150_000], k) for k in (8, 16, 32)]
    for x, y, k in wraps:
        try:
            same = _hash(fn, p1, x, case) == _hash(fn, p1, y, case)
        except ExerciseFailed:
            same = False  # an encoding that refuses wide ids is told so below, with its own hint
        if same:
            raise fail(case, f"two different blocks got the same hash: {x} and {y}, whose first ids are equal mod "
                       f"2**{k}: your hash keeps only the low {k} bits of each id (a {k}-bit pack or array wraps "
                       "around), so 150,000-token vocabularies collide.",
                       hint="pack each id in 8 bytes, struct.pack('<%dq' % len(ids), *ids), or hash "
                       "repr(tuple(ids)).encode(): nothing narrower than the ids themselves.")
    for x, y, what in pairs:
        try:
            same = _hash(fn, p1, x, case) == _hash(fn, p1, y, case)
        except ExerciseFailed as e:
            if max(x + y) < 256:
                raise
            raise rehint(e, "token ids go past 255 (vocabularies have 150,000): bytes(ids) holds only 0..255; pack "
                         "each id in 8 bytes (struct.pack('<%dq' % len(ids), *ids)) or hash repr(tuple(ids))."
                         ) from None
        if same:
            raise fail(case, f"two different blocks got the same hash: {x} and {y} ({what}).",
                       hint="hash the ids in order and unambiguously: struct.pack('<%dq' % len(ids), *ids), or "
                       "repr(tuple(ids)).encode(); not their sum, their sorted order, or digits glued without a "
                       "separator.")
    rng, seen = random.Random(13), {}
    parents = [None, p1, p2, a]
    for i in range(3000):
        bs = rng.choice((1, 2, 4, 16))
        ids = tuple(rng.randrange(200_000) for _ in range(bs))
        parent = rng.choice(parents)
        h = _hash(fn, parent, list(ids), case)
        if i % 50 == 0:
            parents.append(h)
        key = (parent, ids)
        if h in seen and seen[h] != key:
            raise fail(case, f"two different blocks got the same hash after {i + 1} random blocks: ids {seen[h][1]} "
                       f"and {ids}; your hashes are {len(h)} bytes.",
                       hint="use a full cryptographic digest (hashlib.sha256(...).digest(), 32 bytes): a short or "
                       "truncated hash collides, and a collision hands one prompt another prompt's keys.")
        seen[h] = key


def _check_chain(hash_fn, chain_fn) -> None:
    rng = random.Random(5)
    for bs in (1, 2, 3, 4, 16):
        for n in sorted({0, 1, bs - 1, bs, bs + 1, 2 * bs, 3 * bs - 1, 3 * bs + 2, 5 * bs}):
            ids = [rng.randrange(50_000) for _ in range(n)]
            case = f"block_hashes(token_ids of length {n}, block_size={bs})"
            got = call(case, f"block_hashes(..., {bs})", chain_fn, list(ids), bs)
            if not isinstance(got, (list, tuple)):
                raise fail(case, f"returned {type(got).__name__}; expected a list of bytes, one per full block.")
            if n == 2 * bs:  # the ids as a tuple (the statement: a list or a tuple) give the same chain
                tcase = f"block_hashes(a tuple of {n} ids, block_size={bs})"
                try:
                    as_tuple = call(tcase, f"block_hashes(tuple(...), {bs})", chain_fn, tuple(ids), bs)
                except ExerciseFailed as e:
                    raise rehint(e, "token_ids may be a tuple as well as a list: use only what both have (len, "
                                 "slicing, iteration), or start with ids = list(token_ids).") from None
                if not isinstance(as_tuple, (list, tuple)) or [bytes(h) for h in as_tuple] != [bytes(h) for h in got]:
                    raise fail(tcase, "the same ids as a tuple gave another chain than as a list.",
                               hint="token_ids may be a tuple as well as a list: hash each block's ids in one "
                               "canonical form (list(ids) packed, or tuple(ids)), never repr of the container.")
            want = n // bs
            if len(got) != want:
                hint = ("a partial last block has no hash: it is not full, its keys will change as tokens arrive. "
                        "Stop at len(token_ids) // block_size blocks." if len(got) > want else
                        "every full block gets a hash, the last one too (range(0, len - block_size + 1, block_size)).")
                raise fail(case, f"{len(got)} hashes for {n} tokens in blocks of {bs}.", expected=f"{want} "
                           "(full blocks only)", got=len(got), hint=hint)
            parent = None
            for i in range(want):
                exp = _hash(hash_fn, parent, ids[i * bs : (i + 1) * bs], case)
                if bytes(got[i]) != exp:
                    first = "None" if i == 0 else f"the hash of block {i - 1}"
                    raise fail(case, f"block {i}'s hash is not hash_block_tokens({first}, token_ids[{i * bs}:"
                               f"{(i + 1) * bs}]) computed with your own function.",
                               hint="chain them: parent = None; for each full block: parent = hash_block_tokens("
                               "parent, block); append parent.")
                parent = exp


# ============================================================================ the same hash in another process
CONSTANTS = (bytes, str, int, float, tuple, frozenset, type(None))


def _assignment(name: str, scope: dict) -> ast.Assign | None:
    """The notebook's last statement that assigns ``name`` (IPython keeps every cell's source in ``In``), or None."""
    history = scope.get("In")
    if not isinstance(history, list):
        return None
    for cell in reversed(history):
        try:
            tree = ast.parse(cell)
        except (SyntaxError, ValueError, TypeError):
            continue
        for node in reversed(tree.body):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return node
    return None


def _literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def _loader(fn) -> str | None:
    """Python source that defines ``fn`` in a fresh interpreter, or None when it cannot be rebuilt there.

    A notebook's constant is made there the way the notebook made it (its assignment run again, as a second
    server would run it: ``os.urandom`` there gives other bytes), not copied by value; anything else the function
    names is imported from where it lives (``from hashlib import sha256`` included).
    """
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    m = sys.modules.get(mod or "")
    if m is not None and mod != "__main__" and getattr(m, "__file__", None) and "<locals>" not in qual:
        return (f"import importlib\nfn = importlib.import_module({mod!r})\n"
                f"for part in {qual.split('.')!r}:\n    fn = getattr(fn, part)\n")
    lines, done, defined = ["def _obj(home, qual):", "    import importlib", "    o = importlib.import_module(home)",
                            "    for part in qual.split('.'):", "        o = getattr(o, part)", "    return o"], set(), set()

    def name_one(name, value, scope):
        if isinstance(value, types.ModuleType):
            lines.append(f"import {value.__name__} as {name}")
        elif isinstance(value, CONSTANTS):
            define(name, value, scope)
        elif isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) == mod:
            add(value)
        else:
            home, where = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
            if isinstance(home, str) and isinstance(where, str) and home != mod and "<locals>" not in where:
                lines.append(f"{name} = _obj({home!r}, {where!r})")  # from hashlib import sha256, and the like

    def define(name, value, scope):  # a constant: its assignment run again when the notebook has one
        if name in defined:
            return
        defined.add(name)
        node = _assignment(name, scope) if mod == "__main__" else None
        if node is None or _literal(node.value):
            lines.append(f"{name} = {value!r}")
            return
        for used in sorted({n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)} & set(scope)):
            name_one(used, scope[used], scope)
        lines.append(ast.unparse(node))

    def add(obj):  # obj's source, after the modules, constants and same-notebook helpers it names
        if id(obj) in done:
            return
        done.add(id(obj))
        code = getattr(obj, "__code__", None)
        names, todo = set(), [code] if code else []
        while todo:
            c = todo.pop()
            names |= set(c.co_names)
            todo += [k for k in c.co_consts if isinstance(k, types.CodeType)]
        scope = getattr(obj, "__globals__", {})
        for name in sorted(n for n in names if n in scope):  # builtins and attribute names are not in scope
            name_one(name, scope[name], scope)
        lines.append(textwrap.dedent(inspect.getsource(obj)))

    try:
        add(fn)
    except (OSError, TypeError):
        return None
    return "\n".join(lines) + f"\nfn = {fn.__name__}\n"


def _other_process(fn, inputs) -> list[str] | str:
    """The hex hashes of ``inputs`` computed in another Python process with another PYTHONHASHSEED, or a sentence
    saying why they could not be computed there."""
    source = _loader(fn)
    if source is None:
        return "its source could not be found (inspect.getsource failed)"
    script = source + textwrap.dedent("""
        import json, sys
        inputs = json.loads(sys.stdin.read())
        out = [bytes(fn(None if p is None else bytes.fromhex(p), ids)).hex() for p, ids in inputs]
        print(json.dumps(out))
    """)
    seed = "4321" if os.environ.get("PYTHONHASHSEED") == "1234" else "1234"  # unset here means random here
    env = {**os.environ, "PYTHONHASHSEED": seed,
           "PYTHONPATH": os.pathsep.join([os.getcwd()] + [p for p in sys.path if p and os.path.isdir(p)])}
    try:
        out = subprocess.run([sys.executable, "-c", script], input=json.dumps(inputs), capture_output=True,
                             text=True, timeout=120, env=env, cwd=os.getcwd())
    except (subprocess.SubprocessError, OSError) as e:
        return f"the second Python did not run ({type(e).__name__}: {e})"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no error message"])[-1]
        return f"rebuilding it there failed: {last}"
    try:
        got = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"it printed no hashes there ({out.stdout.strip()[-120:]!r})"
    return got


def _check_processes(fn) -> None:
    inputs, parent = [], None
    for ids in ([1, 2, 3, 4], [5, 6, 7, 8], [300, 2, 70000, 9], [0, 0, 0, 0]):
        inputs.append((None if parent is None else parent.hex(), ids))
        parent = _hash(fn, parent, ids, "hash_block_tokens")
    here = [_hash(fn, None if p is None else bytes.fromhex(p), ids, "hash_block_tokens").hex() for p, ids in inputs]
    there = _other_process(fn, inputs)
    if isinstance(there, str):
        raise fail("hash_block_tokens in another Python process (another PYTHONHASHSEED)",
                   f"the check could not run your hash in a fresh Python: {there}. A second server must compute the "
                   "same bytes from your code alone, so this cannot pass unchecked.",
                   hint="define hash_block_tokens from module-level names a fresh Python can rebuild: imports, "
                   "constants (bytes, str, numbers) and functions of the same notebook. A value kept in a dict, list "
                   "or object is not carried over (and a random salt would differ there anyway).")
    if there != here:
        i = next(k for k, (x, y) in enumerate(zip(here, there)) if x != y)
        raise fail("hash_block_tokens in another Python process (another PYTHONHASHSEED)",
                   f"block {i} of a chain hashed to {here[i][:16]}... here and {there[i][:16]}... in a fresh process.",
                   hint="Python's hash() of bytes and str is salted per process (PYTHONHASHSEED), and os.urandom or "
                   "id() differ too: two servers sharing a store would never find each other's blocks. Use "
                   "hashlib.sha256, and a fixed value for the first block's parent.")


# ============================================================================ the cache, mirrored on the oracle
class _Mirror:
    """The learner's cache and the library's, driven together; learner block numbers mapped onto the oracle's."""

    def __init__(self, cls, num_blocks: int, title: str):
        self.cls, self.n = cls, num_blocks
        self.title = f"{title}: {_name(cls)}(num_blocks={num_blocks})"
        self.ops: list[str] = [f"cache = {_name(cls)}({num_blocks})"]
        self.mine = call(self.title, f"{_name(cls)}({num_blocks})", cls, num_blocks)
        for m in METHODS:
            if not callable(getattr(self.mine, m, None)):
                raise fail(self.title, f"{_name(cls)}({num_blocks}) has no {m}() method.",
                           hint="pass the class itself, with lookup, acquire, allocate, cache and release.")
        kept = kept_inside(self.mine, lambda x: isinstance(x, (lib.PrefixCache, lib.FreeBlockQueue)))
        if kept:
            raise fail(self.title, f"your class keeps the library's own {type(kept[1]).__name__} in "
                       f"self.{kept[0]} and hands it the work: the check compares with that very class.",
                       hint="write the free queue yourself (an OrderedDict: move_to_end, popitem(last=False)).")
        self.oracle = lib.PrefixCache(num_blocks)
        self.m: dict[int, int] = {}  # learner block -> oracle block
        self.inv: dict[int, int] = {}
        self.log: list[tuple] = []  # the calls so far, to rebuild a twin
        self.names: dict[bytes, str] = {}
        self.seen: list[bytes] = []

    # ---------------------------------------------------------------- messages
    def name(self, h: bytes) -> str:
        if h not in self.names:
            self.names[h] = f"h{len(self.names)}"
            self.seen.append(h)
        return self.names[h]

    def case(self) -> str:
        ops = self.ops if len(self.ops) <= 16 else self.ops[:1] + ["..."] + self.ops[-14:]
        return self.title + "\n   " + "\n   ".join(ops)

    def _blocks(self, case, what, got) -> list[int]:
        if not isinstance(got, (list, tuple)) or any(isinstance(b, bool) or not isinstance(b, int) for b in got):
            raise fail(case, f"{what} returned {got!r:.80}; expected a list of block numbers.")
        return list(got)

    def mapped(self, blocks) -> list:
        return [self.m.get(b, f"{b} (never allocated)") for b in blocks]

    # ---------------------------------------------------------------- operations
    def lookup(self, hashes) -> tuple[list[int], list[int]]:
        self.ops.append(f"lookup([{', '.join(self.name(h) for h in hashes)}])")
        exp = self.oracle.lookup(hashes)
        got = self._blocks(self.case(), "lookup()", call(self.case(), "lookup()", self.mine.lookup, list(hashes)))
        self.log.append(("lookup", list(hashes)))
        if self.mapped(got) != exp:
            raise fail(self.case(), "the last lookup found other blocks than a right prefix cache:",
                       expected=self._show(exp), got=got, hint=self._lookup_hint(hashes, got, exp), generic=True)
        self.ops[-1] += f" -> {got}"
        return got, exp

    def _show(self, oracle_blocks) -> list:
        return [self.inv.get(b, "?") for b in oracle_blocks]

    def _lookup_hint(self, hashes, got, exp) -> str:
        if len(got) > len(exp):
            extra = hashes[len(exp)] if len(exp) < len(hashes) else None
            if extra is not None and extra in self.seen and self.oracle.get(extra) is None:
                return (f"{self.name(extra)} was cached once but its block was evicted since: forget a block's hash "
                        "when you evict it, or lookup hands out keys the block no longer holds.")
            return "lookup must stop at the first hash that is not cached: the longest run from the first."
        return "a hash that is still cached (its block held, or waiting in the free queue) was not found."

    def acquire(self, mine: list[int], theirs: list[int]) -> None:
        self.ops.append(f"acquire({mine})")
        call(self.case(), "acquire()", self.mine.acquire, list(mine))
        self.log.append(("acquire", list(mine)))
        self.oracle.acquire(theirs)

    def allocate(self) -> tuple[int, int] | None:
        """(learner block, oracle block), or None when both raise (every block held)."""
        o_empty = self.oracle.free_blocks - len(self.oracle.free_queue) > 0
        head = next(iter(self.oracle.free_queue), None)
        try:
            exp = self.oracle.allocate()
        except PoolExhausted:
            exp = None
        self.ops.append("allocate()")
        try:
            got = self.mine.allocate()
        except NotImplementedError:
            raise fail(self.case(), "allocate() is not implemented yet (it raised NotImplementedError).") from None
        except Exception as e:
            if exp is None and isinstance(e, RuntimeError):
                self.ops[-1] += f" raised {type(e).__name__}"
                self.log.append(("allocate",))
                return None
            if exp is None:
                self.ops[-1] += f" raised {type(e).__name__}"
                raise fail(self.case(), f"every block is held, and allocate() raised {type(e).__name__}: {e}; the "
                           "statement asks for a RuntimeError.",
                           hint="check for a full pool yourself and raise RuntimeError('every block is held'): an "
                           "empty OrderedDict's popitem raises KeyError, a deque's popleft IndexError, which a caller "
                           "cannot tell from a bug.") from None
            if not isinstance(e, RuntimeError):
                raise fail(self.case(), f"allocate() crashed with {type(e).__name__}: {e}, while a block was free "
                           f"({'one holding nothing' if o_empty else 'a cached block no request holds'}): an error "
                           "inside allocate, not a full pool.",
                           hint="read the traceback of that error: a dict entry or queue item that should be there "
                           "is missing (on eviction delete both hash -> block and block -> hash; on release put the "
                           "block in exactly one place).") from None
            raise fail(self.case(), f"allocate() raised {type(e).__name__}: {e}, but a block was free "
                       f"({'one holding nothing' if o_empty else 'a cached block no request holds'}).",
                       hint="raise only when every block is held by some request; otherwise take an empty block, "
                       "else evict the least recently freed cached block.") from None
        self.log.append(("allocate",))
        self.ops[-1] += f" -> {got!r}"
        if isinstance(got, bool) or not isinstance(got, int) or not 0 <= got < self.n:
            raise fail(self.case(), f"allocate() returned {got!r}; expected a block number 0..{self.n - 1}.")
        o = self.m.get(got)
        if exp is None:
            raise fail(self.case(), f"every block is held by a request, yet allocate() handed out block {got}, "
                       "which a request is still using.", hint="a block in use must never be evicted: when every "
                       "block is held, raise (RuntimeError) instead.")
        if not o_empty:  # an eviction: it must be the least recently freed cached block
            want = self.inv.get(exp)
            if got != want:
                raise fail(self.case(), "allocate() evicted another block than the least recently freed one:",
                           expected=want, got=got, hint=self._evict_hint(o, head), generic=True)
            return got, exp
        if o is not None and o != exp and (self.oracle.ref_count(o) > 0 or self.oracle.hash_of(o) is not None):
            if self.oracle.ref_count(o) > 0:
                raise fail(self.case(), f"allocate() handed out block {got}, which a request still holds (in use).",
                           hint="a block in use must never be handed out or evicted: count references "
                           "(acquire +1, release -1) and take only blocks at zero.")
            raise fail(self.case(), f"allocate() evicted cached block {got} although a block holding nothing was "
                       "free.", hint="take an empty block first (never used, or freed without a hash); evict a "
                       "cached block only when none is left.")
        # empty blocks are interchangeable: got takes exp's image, and the learner block that had it takes got's
        old_l = self.inv.pop(exp, None)
        if o is not None:
            self.inv.pop(o, None)
        self.m.pop(got, None)
        if old_l is not None and old_l != got:
            if o is not None:
                self.m[old_l], self.inv[o] = o, old_l
            else:
                self.m.pop(old_l, None)
        self.m[got], self.inv[exp] = exp, got
        return got, exp

    def _evict_hint(self, o, head) -> str:
        if o is None:
            return "evict the least recently freed cached block (the head of the free queue)."
        if self.oracle.ref_count(o) > 0:
            return ("that block is in use (a request holds it): a block in use must never be evicted; a hit "
                    "(acquire) must take it out of the free queue.")
        queue = list(self.oracle.free_queue)
        if queue and o == queue[-1] and len(queue) > 1:
            return "that is the most recently freed block: evict the head, the least recently freed."
        return "evict the head of the free queue: the block freed longest ago."

    def cache(self, mine: int, theirs: int, h: bytes) -> None:
        self.ops.append(f"cache({mine}, {self.name(h)})")
        call(self.case(), "cache()", self.mine.cache, mine, h)
        self.log.append(("cache", mine, h))
        self.oracle.cache(theirs, h)

    def recache(self, mine: int, theirs: int, h: bytes) -> None:
        """cache() again on a block that already holds ``h``: nothing may change."""
        self.ops.append(f"cache({mine}, {self.name(h)})  # block {mine} holds {self.name(h)} already")
        try:
            call(self.case(), "cache()", self.mine.cache, mine, h)
        except ExerciseFailed as e:
            raise rehint(e, f"cache() on a block that already holds that very hash must change nothing: a scheduler "
                         "names every full block of a request, the hits again (vLLM skips a block whose hash is "
                         "set already).") from None
        self.log.append(("cache", mine, h))
        self.oracle.cache(theirs, h)
        self.compare()

    def release(self, mine: list[int], theirs: list[int]) -> None:
        self.ops.append(f"release({mine})")
        call(self.case(), "release()", self.mine.release, list(mine))
        self.log.append(("release", list(mine)))
        self.oracle.release(theirs)
        self.compare()

    # ---------------------------------------------------------------- the whole state
    def _twin(self):
        try:
            return copy.deepcopy(self.mine)
        except Exception:
            twin = self.cls(self.n)
            for op in self.log:
                getattr(twin, op[0])(*op[1:])
            return twin

    def compare(self) -> None:
        """Every hash seen so far, looked up alone in a copy of the learner's cache: the oracle's block, or none."""
        try:
            twin = self._twin()
            got = {h: twin.lookup([h]) for h in self.seen}
        except Exception:
            return  # judged by its own calls alone
        for h in self.seen:
            exp = self.oracle.lookup([h])
            if not isinstance(got[h], (list, tuple)) or self.mapped(got[h]) != exp:
                state = ("cached in block " + str(self._show(exp)[0])) if exp else "evicted (not cached)"
                raise fail(self.case(), f"after the last operation {self.name(h)} should be {state}, but lookup("
                           f"[{self.name(h)}]) on a copy of your cache returns {got[h]!r}.",
                           hint="compare your free queue's order with the rule: released blocks join the tail, a "
                           "request's blocks tail first; a hit leaves the queue; allocate evicts the head.",
                           generic=True)


# ============================================================================ flows
def _serve(s: _Mirror, tokens: list[int], bs: int, held: list, recache: bool = False):
    """One request: look up its full blocks, take the hits, allocate the rest (caching each full block)."""
    hashes = lib.block_hashes(tokens, bs)
    mine, theirs = s.lookup(hashes)
    if mine:
        s.acquire(mine, theirs)
    table = (list(mine), list(theirs))
    if mine and recache:  # a scheduler that names every full block of the request, the hits again by their hashes
        s.recache(mine[-1], theirs[-1], hashes[len(mine) - 1])
    for i in range(len(mine), -(-len(tokens) // bs)):
        got = s.allocate()
        if got is None:
            if table[0]:
                s.release(*table)
            return
        table[0].append(got[0])
        table[1].append(got[1])
        if i < len(hashes) and s.oracle.get(hashes[i]) is None:
            s.name(hashes[i])
            s.cache(got[0], got[1], hashes[i])
    s.compare()
    held.append(table)


def _scripted(cls) -> None:
    bs = 2
    chain = [1, 2, 3, 4, 5, 6]  # three full blocks
    s, held = _Mirror(cls, 4, "one prompt, served twice"), []
    _serve(s, chain + [7], bs, held)  # 4 blocks, the last partial
    s.release(*held.pop())
    _serve(s, chain + [8, 9], bs, held, recache=True)  # hits 3 blocks, and names the last hit again

    s, held = _Mirror(cls, 3, "evict the least recently freed"), []
    for t in ([1, 2], [3, 4], [5, 6]):
        _serve(s, t, bs, held)
        s.release(*held.pop())
    _serve(s, [7, 8], bs, held)  # evicts [1, 2]'s block
    _serve(s, [3, 4, 9, 9], bs, held)  # hits [3, 4], evicts [5, 6]'s

    s, held = _Mirror(cls, 3, "a request's blocks are freed last first"), []
    _serve(s, chain, bs, held)
    s.release(*held.pop())
    _serve(s, [9, 9], bs, held)
    _serve(s, chain, bs, held)

    s, held = _Mirror(cls, 3, "a hit block goes back to the tail when freed again"), []
    for t in ([1, 2], [3, 4], [5, 6]):
        _serve(s, t, bs, held)
        s.release(*held.pop())
    _serve(s, [1, 2], bs, held)  # a hit: out of the queue, then back at its tail
    s.release(*held.pop())
    _serve(s, [7, 8], bs, held)  # evicts [3, 4]'s block now
    _serve(s, [1, 2, 5, 6], bs, held)

    s = _Mirror(cls, 3, "a gap in the chain: h1 not cached, h0 and h2 cached")
    a, _, c = s.allocate(), s.allocate(), s.allocate()
    s.cache(a[0], a[1], s.name(H[0]) and H[0])
    s.name(H[1])
    s.cache(c[0], c[1], s.name(H[2]) and H[2])
    s.lookup([H[0], H[1], H[2]])

    s, held = _Mirror(cls, 3, "a lookup that is not followed by acquire changes nothing"), []
    for t in ([1, 2], [3, 4], [5, 6]):
        _serve(s, t, bs, held)
        s.release(*held.pop())
    s.lookup(lib.block_hashes([1, 2], bs))  # looked up, not taken (say the request did not fit)
    _serve(s, [7, 8], bs, held)  # still evicts [1, 2]'s block

    s, held = _Mirror(cls, 2, "two requests share a block"), []
    _serve(s, [1, 2], bs, held)
    _serve(s, [1, 2, 3], bs, held)  # the hit plus one new block: the pool is full
    s.release(*held.pop(0))  # the first request leaves; the shared block is still held
    _serve(s, [4, 5], bs, held)  # no block is free: both must refuse


SIZES = ((1, 1), (3, 2), (4, 2), (6, 3), (8, 2), (12, 4), (5, 1))
OPS = 90


def _random_steps(s: _Mirror, bs: int, rng: random.Random, held: list, prompts: list) -> None:
    if held and (rng.random() < 0.45 or len(held) >= 4):
        s.release(*held.pop(rng.randrange(len(held))))
        return
    if prompts and rng.random() < 0.6:
        base = rng.choice(prompts)
        tokens = base[: rng.randrange(1, len(base) + 1)] if rng.random() < 0.3 else base + [
            rng.randrange(30) for _ in range(rng.randrange(0, 2 * bs + 1))]
    else:
        tokens = prompts[0][: 2 * bs] + [rng.randrange(30) for _ in range(rng.randrange(1, 3 * bs + 1))]
    tokens = tokens[: max(1, s.n * bs)] or [0]
    prompts.append(tokens)
    _serve(s, tokens, bs, held)


def _random(cls) -> None:
    rng = random.Random(28)
    for n, bs in SIZES:
        s, held = _Mirror(cls, n, f"random requests #{n}x{bs} (a shared system prompt, turns, finishes)"), []
        prompts = [[rng.randrange(30) for _ in range(3 * bs)]]
        for _ in range(OPS):
            _random_steps(s, bs, rng, held, prompts)
    # several live instances, driven in turn
    runs = [(_Mirror(cls, n, f"live instance {i + 1} of 3, driven in turn"), bs, [], [[i, i, i, i]])
            for i, (n, bs) in enumerate(((4, 2), (4, 2), (6, 1)))]
    for _ in range(60):
        for s, bs, held, prompts in runs:
            _random_steps(s, bs, rng, held, prompts)


# ============================================================================ the check
def check_prefix_cache_lru(hash_block_tokens, block_hashes=None, PrefixCache=None) -> None:
    """Exercise 13: ``hash_block_tokens``, ``block_hashes`` and ``PrefixCache`` (or one object holding all three)."""
    if block_hashes is None and PrefixCache is None:
        holder = hash_block_tokens
        hash_block_tokens, block_hashes, PrefixCache = (getattr(holder, n, None) for n in
                                                        ("hash_block_tokens", "block_hashes", "PrefixCache"))
    title = f"{CHECK}({_name(hash_block_tokens)}, {_name(block_hashes)}, {_name(PrefixCache)})"
    if not callable(hash_block_tokens) or not callable(block_hashes) or not isinstance(PrefixCache, type):
        raise fail(title, "expected your two functions and your class.",
                   hint="call check_prefix_cache_lru(hash_block_tokens, block_hashes, PrefixCache).")
    for answer, own in ((hash_block_tokens, lib.hash_block_tokens), (block_hashes, lib.block_hashes),
                        (PrefixCache, lib.PrefixCache)):
        if is_own(answer, own):
            raise fail(title, f"{_name(answer)} is the library's own swkv_teach.caches.prefix.{own.__name__} (or "
                       "built on it), the very one the check compares with: it shows nothing about your code.",
                       hint="pass the ones you wrote. If you did write them, an import run after them replaced them: "
                       "run your cell again.")
    _check_hash(hash_block_tokens)
    _check_chain(hash_block_tokens, block_hashes)
    try:
        _scripted(PrefixCache)
        _random(PrefixCache)
    except ExerciseFailed as e:
        found = diagnose(PrefixCache)
        if found:
            raise rehint(e, found, "(a probe on a fresh cache found the bug below)") from None
        raise
    _check_processes(hash_block_tokens)
    passed(f"{_name(hash_block_tokens)} chains blocks stably across processes, {_name(block_hashes)} hashes full "
           f"blocks only, and {_name(PrefixCache)} evicts the least recently freed block, never one in use, like the "
           f"library's prefix cache (7 scripted flows, {len(SIZES) * OPS} random operations on pools of 1 to 12 "
           "blocks and 3 live instances, the whole state compared after each).")
