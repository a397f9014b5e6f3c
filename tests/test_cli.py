"""The memstore command.

Most cases run main() in-process (fast); a few broad ones spawn the installed ``memstore``
script, as a user would, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memstore import MemoryStore, Message, ToolCall
from memstore.cli import build_parser, main

SCRIPT = Path(sys.executable).parent / "memstore"


@pytest.fixture(autouse=True)
def wide_tables(monkeypatch: Any) -> None:
    """Rich tables take the terminal's width; make it wide so rows stay on one line."""
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse usage errors and --version
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def spawn(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None,
          stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "COLUMNS": "120"}
    full_env.pop("MEMSTORE_URL", None)
    full_env.update(env or {})
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, env=full_env,
                          cwd=cwd, input=stdin, timeout=120)


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("memstore"), err
    return lines[0]


def _history(n_turns: int = 30) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for i in range(n_turns):
        lines.append({"role": "user", "content": f"question {i}"})
        lines.append({"role": "assistant", "content": f"answer {i}"})
    return lines


# ---- through the installed script -------------------------------------------------------


def test_installed_script_end_to_end(db_url: str) -> None:
    assert SCRIPT.exists(), "the memstore script is installed with the package"
    # global options before the command, and MEMSTORE_URL
    assert spawn("--url", db_url, "append", "c", "system", "You are terse.").returncode == 0
    r = spawn("append", "c", "user", "Where is my order?", env={"MEMSTORE_URL": db_url})
    assert r.returncode == 0 and "stored seq 2" in r.stdout
    listed = spawn("messages", "c", "--url", db_url)  # piped: JSON lines
    assert [json.loads(x)["seq"] for x in listed.stdout.splitlines()] == [1, 2]
    window = json.loads(spawn("--url", db_url, "window", "c", "--format", "json").stdout)
    assert [m["role"] for m in window["messages"]] == ["system", "user"]
    assert window["budget"] == 4000 and window["seqs"] == [1, 2]
    # bad usage: exit 2, one line naming the option
    bad = spawn("window", "c", "--tokens", "-5", "--url", db_url)
    assert bad.returncode == 2 and "--budget/--tokens" in one_error_line(bad.stderr)
    # runtime error: exit 1, one line; --debug adds the traceback
    debug = spawn("--debug", "window", "nope", "--url", db_url)
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == "memstore: error: conversation 'nope' " \
        "does not exist"


def test_installed_script_demo_and_default_database(tmp_path: Path, capsys: Any,
                                                    monkeypatch: Any) -> None:
    first = spawn("demo", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "memstore.db").exists()  # the embedded default
    lines = first.stdout.splitlines()
    header = "\n".join(lines[:4])
    for word in ("token", "score", "buffered", "head &", "recent", "unbounded", "builder",
                 "seq", "role", "text"):
        assert word in header, word
    rows = [line for line in lines if line[:3].strip().isdigit()]
    assert [int(r[:3]) for r in rows] == list(range(1, 16))
    assert rows[-1].count("✗ open") == 7  # the pending call at the end, in every column
    assert "✓ sent to the model" in first.stdout and first.stderr == ""

    again = spawn("demo", "--budget", "600", "--format", "json", cwd=tmp_path)
    data = json.loads(again.stdout)
    assert data["budget"] == 600 and len(data["messages"]) == 15
    assert len(data["views"]) == 7 and "builder" in data["views"]
    for name, view in data["views"].items():
        decisions = view["decisions"]
        assert decisions["15"] == "incomplete_unit", name
        for m in data["messages"]:
            if m["anchored"]:
                assert decisions[str(m["seq"])] == "kept", name
        if view["budget"] is not None:
            assert view["token_count"] <= 600
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MEMSTORE_URL", raising=False)
    code, out, _ = run(capsys, "stats", "--format", "json")
    assert code == 0
    stats = json.loads(out)
    assert stats["conversations"] == 1 and stats["messages"] == 15  # replaced, not appended


def test_installed_script_never_creates_a_database_to_read(tmp_path: Path,
                                                           capsys: Any) -> None:
    typo = tmp_path / "typo.db"
    for argv in (["window", "agent-1"], ["stats"]):
        r = spawn(*argv, "--url", f"sqlite:///{typo}")
        assert r.returncode == 1, argv
        assert "no database at" in one_error_line(r.stderr)
    for argv in (["messages", "agent-1"], ["conversations"], ["conversations", "show", "a"],
                 ["db", "check"], ["pop", "agent-1"], ["clear", "a"], ["delete", "a"],
                 ["state", "save", "a"], ["db", "downgrade", "base"]):
        code, _, err = run(capsys, *argv, "--url", f"sqlite:///{typo}")
        assert code == 1 and "no database at" in one_error_line(err), argv
    assert not typo.exists()


