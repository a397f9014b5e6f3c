"""The lifecycle commands: conversations list filters, conversations update, fork, prune,
forget, audit.

In-process through main() (as tests/test_cli.py), on SQLite and PostgreSQL; one case spawns
the installed script, as cron would run it.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from memstore import ConversationState, MemoryStore, Message, ToolCall
from memstore.cli import _output
from memstore.cli._lifecycle_args import assignment, duration, instant, json_scalar
from tests.test_cli import one_error_line, run, spawn

NOW = datetime.now(timezone.utc)


@pytest.fixture(autouse=True)
def wide_tables(monkeypatch: Any) -> None:
    monkeypatch.setenv("COLUMNS", "200")


class _Terminal(io.StringIO):
    """Standard input that is a terminal, holding the answer typed."""

    def isatty(self) -> bool:
        return True


def _aged(cid: str, days: list[int], metadata: dict[str, Any] | None = None) -> ConversationState:
    """A conversation of messages ``days`` old (negative: a system message that old)."""
    rows = []
    for seq, d in enumerate(days, 1):
        message = Message.user(f"m{seq}") if d >= 0 else Message.system(f"s{seq}")
        body = json.loads(message.model_dump_json())
        body.update(conversation_id=cid, seq=seq, id=f"{cid}-{seq}", token_count=1,
                    token_counter="fixed",
                    created_at=(NOW - timedelta(days=abs(d))).isoformat())
        rows.append(body)
    return ConversationState.model_validate({
        "conversation": {"id": cid, "created_at": NOW, "updated_at": NOW,
                         "metadata": metadata or {}},
        "messages": rows})


def _people(url: str) -> None:
    """a, b: user u1 (a old, b young); c: user u2; d: no metadata."""
    with MemoryStore(url) as store:
        store.load_state(_aged("a", [-200, 120, 110, 100, 5, 1], {"user_id": "u1", "n": 1}))
        store.load_state(_aged("b", [100, 100, 2], {"user_id": "u1", "n": "1"}))
        store.load_state(_aged("c", [300, 200], {"user_id": "u2", "on": True}))
        store.append("d", Message.user("no metadata"))


def _ids(out: str) -> list[str]:
    return [json.loads(line)["id"] for line in out.splitlines()]


def _snapshot(url: str) -> Any:
    """Everything stored, to compare before and after a command that must write nothing."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {table: [tuple(r) for r in conn.execute(text(
                f"SELECT * FROM {table} ORDER BY 1, 2"))]
                for table in ("memstore_conversations", "memstore_messages",
                              "memstore_conversation_keys", "memstore_summaries",
                              "memstore_audit")}
    finally:
        engine.dispose()


# ---- values on the command line -----------------------------------------------------------


@pytest.mark.parametrize(("given", "value"), [
    ("n=1", 1), ("n=-7", -7), ("on=true", True), ("off=false", False), ("x=null", None),
    ("name=\"1\"", "1"), ("plan=pro", "pro"), ("zip=01234", "01234"), ("r=0.5", 0.5),
    ("e=", ""), ("list=[1, 2]", "[1, 2]"), ("obj={\"a\": 1}", "{\"a\": 1}"),
    ("nan=NaN", "NaN"), ("inf=Infinity", "Infinity"), ("eq=a=b", "a=b"),
    ("space=two words", "two words"), ("quoted=\"a b\"", "a b"),
])
def test_key_value_is_a_json_scalar_or_text(given: str, value: Any) -> None:
    item = assignment(given)
    assert item.key == given.partition("=")[0] and item.text == given
    assert item.value == value and type(item.value) is type(value)
    assert json_scalar(given.partition("=")[2]) == value


