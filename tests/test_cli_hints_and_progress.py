"""The command's first hour: hints that lead somewhere, real progress, clear not-found errors."""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from memstore import MemoryStore, Message
from memstore.cli import _output
from tests.test_cli import one_error_line, run


@pytest.fixture(autouse=True)
def wide_tables(monkeypatch: Any) -> None:
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def _exported(url: str, capsys: Any, tmp_path: Path, *ids: str) -> Path:
    """An export file of ``ids`` (written first: 'a' of 3 messages, 'b' of 2)."""
    with MemoryStore(url) as store:
        store.extend("a", [Message.user("one"), Message.assistant("two"),
                           Message.user("three")])
        store.extend("b", [Message.user("uno"), Message.assistant("dos")])
    path = tmp_path / "all.jsonl"
    assert run(capsys, "export", *ids, "-o", str(path), "--url", url)[0] == 0
    return path


# ---- item 7: the old argument order, --format openai on a memstore file, typos -------------


def test_old_argument_order_with_an_export_file_says_to_drop_the_conversation(
        url: str, capsys: Any, tmp_path: Path) -> None:
    dump = _exported(url, capsys, tmp_path, "a")
    target = f"sqlite:///{tmp_path / 'target.db'}"
    code, _, err = run(capsys, "import", "chat-42", str(dump), "--url", target)
    line = one_error_line(err)
    assert code == 2
    assert f"{dump} is a memstore export file" in line
    assert "drop the conversation argument" in line
    assert f"run memstore import {dump}" in line and "--as chat-42" in line
    assert "--format openai" not in line
    assert not (tmp_path / "target.db").exists()  # nothing was opened
    # the hint works as given
    code, out, _ = run(capsys, "import", str(dump), "--as", "chat-42", "--url", target)
    assert code == 0 and out.strip() == "chat-42: 3 messages written"


def test_old_argument_order_with_message_lines_suggests_as(url: str, capsys: Any,
                                                          tmp_path: Path) -> None:
    _exported(url, capsys, tmp_path)
    code, out, _ = run(capsys, "messages", "a", "--format", "jsonl", "--url", url)
    lines = tmp_path / "a-messages.jsonl"
    lines.write_text(out)
    code, _, err = run(capsys, "import", "chat-42", str(lines), "--url", url)
    line = one_error_line(err)
    assert code == 2 and "holds memstore message lines" in line
    assert f"memstore import {lines} --as chat-42" in line


def test_old_argument_order_with_openai_messages_keeps_the_openai_hint(
        url: str, capsys: Any, tmp_path: Path) -> None:
    history = tmp_path / "history.json"
    history.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    code, _, err = run(capsys, "import", "chat-42", str(history), "--url", url)
    line = one_error_line(err)
    assert code == 2
    assert f"memstore import {history} --into chat-42 --format openai" in line


def test_format_openai_on_an_export_file_names_the_command_not_pydantic_errors(
        url: str, capsys: Any, tmp_path: Path) -> None:
    dump = _exported(url, capsys, tmp_path)
    code, _, err = run(capsys, "import", str(dump), "--into", "chat-42", "--format", "openai",
                       "--url", url)
    line = one_error_line(err)
    assert code == 2
    assert f"{dump}:1: not an OpenAI message: {dump} is a memstore export file" in line
    assert "drop --format openai and --into" in line and f"memstore import {dump}" in line
    assert "Extra inputs" not in line and "Field required" not in line
    with MemoryStore(url) as store:
        assert store.messages("chat-42") == []  # nothing was appended


@pytest.mark.parametrize(("argv", "meant"), [
    (["windw", "c"], "'window'"),
    (["mesages", "c"], "'messages'"),
    (["conversations", "lst"], "'list'"),
    (["db", "upgarde"], "'upgrade'"),
    (["window", "c", "--view", "token-limted"], "'token-limited'"),
    (["append", "c", "asistant", "hi"], "'assistant'"),
    (["window", "c", "--budgt", "5"], "'--budget'"),
])
def test_a_mistyped_command_or_choice_gets_did_you_mean(capsys: Any, argv: list[str],
                                                       meant: str) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert f"did you mean {meant}?" in one_error_line(err)


def test_no_suggestion_when_nothing_is_close(capsys: Any) -> None:
    code, _, err = run(capsys, "xyzzy")
    line = one_error_line(err)
    assert code == 2 and "invalid choice: 'xyzzy'" in line and "did you mean" not in line
    assert "choose from" in line


# ---- item 6: progress with a total where one is known ---------------------------------------


@pytest.fixture
def bars(monkeypatch: Any) -> list[dict[str, Any]]:
    """Every progress bar a command opens: its total, and what it counted."""
    opened: list[dict[str, Any]] = []
    real = _output.progress_bar

    @contextmanager
    def spy(description: str, total: int | None = None, **kw: Any) -> Iterator[Any]:
        seen: dict[str, Any] = {"description": description, "total": total, "positions": []}
        position = kw.get("position")
        if position is not None:  # what the bar is told, while the file is open
            def recorded() -> int:
                seen["positions"].append(position())
                return int(seen["positions"][-1])

            kw["position"] = recorded
        with real(description, total, **kw) as bar:
            seen["bar"] = bar
            opened.append(seen)
            yield bar

    monkeypatch.setattr(_output, "progress_bar", spy)
    monkeypatch.setattr(_output, "progress_shown", lambda: True)  # as on a terminal
    return opened


