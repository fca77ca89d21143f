"""docs/concepts/architecture.md's thread, lock and event tables against the code: a lock,
condition, queue, event, lock file or thread started in ``dra_gpu/`` without its row fails
here, and so does a row whose construction is gone (the same approach as test_docs.py for the
flags).

Cases:
- every construction the inventory finds has a row naming its key in a table of its kind, in
  its program's section, and every key a row names is a construction of that kind;
- each lock table's ``#`` column (the lock order) counts 1, 2, 3, ...;
- the wrappers in :data:`HELPERS` still exist (else their call sites would go unseen);
- on small modules parsed from strings: a lock without its row and a row without its lock fail
  with the messages a developer gets, and every form of construction below is found.

The inventory walks every ``.py`` under ``dra_gpu/`` (the generated ``pb/`` left out) with
``ast`` and finds each construction
of a synchronization primitive or thread, in every form: ``threading.Lock()``, ``Lock()`` after
``from threading import Lock``, ``field(default_factory=threading.Condition)``, a class that
subclasses one (``class _Server(ThreadingHTTPServer)``: the class is the construction), and the
call sites of the project's own wrappers (:data:`HELPERS`). Each gets a stable key, the module
path under ``dra_gpu/`` and where in it, never a line number:

- ``prepare/checkpoint.py:CheckpointStore._cond``: assigned to ``self._cond`` in a method, or a
  class-level field;
- ``kubeletplugin/publisher.py:Publisher.start[publisher]``: a thread with a literal name
  (``name=``, ``thread_name_prefix=``) that is not assigned to an attribute;
- ``controller/command.py:main.stop``: assigned to a local variable;
- ``prepare/state.py:_KeyedLocks.hold``: none of these, the enclosing function;
- a second construction with the same key gets ``#2``, and so on, in source order.

Lock files: each lock FILE is one row of the lock table, naming the places that choose the file
and take it: calls of ``fcntl.flock``/``fcntl.lockf`` and of the helpers in :data:`HELPERS`
(``atomicfile.locked``, ``call_lock.held``, ``call_lock.NodeCallLock``). Inside a
helper's own body its calls are the mechanism, not a lock file, and are not counted.

The tables are those of the sections named in :data:`SECTIONS`; a table's first column says
what it lists (``thread``, ``lock`` or ``event``), its ``where`` column names the keys (in
backticks, several to a cell allowed). A key under ``controller/`` needs a row in the
controller's section, any other key one in a kubelet-plugin section; a key may also be named
in the other program's section (code both run: ``metrics.py``, ``kube/``).
"""

from __future__ import annotations

import ast
import functools
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dra_gpu"
DOC = ROOT / "docs" / "concepts" / "architecture.md"

THREAD, LOCK, FLOCK, EVENT = "thread", "lock", "lock file", "event"
# What kind of construction goes into which kind of table.
TABLE_OF = {THREAD: "thread", LOCK: "lock", FLOCK: "lock", EVENT: "event"}

# Fully qualified name -> kind. Queues are locks with conditions inside (a full one blocks).
PRIMITIVES: dict[str, str] = {
    **dict.fromkeys(
        [
            "threading.Lock",
            "threading.RLock",
            "threading.Condition",
            "threading.Semaphore",
            "threading.BoundedSemaphore",
            "threading.Barrier",
            "_thread.allocate_lock",
            "queue.Queue",
            "queue.SimpleQueue",
            "queue.PriorityQueue",
            "queue.LifoQueue",
        ],
        LOCK,
    ),
    **dict.fromkeys(["fcntl.flock", "fcntl.lockf"], FLOCK),
    **dict.fromkeys(["threading.Event", "concurrent.futures.Future"], EVENT),
    **dict.fromkeys(
        [
            "threading.Thread",
            "threading.Timer",
            "_thread.start_new_thread",
            "concurrent.futures.ThreadPoolExecutor",
            "concurrent.futures.thread.ThreadPoolExecutor",
            "multiprocessing.pool.ThreadPool",
            # Servers that start a thread per request or connection.
            "socketserver.ThreadingMixIn",
            "socketserver.ThreadingTCPServer",
            "socketserver.ThreadingUDPServer",
            "socketserver.ThreadingUnixStreamServer",
            "socketserver.ThreadingUnixDatagramServer",
            "http.server.ThreadingHTTPServer",
            # Libraries' calls that start threads of their own.
            "prometheus_client.start_http_server",
            "prometheus_client.start_wsgi_server",
            "grpc.server",
        ],
        THREAD,
    ),
}

