"""The ``memstore`` command: migrations for deployment, and conversations from the shell.

Examples::

    memstore db upgrade --url postgresql://app@db/app     # run memstore's migrations
    memstore db upgrade --url postgresql://app@db/app --sql > memstore.sql   # DDL for a DBA
    memstore db check                                     # exit 1 when the schema is behind
    memstore append chat-1 user "Where is my order?"
    memstore window chat-1 --tokens 4000                  # the best context that fits

Every command takes ``--url`` (default: ``MEMSTORE_URL``, else ``sqlite:///./memstore.db``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memstore import migrate
from memstore._engine import default_url
from memstore.errors import MemstoreError

__all__ = ["build_parser", "main"]

VIEW_CHOICES = ("token-limited", "score-based", "buffered", "head-and-tail", "recent-turns",
                "unbounded")


def _url(args: argparse.Namespace) -> str:
    return args.url or default_url()


def _print_json(value: Any) -> None:
    print(json.dumps(value, ensure_ascii=False, indent=2, default=str))


def _store(args: argparse.Namespace) -> Any:
    from memstore.store import MemoryStore

    return MemoryStore(_url(args))


# ---- db ---------------------------------------------------------------------------------


def _db_upgrade(args: argparse.Namespace) -> int:
    if args.sql:
        migrate.upgrade(_url(args), args.revision, sql=True, output=sys.stdout)
        return 0
    migrate.upgrade(_url(args), args.revision)
    print(f"memstore schema at {', '.join(migrate.current(_url(args)))}")
    return 0


def _db_downgrade(args: argparse.Namespace) -> int:
    if args.sql:
        migrate.downgrade(_url(args), args.revision, sql=True, output=sys.stdout)
        return 0
    migrate.downgrade(_url(args), args.revision)
    at = migrate.current(_url(args))
    print(f"memstore schema at {', '.join(at) if at else 'base (no memstore tables)'}")
    return 0


def _db_current(args: argparse.Namespace) -> int:
    at = migrate.current(_url(args))
    head = ", ".join(migrate.heads())
    print(f"current: {', '.join(at) if at else 'none'}\nhead:    {head}")
    return 0


def _db_check(args: argparse.Namespace) -> int:
    migrate.check(_url(args))
    print("memstore schema is up to date")
    return 0


def _db_create_partitioned(args: argparse.Namespace) -> int:
    if args.sql:
        migrate.create_partitioned(_url(args), args.partitions, sql=True, output=sys.stdout)
        return 0
    migrate.create_partitioned(_url(args), args.partitions)
    print(f"memstore tables created with {args.partitions} hash partitions each; schema at "
          f"{', '.join(migrate.current(_url(args)))}")
    return 0


# ---- conversations ----------------------------------------------------------------------


def _conversations(args: argparse.Namespace) -> int:
    with _store(args) as store:
        for conv in store.list_conversations(limit=args.limit, after=args.after):
            print(f"{conv.id}\t{conv.message_count} messages\t{conv.token_count} tokens\t"
                  f"updated {conv.updated_at.isoformat()}")
    return 0


def _append(args: argparse.Namespace) -> int:
    from memstore.models import Message

    fields: dict[str, Any] = {"role": args.role, "content": args.content}
    if args.tool_call_id:
        fields["tool_call_id"] = args.tool_call_id
    if args.id:
        fields["id"] = args.id
    message = Message.from_openai(fields, score=args.score, pinned=args.pin)
    with _store(args) as store:
        stored = store.append(args.conversation_id, message)
    print(f"stored seq {stored.seq} ({stored.token_count} tokens, {stored.token_counter})")
    return 0


def _import(args: argparse.Namespace) -> int:
    raw = Path(args.file).read_text(encoding="utf-8") if args.file != "-" else sys.stdin.read()
    stripped = raw.lstrip()
    items = json.loads(raw) if stripped.startswith("[") else [
        json.loads(line) for line in raw.splitlines() if line.strip()
    ]
    with _store(args) as store:
        stored = store.extend(args.conversation_id, items)
    print(f"stored {len(stored)} messages in {args.conversation_id!r}")
    return 0


def _messages(args: argparse.Namespace) -> int:
    with _store(args) as store:
        msgs = store.messages(args.conversation_id, start=args.start, stop=args.stop,
                              limit=args.limit, newest_first=args.newest_first)
    for m in msgs:
        print(json.dumps({"seq": m.seq, **m.to_openai()}, ensure_ascii=False))
    return 0


def _make_view(args: argparse.Namespace) -> Any:
    from memstore import views

    if args.view == "token-limited":
        return views.TokenLimitedView(args.tokens, reserve=args.reserve,
                                      start_on_user=args.start_on_user)
    if args.view == "score-based":
        return views.ScoreBasedView(args.tokens, reserve=args.reserve)
    if args.view == "buffered":
        return views.BufferedView(args.size)
    if args.view == "head-and-tail":
        return views.HeadAndTailView(args.head, args.size)
    if args.view == "recent-turns":
        return views.RecentTurnsView(args.size)
    return views.UnboundedView()


def _window(args: argparse.Namespace) -> int:
    view = _make_view(args)
    with _store(args) as store:
        window = store.window(args.conversation_id, view)
    if args.json:
        _print_json({"messages": window.to_openai(), "token_count": window.token_count,
                     "budget": window.budget, "report": window.report.model_dump()})
        return 0
    for message in window.messages:
        seq = getattr(message, "seq", None)
        label = f"#{seq}" if seq is not None else "--"
        text = message.text if message.text else json.dumps(message.to_openai().get("tool_calls"))
        print(f"{label:>7} {message.role:<9} {text[:200]}")
    report = window.report
    budget = f" of {window.budget}" if window.budget is not None else ""
    print(f"\n{len(window.messages)} messages, {window.token_count} tokens{budget}; "
          f"{report.omitted_count} of {report.conversation_message_count} stored messages "
          f"left out; {report.rows_read} rows read")
    return 0


def _state_save(args: argparse.Namespace) -> int:
    with _store(args) as store:
        state = store.save_state(args.conversation_id)
    text = state.to_json()
    if args.output and args.output != "-":
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        print(text)
    return 0


def _state_load(args: argparse.Namespace) -> int:
    text = Path(args.file).read_text(encoding="utf-8") if args.file != "-" else sys.stdin.read()
    with _store(args) as store:
        conv = store.load_state(text, args.conversation_id, replace=not args.append)
    print(f"loaded {conv.message_count} messages into {conv.id!r}")
    return 0


# ---- parser -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``memstore`` command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="database URL (default: $MEMSTORE_URL or "
                        "sqlite:///./memstore.db)")
    parser = argparse.ArgumentParser(
        prog="memstore",
        description="Durable conversation memory for LLM agents: migrations, messages, windows.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    db = sub.add_parser("db", help="schema migrations (packaged Alembic revisions)")
    dbsub = db.add_subparsers(dest="db_command", required=True)
    p = dbsub.add_parser("upgrade", parents=[common], help="upgrade the schema (default: head)")
    p.add_argument("revision", nargs="?", default="head")
    p.add_argument("--sql", action="store_true", help="print the DDL instead of running it")
    p.set_defaults(func=_db_upgrade)
    p = dbsub.add_parser("downgrade", parents=[common], help="downgrade ('base' drops memstore)")
    p.add_argument("revision")
    p.add_argument("--sql", action="store_true", help="print the DDL instead of running it")
    p.set_defaults(func=_db_downgrade)
    p = dbsub.add_parser("current", parents=[common], help="show the database's revision")
    p.set_defaults(func=_db_current)
    p = dbsub.add_parser("check", parents=[common], help="exit 1 unless the schema is at head")
    p.set_defaults(func=_db_check)
    p = dbsub.add_parser("create-partitioned", parents=[common],
                         help="create the tables hash-partitioned by conversation id "
                              "(PostgreSQL, empty database)")
    p.add_argument("--partitions", type=int, default=8, help="hash partitions (default 8)")
    p.add_argument("--sql", action="store_true", help="print the DDL instead of running it")
    p.set_defaults(func=_db_create_partitioned)

    p = sub.add_parser("conversations", parents=[common], help="list conversations")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--after", help="list conversations whose id sorts after this one")
    p.set_defaults(func=_conversations)

    p = sub.add_parser("append", parents=[common], help="store one message")
    p.add_argument("conversation_id")
    p.add_argument("role", choices=["system", "developer", "user", "assistant", "tool"])
    p.add_argument("content")
    p.add_argument("--tool-call-id")
    p.add_argument("--id", help="client id (idempotency key)")
    p.add_argument("--score", type=float, default=1.0)
    p.add_argument("--pin", action="store_true")
    p.set_defaults(func=_append)

    p = sub.add_parser("import", parents=[common],
                       help="store OpenAI messages from a JSON list or JSON lines file")
    p.add_argument("conversation_id")
    p.add_argument("file", help="path, or - for standard input")
    p.set_defaults(func=_import)

    p = sub.add_parser("messages", parents=[common], help="print stored messages as JSON lines")
    p.add_argument("conversation_id")
    p.add_argument("--start", type=int)
    p.add_argument("--stop", type=int)
    p.add_argument("--limit", type=int)
    p.add_argument("--newest-first", action="store_true")
    p.set_defaults(func=_messages)

    p = sub.add_parser("window", parents=[common],
                       help="assemble a context window (default: the newest that fits 4000 tokens)")
    p.add_argument("conversation_id")
    p.add_argument("--view", choices=VIEW_CHOICES, default="token-limited")
    p.add_argument("--tokens", type=int, default=4000, help="token limit of budgeted views")
    p.add_argument("--reserve", type=int, default=0, help="tokens kept free for the reply")
    p.add_argument("--start-on-user", action="store_true")
    p.add_argument("--size", type=int, default=20,
                   help="buffer size / tail size / max turns of count-based views")
    p.add_argument("--head", type=int, default=2, help="head size of head-and-tail")
    p.add_argument("--json", action="store_true", help="print messages and report as JSON")
    p.set_defaults(func=_window)

    state = sub.add_parser("state", help="save or load a conversation snapshot (JSON)")
    ssub = state.add_subparsers(dest="state_command", required=True)
    p = ssub.add_parser("save", parents=[common])
    p.add_argument("conversation_id")
    p.add_argument("-o", "--output", help="file (default: standard output)")
    p.set_defaults(func=_state_save)
    p = ssub.add_parser("load", parents=[common])
    p.add_argument("file", help="path, or - for standard input")
    p.add_argument("--as", dest="conversation_id", help="target conversation id")
    p.add_argument("--append", action="store_true", help="append instead of replacing")
    p.set_defaults(func=_state_load)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``memstore`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except MemstoreError as exc:
        print(f"memstore: error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"memstore: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