def test_export_progress_has_the_message_total(url: str, capsys: Any, tmp_path: Path,
                                               bars: list[dict[str, Any]]) -> None:
    _exported(url, capsys, tmp_path)  # every conversation: 5 messages
    assert bars[-1]["total"] == 5 and bars[-1]["bar"].done == 5
    assert run(capsys, "export", "b", "a", "-o", str(tmp_path / "x.jsonl"),
               "--url", url)[0] == 0
    assert bars[-1]["total"] == 5 and bars[-1]["bar"].done == 5
    assert run(capsys, "export", "b", "-o", str(tmp_path / "y.jsonl"), "--url", url)[0] == 0
    assert bars[-1]["total"] == 2 and bars[-1]["bar"].done == 2


def test_import_progress_follows_the_file_and_counts_messages(
        url: str, capsys: Any, tmp_path: Path, bars: list[dict[str, Any]]) -> None:
    dump = _exported(url, capsys, tmp_path)
    target = f"sqlite:///{tmp_path / 'target.db'}"
    assert run(capsys, "import", str(dump), "--url", target)[0] == 0
    bar = bars[-1]
    assert bar["description"] == f"importing {dump}"
    assert bar["total"] == dump.stat().st_size  # bytes: the file's size is known
    assert bar["positions"][-1] == dump.stat().st_size  # read to its end
    assert bar["bar"].done == 5  # and the messages counted beside it


def test_import_from_a_pipe_has_no_total(url: str, capsys: Any, tmp_path: Path,
                                         bars: list[dict[str, Any]], monkeypatch: Any) -> None:
    dump = _exported(url, capsys, tmp_path)
    monkeypatch.setattr(sys, "stdin", io.StringIO(dump.read_text()))
    target = f"sqlite:///{tmp_path / 'target.db'}"
    assert run(capsys, "import", "-", "--url", target)[0] == 0
    assert bars[-1]["total"] is None and bars[-1]["bar"].done == 5


def test_import_from_redirected_stdin_has_the_file_size(url: str, capsys: Any,
                                                        tmp_path: Path,
                                                        bars: list[dict[str, Any]],
                                                        monkeypatch: Any) -> None:
    dump = _exported(url, capsys, tmp_path)
    with open(dump, encoding="utf-8") as fp:  # `memstore import - < all.jsonl`
        monkeypatch.setattr(sys, "stdin", fp)
        target = f"sqlite:///{tmp_path / 'target.db'}"
        assert run(capsys, "import", "-", "--url", target)[0] == 0
    assert bars[-1]["total"] == dump.stat().st_size and bars[-1]["bar"].done == 5


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_a_known_total_draws_percentage_count_and_eta(capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with _output.progress_bar("exporting", 10) as bar:
        bar(5)
    shown = _ANSI.sub("", capsys.readouterr().err)
    assert "50%" in shown and "5/10 messages" in shown and "eta" in shown
    with _output.progress_bar("importing", None) as bar:
        bar(1500)
    shown = _ANSI.sub("", capsys.readouterr().err)
    assert "1,500 messages" in shown and "%" not in shown and "eta" not in shown
    with _output.progress_bar("importing f", 2000, position=lambda: 1000) as bar:
        bar(7)
    shown = _ANSI.sub("", capsys.readouterr().err)
    assert "50%" in shown and "7 messages" in shown and "eta" in shown


# ---- reading a conversation that was never written ------------------------------------------


@pytest.mark.parametrize("form", ["table", "json", "jsonl", "openai"])
def test_reading_a_mistyped_conversation_is_an_error(url: str, capsys: Any,
                                                     form: str) -> None:
    with MemoryStore(url) as store:
        store.append("chat-42", Message.user("hi"))
    for command in ("messages", "window"):
        code, out, err = run(capsys, command, "chat-24", "--format", form, "--url", url)
        assert code == 1 and out == "", (command, out)
        assert one_error_line(err) == "memstore: error: conversation 'chat-24' does not exist"


def test_an_existing_empty_conversation_reads_as_empty(url: str, capsys: Any) -> None:
    with MemoryStore(url) as store:
        store.extend("c", [Message.user("hi"), Message.assistant("hello")])
        store.clear("c")  # it stays, with no messages
        store.append("d", Message.user("one"))
    code, out, err = run(capsys, "messages", "c", "--format", "jsonl", "--url", url)
    assert (code, out, err) == (0, "", "")
    code, out, _ = run(capsys, "messages", "d", "--start", "5", "--format", "json",
                       "--url", url)
    assert code == 0 and json.loads(out) == []  # nothing in the range: not an error
    code, out, _ = run(capsys, "window", "c", "--format", "json", "--url", url)
    window = json.loads(out)
    assert code == 0 and window["seqs"] == [] and window["report"]["conversation_exists"]
    code, out, _ = run(capsys, "window", "c", "--format", "table", "--url", url)
    assert code == 0 and "0 messages, 0 tokens of 4,000" in out