# The project's own wrappers: their call sites are the constructions the tables name (a lock
# file is chosen there, a thread named there: ``_thread("watch", ...)`` is ``main[watch]``);
# inside them, what they wrap is not counted again. A new function that locks a file its caller
# names, or starts a thread its caller names, belongs here.
HELPERS: dict[str, str] = {
    "dra_gpu.kubeletplugin.atomicfile.locked": FLOCK,
    "dra_gpu.kubeletplugin.atomicfile.take": FLOCK,
    "dra_gpu.kubeletplugin.atomicfile.try_take": FLOCK,
    "dra_gpu.kubeletplugin.atomicfile.waited_for": FLOCK,
    "dra_gpu.kubeletplugin.atomicfile._try": FLOCK,
    "dra_gpu.kubeletplugin.call_lock.held": FLOCK,
    "dra_gpu.kubeletplugin.call_lock.NodeCallLock": FLOCK,
    "dra_gpu.controller.command._thread": THREAD,
}

# A reference to a primitive passed to these is no construction.
NOT_CONSTRUCTING = {"isinstance", "issubclass", "typing.cast", "cast", "typing.TypeVar"}

PLUGIN, CONTROLLER = "plugin", "controller"
# Section heading -> which program its tables describe.
SECTIONS = {
    "Threads of the kubelet plugin": PLUGIN,
    "Locks of the kubelet plugin": PLUGIN,
    "Events of the kubelet plugin": PLUGIN,
    "Threads, locks and events of the controller": CONTROLLER,
}

WHAT_A_ROW_SAYS = {
    "thread": "the thread's name, who starts it and what it does",
    "lock": (
        "what it guards, who takes it, whether it is held around I/O, and its place in the order "
        "(the # column: a thread holding a lock takes only locks further down)"
    ),
    "event": "who sets it and who waits on it",
}


@dataclass(frozen=True)
class Construction:
    key: str  # module path under dra_gpu/ ':' where in it
    kind: str  # THREAD, LOCK, FLOCK or EVENT
    what: str  # the primitive or helper, fully qualified
    line: int  # for the message only

    @property
    def module(self) -> str:
        return self.key.split(":", 1)[0]

    @property
    def program(self) -> str:
        return CONTROLLER if self.module.startswith("controller/") else PLUGIN


# --- the inventory --------------------------------------------------------------------------


