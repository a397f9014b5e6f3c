"""The memstore command, driven through main() on a temporary SQLite database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memstore.cli import main


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_append_window_messages_and_conversations(url: str, capsys: Any) -> None:
    assert run(capsys, "append", "demo", "system", "You are terse.", "--url", url)[0] == 0
    code, out, _ = run(capsys, "append", "demo", "user", "Where is my order?", "--url", url)
    assert code == 0 and "stored seq 2" in out and "tiktoken/cl100k_base" in out
    code, out, _ = run(capsys, "window", "demo", "--tokens", "4000", "--url", url)
    assert code == 0
    assert "#1 system    You are terse." in out and "#2 user      Where is my order?" in out
    assert "2 messages" in out and "of 4000" in out
    code, out, _ = run(capsys, "window", "demo", "--json", "--url", url)
    payload = json.loads(out)
    assert [m["role"] for m in payload["messages"]] == ["system", "user"]
    assert payload["budget"] == 4000 and payload["token_count"] <= 4000
    code, out, _ = run(capsys, "messages", "demo", "--newest-first", "--limit", "1", "--url", url)
    assert json.loads(out)["seq"] == 2
    code, out, _ = run(capsys, "conversations", "--url", url)
    assert out.startswith("demo\t2 messages")


@pytest.mark.parametrize("view", ["token-limited", "score-based", "buffered", "head-and-tail",
                                  "recent-turns", "unbounded"])
def test_every_view_from_the_command_line(url: str, capsys: Any, tmp_path: Path, view: str) -> None:
    lines = [{"role": "system", "content": "sys"}]
    for i in range(30):
        lines.append({"role": "user", "content": f"question {i}"})
        lines.append({"role": "assistant", "content": f"answer {i}"})
    source = tmp_path / "history.jsonl"
    source.write_text("\n".join(json.dumps(x) for x in lines))
    assert run(capsys, "import", "c", str(source), "--url", url)[0] == 0
    code, out, _ = run(capsys, "window", "c", "--view", view, "--tokens", "60", "--size", "4",
                       "--json", "--url", url)
    assert code == 0
    payload = json.loads(out)
    assert payload["messages"][0]["role"] == "system"
    assert payload["messages"][-1]["content"] == "answer 29"
    if view != "unbounded":
        assert len(payload["messages"]) < len(lines)


def test_state_save_and_load(url: str, capsys: Any, tmp_path: Path) -> None:
    run(capsys, "append", "a", "user", "hello", "--url", url)
    out_file = tmp_path / "state.json"
    assert run(capsys, "state", "save", "a", "-o", str(out_file), "--url", url)[0] == 0
    code, out, _ = run(capsys, "state", "load", str(out_file), "--as", "b", "--url", url)
    assert code == 0 and "loaded 1 messages into 'b'" in out
    code, out, _ = run(capsys, "messages", "b", "--url", url)
    assert json.loads(out)["content"] == "hello"


def test_db_commands(tmp_path: Path, capsys: Any) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    code, _, err = run(capsys, "db", "check", "--url", url)
    assert code == 1 and "memstore db upgrade" in err
    code, out, _ = run(capsys, "db", "current", "--url", url)
    assert "current: none" in out
    assert run(capsys, "db", "upgrade", "--url", url)[0] == 0
    assert run(capsys, "db", "check", "--url", url)[0] == 0
    code, out, _ = run(capsys, "db", "upgrade", "--sql", "--url", "postgresql://u@h/db")
    assert code == 0 and "CREATE TABLE memstore_messages" in out and "JSONB" in out
    assert run(capsys, "db", "downgrade", "base", "--url", url)[0] == 0
    assert run(capsys, "db", "check", "--url", url)[0] == 1


def test_errors_are_reported_not_raised(url: str, capsys: Any) -> None:
    code, _, err = run(capsys, "messages", "missing", "--url", url)
    assert code == 1 and "'missing' does not exist" in err
    code, _, err = run(capsys, "append", "x", "tool", "result", "--url", url)
    assert code == 2 and "tool_call_id" in err
