"""The package's modules import downward only: no import circle among cek's own modules, with
imports inside functions counted (a lazy import hides a circle from Python, not from a reader)
and those under `if TYPE_CHECKING:` left out (they never run)."""

import ast
from pathlib import Path

import cek

PACKAGE = Path(cek.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """The cek modules `module` imports anywhere in its code but under TYPE_CHECKING."""
    found = set()

    def visit(node):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package upward
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.add(prefix)
            found.update(f"{prefix}.{a.name}" for a in node.names)  # a submodule imported
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        imported = _imported(tree, name, path.name == "__init__.py")
        # a module's package's __init__ runs first anyway: importing it is not an edge back
        graph[name] = {m for m in imported if m in paths and m != name
                       and not name.startswith(m + ".")}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state = {}

    def walk(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = walk(nxt, stack + [nxt])
                if found:
                    return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            found = walk(start, [start])
            if found:
                return found
    return None


def test_the_graph_sees_the_imports_it_must():
    graph = _graph()
    assert {"cek.compile", "cek.kernel"} <= graph["cek.gpu"]  # at the top of the module
    assert "cek.gpu" in graph["cek.doctor"]  # inside a function only
    assert "cek.kernel" not in graph["cek.compile"]  # under TYPE_CHECKING only


def test_no_import_circle_among_ceks_modules():
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()))


def test_a_circle_is_found_where_there_is_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
