"""The command starts quickly: what it imports, checked structurally (no timing).

``memstore --help``, ``--version`` and usage errors import neither SQLAlchemy, nor
pydantic, nor Rich; ``import memstore`` loads its public names on first use; a command
that only reads never loads the tokenizer. (Wall times: ``python -m
benchmarks.cli_startup``.)
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import memstore
from memstore import MemoryStore, Message, TokenLimitedView

HEAVY = ("sqlalchemy", "pydantic", "rich", "tiktoken", "alembic", "memstore.store",
         "memstore.errors", "memstore.models", "memstore.cli._commands")


def _fresh(code: str) -> str:
    """What ``code`` prints in a fresh interpreter (its last line)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _loaded(names: tuple[str, ...] = HEAVY) -> str:
    return (f"print(sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') "
            f"for h in {names!r})))")


def test_importing_the_cli_imports_nothing_heavy() -> None:
    code = "import sys\nimport memstore.cli\nmemstore.cli.build_parser()\n" + _loaded()
    assert _fresh(code) == "[]"


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["window", "--help"],
                                  ["windw", "c"], ["window", "c", "--budget", "x"],
                                  ["window", "c", "--budgt", "5"], []])
def test_help_version_and_usage_errors_import_nothing_heavy(argv: list[str]) -> None:
    code = ("import sys, contextlib, io\nfrom memstore.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), "
            "contextlib.redirect_stderr(io.StringIO()):\n"
            f"    try:\n        main({argv!r})\n    except SystemExit:\n        pass\n"
            + _loaded())
    assert _fresh(code) == "[]"


def test_import_memstore_loads_names_on_first_use() -> None:
    code = ("import sys, memstore\n"
            "print(sorted(m for m in sys.modules if m.startswith('memstore.')), "
            "'sqlalchemy' in sys.modules)")
    assert _fresh(code) == "[] False"
    # every public name, through `from memstore import X`, in a fresh interpreter
    names = [n for n in memstore.__all__ if n != "__version__"]
    code = (f"from memstore import {', '.join(names)}, __version__\n"
            "import memstore\n"
            "print(all(n in dir(memstore) for n in memstore.__all__), __version__ != '')")
    assert _fresh(code) == "True True"


def test_from_memstore_import_star_and_unknown_names() -> None:
    namespace: dict[str, Any] = {}
    exec("from memstore import *", namespace)
    assert set(memstore.__all__) <= set(namespace)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        memstore.Nope  # noqa: B018


def _type_checking_imports() -> dict[str, str]:
    """``name -> module`` of the imports under ``if TYPE_CHECKING:`` in memstore/__init__."""
    tree = ast.parse(Path(memstore.__file__).read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for item in node.body:
                if isinstance(item, ast.ImportFrom) and item.module:
                    found.update({alias.name: item.module for alias in item.names})
    return found


def test_lazy_names_match_all_and_what_type_checkers_see() -> None:
    lazy: dict[str, str] = memstore._LAZY
    public = set(memstore.__all__) - {"__version__"}
    assert set(lazy) == public
    # mypy and IDEs see each name imported from the module it is loaded from
    assert _type_checking_imports() == lazy
    for name, module in lazy.items():
        assert getattr(memstore, name) is getattr(sys.modules[module], name), name


# ---- a command that reads never loads the tokenizer ------------------------------------------


def test_the_deferred_counter_is_the_default_counter(tmp_path: Path) -> None:
    from memstore.cli._commands import DeferredCounter
    from memstore.tokens import default_counter

    deferred, real = DeferredCounter(), default_counter()
    assert deferred.name == real.name and deferred.priming == real.priming
    message = Message.assistant("hello, there", name="atlas")
    assert deferred.count_message(message) == real.count_message(message)
    assert deferred.count_messages([message]) == real.count_messages([message])
    assert deferred.count_tools is not None  # other attributes: the loaded counter's


def test_window_from_the_command_line_loads_no_tokenizer_and_no_rich(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    with MemoryStore(url) as store:
        store.extend("c", [Message.system("Be brief."), Message.user("hi " * 50),
                           Message.assistant("hello")])
        expected = store.window("c", TokenLimitedView(40))
    code = ("import sys, contextlib, io\nfrom memstore.cli import main\nbuf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf):\n"
            f"    assert main(['window', 'c', '--budget', '40', '--format', 'json', "
            f"'--url', {url!r}]) == 0\n"
            "print(buf.getvalue().replace('\\n', ' '))\n"
            "print('tiktoken' in sys.modules, 'rich' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    shown, loaded = done.stdout.strip().splitlines()
    assert loaded == "False False"  # no tokenizer; JSON needs no Rich either
    window = json.loads(shown)
    assert window["seqs"] == expected.seqs and window["token_count"] == expected.token_count
    assert window["report"]["counter"] == "tiktoken/cl100k_base"
    assert window["report"] == json.loads(expected.report.model_dump_json())  # the same