@pytest.mark.parametrize("bad", ["novalue", "=1", ""])
def test_key_value_needs_a_key_and_an_equals_sign(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected KEY=VALUE"):
        assignment(bad)


def test_durations_and_dates() -> None:
    assert duration("90d") == timedelta(days=90)
    assert duration("12h") == timedelta(hours=12)
    assert duration("30m") == timedelta(minutes=30)
    assert duration("2w") == timedelta(weeks=2)
    assert duration("45s") == timedelta(seconds=45)
    assert duration(" 7D ") == timedelta(days=7)
    for bad in ("90", "d", "1.5d", "-1d", "1d12h", "9999999999d"):
        with pytest.raises(argparse.ArgumentTypeError):
            duration(bad)
    utc = timezone.utc
    assert instant("2026-01-31") == datetime(2026, 1, 31, tzinfo=utc)  # naive: UTC
    assert instant("2026-01-31T12:30") == datetime(2026, 1, 31, 12, 30, tzinfo=utc)
    assert instant("2026-01-31T12:00:00Z") == datetime(2026, 1, 31, 12, tzinfo=utc)
    assert instant("2026-01-31T12:00:00+02:00") == datetime(2026, 1, 31, 10, tzinfo=utc)
    assert instant("2026-01-31T12:00:00+02:00").tzinfo == utc
    for bad in ("yesterday", "31/01/2026", "2026-13-01", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="ISO 8601"):
            instant(bad)


@pytest.mark.parametrize(("argv", "option"), [
    (["conversations", "--where", "n=1.5"], "--where"),
    (["conversations", "list", "--where", "novalue"], "--where"),
    (["conversations", "--updated-after", "yesterday"], "--updated-after"),
    (["conversations", "list", "--order", "newest"], "--order"),
    (["conversations", "update", "a", "--ttl", "30"], "--ttl"),
    (["conversations", "update", "a", "--expires", "soon"], "--expires"),
    (["conversations", "update", "a", "--set", "x"], "--set"),
    (["fork", "a", "b", "--at", "-1"], "--at"),
    (["prune", "--older-than", "90x"], "--older-than"),
    (["prune", "--keep-last", "-1"], "--keep-last"),
    (["audit", "--limit", "0"], "--limit"),
])
def test_bad_values_are_usage_errors_naming_the_option(capsys: Any, tmp_path: Path,
                                                        argv: list[str], option: str) -> None:
    url = f"sqlite:///{tmp_path / 'never.db'}"
    code, out, err = run(capsys, *argv, "--url", url)
    assert code == 2 and out == ""
    assert option in one_error_line(err)
    assert not (tmp_path / "never.db").exists()


# ---- conversations list: filters and order --------------------------------------------------


def test_list_filters_by_metadata_parent_and_time(db_url: str, capsys: Any) -> None:
    _people(db_url)

    def listed(*argv: str) -> list[str]:
        code, out, err = run(capsys, "conversations", *argv, "--url", db_url)
        assert code == 0, err
        return _ids(out)

    assert listed("--where", "user_id=u1") == ["a", "b"]
    assert listed("list", "--where", "user_id=u1", "--where", "n=1") == ["a"]  # an integer
    assert listed("list", "--where", 'n="1"') == ["b"]  # the string "1"
    assert listed("--where", "on=true") == ["c"]
    assert listed("--where", "user_id=null") == ["d"]  # no such key
    assert listed("--where", "user_id=nobody") == []
    assert listed("--updated-after", "2000-01-01", "--updated-before", "2999-01-01Z") \
        == ["a", "b", "c", "d"]
    assert listed("--updated-after", (NOW + timedelta(hours=1)).isoformat()) == []
    with MemoryStore(db_url) as store:
        store.fork("a", "a-1")
        store.fork("a-1", "a-1-1")
    assert listed("--parent", "a") == ["a-1"]
    code, out, _ = run(capsys, "conversations", "--parent", "a-1", "--format", "json",
                       "--url", db_url)
    assert [c["id"] for c in json.loads(out)] == ["a-1-1"]
    code, _, err = run(capsys, "conversations", "--where", "a=1", "--where", "a=2",
                       "--url", db_url)
    assert code == 2 and "'a' twice" in one_error_line(err)


def test_list_by_update_time_pages_with_the_hint(db_url: str, capsys: Any) -> None:
    with MemoryStore(db_url) as store:
        for cid in ("x", "y", "z"):
            store.create_conversation(cid, {"tenant": "t1"})
        store.update_conversation("x", metadata={"touched": True})  # newest now
    code, out, err = run(capsys, "conversations", "--where", "tenant=t1", "--order", "updated",
                         "--limit", "2", "--url", db_url)
    assert code == 0 and _ids(out) == ["x", "z"]
    hint = err.strip().removeprefix("more after this page: ")
    assert hint.startswith("memstore conversations list --after z --limit 2 --where tenant=t1 "
                           "--order updated"), hint
    code, out, err = run(capsys, *hint.split()[1:], "--url", db_url)
    assert code == 0 and _ids(out) == ["y"] and err == ""
    code, _, err = run(capsys, "conversations", "--order", "updated", "--after", "gone",
                       "--url", db_url)
    assert code == 1 and "'gone' does not exist" in one_error_line(err)


# ---- conversations update ------------------------------------------------------------------


def test_update_sets_typed_metadata_and_expiry(db_url: str, capsys: Any) -> None:
    with MemoryStore(db_url) as store:
        store.create_conversation("c", {"keep": "me", "drop": 1})
    code, out, err = run(capsys, "conversations", "update", "c", "--set", "user_id=u1",
                         "--set", "n=1", "--set", "on=true", "--set", "s=\"1\"",
                         "--unset", "drop", "--ttl", "30d", "--format", "json",
                         "--url", db_url)
    assert code == 0, err
    shown = json.loads(out)
    assert shown["metadata"] == {"keep": "me", "user_id": "u1", "n": 1, "on": True, "s": "1"}
    expires = datetime.fromisoformat(shown["expires_at"].replace("Z", "+00:00"))
    assert abs(expires - (datetime.now(timezone.utc) + timedelta(days=30))) < timedelta(
        minutes=5)
    with MemoryStore(db_url) as store:
        assert store.count_conversations(where={"n": 1, "on": True, "s": "1"}) == 1
    code, out, _ = run(capsys, "conversations", "update", "c", "--expires", "2030-01-02",
                       "--set", "keep=null", "--format", "jsonl", "--url", db_url)
    shown = json.loads(out)
    assert shown["expires_at"].startswith("2030-01-02T00:00:00") and "keep" not in \
        shown["metadata"]
    code, out, _ = run(capsys, "conversations", "update", "c", "--expires", "never",
                       "--format", "table", "--url", db_url)
    assert code == 0 and "never" in out and "user_id" in out
    with MemoryStore(db_url) as store:
        assert store.get_conversation("c").expires_at is None


def test_update_refusals(db_url: str, capsys: Any) -> None:
    with MemoryStore(db_url) as store:
        store.create_conversation("c")
    before = _snapshot(db_url)
    for argv, code_, words in (
        (["c"], 2, "nothing to change"),
        (["c", "--set", "a=1", "--set", "a=2"], 2, "'a' twice"),
        (["c", "--set", "a=1", "--unset", "a"], 2, "both name 'a'"),
        (["c", "--ttl", "1d", "--expires", "never"], 2, "not allowed with"),
        (["nope", "--set", "a=1"], 1, "'nope' does not exist"),
    ):
        code, _, err = run(capsys, "conversations", "update", *argv, "--url", db_url)
        assert code == code_ and words in one_error_line(err), (argv, err)
    assert _snapshot(db_url) == before


# ---- fork ----------------------------------------------------------------------------------


def test_fork_copies_up_to_a_seq(db_url: str, capsys: Any) -> None:
    call = ToolCall(id="c1", name="track", arguments="{}")
    with MemoryStore(db_url) as store:
        store.create_conversation("main", {"user_id": "u1"})
        store.extend("main", [Message.system("sys"), Message.user("where?"),
                              Message.assistant(tool_calls=[call]),
                              Message.tool("shipped", tool_call_id="c1"),
                              Message.assistant("it shipped")])
    code, out, err = run(capsys, "fork", "main", "retry", "--at", "2", "--format", "table",
                         "--url", db_url)
    assert code == 0, err
    assert out.startswith("forked 'main' at seq 2 into 'retry': 2 messages, ")
    code, out, _ = run(capsys, "fork", "main", "--url", db_url)  # piped: JSON lines
    made = json.loads(out)
    assert made["parent_id"] == "main" and made["forked_at_seq"] == 5
    assert made["metadata"] == {"user_id": "u1"} and made["message_count"] == 5
    with MemoryStore(db_url) as store:
        assert [m.content for m in store.messages("retry")] == ["sys", "where?"]
        assert len(store.messages(made["id"])) == 5
        assert len(store.messages("main")) == 5
    code, _, err = run(capsys, "fork", "main", "split", "--at", "3", "--url", db_url)
    assert code == 2 and one_error_line(err).startswith("memstore: error: --at 3 would split")
    code, _, err = run(capsys, "fork", "main", "far", "--at", "9", "--url", db_url)
    assert code == 2 and "--at 9 is outside" in one_error_line(err)
    code, _, err = run(capsys, "fork", "main", "retry", "--url", db_url)
    assert code == 1 and "'retry' already exists" in one_error_line(err)
    code, _, err = run(capsys, "fork", "nope", "x", "--url", db_url)
    assert code == 1 and "'nope' does not exist" in one_error_line(err)


# ---- prune ---------------------------------------------------------------------------------


def test_prune_dry_run_writes_nothing_then_prune_deletes_as_counted(db_url: str, capsys: Any,
                                                                    tmp_path: Path) -> None:
    _people(db_url)
    argv = ["prune", "--older-than", "30d", "--keep-last", "1", "--where", "user_id=u1"]
    before = _snapshot(db_url)
    sqlite_file = tmp_path / "memstore.db"
    digest = hashlib.sha256(sqlite_file.read_bytes()).hexdigest() \
        if db_url.startswith("sqlite") else None
    code, out, err = run(capsys, *argv, "--dry-run", "--format", "json", "--url", db_url)
    assert code == 0, err
    dry = json.loads(out)
    assert dry == {"conversations_scanned": 2, "conversations_touched": 2,
                   "messages_deleted": 5, "summaries_deleted": 0, "conversations_dropped": 0,
                   "dry_run": True}
    assert _snapshot(db_url) == before  # not a row changed
    if digest is not None:  # nor a byte of the database file
        assert hashlib.sha256(sqlite_file.read_bytes()).hexdigest() == digest
    code, out, _ = run(capsys, *argv, "--dry-run", "--format", "table", "--url", db_url)
    assert "dry run: nothing was deleted" in out and "messages would go" in out
    assert _snapshot(db_url) == before

    code, out, err = run(capsys, *argv, "--format", "jsonl", "--url", db_url)
    assert code == 0, err
    done = json.loads(out)
    assert {**done, "dry_run": True} == dry and done["dry_run"] is False
    with MemoryStore(db_url) as store:
        assert [m.content for m in store.messages("a")] == ["s1", "m5", "m6"]  # system kept
        assert [m.content for m in store.messages("b")] == ["m3"]
        assert len(store.messages("c")) == 2  # u2: not covered
    code, out, _ = run(capsys, "prune", "--keep-last", "0", "--no-keep-anchored",
                       "--drop-empty", "--conversation", "a", "--format", "table",
                       "--url", db_url)
    assert code == 0 and "conversations deleted whole" in out
    with MemoryStore(db_url) as store:
        assert [c.id for c in store.list_conversations()] == ["b", "c", "d"]


def test_prune_expired_and_refusals(db_url: str, capsys: Any) -> None:
    _people(db_url)
    assert run(capsys, "conversations", "update", "c", "--expires", "2000-01-01",
               "--url", db_url)[0] == 0
    before = _snapshot(db_url)
    code, _, err = run(capsys, "prune", "--url", db_url)
    assert code == 2 and "nothing to prune" in one_error_line(err)
    code, _, err = run(capsys, "prune", "--where", "n=1", "--url", db_url)
    assert code == 2 and "--older-than" in one_error_line(err)
    assert _snapshot(db_url) == before
    code, out, _ = run(capsys, "prune", "--expired", "--format", "json", "--url", db_url)
    report = json.loads(out)
    assert report["conversations_dropped"] == 1 and report["messages_deleted"] == 2
    with MemoryStore(db_url) as store:
        assert [c.id for c in store.list_conversations()] == ["a", "b", "d"]


def test_prune_shows_progress_on_a_terminal_counted_against_the_filter(
        db_url: str, capsys: Any, monkeypatch: Any) -> None:
    _people(db_url)
    bars: list[Any] = []
    real = _output.progress_bar

    def spy(description: str, total: int | None = None, **kw: Any) -> Any:
        bars.append([description, total, kw, None])
        bar = real(description, total, **kw)

        class Recorded:
            def __enter__(self) -> Any:
                bars[-1][3] = bar.__enter__()
                return bars[-1][3]

            def __exit__(self, *exc: Any) -> Any:
                return bar.__exit__(*exc)

        return Recorded()

    monkeypatch.setattr(_output, "progress_bar", spy)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, out, err = run(capsys, "prune", "--older-than", "30d", "--where", "user_id=u1",
                         "--format", "json", "--url", db_url)
    assert code == 0
    (description, total, kw, bar), = bars
    assert (description, total, kw) == ("pruning", 2, {"unit": "conversations"})
    assert bar.done == 2 == json.loads(out)["conversations_scanned"]
    assert "pruning" in err and "pruning" not in out  # on standard error, never in the data

    bars.clear()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    code, out, err = run(capsys, "prune", "--older-than", "30d", "--url", db_url)
    assert code == 0 and err == "" and bars[0][1] is None  # off a terminal: nothing counted


# ---- forget and audit ----------------------------------------------------------------------


def test_forget_asks_on_a_terminal_and_needs_yes_otherwise(db_url: str, capsys: Any,
                                                           monkeypatch: Any) -> None:
    _people(db_url)
    with MemoryStore(db_url) as store:
        store.fork("a", "a-fork")
    before = _snapshot(db_url)
    argv = ["forget", "--where", "user_id=u1", "--reason", "erasure 118", "--url", db_url]

    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # a pipe, not a terminal
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and "pass --yes" in one_error_line(err)
    assert _snapshot(db_url) == before

    code, out, err = run(capsys, *argv, "--dry-run", "--format", "table")  # no --yes needed
    assert code == 0, err
    assert out.strip() == ("would erase 3 conversations, 15 messages (dry run: nothing was "
                           "deleted)")
    code, out, _ = run(capsys, *argv, "--dry-run", "--format", "json")
    assert json.loads(out) == {"conversations": 3, "messages": 15, "audit_id": None,
                               "dry_run": True}
    code, _, err = run(capsys, *argv, "--dry-run", "--vacuum")
    assert code == 2 and "--dry-run" in one_error_line(err)
    assert _snapshot(db_url) == before

    for answer in ("n\n", "\n", "", "nope\n"):
        monkeypatch.setattr(sys, "stdin", _Terminal(answer))
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "", answer
        # the fork copied its source's metadata: it matches too
        assert ("Erase the 3 conversations matching user_id=\"u1\", with every fork of them "
                "(3 conversations with the forks, 15 messages)") in err
        assert "There is no undo. [y/N]" in err
        assert err.strip().endswith("memstore: not confirmed: nothing was deleted")
        assert _snapshot(db_url) == before

    monkeypatch.setattr(sys, "stdin", _Terminal("y\n"))
    code, out, err = run(capsys, *argv, "--format", "table")
    assert code == 0, err
    assert out.strip() == "erased 3 conversations, 15 messages (audit entry 1)"  # a fork too
    with MemoryStore(db_url) as store:
        assert [c.id for c in store.list_conversations()] == ["c", "d"]

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, out, _ = run(capsys, "forget", "--conversation", "c", "--conversation", "c", "--yes",
                       "--vacuum", "--format", "json", "--url", db_url)
    assert code == 0 and json.loads(out) == {"conversations": 1, "messages": 2, "audit_id": 2,
                                             "dry_run": False}
    code, _, err = run(capsys, "forget", "--yes", "--url", db_url)
    assert code == 2 and "needs a selector" in one_error_line(err)

    code, out, _ = run(capsys, "audit", "--format", "json", "--url", db_url)
    entries = json.loads(out)
    assert [(e["id"], e["operation"], e["conversations"], e["messages"], e["reason"])
            for e in entries] == [(1, "forget", 3, 15, "erasure 118"), (2, "forget", 1, 2, None)]
    assert all(len(e["selector_digest"]) == 64 for e in entries)
    assert "u1" not in out  # the audit log never holds the erased values
    code, out, err = run(capsys, "audit", "--limit", "1", "--format", "table", "--url", db_url)
    assert code == 0 and "erasure 118" in out
    assert err.strip() == "more after this page: memstore audit --after 1 --limit 1 " \
        "--format table"
    code, out, err = run(capsys, "audit", "--after", "1", "--url", db_url)
    assert [json.loads(line)["id"] for line in out.splitlines()] == [2] and err == ""


def test_lifecycle_commands_never_create_a_database(tmp_path: Path, capsys: Any,
                                                   monkeypatch: Any) -> None:
    monkeypatch.setattr(sys, "stdin", _Terminal("y\n"))
    typo = f"sqlite:///{tmp_path / 'typo.db'}"
    for argv in (["conversations", "--where", "a=1"], ["conversations", "update", "c",
                                                      "--set", "a=1"],
                 ["fork", "a", "b"], ["prune", "--older-than", "1d"],
                 ["prune", "--expired", "--dry-run"], ["forget", "--where", "a=1"],
                 ["forget", "--where", "a=1", "--yes"], ["audit"]):
        code, _, err = run(capsys, *argv, "--url", typo)
        assert code == 1 and "no database at" in one_error_line(err), argv
    assert not (tmp_path / "typo.db").exists()


def test_retention_and_erasure_from_the_installed_script(db_url: str) -> None:
    _people(db_url)
    before = _snapshot(db_url)
    dry = spawn("prune", "--older-than", "90d", "--keep-last", "1", "--dry-run", "--url", db_url)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["messages_deleted"] == 6 and dry.stderr == ""
    refused = spawn("forget", "--where", "user_id=u1", "--url", db_url, stdin="y\n")
    assert refused.returncode == 2 and "pass --yes" in one_error_line(refused.stderr)
    assert _snapshot(db_url) == before
    done = spawn("forget", "--where", "user_id=u1", "--yes", "--url", db_url)
    assert done.returncode == 0 and json.loads(done.stdout)["conversations"] == 2
