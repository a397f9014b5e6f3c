"""The memstore command on hostile ground: output safety, pipes, encodings, files, usage.

Helpers are those of tests/test_cli.py: ``run`` calls main() in-process, ``spawn`` runs
the installed script as a user would.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from memstore import MemoryStore, Message
from memstore.cli import main
from tests.test_cli import SCRIPT, one_error_line, run, spawn

EVIL = "hi \x1b[31mred\x1b]0;title\x07 \u202edesrever\x9b2J end"


@pytest.fixture(autouse=True)
def wide_tables(monkeypatch: Any) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("MEMSTORE_URL", raising=False)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def _spawn_closed_pipe(*argv: str, env: dict[str, str] | None = None
                       ) -> subprocess.CompletedProcess[bytes]:
    """Run the script with standard output a pipe whose reader is already gone."""
    read, write = os.pipe()
    os.close(read)  # like `| head -1` that has already exited: every write is EPIPE
    full_env = {**os.environ, "COLUMNS": "120", **(env or {})}
    full_env.pop("MEMSTORE_URL", None)
    try:
        return subprocess.run([str(SCRIPT), *argv], stdout=write, stderr=subprocess.PIPE,
                              env=full_env, timeout=120, check=False)
    finally:
        os.close(write)


def _seqs(url: str, cid: str = "c") -> list[int]:
    with MemoryStore(url) as store:
        return [m.seq for m in store.messages(cid)]


# ---- 1. pop prints before it deletes ------------------------------------------------------


@pytest.mark.parametrize("form", ["table", "json", "jsonl"])
def test_pop_deletes_nothing_when_printing_fails(url: str, form: str) -> None:
    with MemoryStore(url) as store:
        store.extend("c", [Message.user(f"m{i} " * 50) for i in range(5)])
    r = _spawn_closed_pipe("pop", "c", "-n", "2", "--format", form, "--url", url)
    assert r.returncode == 0, r.stderr  # a closed pipe is quiet
    assert r.stderr == b""
    assert _seqs(url) == [1, 2, 3, 4, 5]  # not printed, so not deleted


def test_pop_on_an_ascii_terminal_prints_and_deletes(url: str) -> None:
    with MemoryStore(url) as store:
        store.extend("c", [Message.user("café ✓ 日本"), Message.assistant("naïve — ok")])
    r = spawn("pop", "c", "-n", "1", "--format", "table", "--url", url,
              env={"PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0, r.stderr
    assert "na?ve" in r.stdout  # what ascii cannot show is replaced, not an error
    assert _seqs(url) == [1]
    r = spawn("pop", "c", "--format", "json", "--url", url, env={"PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["content"] == "café ✓ 日本"
    assert _seqs(url) == []


def test_pop_prints_what_it_deletes(url: str, capsys: Any) -> None:
    with MemoryStore(url) as store:
        store.extend("c", [Message.user(f"m{i}") for i in range(4)])
    code, out, err = run(capsys, "pop", "c", "-n", "2", "--format", "json", "--url", url)
    assert code == 0, err
    assert [m["seq"] for m in json.loads(out)] == [3, 4]
    assert _seqs(url) == [1, 2]
    with MemoryStore(url) as store:  # seqs continue as after pop
        assert store.append("c", Message.user("next")).seq == 3


# ---- 2. a closed pipe ends table output with status 0 --------------------------------------


@pytest.mark.parametrize("argv", [["messages", "big", "--format", "table"],
                                  ["conversations", "--format", "table"],
                                  ["stats", "--format", "table"],
                                  ["window", "big", "--format", "table"],
                                  ["demo"]])
def test_tables_are_quiet_on_a_closed_pipe(tmp_path: Path, argv: list[str]) -> None:
    url = f"sqlite:///{tmp_path / 'pipe.db'}"
    with MemoryStore(url) as store:
        store.extend("big", [Message.user(f"message {i} " * 5) for i in range(200)])
    r = _spawn_closed_pipe(*argv, "--url", url)
    assert r.returncode == 0 and r.stderr == b"", r.stderr


# ---- 3. stored text and ids cannot drive the terminal --------------------------------------


def test_control_characters_are_escaped_in_tables_and_status_lines(url: str, capsys: Any,
                                                                   tmp_path: Path) -> None:
    cid = "id\x1b[2J\u202e"
    with MemoryStore(url) as store:
        store.append(cid, Message.user(EVIL, metadata={"k": "\x9b\x1b"}))
        store.append("c\x1b", Message.user("plain"))
    outputs = []
    for argv in (["messages", cid, "--format", "table"], ["window", cid, "--format", "table"],
                 ["conversations", "--format", "table"],
                 ["conversations", "show", cid, "--format", "table"],
                 ["conversations", "--limit", "1", "--format", "table"]):
        code, out, err = run(capsys, *argv, "--url", url)
        assert code == 0, (argv, err)
        outputs.append(out + err)
    dump = tmp_path / "d.jsonl"
    assert run(capsys, "export", "-o", str(dump), "--url", url)[0] == 0
    url2 = f"sqlite:///{tmp_path / 'other.db'}"
    code, out, err = run(capsys, "import", str(dump), "--url", url2)
    assert code == 0, err
    outputs.append(out + err)
    code, out, err = run(capsys, "messages", "x\x1by", "--url", url)
    assert code == 1
    outputs.append(err)
    for text in outputs:
        for bad in ("\x1b", "\x07", "\x9b", "\u202e"):
            assert bad not in text, (bad, text)
    assert "\\x1b[31mred" in outputs[0] and "\\u202edesrever" in outputs[0]
    assert "id\\x1b[2J\\u202e" in outputs[2]
    assert "--after $'c\\x1b'" in outputs[4]  # the hint can be pasted into a shell
    # JSON stays exact
    code, out, _ = run(capsys, "messages", cid, "--format", "json", "--url", url)
    assert json.loads(out)[0]["content"] == EVIL


# ---- 4. export -o never truncates on an error ----------------------------------------------


def test_export_to_a_file_checks_ids_first_and_replaces_atomically(url: str, capsys: Any,
                                                                   tmp_path: Path) -> None:
    with MemoryStore(url) as store:
        store.extend("a", [Message.user("one"), Message.assistant("two")])
    target = tmp_path / "precious.jsonl"
    target.write_text("keep me\n")
    target.chmod(0o640)
    code, _, err = run(capsys, "export", "a", "nope", "-o", str(target), "--url", url)
    assert code == 1 and "'nope'" in one_error_line(err)
    assert target.read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.db", "precious.jsonl"]
    code, _, err = run(capsys, "export", "a", "-o", str(target), "--url", url)
    assert code == 0, err
    assert len(target.read_text().splitlines()) == 3
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the file's mode is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.db", "precious.jsonl"]
    # an unknown id before writing standard output: nothing printed
    code, out, _ = run(capsys, "export", "a", "nope", "--url", url)
    assert code == 1 and out == ""


# ---- 5. JSON is UTF-8 whatever the terminal's encoding -------------------------------------


def test_json_outputs_on_a_non_utf8_stdout(url: str, tmp_path: Path) -> None:
    with MemoryStore(url) as store:
        store.extend("c", [Message.user("café ✓ 日本")])
    env = {"PYTHONIOENCODING": "ascii"}
    for argv in (["messages", "c", "--format", "json"], ["messages", "c", "--format", "jsonl"],
                 ["messages", "c", "--format", "openai"], ["window", "c", "--format", "json"],
                 ["export", "c"], ["state", "save", "c"], ["conversations", "--format", "json"],
                 ["stats", "--format", "json"]):
        r = subprocess.run([str(SCRIPT), *argv, "--url", url], capture_output=True,
                           env={**os.environ, **env}, timeout=120, check=False)
        assert r.returncode == 0, (argv, r.stderr)
        text = r.stdout.decode("utf-8")
        assert "café" in text or '"id": "c"' in text or '"messages": 1' in text, (argv, text)
    for argv in (["messages", "c", "--format", "table"], ["window", "c", "--format", "table"]):
        r = subprocess.run([str(SCRIPT), *argv, "--url", url], capture_output=True,
                           env={**os.environ, **env}, timeout=120, check=False)
        assert r.returncode == 0 and b"caf?" in r.stdout, (argv, r.stderr)


# ---- 6. --url errors hide the password and name their source -------------------------------


def test_url_errors_hide_the_password(capsys: Any, monkeypatch: Any) -> None:
    from memstore.cli import _commands

    def no_driver(*args: Any, **kwargs: Any) -> Any:
        raise ImportError("no module named 'fake'")

    monkeypatch.setattr(_commands, "MemoryStore", no_driver)
    secret = "postgresql+psycopg://app:s3cret@db.example/app"
    code, _, err = run(capsys, "stats", "--url", secret)
    line = one_error_line(err)
    assert code == 2 and "s3cret" not in line and "app:***@db.example" in line
    assert line.startswith("memstore: error: --url:")
    monkeypatch.setenv("MEMSTORE_URL", secret)
    code, _, err = run(capsys, "stats")
    line = one_error_line(err)
    assert code == 2 and "s3cret" not in line and line.startswith("memstore: error: MEMSTORE_URL:")
    code, _, err = run(capsys, "stats", "--url", "")
    assert code == 2 and "--url" in one_error_line(err)


# ---- 9, 10. conversations: --format before the action, and the next-page hint --------------


def test_format_before_list_or_show_is_kept(url: str, capsys: Any) -> None:
    with MemoryStore(url) as store:
        store.append("c", Message.user("x"))
    code, out, _ = run(capsys, "conversations", "--format", "json", "list", "--url", url)
    assert code == 0 and json.loads(out)[0]["id"] == "c"
    code, out, _ = run(capsys, "conversations", "--format", "json", "show", "c", "--url", url)
    assert code == 0 and json.loads(out)["id"] == "c"
    code, out, _ = run(capsys, "conversations", "--format", "json", "list", "--format", "jsonl",
                       "--url", url)
    assert code == 0 and json.loads(out.splitlines()[0])["id"] == "c"  # the later one wins


def test_next_page_hint_only_when_there_is_more(url: str, capsys: Any) -> None:
    with MemoryStore(url) as store:
        for cid in ("a b", "c'd", "e"):
            store.append(cid, Message.user("x"))
    code, _, err = run(capsys, "conversations", "--limit", "3", "--url", url)
    assert code == 0 and err == ""  # exactly --limit left: no next page
    code, _, err = run(capsys, "conversations", "--limit", "1", "--format", "json",
                         "--url", url)
    assert code == 0
    hint = err.strip()
    assert hint == ("more after this page: memstore conversations list --after 'a b' "
                    f"--limit 1 --format json --url {url}"), hint
    code, _, err = run(capsys, "conversations", "--limit", "1", "--after", "a b", "--url", url)
    assert "--after 'c'\"'\"'d'" in err


# ---- 11, 12. files that are not UTF-8 or not JSON ------------------------------------------


def test_bad_import_file_creates_no_database(tmp_path: Path, capsys: Any) -> None:
    db = tmp_path / "new.db"
    url = f"sqlite:///{db}"
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"x": "caf\xe9"}\n'.encode("latin-1"))
    code, _, err = run(capsys, "import", str(latin), "--url", url)
    line = one_error_line(err)
    assert code == 1 and f"{latin}: not UTF-8 text" in line
    garbage = tmp_path / "g.jsonl"
    garbage.write_text("\nnot json\n")
    code, _, err = run(capsys, "import", str(garbage), "--url", url)
    assert code == 1 and f"{garbage}:2: not JSON" in one_error_line(err)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    code, out, _ = run(capsys, "import", str(empty), "--url", url)
    assert code == 0 and "no conversation" in out
    # JSON objects that are no export's first line (docs/cli.md: "a wrong file creates and
    # migrates nothing"; these created and migrated the database, then failed).
    wrong = {
        '{"role": "user", "content": "hi"}\n': ("c.jsonl:1: a message line before any "
                                               "conversation header (pass --as CONV"),
        '{"memstore_export": 99, "type": "conversation", "id": "x"}\n':
            "c.jsonl:1: export format version 99 is not supported",
        '{"memstore_export": 1, "type": "summary"}\n': "c.jsonl:1: a summary line before",
    }
    for text, message in wrong.items():
        (tmp_path / "c.jsonl").write_text(text)
        code, _, err = run(capsys, "import", str(tmp_path / "c.jsonl"), "--url", url)
        assert code == 1 and message in one_error_line(err), err
    code, _, err = run(capsys, "import", str(tmp_path / "c.jsonl"), "--as", "c", "--url", url)
    assert code == 1 and "c.jsonl:1:" in one_error_line(err)
    (tmp_path / "c.jsonl").write_text('{"role": "user", "content": "hi"}\n')
    code, _, err = run(capsys, "import", str(tmp_path / "c.jsonl"), "--as", "c", "--url", url)
    assert code == 1 and "c.jsonl:1: not a stored message" in one_error_line(err)
    assert not db.exists()


@pytest.mark.parametrize("argv", [["import", "{f}", "--format", "openai", "--into", "c"],
                                  ["state", "load", "{f}"]])
def test_non_utf8_input_names_the_file(tmp_path: Path, capsys: Any, argv: list[str]) -> None:
    bad = tmp_path / "in.json"
    bad.write_bytes(b'[{"role": "user", "content": "caf\xe9"}]')
    code, _, err = run(capsys, *(a.format(f=bad) for a in argv), "--url",
                       f"sqlite:///{tmp_path / 'x.db'}")
    line = one_error_line(err)
    assert code == 1 and line.startswith(f"memstore: error: {bad}: not UTF-8 text"), line


# ---- 13. usage errors name the option ------------------------------------------------------


@pytest.mark.parametrize(("argv", "words"), [
    (["conversations", "--limit", "10001"], ["--limit", "10000"]),
    (["conversations", "list", "--limit", "10001"], ["--limit", "10000"]),
    (["window", "c", "--reserve", "5000"], ["--reserve 5000", "--budget 4000"]),
    (["window", "c", "--budget", "100", "--reserve", "100"], ["--reserve", "--budget"]),
    (["window", "c", "--budget", "99999999999999999999999"], ["--budget", "9007199254740991"]),
    (["demo", "--budget", "99999999999999999999999"], ["--budget", "9007199254740991"]),
])
def test_out_of_range_values_are_usage_errors(url: str, capsys: Any, argv: list[str],
                                             words: list[str]) -> None:
    with MemoryStore(url) as store:
        store.append("c", Message.user("x"))
    code, _, err = run(capsys, *argv, "--url", url)
    line = one_error_line(err)
    assert code == 2, line
    for word in words:
        assert word in line, (word, line)


# ---- 15, 16. writing commands ---------------------------------------------------------------


@pytest.mark.parametrize("argv", [["append", "c", "user", "hi"], ["demo"],
                                  ["import", "{f}"], ["state", "load", "{s}"]])
def test_creating_in_a_missing_directory_names_it(tmp_path: Path, capsys: Any,
                                                  argv: list[str]) -> None:
    src = f"sqlite:///{tmp_path / 'src.db'}"
    with MemoryStore(src) as store:
        store.append("c", Message.user("hi"))
    dump, snap = tmp_path / "d.jsonl", tmp_path / "s.json"
    assert run(capsys, "export", "-o", str(dump), "--url", src)[0] == 0
    assert run(capsys, "state", "save", "c", "-o", str(snap), "--url", src)[0] == 0
    missing = tmp_path / "no" / "such"
    code, _, err = run(capsys, *(a.format(f=dump, s=snap) for a in argv),
                       "--url", f"sqlite:///{missing / 'x.db'}")
    line = one_error_line(err)
    assert code != 0 and str(missing) in line and "does not exist" in line, line


def test_append_of_a_stored_id_says_so(url: str, capsys: Any) -> None:
    assert run(capsys, "append", "c", "user", "one", "--id", "k", "--url", url)[0] == 0
    assert run(capsys, "append", "c", "user", "two", "--url", url)[0] == 0
    code, out, _ = run(capsys, "append", "c", "user", "one", "--id", "k", "--url", url)
    assert code == 0 and out.startswith("already stored as seq 1")
    assert _seqs(url) == [1, 2]


# ---- 17. narrow terminals ------------------------------------------------------------------


def test_tables_on_a_40_column_terminal(url: str, capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    with MemoryStore(url) as store:
        stored = store.extend("c", [Message.user("word " * 40),
                                    Message.assistant("short", pinned=True)])
    for argv in (["messages", "c"], ["window", "c"], ["pop", "c"]):
        code, out, _ = run(capsys, *argv, "--format", "table", "--url", url)
        assert code == 0
        lines = out.splitlines()
        assert max(len(line) for line in lines) <= 40, out
        assert "text" in out and "tokens" in out, out
        assert ("short" if argv[0] == "pop" else "word") in out, out
        shown = stored[1:] if argv[0] == "pop" else stored
        for m in shown:  # seq and token count whole, on the message's first line
            assert any(line.split()[:1] == [str(m.seq)] and f" {m.token_count} " in line
                       for line in lines if line.strip()), out


def test_demo_on_a_narrow_terminal_says_what_it_needs(url: str, capsys: Any,
                                                      monkeypatch: Any) -> None:
    from memstore.cli._demo import MIN_TEXT

    monkeypatch.setenv("COLUMNS", "40")
    code, out, err = run(capsys, "demo", "--url", url)
    assert code == 0
    assert "needs" in err and "terminal has 40" in err and "--format json" in err
    needed = int(err.split("needs ")[1].split()[0])
    assert 40 < needed <= 80  # its narrowest layout: the views that count messages left out
    assert max(len(line) for line in out.splitlines()) <= needed
    header = " ".join(out.split())
    for word in ("seq", "role", "tokens", "text", "limited", "based", "tail", "builder",
                 "Not shown at this width: buffered, recent-turns, unbounded"):
        assert word in header, word
    rows = [line for line in out.splitlines()
            if line[:3].strip().isdigit() and line[4:].split()[0].rstrip("*") in
            ("system", "developer", "user", "assistant", "tool")]
    assert [int(r[:3]) for r in rows] == list(range(1, 16))
    assert "Order 1138 was due" in rows[4] and len(rows[4]) >= MIN_TEXT  # the text shows


# ---- minor -----------------------------------------------------------------------------------


def test_ctrl_c_while_starting_is_one_line(capsys: Any, monkeypatch: Any) -> None:
    from memstore.cli import _app

    def interrupted() -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(_app, "build_parser", interrupted)
    assert main(["stats"]) == 130
    assert capsys.readouterr().err == "memstore: interrupted\n"
