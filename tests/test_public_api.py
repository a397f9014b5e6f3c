"""The public surface: curated, documented, typed; internals stay internal."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import memstore
from memstore import FixedCounter, MemoryStore, Message

PACKAGE = Path(memstore.__file__).parent


def test_all_is_sorted_importable_and_documented() -> None:
    names = [n for n in memstore.__all__ if n != "__version__"]
    assert names == sorted(names, key=str)
    for name in names:
        obj = getattr(memstore, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"{name} has no docstring"
    assert "schema" not in memstore.__all__ and "metadata" not in memstore.__all__


def test_every_error_derives_from_memstore_error() -> None:
    from memstore import errors

    for name in errors.__all__:
        obj = getattr(errors, name)
        if inspect.isclass(obj):
            assert issubclass(obj, errors.MemstoreError), name


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_views_and_the_builder_are_pure() -> None:
    modules = [*(PACKAGE / "views").glob("*.py"), *(PACKAGE / "context").glob("*.py")]
    assert len(modules) >= 9
    for module in modules:
        imported = _imports(module)
        assert not imported & {"sqlalchemy", "tiktoken", "alembic"}, module.name


def test_sql_is_executed_only_in_the_database_layer() -> None:
    # the database layer (memstore/_db/) and the migrations' runner
    executing = {"execute", "exec_driver_sql", "executemany", "scalar", "scalars"}
    checked = 0
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "_db" or path.name == "migrate.py":
            continue
        checked += 1
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr not in executing, f"{path.name}:{node.lineno}"
    assert checked > 30


FRAMEWORKS = ("langchain", "langchain_core", "autogen_core", "autogen_agentchat", "autogen_ext",
              "camel", "agents", "openai", "anthropic", "llama_index", "langgraph",
              "pydantic_ai")


def _fresh_python(code: str) -> str:
    """What ``code`` prints in a fresh interpreter."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout


def test_import_memstore_imports_no_framework() -> None:
    code = (
        "import sys, memstore, memstore.integrations, memstore.formats\n"
        f"frameworks = {FRAMEWORKS!r}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in frameworks\n"
        "             or m.startswith('memstore.integrations.')))\n"
    )
    out = _fresh_python(code)
    assert out.strip() == "[]", out


def test_a_sqlite_worker_imports_only_what_it_uses(tmp_path: Any) -> None:
    """A fresh process that opens a SQLite store at head and reads a window never loads
    Alembic, the asyncio extension (with SQLAlchemy's ORM) or tiktoken; the async store
    and the version still come on first use."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    with MemoryStore(url, counter=FixedCounter()) as store:  # created, so at head
        store.append("c", Message.user("hi"))
    unused = ("alembic", "mako", "sqlalchemy.ext.asyncio", "sqlalchemy.orm", "memstore.aio",
              "tiktoken")
    code = (
        "import sys, memstore\n"
        f"s = memstore.MemoryStore({url!r}, counter=memstore.FixedCounter())\n"
        "w = s.window('c', memstore.TokenLimitedView(100))\n"
        "assert [m.content for m in w.messages] == ['hi'], w\n"
        f"print(sorted(m for m in {unused!r} if m in sys.modules))\n"
        "print(memstore.AsyncMemoryStore.__module__, memstore.__version__ != '')\n"
        "print('memstore.aio' in sys.modules, 'AsyncMemoryStore' in dir(memstore))\n"
    )
    out = _fresh_python(code)
    assert out.split("\n")[:3] == ["[]", "memstore.aio True", "True True"], out
