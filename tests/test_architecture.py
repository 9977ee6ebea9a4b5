"""The house plan of docs/ARCHITECTURE.md: imports go only downward between layers, and there are no circles.

Every `import` / `from ... import` of every module is read with `ast` (including imports inside functions,
which still make a dependency), so a lazy import cannot hide an upward edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "eaglespec"

# Layer of each top-level module or subpackage of eaglespec (docs/ARCHITECTURE.md, "The house plan").
LAYERS = {
    "config": 0, "datasets": 0,
    "runtime": 1,
    "spec": 2,
    "engine": 3,
    "flags": 4,
    "serve": 5, "train": 5, "measure": 5,
    "cli": 6,
}
# Applications of the same layer live side by side and must not import each other.
SIBLINGS_APART = {"serve", "train", "measure"}


def _module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, package_dir: Path) -> set[str]:
    """Absolute names of the eaglespec modules `path` imports."""
    name = _module_name(path, package_dir)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)  # `from eaglespec.x import module`
    return {m for m in found if m == "eaglespec" or m.startswith("eaglespec.")}


def _graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the eaglespec modules it imports."""
    modules = {_module_name(p, package): p for p in package.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        # keep only names that are modules (drop `from eaglespec.x import SomeClass`)
        graph[name] = {m for m in _imports(path, package) if m in modules and m != name}
    return graph


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in graph.items():
        for dst in targets:
            a, b = _unit(src), _unit(dst)
            if src == "eaglespec" or dst == "eaglespec" or a == b:
                continue
            if LAYERS[b] > LAYERS[a] or (LAYERS[b] == LAYERS[a] and {a, b} <= SIBLINGS_APART):
                bad.append(f"{src} -> {dst}")
    return sorted(bad)


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return cycles


def test_every_module_has_a_layer():
    missing = sorted({_unit(m) for m in _graph() if m != "eaglespec" and _unit(m) not in LAYERS})
    assert not missing, f"modules outside the house plan (add them to LAYERS and docs/ARCHITECTURE.md): {missing}"


def test_imports_only_go_down():
    bad = upward_imports(_graph())
    assert not bad, "upward or sideways imports:\n" + "\n".join(bad)


def test_no_import_circles():
    cycles = import_circles(_graph())
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_a_circle_and_an_upward_import(tmp_path):
    """The oracle itself: a planted circle through a lazy upward import is reported by both checks."""
    pkg = tmp_path / "eaglespec"
    (pkg / "runtime").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "runtime" / "__init__.py").write_text("")
    (pkg / "runtime" / "a.py").write_text("def f():\n    from eaglespec.cli import main\n")
    (pkg / "cli.py").write_text("from eaglespec.runtime import a\n")
    graph = _graph(pkg)
    assert graph["eaglespec.runtime.a"] == {"eaglespec.cli"} and "eaglespec.runtime.a" in graph["eaglespec.cli"]
    assert upward_imports(graph) == ["eaglespec.runtime.a -> eaglespec.cli"]
    assert ["eaglespec.cli", "eaglespec.runtime.a", "eaglespec.cli"] in import_circles(graph)


def test_one_decoder_layer_implementation():
    """The target's layers, the draft heads' layers and training's unroll all run `runtime.model.decoder_layer`:
    the layer classes hold weights only, and nothing else in the package calls the attention kernel on its own
    projections (the unroll's `attend` and `cached_attention` are the only callers of the kernel, both through
    `runtime.model.grouped_sdpa`)."""
    from eaglespec.runtime.model import DecoderLayer
    from eaglespec.spec.heads import HeadLayer
    from eaglespec.train.train import TTTUnroll

    assert "forward" not in vars(DecoderLayer) and "forward" not in vars(HeadLayer)
    assert not [n for n in vars(TTTUnroll) if "layer" in n]
    callers = sorted(str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")
                     if "scaled_dot_product_attention(" in p.read_text())
    assert callers == ["eaglespec/runtime/model.py"], callers
