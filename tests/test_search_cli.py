"""``memstore search``: the table, JSON lines, filters, exit codes, ``--rebuild-index``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memstore import MemoryStore, Message, ToolCall
from memstore.cli import main
from memstore.tokens import FixedCounter


@pytest.fixture(autouse=True)
def wide_tables(monkeypatch: Any) -> None:
    monkeypatch.setenv("COLUMNS", "160")


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with MemoryStore(url, counter=FixedCounter()) as store:
        store.create_conversation("trip", metadata={"user": "u1"})
        store.extend("trip", [
            Message.user("Book a flight to Lisbon on Tuesday."),
            Message.assistant(tool_calls=[ToolCall(id="c1", name="book_flight",
                                                   arguments='{"to": "Lisbon"}')]),
            Message.tool("Booked TP1351.", tool_call_id="c1"),
            Message.assistant("Your flight to Lisbon is booked: TP1351."),
        ])
        store.create_conversation("other", metadata={"user": "u2"})
        store.append("other", Message.user("Lisbon is lovely \x1b[31min spring."))
    return url


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def test_json_lines_one_hit_per_line(url: str, capsys: Any) -> None:
    code, out, err = run(capsys, "--url", url, "search", "lisbon flight", "--format", "json")
    assert code == 0 and err == ""
    hits = lines(out)
    assert {(h["conversation_id"], h["seq"]) for h in hits} == {
        ("trip", 1), ("trip", 2), ("trip", 4)}  # 2: the tool call book_flight, to Lisbon
    first = next(h for h in hits if h["seq"] == 1)
    assert set(first) == {"conversation_id", "seq", "role", "created_at", "rank", "snippet",
                          "matched", "message", "before", "after"}
    assert "[Lisbon]" in first["snippet"] and "[flight]" in first["snippet"]
    assert {m.lower() for m in first["matched"]} == {"flight", "lisbon"}
    assert first["message"]["role"] in ("user", "assistant")


def test_json_is_the_default_off_a_terminal(url: str, capsys: Any) -> None:
    code, out, _ = run(capsys, "--url", url, "search", "TP1351")
    assert code == 0
    assert {(h["conversation_id"], h["seq"]) for h in lines(out)} == {("trip", 3), ("trip", 4)}


def test_filters(url: str, capsys: Any) -> None:
    def found(*extra: str) -> set[tuple[str, int]]:
        code, out, err = run(capsys, "--url", url, "search", "lisbon", "--format", "json",
                             *extra)
        assert code == 0, err
        return {(h["conversation_id"], h["seq"]) for h in lines(out)}

    everything = {("trip", 1), ("trip", 2), ("trip", 4), ("other", 1)}
    assert found() == everything
    assert found("--conversation", "other") == {("other", 1)}
    assert found("--conversation", "other", "--conversation", "trip") == everything
    assert found("--where", "user=u1") == everything - {("other", 1)}
    assert found("--role", "assistant") == {("trip", 2), ("trip", 4)}
    assert found("--role", "user", "--role", "tool") == {("trip", 1), ("other", 1)}
    assert found("--since", "2999-01-01") == set()
    assert found("--until", "2999-01-01T00:00:00+02:00") == everything
    assert len(found("--limit", "1")) == 1
    _, out, _ = run(capsys, "--url", url, "search", "booked", "--context", "1",
                    "--format", "json")
    (hit,) = [h for h in lines(out) if h["seq"] == 4]
    assert hit["before"] == [3] and hit["after"] == []


def test_the_table_highlights_the_matches(url: str, capsys: Any,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from memstore.cli import _output

    monkeypatch.setattr(_output, "default_format", lambda: "table")
    code, out, _ = run(capsys, "--url", url, "search", "lisbon", "--context", "1")
    assert code == 0
    assert "conversation" in out and "match" in out and "4 hits" in out
    assert "Lisbon" in out and "\x1b[31m" not in out and "\\x1b" in out  # escaped, not acted on
    code, out, err = run(capsys, "--url", url, "search", "platypus", "--format", "table")
    assert code == 0 and out == "" and "no message matches" in err


def test_highlighting_reaches_a_terminal(url: str, monkeypatch: pytest.MonkeyPatch,
                                         capsys: Any) -> None:
    from io import StringIO

    from memstore.cli import _output

    buffer = StringIO()
    real = _output.console
    monkeypatch.setattr(_output, "console", lambda file=None, width=None: real(
        file=buffer, width=160) if file is None else real(file, width))
    monkeypatch.setattr(buffer, "isatty", lambda: True, raising=False)
    from rich.console import Console

    monkeypatch.setattr(_output, "_console_class", lambda: lambda **kw: Console(
        **{**kw, "force_terminal": True, "color_system": "standard"}))
    code, _, _ = run(capsys, "--url", url, "search", "tuesday", "--format", "table")
    assert code == 0
    assert "\x1b[1;7mTuesday\x1b[0m" in buffer.getvalue()  # bold reverse


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["search"], 2, "needs a QUERY"),
    (["search", "   "], 2, "nothing to search for"),
    (["search", "-- -x"], 2, "only excludes"),
    (["search", "x", "--limit", "0"], 2, "--limit"),
    (["search", "x", "--limit", "1001"], 2, "--limit"),
    (["search", "x", "--context", "51"], 2, "--context"),
    (["search", "x", "--role", "human"], 2, "--role"),
    (["search", "x", "--since", "yesterday"], 2, "--since"),
    (["search", "x", "--where", "novalue"], 2, "--where"),
    (["search", "x", "--format", "csv"], 2, "--format"),
    (["search", "x", "--language", "english"], 2, "--rebuild-index"),
    (["search", "x", "--rebuild-index"], 2, "no QUERY"),
])
def test_usage_errors(url: str, capsys: Any, argv: list[str], code: int, message: str) -> None:
    got, out, err = run(capsys, "--url", url, *argv)
    assert got == code and out == ""
    assert message in err


def test_a_missing_database_is_not_created(tmp_path: Path, capsys: Any) -> None:
    missing = tmp_path / "none.db"
    code, _, err = run(capsys, "--url", f"sqlite:///{missing}", "search", "x")
    assert code != 0 and "no database" in err and not missing.exists()


def test_rebuild_index(url: str, capsys: Any) -> None:
    code, _, err = run(capsys, "--url", url, "search", "--rebuild-index", "--language",
                       "english")
    assert code == 0 and "search index rebuilt (english): 5 messages" in err
    code, out, _ = run(capsys, "--url", url, "search", "books", "--format", "json")
    assert {h["seq"] for h in lines(out)} == {1, 2, 3, 4}  # book, book_flight, booked
    code, _, err = run(capsys, "--url", url, "search", "--rebuild-index")
    assert code == 0 and "(english)" in err  # keeps the current configuration
    code, _, err = run(capsys, "--url", url, "search", "--rebuild-index", "--language", "simple")
    assert code == 0 and "(simple)" in err
    code, out, _ = run(capsys, "--url", url, "search", "books", "--format", "json")
    assert out == ""
