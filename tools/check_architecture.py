"""Fails (exit 1) when kindex's structure breaks its rules (ARCHITECTURE.md); run by CI.

1. No import cycle among kindex modules, counting imports inside functions (only ``if TYPE_CHECKING:`` imports,
   which never run, are left out).
2. Imports point one way: a module imports only from its own layer or the layers below it (LAYERS).
3. Every exception class kindex defines derives from ``KindexError``, and every ``raise Name(...)`` in kindex
   raises one of those.
4. No module over MAX_LINES lines unless its docstring says why (a line starting with ``Long because``).
"""

from __future__ import annotations

import ast
import builtins
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kindex"
MAX_LINES = 400

# Bottom to top. A module may import from its own layer and any layer below; never from above.
LAYERS: list[list[str]] = [
    ["kindex.errors", "kindex.version"],
    [
        "kindex.tokenize",
        "kindex.markdown",
        "kindex.globs",
        "kindex.templating",
        "kindex.hosts",
        "kindex.jsonlog",
        "kindex.files",
        "kindex.gcpause",
    ],
    ["kindex.records", "kindex.results"],
    [
        "kindex.config",
        "kindex.analysis",
        "kindex.jsonextract",
        "kindex.sanitize",
        "kindex.scan",
        "kindex.store",
        "kindex.cache",
        "kindex.lock",
    ],
    ["kindex.llm", "kindex.skillmodel", "kindex.fitting"],
    ["kindex.extractive", "kindex.generators", "kindex.searchindex", "kindex.validate"],
    ["kindex.generate", "kindex.retrieve"],
    ["kindex.skills"],
    ["kindex.kb"],
    ["kindex.watch", "kindex.queue"],
    ["kindex.server", "kindex.mcpserver", "kindex.cli", "kindex"],
]
# Optional heavy dependencies may be imported inside a function (litellm, fastapi's server, uvicorn, tqdm; httpx
# for litellm's timeouts, only where litellm is loaded).
LAZY_ALLOWED = {
    "litellm",
    "httpx",
    "uvicorn",
    "tqdm",
    "kindex.server",
    "kindex.server.app",
    "kindex.mcpserver",
    # Queue mode needs Celery and Redis (extra kindex[queue]): imported only when it is asked for.
    "kindex.server.queued",
    "kindex.queue.jobs",
    "kindex.queue.ratelimit",
    "kindex.queue.worker",
    # Frontmatter is parsed by the scan only; the read path (`kindex context`) does not pay for loading PyYAML.
    "yaml",
    # Importing rjieba builds its whole dictionary; a one-shot question is cut without it (kindex.analysis).
    "rjieba",
    # Compiled only when a glob is matched: most questions name no file. bracex (wcmatch's brace expander) checks
    # a glob's bounds only where globs are read.
    "wcmatch",
    "bracex",
    # Read only when a KB has a kindex.toml.
    "tomllib",
    # With email, zipfile and csv (~40 ms): read only to word the error for a missing extra.
    "importlib.metadata",
}
# Exceptions that are a framework's protocol, not a failure kindex reports: Celery's Reject hands a message back
# to the queue.
PROTOCOL_RAISES = {"Reject"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    best, found = -1, -1
    for i, layer in enumerate(LAYERS):
        for name in layer:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, found = len(name), i
    return found


def imports(tree: ast.Module, module: str, is_package: bool) -> list[tuple[str, int, bool]]:
    """(imported kindex module, line, inside a function) for every import that can run."""
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other, in_function)
                continue
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, inner) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = module.split(".") if is_package else module.split(".")[:-1]
                    pkg = pkg[: len(pkg) - child.level + 1]
                    base = ".".join([*pkg, base] if base else pkg)
                for a in child.names:
                    candidate = f"{base}.{a.name}"
                    out.append(
                        (
                            candidate
                            if (ROOT / Path(*candidate.split(".")).with_suffix(".py")).exists()
                            or (ROOT / Path(*candidate.split(".")) / "__init__.py").exists()
                            else base,
                            child.lineno,
                            inner,
                        )
                    )
            visit(child, inner)

    visit(tree, False)
    return out


def main() -> int:
    failures: list[str] = []
    graph: dict[str, set[str]] = {}
    trees: dict[str, ast.Module] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        trees[name] = tree
        graph[name] = set()
        lines = text.count("\n")
        doc = ast.get_docstring(tree) or ""
        if lines > MAX_LINES and "Long because" not in doc:
            failures.append(f"{path.relative_to(ROOT)}: {lines} lines and no 'Long because …' in its docstring")
        for target, line, in_function in imports(tree, name, path.name == "__init__.py"):
            root = target.split(".")[0]
            if in_function and target not in LAZY_ALLOWED and root not in LAZY_ALLOWED:
                failures.append(f"{path.relative_to(ROOT)}:{line}: import of {target} inside a function")
            if root != "kindex" or target == name:
                continue
            graph[name].add(target)
            if name == "kindex" or name.endswith(".__main__"):
                continue
            mine, theirs = layer_of(name), layer_of(target)
            if mine < 0:
                failures.append(f"{path.relative_to(ROOT)}: module {name} is in no layer (add it to LAYERS)")
            elif theirs > mine:
                failures.append(
                    f"{path.relative_to(ROOT)}:{line}: {name} (layer {mine}) imports {target} "
                    f"(layer {theirs}): imports point down only"
                )
    failures += cycles(graph)
    failures += exceptions(trees)
    for f in failures:
        print(f, file=sys.stderr)
    print(f"checked {len(graph)} modules: {'ok' if not failures else f'{len(failures)} problem(s)'}")
    return 1 if failures else 0


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every import cycle (a package importing its own submodules is no cycle: that is how packages load)."""
    edges = {m: {t for t in ts if t in graph and not t.startswith(m + ".")} for m, ts in graph.items()}
    out: list[str] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                out.append("import cycle: " + " -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            dfs(node)
    return out


def exceptions(trees: dict[str, ast.Module]) -> list[str]:
    sys.path.insert(0, str(ROOT))
    import importlib

    from kindex.errors import KindexError

    out: list[str] = []
    for name, tree in trees.items():
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == name
                and not issubclass(value, KindexError)
            ):
                out.append(f"{name}.{value.__name__} is an exception class that does not derive from KindexError")
        # PEP 562 and the data model require AttributeError from __getattr__.
        exempt = {
            id(inner)
            for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef) and fn.name == "__getattr__"
            for inner in ast.walk(fn)
        }
        for node in ast.walk(tree):
            if id(node) in exempt:
                continue
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                raised = vars(module).get(func.id) if isinstance(func, ast.Name) else None
                if raised is None and isinstance(func, ast.Name):
                    raised = getattr(builtins, func.id, None)
                if (
                    isinstance(raised, type)
                    and issubclass(raised, BaseException)
                    and not issubclass(raised, KindexError)
                    and raised.__name__ not in PROTOCOL_RAISES
                ):
                    out.append(f"{name}:{node.lineno}: raises {raised.__name__}, not a KindexError")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
