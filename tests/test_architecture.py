"""The package's layers, read from its source: no import cycles, pure layers stay pure.

Every ``import``/``from ... import`` in ``memstore/`` counts, including those inside
functions and under ``TYPE_CHECKING``: a cycle that only shows at run time or to the
type checker is still a cycle a reader has to untangle. The layers and what each may
import are described in docs/concepts.md ("How the package is laid out").
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "memstore"

#: Layers that never talk SQL: what they may not import (module prefixes).
PURE = {
    "memstore.views": ("memstore._db", "memstore.store", "memstore.aio", "memstore.transfer",
                       "memstore.migrate", "memstore.context", "memstore.cli",
                       "memstore.integrations", "sqlalchemy", "alembic"),
    "memstore.context": ("memstore._db", "memstore.store", "memstore.aio", "memstore.transfer",
                         "memstore.migrate", "memstore.cli", "memstore.integrations",
                         "sqlalchemy", "alembic"),
    "memstore.models": ("memstore._db", "memstore.views", "memstore.context", "memstore.store",
                        "memstore.aio", "memstore.formats", "sqlalchemy"),
    "memstore.tokens": ("memstore._db", "memstore.views", "memstore.context", "memstore.store",
                        "memstore.aio", "sqlalchemy"),
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()
PACKAGES = {name for name, path in MODULES.items() if path.name == "__init__.py"}


def _owner(name: str) -> str | None:
    """The module of ``memstore`` that defines ``name`` (a module or a name in one)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> dict[str, set[str]]:
    """Every module ``module`` imports: memstore modules by owner, others by top name."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    package = module if module in PACKAGES else module.rpartition(".")[0]
    internal: set[str] = set()
    external: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names = [f"{source}.{alias.name}" for alias in node.names]
            if not source.startswith("memstore"):
                names = [source]
        for name in names:
            if name == "memstore" or name.startswith("memstore."):
                owner = _owner(name)
                if owner and owner != module:
                    internal.add(owner)
            else:
                external.add(name.split(".")[0])
    return {"internal": internal, "external": external}


GRAPH = {module: _imports(module) for module in MODULES}


def _edges(module: str) -> set[str]:
    # A package's own re-exports count too: ``memstore.models`` importing
    # ``memstore.models.message`` is an edge like any other.
    return GRAPH[module]["internal"]


def _cycle_from(start: str) -> list[str] | None:
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in sorted(_edges(node)):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_the_walker_sees_the_package() -> None:
    assert {"memstore", "memstore.store", "memstore.views", "memstore.context.builder",
            "memstore._db.ops"} <= set(MODULES)
    assert "memstore._db.ops" in GRAPH["memstore._base"]["internal"]
    assert "sqlalchemy" in GRAPH["memstore._db.ops"]["external"]


def test_no_import_cycles() -> None:
    cycles = [" -> ".join(c) for m in sorted(MODULES) if (c := _cycle_from(m))]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_finder_finds_a_cycle() -> None:
    saved = GRAPH["memstore.errors"]
    GRAPH["memstore.errors"] = {"internal": {"memstore.models"}, "external": set()}
    try:
        assert _cycle_from("memstore.errors") is not None
    finally:
        GRAPH["memstore.errors"] = saved


@pytest.mark.parametrize("layer", sorted(PURE))
def test_pure_layers_stay_pure(layer: str) -> None:
    banned = PURE[layer]
    bad = []
    for module in MODULES:
        if module != layer and not module.startswith(layer + "."):
            continue
        for target in GRAPH[module]["internal"] | GRAPH[module]["external"]:
            if any(target == b or target.startswith(b + ".") for b in banned):
                bad.append(f"{module} imports {target}")
    assert not bad, "\n".join(bad)