def module_name(module: str) -> str:
    """``prepare/checkpoint.py`` -> ``dra_gpu.prepare.checkpoint``."""
    parts = ["dra_gpu", *module.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def aliases(tree: ast.Module, name: str) -> dict[str, str]:
    """Local name -> fully qualified name: every import of the module (function-local ones
    too) and its top-level functions and classes."""
    found = {
        node.name: f"{name}.{node.name}"
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    package = name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    found[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    found[top] = top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                found[alias.asname or alias.name] = f"{base}.{alias.name}"
    return found


def resolve(node: ast.AST, names: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        head = resolve(node.value, names)
        return f"{head}.{node.attr}" if head is not None else None
    return None


def subclasses(trees: dict[str, tuple[ast.Module, dict[str, str]]]) -> dict[str, str]:
    """The project's classes that subclass a primitive (or such a class), by qualified name."""
    known = dict(PRIMITIVES)
    found: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for module, (tree, names) in trees.items():
            for node in tree.body:
                if not isinstance(node, ast.ClassDef):
                    continue
                qualified = f"{module_name(module)}.{node.name}"
                for base in node.bases:
                    kind = known.get(resolve(base, names) or "")
                    if kind is not None and qualified not in found:
                        found[qualified] = known[qualified] = kind
                        changed = True
    return found


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _thread_name(call: ast.Call, *, helper: bool) -> str | None:
    for keyword in call.keywords:
        if keyword.arg in ("name", "thread_name_prefix"):
            return _literal(keyword.value)
    return _literal(call.args[0]) if helper and call.args else None


class _Walker:
    """One module's constructions; see the module docstring for the keys."""

    def __init__(self, module: str, names: dict[str, str], classes: dict[str, str]) -> None:
        self.module = module
        self.names = names
        self.classes = classes  # the project's subclasses of primitives
        self.found: list[tuple[str, str, str, int]] = []  # (key, kind, what, line)
        self._targets: dict[int, tuple[str, str]] = {}  # id(node) -> ("attr" | "name", name)

    def kind_of(self, what: str | None) -> str | None:
        if what is None or what in self.classes:  # a subclass: its class is the construction
            return None
        return PRIMITIVES.get(what) or HELPERS.get(what)

    def walk(self, node: ast.AST, scope: tuple[tuple[str, str], ...], inside: set[str]) -> None:
        """``scope``: (``class`` | ``def``, name) frames; ``inside``: the helpers' kinds whose
        body this is."""
        if isinstance(node, ast.ClassDef):
            qualified = f"{module_name(self.module)}.{node.name}"
            for base in node.bases:  # a subclass of a primitive: the class is the construction
                what = resolve(base, self.names)
                kind = PRIMITIVES.get(what or "") or self.classes.get(what or "")
                if kind is not None and what is not None:
                    self._record(node, kind, what, (*scope, ("class", node.name)))
                    break
            for child in [*node.decorator_list, *node.keywords]:
                self.walk(child, scope, inside)
            helper = HELPERS.get(qualified) if not scope else None
            kinds = inside | ({helper} if helper else set())
            for statement in node.body:
                self.walk(statement, (*scope, ("class", node.name)), kinds)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            helper = HELPERS.get(f"{module_name(self.module)}.{node.name}") if not scope else None
            kinds = inside | ({helper} if helper else set())
            for child in [*node.decorator_list, *_defaults(node.args)]:
                self.walk(child, scope, inside)
            for statement in node.body:
                self.walk(statement, (*scope, ("def", node.name)), kinds)
            return
        if isinstance(node, ast.Assign | ast.AnnAssign):
            self._note_targets(node)
            value = node.value
            if value is not None:
                self.walk(value, scope, inside)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:  # subscripts and attributes of other objects
                self.walk(target, scope, inside)
            return  # an AnnAssign's annotation is a type, no construction
        if isinstance(node, ast.Call):
            # ``queue.Queue[int]()`` constructs a queue.Queue.
            func = node.func.value if isinstance(node.func, ast.Subscript) else node.func
            what = resolve(func, self.names)
            kind = self.kind_of(what)
            if kind is not None and what is not None and kind not in inside:
                name = _thread_name(node, helper=what in HELPERS)
                self._record(node, kind, what, scope, name=name)
            if kind is None:
                self.walk(node.func, scope, inside)
            typing_only = what in NOT_CONSTRUCTING or (
                isinstance(func, ast.Name) and func.id in NOT_CONSTRUCTING
            )
            for child in [*node.args, *(k.value for k in node.keywords)]:
                # isinstance(x, threading.Thread): a type named, nothing constructed.
                if not (typing_only and _is_type(child)):
                    self.walk(child, scope, inside)
            return
        if isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Load):
            what = resolve(node, self.names)
            kind = self.kind_of(what)
            if kind is not None and what is not None and kind not in inside:
                # A reference that is not called here: a factory (default_factory=, a dict of
                # them), called elsewhere.
                self._record(node, kind, what, scope)
                return
            if isinstance(node, ast.Attribute) and not (
                # ``threading.Thread.__init__(self)``: an attribute of the class, not a factory.
                isinstance(node.value, ast.Name | ast.Attribute)
                and self.kind_of(resolve(node.value, self.names)) is not None
            ):
                self.walk(node.value, scope, inside)
            return
        if isinstance(node, ast.Subscript):
            # ``queue.Queue[int]``: a generic alias, a type; its index may hold constructions.
            if self.kind_of(resolve(node.value, self.names)) is None:
                self.walk(node.value, scope, inside)
            self.walk(node.slice, scope, inside)
            return
        if isinstance(node, ast.arg):
            return  # its annotation is a type
        for child in ast.iter_child_nodes(node):
            self.walk(child, scope, inside)

    def _note_targets(self, node: ast.Assign | ast.AnnAssign) -> None:
        """Which construction in the value binds which name (a single target; a tuple of
        values to a tuple of targets; a dataclass ``field(default_factory=...)``)."""
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        value = node.value
        if value is None:
            return
        pairs: list[tuple[ast.AST, ast.AST]] = [(target, value)]
        if (
            isinstance(target, ast.Tuple)
            and isinstance(value, ast.Tuple)
            and len(target.elts) == len(value.elts)
        ):
            pairs = list(zip(target.elts, value.elts, strict=True))
        for bound, made in pairs:
            if isinstance(made, ast.Call) and resolve(made.func, self.names) in (
                "dataclasses.field",
            ):
                made = next((k.value for k in made.keywords if k.arg == "default_factory"), made)
            if isinstance(bound, ast.Name):
                self._targets[id(made)] = ("name", bound.id)
            elif (
                isinstance(bound, ast.Attribute)
                and isinstance(bound.value, ast.Name)
                and bound.value.id in ("self", "cls")
            ):
                self._targets[id(made)] = ("attr", bound.attr)

    def _record(
        self,
        node: ast.AST,
        kind: str,
        what: str,
        scope: tuple[tuple[str, str], ...],
        *,
        name: str | None = None,
    ) -> None:
        where = ".".join(n for _, n in scope)
        bound = self._targets.get(id(node))
        classes = [i for i, (frame, _) in enumerate(scope) if frame == "class"]
        if isinstance(node, ast.ClassDef):
            pass
        elif bound is not None and bound[0] == "attr" and classes:
            where = ".".join(n for _, n in scope[: classes[-1] + 1]) + "." + bound[1]
        elif name is not None and kind == THREAD:
            where = f"{where}[{name}]"
        elif bound is not None:
            where = f"{where}.{bound[1]}" if where else bound[1]
        self.found.append((f"{self.module}:{where or '<module>'}", kind, what, _line(node)))


def _is_type(node: ast.AST) -> bool:
    """Names of types: ``threading.Thread``, ``(A, B)``, ``A | B``, ``queue.Queue[int]``."""
    if isinstance(node, ast.Tuple):
        return all(_is_type(e) for e in node.elts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _is_type(node.left) and _is_type(node.right)
    if isinstance(node, ast.Subscript):
        return _is_type(node.value)
    return isinstance(node, ast.Name | ast.Attribute | ast.Constant)


def _defaults(args: ast.arguments) -> list[ast.expr]:
    return [*args.defaults, *(d for d in args.kw_defaults if d is not None)]


def _line(node: ast.AST) -> int:
    return getattr(node, "lineno", 0)


@functools.cache
def parse(module: str, text: str) -> ast.Module:
    return ast.parse(text, filename=module)  # read only: one tree serves every test


# A module names a primitive or a helper only through an import of its module, or a subclass
# of one by the class's name: a module without any of those names constructs nothing, and is not
# parsed (half of the package, half of this test's time).
MODULE_WORDS = {q.split(".")[0] for q in PRIMITIVES} | {q.split(".")[-2] for q in HELPERS}


def _words(names: set[str]) -> re.Pattern[str]:
    return re.compile(r"\b(" + "|".join(sorted(map(re.escape, names))) + r")\b")


def parsed(
    sources: dict[str, str],
) -> tuple[dict[str, tuple[ast.Module, dict[str, str]]], dict[str, str]]:
    """(module -> (tree, aliases)) of the modules that may construct something, and the
    project's subclasses of primitives (:func:`subclasses`)."""
    helper_modules = {q.rsplit(".", 1)[0] for q in HELPERS}
    words = _words(MODULE_WORDS)
    wanted = {m for m, t in sources.items() if words.search(t) or module_name(m) in helper_modules}
    trees: dict[str, tuple[ast.Module, dict[str, str]]] = {}
    while True:
        for module in sorted(wanted - trees.keys()):
            tree = parse(module, sources[module])
            trees[module] = (tree, aliases(tree, module_name(module)))
        classes = subclasses(trees)
        named = _words({q.rsplit(".", 1)[1] for q in classes}) if classes else None
        more = {m for m, t in sources.items() if named is not None and named.search(t)}
        if more <= wanted:
            return trees, classes
        wanted |= more


def inventory(sources: dict[str, str]) -> list[Construction]:
    """The constructions in ``sources`` (module path under dra_gpu/ -> its text)."""
    trees, classes = parsed(sources)
    found: list[Construction] = []
    for module, (tree, names) in sorted(trees.items()):
        walker = _Walker(module, names, classes)
        for statement in tree.body:
            walker.walk(statement, (), set())
        seen: Counter[str] = Counter()
        for key, kind, what, line in sorted(walker.found, key=lambda f: f[3]):
            seen[key] += 1
            unique = key if seen[key] == 1 else f"{key}#{seen[key]}"
            found.append(Construction(unique, kind, what, line))
    return found


@functools.cache
def package_sources() -> dict[str, str]:
    return {
        path.relative_to(PACKAGE).as_posix(): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
        if "pb" not in path.relative_to(PACKAGE).parts[:1]
    }


# --- the tables -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    section: str
    table: str  # "thread", "lock" or "event": the table's first column that names one
    name: str  # its cell in the column named like the table ("lock": `calls.lock`)
    keys: tuple[str, ...]
    cells: dict[str, str]


def _cells(line: str) -> list[str]:
    # `\|` is a literal bar inside a cell.
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def tables(text: str) -> Iterator[tuple[str, list[str], list[list[str]]]]:
    """(section heading, header, rows) of every table under a heading of :data:`SECTIONS`."""
    section: str | None = None
    header: list[str] | None = None
    rows: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if header is not None and not line.startswith("|"):
            assert section is not None
            yield section, header, rows
            header, rows = None, []
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            section = heading if heading in SECTIONS else None
        elif section is not None and line.startswith("|"):
            if header is None:
                header = [c.lower() for c in _cells(line)]
            elif not set(line) <= set("|-: "):
                rows.append(_cells(line))


def doc_rows(text: str) -> tuple[list[Row], list[str]]:
    """The rows of the tables, and what is wrong with the tables' shape."""
    found: list[Row] = []
    problems: list[str] = []
    seen_sections = set()
    for section, header, rows in tables(text):
        seen_sections.add(section)
        what = next((c for c in header if c in ("thread", "lock", "event")), None)
        if what is None or "where" not in header:
            problems.append(
                f'a table in "{section}" has no `thread`, `lock` or `event` column, or no '
                f"`where` column: {header}"
            )
            continue
        for cells in rows:
            named = dict(zip(header, cells, strict=False))
            keys = tuple(re.findall(r"`([^`]+)`", named.get("where", "")))
            name = named.get(what, "").replace("`", "") or "(no name)"
            if not keys and what != "thread":  # only a process's main thread has no key
                problems.append(
                    f'"{section}", row "{name}": no key in backticks in its `where` column'
                )
            found.append(Row(section, what, name, keys, named))
    for section in SECTIONS:
        if section not in seen_sections:
            problems.append(
                f'docs/concepts/architecture.md has no section "{section}" with a table'
            )
    return found, problems


# --- the check ------------------------------------------------------------------------------


def problems(found: Sequence[Construction], rows: Sequence[Row]) -> list[str]:
    """Every construction without its row, and every row key without its construction."""
    out: list[str] = []
    by_key = {c.key: c for c in found}
    listed: dict[str, list[Row]] = {}
    for row in rows:
        for key in row.keys:
            listed.setdefault(key, []).append(row)
    for c in found:
        table = TABLE_OF[c.kind]
        wanted = [s for s, program in SECTIONS.items() if program == c.program]
        ok = [r for r in listed.get(c.key, []) if r.table == table and r.section in wanted]
        if ok:
            continue
        elsewhere = listed.get(c.key, [])
        section = next((s for s in wanted if f"{table}s" in s.lower()), wanted[0])
        hint = (
            f' (it is named in a {elsewhere[0].table} table of "{elsewhere[0].section}": the '
            "wrong table)"
            if elsewhere
            else ""
        )
        kind_hint = ""
        if c.kind == FLOCK:
            kind_hint = (
                " A lock file is one row however many places take it: add the key to the row of "
                "its file, or a new row for a new file. If this function is itself a wrapper "
                "that locks a file its caller names, add it to HELPERS in "
                "tests/unit/test_lock_table.py instead."
            )
        out.append(
            f"dra_gpu/{c.module}:{c.line}: {c.kind} ({c.what}) `{c.key}` has no row in "
            f'docs/concepts/architecture.md, section "{section}"{hint}. Add a row naming `{c.key}` '
            "in its "
            f"`where` column: {WHAT_A_ROW_SAYS[table]}.{kind_hint}"
        )
    for key, named_in in sorted(listed.items()):
        for row in named_in:
            made = by_key.get(key)
            if made is None:
                module = key.split(":", 1)[0]
                now = sorted(f.key for f in found if f.module == module)
                out.append(
                    f'docs/concepts/architecture.md, "{row.section}", row "{row.name}": `{key}` '
                    "names no "
                    f"construction in dra_gpu/ (renamed, moved or removed?): fix the key or drop "
                    f"it (and the row, if it was its last). Constructions in {module} now: "
                    f"{', '.join(now) if now else 'none'}"
                )
            elif TABLE_OF[made.kind] != row.table:
                out.append(
                    f'docs/concepts/architecture.md, "{row.section}", row "{row.name}": `{key}` is '
                    f"{_a(made.kind)} ({made.what}): its row belongs in "
                    f"{_a(TABLE_OF[made.kind])} table"
                )
    return out


def _a(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def order_problems(rows: Sequence[Row]) -> list[str]:
    """The lock tables' ``#`` column counts 1, 2, 3... in each table (the order is the rows')."""
    out = []
    by_section: dict[str, list[Row]] = {}
    for row in rows:
        if row.table == "lock" and "#" in row.cells:
            by_section.setdefault(row.section, []).append(row)
    for section, locks in by_section.items():
        numbers = [r.cells["#"] for r in locks]
        if numbers != [str(i) for i in range(1, len(locks) + 1)]:
            out.append(f'"{section}": the # column must count 1, 2, 3, ... down; it is {numbers}')
    return out


# --- the tests ------------------------------------------------------------------------------


def test_every_construction_has_its_row_and_every_row_its_construction() -> None:
    rows, shape = doc_rows(DOC.read_text())
    found = inventory(package_sources())
    assert found, "the inventory found nothing: the walker is broken"
    wrong = shape + problems(found, rows) + order_problems(rows)
    assert not wrong, "\n" + "\n".join(wrong)


def test_helpers_are_still_defined() -> None:
    """A helper renamed or removed would stop its call sites from being found."""
    modules = {q.rsplit(".", 1)[0] for q in HELPERS}
    defined = set()
    for module, text in package_sources().items():
        if module_name(module) in modules:
            for node in parse(module, text).body:
                if isinstance(node, ast.FunctionDef | ast.ClassDef):
                    defined.add(f"{module_name(module)}.{node.name}")
    gone = sorted(set(HELPERS) - defined)
    assert not gone, f"HELPERS names what dra_gpu/ no longer defines (renamed?): {gone}"


# The check can fail: a module with a lock the table lacks, and a row whose lock is gone.
UNLISTED = """
import threading


class Cache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen = threading.Lock()
"""

ONE_ROW = """
### Locks of the kubelet plugin

| # | lock | where | kind | guards | taken by | held around I/O? |
|---|---|---|---|---|---|---|
| 1 | `Cache._lock` | `cache.py:Cache._lock` | Lock | the cache | readers | no |
| 2 | `Cache._old` | `cache.py:Cache._old` | Lock | what it once did | nobody | no |
"""


def test_a_lock_without_its_row_fails_naming_it() -> None:
    rows, _ = doc_rows(ONE_ROW)
    assert problems(inventory({"cache.py": UNLISTED}), rows) == [
        "dra_gpu/cache.py:8: lock (threading.Lock) `cache.py:Cache._seen` has no row in "
        'docs/concepts/architecture.md, section "Locks of the kubelet plugin". Add a row naming '
        "`cache.py:Cache._seen` in its `where` column: what it guards, who takes it, whether it "
        "is held around I/O, and its place in the order (the # column: a thread holding a lock "
        "takes only locks further down).",
        'docs/concepts/architecture.md, "Locks of the kubelet plugin", row "Cache._old": '
        "`cache.py:Cache"
        "._old` names no construction in dra_gpu/ (renamed, moved or removed?): fix the key or "
        "drop it (and the row, if it was its last). Constructions in cache.py now: "
        "cache.py:Cache._lock, cache.py:Cache._seen",
    ]


FORMS = """
import fcntl
import threading
import queue as q
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from threading import Condition, Lock

from dra_gpu.kubeletplugin import atomicfile

LOCK = Lock()


@dataclass
class Store:
    _cond: threading.Condition = field(default_factory=Condition, init=False)

    def __post_init__(self) -> None:
        self._queue: q.Queue[int] = q.Queue(maxsize=8)
        self._pool = ThreadPoolExecutor(thread_name_prefix="work")

    def start(self, stop: threading.Event) -> threading.Thread:
        threading.Thread(target=print, name="runner").start()
        done, wake = threading.Event(), threading.Event()
        threading.Timer(1.0, print).start()
        return isinstance(stop, threading.Thread | threading.Lock)

    def hold(self, path):
        with atomicfile.locked(path, timeout_s=1.0):
            fcntl.flock(3, fcntl.LOCK_EX)


class Worker(threading.Thread):
    def __init__(self) -> None:
        threading.Thread.__init__(self)
"""

# A helper's own body is its mechanism, not a lock file of its own.
HELPER_BODY = """
import fcntl


def take(fd):
    fcntl.flock(fd, fcntl.LOCK_EX)


def elsewhere(fd):
    fcntl.flock(fd, fcntl.LOCK_EX)
"""


def test_the_inventory_finds_every_form() -> None:
    found = inventory({"forms.py": FORMS, "kubeletplugin/atomicfile.py": HELPER_BODY})
    assert [(c.key, c.kind) for c in found] == [
        ("forms.py:LOCK", LOCK),
        ("forms.py:Store._cond", LOCK),
        ("forms.py:Store._queue", LOCK),
        ("forms.py:Store._pool", THREAD),
        ("forms.py:Store.start[runner]", THREAD),
        ("forms.py:Store.start.done", EVENT),
        ("forms.py:Store.start.wake", EVENT),
        ("forms.py:Store.start", THREAD),
        ("forms.py:Store.hold", FLOCK),
        ("forms.py:Store.hold#2", FLOCK),
        ("forms.py:Worker", THREAD),
        ("kubeletplugin/atomicfile.py:elsewhere", FLOCK),
    ]
