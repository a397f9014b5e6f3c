"""The docs cannot rot: every Python example in the README and docs runs, the first screen has
the two commands, generated pages are fresh, every CLI command is documented."""

from __future__ import annotations

import argparse
import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import memstore
from memstore.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: Put before a block that cannot run on its own: ``<!-- skip -->`` or ``<!-- skip: reason -->``.
SKIP = re.compile(r"<!-- skip(?::[^>]*)? -->$")


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def python_examples() -> list[Any]:
    """Every ```python block of the README and docs, unless ``<!-- skip -->`` precedes it."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for i, match in enumerate(re.finditer(r"```python\n(.*?)```", text, flags=re.S)):
            before = text[: match.start()].rstrip()
            name = f"{page.relative_to(ROOT)}:{i}"
            marks = [pytest.mark.skip(reason="marked <!-- skip -->")] \
                if SKIP.search(before) else []
            found.append(pytest.param(name, match.group(1), id=name, marks=marks))
    return found


def test_first_screen_has_the_two_commands() -> None:
    first_screen = "\n".join(README.splitlines()[:25])
    commands = _blocks(first_screen, "bash")
    assert len(commands) >= 2
    assert "memstore demo" in commands[0] and "pip install" in commands[0]
    assert "pytest" in commands[1] and "pip install" in commands[1]
    ci = (ROOT / ".ci" / "run").read_text()
    for command in commands[:2]:
        assert command.strip() in ci, f".ci/run must run the README's command verbatim: {command}"


def test_readme_quickstart_is_never_skipped() -> None:
    assert "<!-- skip" not in README


@pytest.mark.parametrize(("name", "code"), python_examples())
def test_python_examples_run(name: str, code: str, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMSTORE_URL", f"sqlite:///{tmp_path / 'docs.db'}")
    exec(compile(code, name, "exec"), {"__name__": "__docs__"})


def _commands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                found += _commands(child)
    return found


def test_every_cli_command_is_documented() -> None:
    cli_doc = (ROOT / "docs" / "cli.md").read_text()
    overview = cli_doc.partition("<!-- BEGIN GENERATED")[0]
    parsers = _commands(build_parser())
    assert len(parsers) > 15
    for parser in parsers:
        assert f"### `{parser.prog}`" in cli_doc, f"{parser.prog} has no reference entry"
        words = parser.prog.split()
        if len(words) == 2:  # every top-level command is in the hand-written overview too
            assert f"`memstore {words[1]}" in overview, f"{parser.prog} is not in the overview"


def gen_cli_docs_python() -> tuple[int, ...]:
    """The Python version ``scripts/gen_cli_docs.py`` formats docs/cli.md with."""
    match = re.search(r"^PYTHON = \((\d+), (\d+)\)$",
                      (ROOT / "scripts" / "gen_cli_docs.py").read_text(), flags=re.M)
    assert match is not None
    return tuple(map(int, match.groups()))


@pytest.mark.parametrize("script", ["gen_view_docs.py", "gen_cli_docs.py", "gen_demo_svg.py"])
def test_generated_docs_are_fresh(script: str) -> None:
    if script == "gen_cli_docs.py" and sys.version_info[:2] != gen_cli_docs_python():
        pytest.skip("docs/cli.md holds another Python's argparse layout (gen_cli_docs.PYTHON)")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_docs_speak_of_the_product_only() -> None:
    for page in PAGES:
        text = page.read_text()
        assert "DESIGN §" not in text, page
        assert not re.search(r"\bissues? \d", text, flags=re.I), page


def test_every_page_is_in_the_site_navigation() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    nav = set(re.findall(r"^\s+- [^:]+: (\S+\.md)$", config, flags=re.M))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages == nav, f"not in nav: {pages - nav}; missing files: {nav - pages}"


def test_the_package_namespace_is_curated() -> None:
    public = {n for n in dir(memstore) if not n.startswith("_")}
    extra = {n for n in public - set(memstore.__all__)
             if not inspect.ismodule(getattr(memstore, n))}
    assert extra == set(), f"public names outside __all__: {extra}"
    assert not hasattr(memstore, "PackageNotFoundError")


def test_every_public_name_is_in_the_api_reference() -> None:
    api = (ROOT / "docs" / "api.md").read_text()
    for name in memstore.__all__:
        if name in ("__version__", "ContentPart"):  # a version string and a type alias
            continue
        assert f"::: memstore.{name}\n" in api or f"- {name}\n" in api, name


SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|data|mod|exc|obj|const):`")


def test_docstrings_use_the_syntax_the_site_renders() -> None:
    # The API reference is rendered by mkdocstrings, which shows a Sphinx role
    # (:class:`X`) as literal text; cross-references are written [`X`][memstore.X].
    package = Path(__file__).resolve().parent.parent / "memstore"
    found = [f"{path.relative_to(package.parent)}:{number}: {line.strip()}"
             for path in sorted(package.rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if SPHINX_ROLE.search(line)]
    assert not found, "Sphinx roles the docs site shows raw:\n" + "\n".join(found[:20])