def test_installed_script_is_quiet_on_a_closed_pipe(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pipe.db'}"
    with MemoryStore(url) as store:
        store.extend("big", [Message.user(f"message {i} " * 20) for i in range(3000)])
    with subprocess.Popen([str(SCRIPT), "messages", "big", "--url", url],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()
        proc.stdout.close()  # like `| head -1`
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 0
    assert err == ""


# ---- in-process: every command and its formats ------------------------------------------


def test_every_option_has_help_text() -> None:
    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}")
            elif action.help is None:
                pytest.fail(f"{path}: {action.option_strings or action.dest} has no help")

    walk(build_parser(), "memstore")


def test_append_messages_window_and_formats(url: str, capsys: Any) -> None:
    assert run(capsys, "append", "c", "system", "You are terse.", "--url", url)[0] == 0
    code, out, _ = run(capsys, "append", "c", "user", "Where is my order?", "--pin",
                       "--score", "2", "--id", "k1", "--url", url)
    assert code == 0 and "stored seq 2" in out and "tiktoken/cl100k_base" in out
    # the same client id again stores nothing new
    code, out, _ = run(capsys, "append", "c", "user", "Where is my order?", "--id", "k1",
                       "--url", url)
    assert out.startswith("already stored as seq 2") and "stored seq" not in out[7:]

    code, out, _ = run(capsys, "messages", "c", "--format", "table", "--url", url)
    assert code == 0 and "user (pinned)" in out and "Where is my order?" in out
    code, out, _ = run(capsys, "messages", "c", "--format", "json", "--url", url)
    rows = json.loads(out)
    assert rows[1]["pinned"] is True and rows[1]["score"] == 2.0 and rows[1]["id"] == "k1"
    code, out, _ = run(capsys, "messages", "c", "--format", "openai", "--newest-first",
                       "--limit", "1", "--url", url)
    assert json.loads(out) == [{"role": "user", "content": "Where is my order?"}]
    code, out, _ = run(capsys, "messages", "c", "--start", "2", "--url", url)
    assert [json.loads(x)["seq"] for x in out.splitlines()] == [2]

    code, out, _ = run(capsys, "window", "c", "--format", "table", "--url", url)
    assert "anchored" in out and "pinned" in out and "2 messages" in out and "of 4,000" in out
    code, out, _ = run(capsys, "window", "c", "--json", "--url", url)
    assert json.loads(out)["report"]["view"] == "TokenLimitedView"
    code, out, _ = run(capsys, "window", "c", "--format", "jsonl", "--url", url)
    assert [json.loads(x)["seq"] for x in out.splitlines()] == [1, 2]


@pytest.mark.parametrize("view", ["token-limited", "score-based", "buffered", "head-and-tail",
                                  "recent-turns", "unbounded"])
def test_every_view_from_the_command_line(url: str, capsys: Any, tmp_path: Path,
                                          view: str) -> None:
    source = tmp_path / "history.json"
    source.write_text(json.dumps(_history()))
    assert run(capsys, "import", str(source), "--into", "c", "--format", "openai",
               "--url", url)[0] == 0
    code, out, _ = run(capsys, "window", "c", "--view", view, "--tokens", "60", "--size", "4",
                       "--json", "--url", url)
    assert code == 0
    payload = json.loads(out)
    assert payload["messages"][0]["role"] == "system"
    assert payload["messages"][-1]["content"] == "answer 29"
    if view != "unbounded":
        assert len(payload["messages"]) < 61
    code, out, _ = run(capsys, "window", "c", "--view", view, "--tokens", "60", "--size", "4",
                       "--format", "table", "--url", url)
    assert code == 0 and "rows read" in out


def test_score_based_options_reach_the_view(url: str, capsys: Any) -> None:
    with MemoryStore(url) as store:
        store.extend("c", [Message.user(f"turn {i}", score=5.0 if i == 0 else 1.0)
                           for i in range(40)])
    def seqs(*extra: str) -> list[int]:
        code, out, err = run(capsys, "window", "c", "--view", "score-based", "--budget", "60",
                             *extra, "--json", "--url", url)
        assert code == 0, err
        return list(json.loads(out)["seqs"])

    assert 1 in seqs("--keep-rate", "0.99")  # slow decay: the high-scored first turn wins
    assert 1 not in seqs("--keep-rate", "0.5")  # fast decay: only recent turns
    assert seqs("--half-life", "3600")  # half-life replaces keep-rate; still a window
    code, _, err = run(capsys, "window", "c", "--view", "score-based", "--half-life", "0",
                       "--url", url)
    assert code == 2 and "--half-life" in err


def test_conversations_list_show_delete_clear_pop(url: str, capsys: Any) -> None:
    with MemoryStore(url) as store:
        for cid in ("a", "b", "c"):
            store.extend(cid, [Message.user("one"), Message.assistant("two")])
    code, out, err = run(capsys, "conversations", "list", "--limit", "2", "--url", url)
    assert [json.loads(x)["id"] for x in out.splitlines()] == ["a", "b"]
    assert "--after b" in err
    code, out, _ = run(capsys, "conversations", "--after", "b", "--url", url)
    assert [json.loads(x)["id"] for x in out.splitlines()] == ["c"]
    code, out, _ = run(capsys, "conversations", "--format", "table", "--url", url)
    assert "messages" in out and "updated" in out
    code, out, _ = run(capsys, "conversations", "show", "b", "--format", "json", "--url", url)
    assert json.loads(out)["message_count"] == 2

    code, out, _ = run(capsys, "pop", "a", "--url", url)
    assert json.loads(out)["content"] == "two"
    code, out, _ = run(capsys, "clear", "b", "--url", url)
    assert "deleted 2 messages" in out
    assert run(capsys, "conversations", "delete", "c", "--url", url)[0] == 0
    assert run(capsys, "delete", "b", "--url", url)[0] == 0
    code, out, _ = run(capsys, "conversations", "--url", url)
    assert [json.loads(x)["id"] for x in out.splitlines()] == ["a"]
    code, _, err = run(capsys, "delete", "b", "--url", url)
    assert code == 1 and "'b' does not exist" in err


def test_stats(db_url: str, capsys: Any) -> None:
    with MemoryStore(db_url) as store:
        store.extend("a", [Message.user("hello"), Message.assistant("hi")])
        tokens = store.count_tokens("a")
    code, out, _ = run(capsys, "stats", "--format", "json", "--url", db_url)
    data = json.loads(out)
    assert (data["conversations"], data["messages"], data["tokens"]) == (1, 2, tokens)
    code, out, _ = run(capsys, "stats", "--format", "table", "--url", db_url)
    assert code == 0 and "schema revision" in out and "database size" in out


def test_state_save_and_load_needs_replace(url: str, capsys: Any, tmp_path: Path) -> None:
    run(capsys, "append", "a", "user", "hello", "--url", url)
    snapshot = tmp_path / "state.json"
    assert run(capsys, "state", "save", "a", "-o", str(snapshot), "--url", url)[0] == 0
    code, out, _ = run(capsys, "state", "load", str(snapshot), "--as", "b", "--url", url)
    assert code == 0 and "loaded 1 message into 'b'" in out
    code, out, _ = run(capsys, "state", "load", str(snapshot), "--as", "b", "--url", url)
    assert code == 0 and "nothing to do" in out
    run(capsys, "append", "c", "user", "other content", "--url", url)
    code, _, err = run(capsys, "state", "load", str(snapshot), "--as", "c", "--url", url)
    assert code == 1 and "--replace" in err
    code, out, _ = run(capsys, "messages", "c", "--url", url)
    assert json.loads(out)["content"] == "other content"  # untouched
    assert run(capsys, "state", "load", str(snapshot), "--as", "c", "--replace",
               "--url", url)[0] == 0
    code, out, _ = run(capsys, "messages", "c", "--url", url)
    assert json.loads(out)["content"] == "hello"
    run(capsys, "append", "d", "user", "first", "--url", url)
    assert run(capsys, "state", "load", str(snapshot), "--as", "d", "--append",
               "--url", url)[0] == 0
    code, out, _ = run(capsys, "messages", "d", "--url", url)
    assert [json.loads(x)["content"] for x in out.splitlines()] == ["first", "hello"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    code, _, err = run(capsys, "state", "load", str(bad), "--url", url)
    assert code == 1 and "not a memstore snapshot" in err


def test_import_openai_reports_the_bad_line(url: str, capsys: Any, tmp_path: Path) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_text('{"role": "user", "content": "ok"}\n'
                      '{"role": "tool", "content": "no call id"}\n')
    code, _, err = run(capsys, "import", str(source), "--into", "x", "--format", "openai",
                       "--url", url)
    assert code == 1 and f"{source}:2:" in err and "tool_call_id" in err
    assert len(err.strip().splitlines()) == 1 and "http" not in err
    source.write_text('{"role": "user", "content": "ok"}\nnot json\n')
    code, _, err = run(capsys, "import", str(source), "--into", "x", "--format", "openai",
                       "--url", url)
    assert code == 1 and f"{source}:2: not JSON" in err
    code, _, err = run(capsys, "conversations", "--url", url)
    assert code == 1 or err == ""  # nothing was written: no database, or no conversation
    code, _, err = run(capsys, "import", str(source), "--format", "openai", "--url", url)
    assert code == 2 and "--into" in err


def test_the_tools_output_is_its_input(url: str, capsys: Any, monkeypatch: Any) -> None:
    import io

    with MemoryStore(url) as store:
        store.extend("c", _history(3))
    code, out, _ = run(capsys, "window", "c", "--format", "openai", "--url", url)
    monkeypatch.setattr(sys, "stdin", io.StringIO(out))
    code, out, _ = run(capsys, "import", "-", "--into", "copy", "--format", "openai",
                       "--url", url)
    assert code == 0 and "stored 7 messages in 'copy'" in out
    code, out, _ = run(capsys, "messages", "copy", "--format", "openai", "--url", url)
    assert json.loads(out) == _history(3)


def test_old_import_form_gets_a_hint(url: str, capsys: Any) -> None:
    code, _, err = run(capsys, "import", "chat-1", "history.json", "--url", url)
    assert code == 2
    line = one_error_line(err)
    assert "memstore import history.json --into chat-1 --format openai" in line


def test_usage_errors_are_one_line(url: str, capsys: Any) -> None:
    for argv, option in ((["window", "c", "--tokens", "-5"], "--budget/--tokens"),
                         (["window", "c", "--view", "nope"], "--view"),
                         (["window", "c", "--keep-rate", "1.5"], "--keep-rate"),
                         (["window", "c", "--keep-rate", "-0.1"], "--keep-rate"),
                         (["messages", "c", "--limit", "x"], "--limit"),
                         (["append", "c", "robot", "hi"], "role"),
                         (["append", "c", "user", "hi", "--score", "-1"], "--score"),
                         (["state", "load", "f", "--replace", "--append"], "--append"),
                         (["--url", "::not a url::", "stats"], "--url"),
                         (["--url", "mysql://x@y/z", "stats"], "mysql")):
        code, _, err = run(capsys, *argv)
        assert code == 2, argv
        assert option in one_error_line(err), (argv, err)


def test_tool_calls_show_in_tables(url: str, capsys: Any) -> None:
    with MemoryStore(url) as store:
        store.extend("t", [Message.user("weather?"),
                           Message.assistant(tool_calls=[ToolCall(id="c1", name="weather",
                                                                  arguments="{}")]),
                           Message.tool("[sunny]", tool_call_id="c1")])
    code, out, _ = run(capsys, "messages", "t", "--format", "table", "--url", url)
    assert code == 0 and "weather({})" in out and "[c1] [sunny]" in out  # no markup is interpreted


def test_db_commands(tmp_path: Path, capsys: Any) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    code, _, err = run(capsys, "db", "check", "--url", url)
    assert code == 1 and "memstore db upgrade" in err
    code, out, _ = run(capsys, "db", "current", "--url", url)
    assert "current: none" in out and not (tmp_path / "fresh.db").exists()
    assert run(capsys, "db", "upgrade", "--url", url)[0] == 0
    assert run(capsys, "db", "check", "--url", url)[0] == 0
    code, out, _ = run(capsys, "db", "upgrade", "--sql", "--url", "postgresql://u@h/db")
    assert code == 0 and "CREATE TABLE memstore_messages" in out and "JSONB" in out
    assert run(capsys, "db", "downgrade", "base", "--url", url)[0] == 0
    assert run(capsys, "db", "check", "--url", url)[0] == 1


def test_version(capsys: Any) -> None:
    from memstore import __version__

    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"memstore {__version__}"


# ---- export and import ------------------------------------------------------------------


def _rich_history() -> list[Message]:
    from memstore.cli._demo import demo_messages

    return [*demo_messages(), Message.user("named, scored, with metadata", name="dana",
                                           score=3.5, metadata={"k": [1, "two", None]}),
            Message.tool("late answer", tool_call_id="call_d")]


VIEWS = ("token-limited", "score-based", "buffered", "head-and-tail", "recent-turns",
         "unbounded")


def _windows(url: str, cid: str) -> list[Any]:
    from memstore.cli._commands import make_view

    parser = build_parser()
    found = []
    with MemoryStore(url) as store:
        for view in VIEWS:
            args = parser.parse_args(["window", cid, "--view", view, "--budget", "700",
                                      "--size", "5"])
            w = store.window(cid, make_view(args))
            found.append((w.seqs, w.token_count, w.report.model_dump(exclude={"rows_read"}),
                          [m.model_dump(exclude={"conversation_id"}) for m in w.messages]))
    return found


@pytest.mark.postgres
def test_export_sqlite_import_postgres_round_trip(tmp_path: Path, postgres: Any) -> None:
    from memstore import migrate

    source = f"sqlite:///{tmp_path / 'source.db'}"
    with MemoryStore(source) as store:
        store.create_conversation("a", metadata={"tenant": "acme", "tags": ["x"]})
        store.extend("a", _rich_history())
        store.pin("a", 4)
        store.set_score("a", 5, 0.25)
        store.extend("b", [Message.user("hello"), Message.assistant("hi")])
        before = {cid: store.save_state(cid) for cid in ("a", "b")}
    target = postgres.create_database("memstore_cli")
    migrate.upgrade(target)
    dump = tmp_path / "all.jsonl"

    exported = spawn("export", "-o", str(dump), "--url", source)
    assert exported.returncode == 0, exported.stderr
    assert "exported 2 conversations, 19 messages" in exported.stderr
    imported = spawn("import", str(dump), "--url", target)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.splitlines() == ["a: 17 messages written", "b: 2 messages written"]

    with MemoryStore(target) as store:
        for cid, state in before.items():
            after = store.save_state(cid)
            assert after.conversation.metadata == state.conversation.metadata
            assert after.conversation.created_at == state.conversation.created_at
            assert [m.model_dump() for m in after.messages] == \
                [m.model_dump() for m in state.messages]  # every field, on both databases
    for cid in ("a", "b"):
        assert _windows(target, cid) == _windows(source, cid)

    again = spawn("import", str(dump), "--url", target)  # idempotent
    assert again.returncode == 0
    assert again.stdout.splitlines() == ["a: nothing new (17 messages already stored)",
                                         "b: nothing new (2 messages already stored)"]
    with MemoryStore(target) as store:
        assert store.stats().messages == 19


def test_import_errors_name_the_line_and_write_nothing(url: str, capsys: Any,
                                                       tmp_path: Path) -> None:
    with MemoryStore(url) as store:
        store.extend("a", [Message.user("one"), Message.assistant("two")])
    dump = tmp_path / "a.jsonl"
    assert run(capsys, "export", "a", "-o", str(dump), "--url", url)[0] == 0
    lines = dump.read_text().splitlines()
    assert json.loads(lines[0])["id"] == "a" and len(lines) == 3

    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([lines[0], lines[1], '{"seq": "x"}']) + "\n")
    code, _, err = run(capsys, "import", str(broken), "--as", "copy", "--url", url)
    assert code == 1 and f"{broken}:3:" in one_error_line(err)
    code, _, err = run(capsys, "messages", "copy", "--url", url)
    assert code == 1 and "does not exist" in err  # all or nothing

    # a conversation stored with other content needs --replace
    elsewhere = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    with MemoryStore(elsewhere) as store:
        store.extend("k", [Message.user("uno", id="m1")])
    with MemoryStore(url) as store:
        store.extend("k", [Message.user("one", id="m1"), Message.assistant("two")])
    other = tmp_path / "other.jsonl"
    assert run(capsys, "export", "k", "-o", str(other), "--url", elsewhere)[0] == 0
    code, _, err = run(capsys, "import", str(other), "--url", url)
    assert code == 1 and "--replace" in one_error_line(err), err
    code, out, _ = run(capsys, "import", str(other), "--replace", "--url", url)
    assert code == 0 and "replaced" in out
    with MemoryStore(url) as store:
        assert [m.text for m in store.messages("k")] == ["uno"]


def test_messages_jsonl_imports_as_a_new_conversation(url: str, capsys: Any,
                                                      monkeypatch: Any) -> None:
    import io

    with MemoryStore(url) as store:
        store.extend("c", _history(2))
        original = store.messages("c")
    code, out, _ = run(capsys, "messages", "c", "--format", "jsonl", "--url", url)
    monkeypatch.setattr(sys, "stdin", io.StringIO(out))
    code, out, err = run(capsys, "import", "-", "--as", "copy", "--url", url)
    assert code == 0, err
    assert out.strip() == "copy: 5 messages written"
    with MemoryStore(url) as store:
        copied = store.messages("copy")
    assert [m.model_dump(exclude={"conversation_id"}) for m in copied] == \
        [m.model_dump(exclude={"conversation_id"}) for m in original]


def test_progress_only_on_a_terminal(capsys: Any, monkeypatch: Any) -> None:
    from memstore.cli import _output

    with _output.progress_bar("importing", None) as advance:
        advance(500)
    assert capsys.readouterr() == ("", "")  # not a terminal: silent
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with _output.progress_bar("importing", None) as advance:
        for _ in range(3):
            advance(500)
    out, err = capsys.readouterr()
    assert out == "" and "importing" in err  # on standard error, never in the data


# ---- review fixes: refusals are one line and write nothing ---------------------------------


def test_append_refuses_empty_id_and_name(url: str, capsys: Any) -> None:
    """An empty --id or --name reaches the model, which refuses it; it is never dropped."""
    for option, field in (("--id", "id"), ("--name", "name")):
        code, _, err = run(capsys, "append", "c", "user", "hello", option, "", "--url", url)
        assert code == 2, err
        assert f"{field}: {field} must not be empty" in one_error_line(err)
    code, _, err = run(capsys, "append", "c", "tool", "result", "--tool-call-id", "",
                       "--url", url)
    assert code == 2 and "tool_call_id" in one_error_line(err)
    code, _, err = run(capsys, "append", "c", "user", "hello", "--tool-call-id", "",
                       "--url", url)
    assert code == 2 and "--tool-call-id is only for tool messages" in one_error_line(err)
    code, _, err = run(capsys, "messages", "c", "--url", url)
    assert code == 1 and "no database" in err  # nothing was written
    # an id given twice is still the idempotency key it was
    assert run(capsys, "append", "c", "user", "hello", "--id", "k1", "--url", url)[0] == 0
    assert run(capsys, "append", "c", "user", "hello", "--id", "k1", "--url", url)[0] == 0
    with MemoryStore(url) as store:
        assert [m.id for m in store.messages("c")] == ["k1"]


def _deep(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


def test_import_of_json_nested_too_deeply_names_the_line(url: str, capsys: Any,
                                                         tmp_path: Path) -> None:
    with MemoryStore(url) as store:
        store.extend("a", [Message.user("one")])
    dump = tmp_path / "a.jsonl"
    assert run(capsys, "export", "a", "-o", str(dump), "--url", url)[0] == 0
    header = dump.read_text().splitlines()[0]
    deep = tmp_path / "deep.jsonl"
    deep.write_text(header + "\n" + '{"role":"user","metadata":{"a":' + _deep() + "}}\n")
    code, _, err = run(capsys, "import", str(deep), "--as", "copy", "--url", url)
    assert code == 1 and f"{deep}:2: JSON nested too deeply" in one_error_line(err), err
    deep.write_text(_deep() + "\n")
    code, _, err = run(capsys, "import", str(deep), "--url", url)
    assert code == 1 and f"{deep}:1: JSON nested too deeply" in one_error_line(err), err

    openai = tmp_path / "openai.jsonl"
    openai.write_text('{"role": "user", "content": "ok"}\n{"role": "user", "content": '
                      + _deep() + "}\n")
    code, _, err = run(capsys, "import", str(openai), "--format", "openai", "--into", "copy",
                       "--url", url)
    assert code == 1 and f"{openai}:2: JSON nested too deeply" in one_error_line(err), err
    openai.write_text('[{"role": "user", "content": "ok"}, ' + _deep() + "]")
    code, _, err = run(capsys, "import", str(openai), "--format", "openai", "--into", "copy",
                       "--url", url)
    assert code == 1 and f"{openai}: JSON nested too deeply" in one_error_line(err), err
    with MemoryStore(url) as store:
        assert [c.id for c in store.list_conversations()] == ["a"]  # nothing was written


def test_import_hints_at_replace_only_when_it_would_help(url: str, capsys: Any,
                                                         tmp_path: Path,
                                                         monkeypatch: Any) -> None:
    from memstore import ConflictError, transfer

    # a message id repeated within the file: a bad line, not a conflict with stored rows
    dup = tmp_path / "dup.jsonl"
    message = {"role": "user", "content": "hi", "id": "a", "seq": 1,
               "created_at": "2026-01-05T10:00:00Z", "token_count": 4,
               "token_counter": "approx/4"}
    dup.write_text("\n".join(json.dumps(x) for x in [
        {"memstore_export": 1, "type": "conversation", "id": "dup",
         "created_at": "2026-01-05T10:00:00Z", "updated_at": "2026-01-05T10:02:11Z",
         "metadata": {}, "message_count": 2},
        message, {**message, "seq": 2}]) + "\n")
    code, _, err = run(capsys, "import", str(dup), "--url", url)
    line = one_error_line(err)
    assert code == 1 and f"{dup}:3: " in line and "'a'" in line, err
    assert "--replace" not in line
    code, _, err = run(capsys, "conversations", "--url", url)
    assert "dup" not in err

    # a conflict that --replace would not resolve gets no hint
    def conflict(*args: Any, **kwargs: Any) -> Any:
        raise ConflictError("some other conflict")

    monkeypatch.setattr(transfer, "import_jsonl", conflict)
    code, _, err = run(capsys, "import", str(dup), "--url", url)
    assert code == 1 and one_error_line(err) == "memstore: error: some other conflict"
    # and none when --replace was passed already
    stored = ConflictError("message id 'a' is already stored with different content")
    setattr(stored, transfer._STORED_CONFLICT, True)  # as import_jsonl marks it
    assert transfer.conflicts_with_stored(stored)

    def stored_conflict(*args: Any, **kwargs: Any) -> Any:
        raise stored

    monkeypatch.setattr(transfer, "import_jsonl", stored_conflict)
    code, _, err = run(capsys, "import", str(dup), "--url", url)
    assert code == 1 and "(pass --replace" in one_error_line(err)
    code, _, err = run(capsys, "import", str(dup), "--replace", "--url", url)
    assert code == 1 and "--replace" not in one_error_line(err)


def test_state_load_refuses_any_existing_conversation(db_url: str, capsys: Any,
                                                      tmp_path: Path) -> None:
    """Without --replace or --append, a load never overwrites a conversation that exists,
    even one with no messages: its metadata, creation time and summaries are kept."""
    with MemoryStore(db_url) as store:
        store.append("src", Message.user("hello"))
        store.create_conversation("empty", metadata={"owner": "ann", "important": True})
        store.extend("summarized", [Message.user(f"u{i} " + "word " * 50) for i in range(6)])
        store.summarize("summarized", lambda ms: "SUMMARY", keep_tokens=10)
        store.truncate("summarized", before_seq=100)
        before = {cid: (store.get_conversation(cid), store.summaries(cid))
                  for cid in ("empty", "summarized")}
    snapshot = tmp_path / "state.json"
    assert run(capsys, "state", "save", "src", "-o", str(snapshot), "--url", db_url)[0] == 0
    code, _, err = run(capsys, "state", "load", str(snapshot), "--as", "empty",
                       "--url", db_url)
    line = one_error_line(err)
    assert code == 1 and "'empty' exists (0 messages, metadata" in line, err
    assert "--replace" in line and "--append" in line
    code, _, err = run(capsys, "state", "load", str(snapshot), "--as", "summarized",
                       "--url", db_url)
    assert code == 1 and "'summarized' exists (0 messages, 1 summary)" in one_error_line(err)
    with MemoryStore(db_url) as store:
        assert {cid: (store.get_conversation(cid), store.summaries(cid))
                for cid in ("empty", "summarized")} == before  # untouched
    # the same messages with other metadata are other content too
    with MemoryStore(db_url) as store:
        store.load_state(store.save_state("src"), "same-messages")
    state = json.loads(snapshot.read_text())
    state["conversation"]["metadata"] = {"changed": 1}
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(state))
    code, _, err = run(capsys, "state", "load", str(changed), "--as", "same-messages",
                       "--url", db_url)
    assert code == 1 and "exists (1 message)" in one_error_line(err)
    # a conversation that does not exist is created exactly as the snapshot
    code, out, _ = run(capsys, "state", "load", str(snapshot), "--as", "new", "--url", db_url)
    assert code == 0 and "loaded 1 message into 'new'" in out
    code, out, _ = run(capsys, "state", "load", str(snapshot), "--as", "new", "--url", db_url)
    assert code == 0 and "nothing to do" in out
    assert run(capsys, "state", "load", str(snapshot), "--as", "empty", "--replace",
               "--url", db_url)[0] == 0
    with MemoryStore(db_url) as store:
        saved = store.save_state("src")
        for cid in ("new", "empty"):
            loaded = store.save_state(cid)
            assert loaded.conversation.metadata == saved.conversation.metadata
            assert loaded.conversation.created_at == saved.conversation.created_at
            assert [m.text for m in loaded.messages] == ["hello"]


def test_db_commands_refuse_an_unknown_revision(tmp_path: Path, capsys: Any) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    for argv in (["db", "upgrade", "zzz"], ["db", "downgrade", "zzz"],
                 ["db", "upgrade", "zzz", "--sql"]):
        code, _, err = run(capsys, *argv, "--url", url)
        line = one_error_line(err)
        assert code == 2, (argv, err)
        assert "revision 'zzz'" in line and "0001_initial" in line and "CommandError" not in line
    assert not (tmp_path / "fresh.db").exists()  # refused before a database was created
    assert run(capsys, "db", "upgrade", "--url", url)[0] == 0
    code, _, err = run(capsys, "db", "downgrade", "+1", "--url", url)
    assert code == 2 and "revision '+1'" in one_error_line(err)
    from memstore import migrate

    assert migrate.current(url) == migrate.heads()  # the refused downgrade changed nothing


def test_db_commands_refuse_relative_revisions_past_either_end(db_url: str, capsys: Any) -> None:
    from memstore import migrate

    head = migrate.heads()[0]
    for argv in (["upgrade", "head-9"], ["upgrade", "head+1"], ["upgrade", "+5"],
                 ["upgrade", "base-1"], ["upgrade", ""], ["upgrade", "heads@head"],
                 ["upgrade", "head:base"], ["upgrade", "head-9", "--sql"],
                 ["downgrade", "head-9"], ["downgrade", "-9"], ["downgrade", "+1"],
                 ["downgrade", "nosuch@head"], ["downgrade", "head+1", "--sql"]):
        code, out, err = run(capsys, "db", *argv, "--url", db_url)
        line = one_error_line(err)
        assert code == 2, (argv, err)
        assert f"revision {argv[1]!r}" in line and "0001_initial" in line, line
        assert "Error" not in line and out == "", line  # no AssertionError, no DDL
        assert migrate.current(db_url) == (head,)  # nothing was written
    # downgrade to a revision above the database's: refused, naming both
    assert run(capsys, "db", "downgrade", "0001_initial", "--url", db_url)[0] == 0
    code, _, err = run(capsys, "db", "downgrade", "head", "--url", db_url)
    line = one_error_line(err)
    assert code == 2 and "revision 'head'" in line and "0001_initial, below" in line
    assert migrate.current(db_url) == ("0001_initial",)
    code, out, _ = run(capsys, "db", "upgrade", "+1", "--url", db_url)
    assert code == 0 and "memstore schema at 0002_conversation_epoch" in out
    code, out, _ = run(capsys, "db", "downgrade", "-2", "--url", db_url)
    assert code == 0 and "memstore schema at base (no memstore tables)" in out
    assert run(capsys, "db", "upgrade", "--url", db_url)[0] == 0
    # an upgrade to a revision below the database's leaves it, and says so
    code, out, _ = run(capsys, "db", "upgrade", "0002_conversation_epoch", "--url", db_url)
    assert code == 0 and out.strip() == (
        f"memstore schema at {head} (already past 0002_conversation_epoch; upgrade never "
        "moves down: `memstore db downgrade 0002_conversation_epoch` does)")
    assert migrate.current(db_url) == (head,)
    code, out, _ = run(capsys, "db", "upgrade", head, "--url", db_url)
    assert code == 0 and out.strip() == f"memstore schema at {head}"


def test_db_commands_on_sqlite_paths_that_cannot_be_a_database(tmp_path: Path,
                                                               capsys: Any) -> None:
    for argv in (["upgrade"], ["current"], ["check"], ["downgrade", "base"]):
        code, _, err = run(capsys, "db", *argv, "--url", f"sqlite:///{tmp_path}")
        line = one_error_line(err)
        assert code == 2 and f"{str(tmp_path)!r} is a directory" in line, (argv, err)
    code, _, err = run(capsys, "db", "upgrade", "--url", f"sqlite:///{tmp_path / 'no/x.db'}")
    assert code == 2 and "does not exist" in one_error_line(err)
    code, _, err = run(capsys, "db", "create-partitioned", "--url",
                       f"sqlite:///{tmp_path / 'new.db'}")
    assert code == 2 and "PostgreSQL's" in one_error_line(err)
    code, out, err = run(capsys, "db", "upgrade", "base", "--url", f"sqlite:///{tmp_path / 'b.db'}")
    assert code == 0 and "base (no memstore tables)" in out
    # A command that creates the database says the same (the store's own check).
    code, _, err = run(capsys, "append", "c", "user", "hi", "--url", f"sqlite:///{tmp_path}")
    assert code == 2 and f"{str(tmp_path)!r} is a directory" in one_error_line(err)
    code, _, err = run(capsys, "append", "c", "user", "hi", "--url",
                       f"sqlite:///{tmp_path / 'no/x.db'}")
    assert code == 2 and "does not exist" in one_error_line(err)
    assert list(tmp_path.iterdir()) == []  # no command above created a file


def test_import_stopped_by_a_database_error_lists_what_it_stored(url: str, capsys: Any,
                                                                   tmp_path: Path,
                                                                   monkeypatch: Any) -> None:
    from memstore import DatabaseError, MemoryStore, Message, export_jsonl, transfer

    source = tmp_path / "in.jsonl"
    with MemoryStore("sqlite://") as other, source.open("w") as fp:
        other.append("a", Message.user("hi"))
        export_jsonl(other, fp)  # a valid first line: the file is read (by the stub)

    def fail(*args: Any, **kwargs: Any) -> Any:
        exc = DatabaseError("database error: simulated")
        exc.imported = [transfer.ImportedConversation(  # type: ignore[attr-defined]
            id="a", written=2, unchanged=0, replaced=False, recounted=0)]
        raise exc

    monkeypatch.setattr(transfer, "import_jsonl", fail)
    code, out, err = run(capsys, "import", str(source), "--url", url)
    assert code != 0 and "simulated" in one_error_line(err)
    assert out.splitlines() == ["a: 2 messages written"]  # stored before the error


def test_demo_with_a_budget_too_small_suggests_one_that_works(url: str, capsys: Any) -> None:
    code, out, _ = run(capsys, "demo", "--budget", "50", "--url", url)
    assert code == 0 and "too small" in out
    hint = out.split("Next: ")[1].split()
    assert hint[:5] == ["memstore", "window", "demo", "--view", "score-based"]
    budget = int(hint[hint.index("--budget") + 1])
    assert budget > 50
    code, out, err = run(capsys, *hint[1:], "--url", url)
    assert code == 0, err


# ---- new-user walkthrough fixes -------------------------------------------------------------


def test_url_accepts_what_the_library_accepts(tmp_path: Path, capsys: Any,
                                              monkeypatch: Any) -> None:
    """postgres:// (what hosting providers give) works; a bare path gets the library's hint."""
    from memstore.cli._commands import url_of

    for url in ("postgres://postgres@127.0.0.1/x", "postgres+psycopg://u:pw@h:5433/db"):
        assert url_of(argparse.Namespace(url=url)) == url
    monkeypatch.setenv("MEMSTORE_URL", "postgres://postgres@127.0.0.1/x")
    assert url_of(argparse.Namespace(url=None)) == "postgres://postgres@127.0.0.1/x"
    monkeypatch.delenv("MEMSTORE_URL")
    code, _, err = run(capsys, "db", "check", "--url", "./memstore.db")
    line = one_error_line(err)
    assert code == 2 and "--url" in line and "write 'sqlite:///./memstore.db'" in line
    monkeypatch.setenv("MEMSTORE_URL", "agent.db")
    code, _, err = run(capsys, "stats")
    line = one_error_line(err)
    assert code == 2 and "MEMSTORE_URL" in line and "'sqlite:///agent.db'" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.postgres
def test_postgres_scheme_url_and_the_upgrade_hint(postgres: Any, capsys: Any,
                                                  monkeypatch: Any) -> None:
    """A fresh PostgreSQL database: the error names the command with the real URL."""
    from sqlalchemy.engine import make_url

    from memstore import SchemaOutOfDateError

    created = make_url(postgres.create_database("cli_schema"))
    url = created.set(drivername="postgres").render_as_string(hide_password=False)
    secret = created.set(drivername="postgres", password="s3cret").render_as_string(
        hide_password=False)  # trust authentication: the password is not checked
    # the library's message: readable, and names both remedies
    with pytest.raises(SchemaOutOfDateError) as info:
        MemoryStore(url, migrate="check")
    text = str(info.value)
    assert "no memstore tables yet" in text and "no memstore schema" not in text
    assert "memstore db upgrade" in text and "memstore.migrate.upgrade(" in text
    # the command's: this database's URL, password hidden, no Python call
    code, _, err = run(capsys, "db", "check", "--url", url)
    line = one_error_line(err)
    assert code == 1 and "the database has no memstore tables yet" in line, line
    assert f"`memstore db upgrade --url {url}`" in line
    assert "<database url>" not in line and "migrate.upgrade" not in line
    code, _, err = run(capsys, "stats", "--url", secret)
    line = one_error_line(err)
    assert code == 1 and "s3cret" not in line and ":***@" in line
    # MEMSTORE_URL=postgres://... works for every command
    monkeypatch.setenv("MEMSTORE_URL", url)
    code, _, err = run(capsys, "messages", "c")
    line = one_error_line(err)
    assert code == 1 and "`memstore db upgrade`" in line and url in line
    assert run(capsys, "db", "upgrade")[0] == 0
    assert run(capsys, "append", "c", "user", "hello")[0] == 0
    code, out, _ = run(capsys, "stats", "--format", "json")
    assert code == 0 and json.loads(out)["messages"] == 1
    # a schema behind head: named as such
    assert run(capsys, "db", "downgrade", "-1")[0] == 0
    code, _, err = run(capsys, "window", "c")
    line = one_error_line(err)
    assert code == 1 and "behind this memstore's" in line and "upgrade it with" in line


def test_sqlite_without_memstore_tables_gets_the_upgrade_command(tmp_path: Path,
                                                                 capsys: Any) -> None:
    import sqlite3

    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE unrelated (x)")
    conn.close()
    url = f"sqlite:///{path}"
    code, _, err = run(capsys, "messages", "c", "--url", url)
    line = one_error_line(err)
    assert code == 1 and "the database has no memstore tables yet" in line
    assert f"`memstore db upgrade --url {url}`" in line and "migrate.upgrade" not in line
    assert run(capsys, "db", "upgrade", "--url", url)[0] == 0
    assert run(capsys, "db", "check", "--url", url)[0] == 0


def test_import_help_says_which_formats_append(url: str, capsys: Any,
                                               tmp_path: Path) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(sub.choices["import"].format_help().split())
    assert "importing the same file twice stores nothing new" not in text.lower()
    assert "same memstore file twice stores nothing new" in text
    assert "--format openai appends every time" in text
    doc = " ".join((Path(__file__).parent.parent / "docs" / "cli.md").read_text().split())
    assert "appends every time" in doc and "idempotent" in doc
    # what the help says is what happens
    source = tmp_path / "h.json"
    source.write_text(json.dumps(_history(1)))
    for _ in range(2):
        code, out, _ = run(capsys, "import", str(source), "--format", "openai", "--into", "h1",
                           "--url", url)
        assert code == 0 and out.strip() == "stored 3 messages in 'h1'"
    with MemoryStore(url) as store:
        assert len(store.messages("h1")) == 6
    # messages with client ids: a second import stores nothing new, and says so
    source.write_text(json.dumps([{**m, "id": f"m{i}"} for i, m in enumerate(_history(1))]))
    assert run(capsys, "import", str(source), "--format", "openai", "--into", "h2",
               "--url", url)[1].strip() == "stored 3 messages in 'h2'"
    code, out, _ = run(capsys, "import", str(source), "--format", "openai", "--into", "h2",
                       "--url", url)
    assert code == 0 and out.strip() == "nothing new in 'h2' (3 messages already stored)"
    # an id repeated within the file is stored once and counted once
    source.write_text(json.dumps([{"role": "user", "content": "a", "id": "x"},
                                  {"role": "user", "content": "a", "id": "x"},
                                  {"role": "user", "content": "b"}]))
    code, out, _ = run(capsys, "import", str(source), "--format", "openai", "--into", "h3",
                       "--url", url)
    assert code == 0 and out.strip() == "stored 2 messages in 'h3' (1 already stored)"
    with MemoryStore(url) as store:
        assert len(store.messages("h3")) == 2


def test_import_errors_name_the_cli_flag_not_the_python_argument(url: str, capsys: Any,
                                                                 tmp_path: Path) -> None:
    bare = tmp_path / "history.jsonl"
    with MemoryStore(url) as store:
        store.extend("c", _history(1))
        bare.write_text("".join(m.model_dump_json() + "\n" for m in store.messages("c")))
    code, _, err = run(capsys, "import", str(bare), "--url", url)
    line = one_error_line(err)
    assert code == 1 and "--as CONV" in line and "rename" not in line, line
    two = tmp_path / "two.jsonl"
    assert run(capsys, "export", "-o", str(two), "--url", url)[0] == 0
    two.write_text(two.read_text() + two.read_text().replace('"c"', '"d"'))
    code, _, err = run(capsys, "import", str(two), "--as", "x", "--url", url)
    line = one_error_line(err)
    assert code == 1 and "--as imports one conversation" in line and "rename" not in line


@pytest.mark.parametrize("columns", [None, "80"])
def test_demo_is_readable_at_80_columns(url: str, capsys: Any, monkeypatch: Any,
                                        columns: str | None) -> None:
    """Piped (Rich's default: 80 columns) or an 80-column terminal: nothing is cut off,
    each message's text shows (the views that count messages make room for it), the
    totals row says what it counts, and the token-limited column says why 18-token
    messages were left out under a budget it used a seventh of."""
    if columns is None:
        monkeypatch.delenv("COLUMNS")
    else:
        monkeypatch.setenv("COLUMNS", columns)
    for budget in ("50", "1000"):
        code, out, _ = run(capsys, "demo", "--budget", budget, "--url", url)
        assert code == 0
        code, data, _ = run(capsys, "demo", "--budget", budget, "--format", "json",
                            "--url", url)
        views = json.loads(data)["views"]
        lines = out.splitlines()
        assert max(len(line) for line in lines) <= 80, out
        flat = " ".join(out.split())
        assert lines[0].startswith("What each view keeps of conversation 'demo' "
                                   "(15 messages, 2,339 tokens stored)")
        header = " ".join(" ".join(lines[1:3]).split())
        assert header == "token score head & seq role tokens text limited based tail " \
            "builder", out
        rows = {int(line[:3]): line for line in lines if line[:3].strip().isdigit()}
        assert sorted(rows) == list(range(1, 16))
        # the text preview, shortened
        assert "Order 1138 was due" in rows[5] and "…" in rows[5], out
        assert "→ lookup_order(" in rows[6] and "[call_a] {" in rows[7], out
        # the totals row is labelled, and its figures are what each window sent
        at = next(i for i, line in enumerate(lines) if "tokens sent:" in line)
        footer = lines[at].split("tokens sent:")[1].split()
        sent = [f"{views[name]['token_count']:,}" if "error" not in views[name] else None
                for name in ("token-limited", "score-based", "head-and-tail", "builder")]
        if budget == "50":
            # token-limited, score-based, builder: too small; the footer wraps, whole
            assert sent[0] is None and sent[1] is None and sent[3] is None
            footer = " ".join(lines[at:at + 2]).split("tokens sent:")[1].split()
            assert footer.count("too") == 3 and footer.count("small") == 3, out
            assert sent[2] in footer
        else:
            assert footer == sent, out
            assert sent[0] == "141" and views["token-limited"]["budget"] == 1000
            assert "2,339" not in lines[at]  # the stored total is in the title, not here
            # why an 18-token message is left out: the 1,948-token tool output blocks it
            assert all("✗ blocked" in rows[seq] for seq in range(4, 11)), out
            assert "✗ budget" in rows[11] and "✗ budget" in rows[12], out
            assert views["token-limited"]["blocked_by"] == {"first_seq": 11, "last_seq": 12,
                                                            "tokens": 17 + 1948}
            assert ("Why blocked: token-limited keeps a contiguous suffix of the history, "
                    "so once seqs 11-12 (1,965 tokens) did not fit in the 859 tokens left "
                    "of its 1,000, every older message was left out, however small (it "
                    "sent 141 of 1,000 tokens;") in flat, out
        for words in ("score: a higher-scored unit took the room;",
                      "outside the view's message, head-and-tail or turn limit;",
                      "builder: a retrieved policy document, then the history through "
                      f"score-based, in one budget of {int(budget):,}.",
                      "Not shown at this width: buffered, recent-turns, unbounded"):
            assert words in flat, (words, out)
        assert lines[-1].startswith("Next: memstore window demo")  # one line, to copy


def test_demo_table_snapshot_at_80_and_112_columns() -> None:
    """The table itself, rendered by Rich at 80 columns (and at the docs' 112, where
    every view fits): the columns kept, and the first rows, exactly."""
    import io

    from rich.console import Console

    from memstore.cli._demo import demo_layout, demo_table, run_demo

    with MemoryStore("sqlite://") as store:
        result = run_demo(store, 1000)
    shown = {}
    for width in (80, 112):
        console = Console(width=width, record=True, file=io.StringIO(), markup=False)
        console.print(demo_table(result, width))
        shown[width] = console.export_text()
        assert max(len(line) for line in shown[width].splitlines()) <= width
        assert demo_layout(result, width).width == width
    lines = shown[80].splitlines()
    assert lines[2:7] == [
        "seq role      tokens text                      limited   based   tail   builder",
        "───────────────────────────────────────────────────────────────────────────────",
        "  1 system        32 You are Atlas, the suppo… ✓         ✓       ✓      ✓      ",
        "  2 developer     31 Tools: lookup_order, tra… ✓         ✓       ✓      ✓      ",
        "  3 user*         31 For the record: I'm Dana… ✓         ✓       ✓      ✓      ",
    ], shown[80]
    assert "  4 assistant     18 Noted, Dana: email only.… ✗ blocked ✓       ✓      ✓" in \
        shown[80]
    assert "                                  tokens sent: 141       350     2,161  387" in \
        shown[80]
    wide = shown[112].splitlines()
    assert " ".join(" ".join(wide[1:3]).split()) == (
        "token score head & recent seq role tokens text limited based buffered tail turns "
        "unbounded builder"), shown[112]
    assert "tokens sent: 141       350     2,152    2,161  2,122   2,315     387" in shown[112]
    assert "Not shown" not in shown[112]
    # the width the note names is the narrowest that shows every view
    need = int(" ".join(shown[80].split()).split("every view fits in ")[1].split()[0])
    assert len(demo_layout(result, need).shown) == 7
    assert len(demo_layout(result, need - 1).shown) < 7


def test_counts_of_one_are_singular(url: str, capsys: Any, tmp_path: Path) -> None:
    code, out, _ = run(capsys, "append", "c", "user", "hi", "--url", url)
    assert code == 0
    code, out, _ = run(capsys, "window", "c", "--format", "table", "--url", url)
    assert "1 message, " in out and "1 messages" not in out
    assert "of 1 stored message left out" in out
    dump = tmp_path / "c.jsonl"
    code, _, err = run(capsys, "export", "c", "-o", str(dump), "--url", url)
    assert "exported 1 conversation, 1 message to" in err
    code, out, _ = run(capsys, "import", str(dump), "--as", "d", "--url", url)
    assert out.strip() == "d: 1 message written"
    code, out, _ = run(capsys, "import", str(dump), "--as", "d", "--url", url)
    assert out.strip() == "d: nothing new (1 message already stored)"
    code, out, _ = run(capsys, "import", str(dump), "--as", "d", "--replace", "--url", url)
    assert out.strip() == "d: replaced (1 message written)"
    code, out, _ = run(capsys, "clear", "d", "--url", url)
    assert out.strip() == "deleted 1 message from 'd'"
    source = tmp_path / "one.json"
    source.write_text('[{"role": "user", "content": "hi"}]')
    code, out, _ = run(capsys, "import", str(source), "--format", "openai", "--into", "e",
                       "--url", url)
    assert out.strip() == "stored 1 message in 'e'"
    snapshot = tmp_path / "s.json"
    assert run(capsys, "state", "save", "c", "-o", str(snapshot), "--url", url)[0] == 0
    code, out, _ = run(capsys, "state", "load", str(snapshot), "--as", "f", "--url", url)
    assert out.strip() == "loaded 1 message into 'f'"


def test_keep_rate_accepts_what_the_view_accepts(url: str, capsys: Any) -> None:
    with MemoryStore(url) as store:
        store.extend("c", [Message.user(f"turn {i}") for i in range(10)])
    for rate in ("0", "1", "0.5"):
        code, out, err = run(capsys, "window", "c", "--view", "score-based", "--keep-rate", rate,
                             "--budget", "40", "--json", "--url", url)
        assert code == 0, (rate, err)
        assert json.loads(out)["seqs"][-1] == 10
    for rate in ("-0.1", "1.01", "nan"):
        code, _, err = run(capsys, "window", "c", "--keep-rate", rate, "--url", url)
        assert code == 2 and "--keep-rate" in one_error_line(err), rate
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert "in [0, 1]" in sub.choices["window"].format_help()


def test_window_budget_error_suggests_a_budget(url: str, capsys: Any) -> None:
    with MemoryStore(url) as store:
        store.extend("c", [Message.system("You are a careful assistant. " * 10),
                           Message.user("hello")])
    for extra in ((), ("--reserve", "20"), ("--view", "score-based")):
        code, _, err = run(capsys, "window", "c", "--budget", "30", *extra, "--url", url)
        line = one_error_line(err)
        assert code == 1 and "; use --budget " in line and line.endswith(" or more"), line
        needed = int(line.split("; use --budget ")[1].split()[0])
        assert needed > 30
        code, _, err = run(capsys, "window", "c", "--budget", str(needed), *extra, "--url", url)
        assert code == 0, err
        code, _, err = run(capsys, "window", "c", "--budget", str(needed - 1), *extra,
                           "--url", url)
        assert code == 1, err  # the smallest budget that works


def test_import_of_an_integer_json_cannot_read_names_the_line(url: str, capsys: Any,
                                                              tmp_path: Path) -> None:
    """An integer of more than 4,300 digits made json.loads raise a plain ValueError,
    which reached the catch-all message naming no file or line."""
    huge = "9" * 5000
    dump = tmp_path / "huge.jsonl"
    dump.write_text('{"role": "user", "content": "ok"}\n{"role": "user", "content": "x", '
                    f'"score": {huge}}}\n')
    code, _, err = run(capsys, "import", str(dump), "--format", "openai", "--into", "c",
                       "--url", url)
    assert code == 1 and f"{dump}:2: not JSON memstore can read" in one_error_line(err), err
    dump.write_text(f'[{{"role": "user", "content": "x", "score": {huge}}}]')
    code, _, err = run(capsys, "import", str(dump), "--format", "openai", "--into", "c",
                       "--url", url)
    assert code == 1 and f"{dump}: not JSON memstore can read" in one_error_line(err), err
    dump.write_text(f"{huge}\n")
    code, _, err = run(capsys, "import", str(dump), "--url", url)
    assert code == 1 and f"{dump}:1: not JSON memstore can read" in one_error_line(err), err
    with MemoryStore(url) as store:
        assert store.list_conversations() == []
