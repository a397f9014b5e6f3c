"""``memstore search``: find stored messages by their words.

``memstore search QUERY [--conversation ID]... [--where KEY=VALUE]... [--role ROLE]...
[--since DATE] [--until DATE] [--limit N] [--context N] [--format table|json]`` prints a
table with each hit's matched words highlighted (``--format json``: one hit per line).
``memstore search --rebuild-index [--language simple|english]`` drops the search index
and builds it again from the stored messages.

Like `memstore.cli._app`, the top of this module imports only the standard library (the
parser is built at every start); the command imports the store when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from memstore.cli._lifecycle_args import instant, where_item

__all__ = ["add_command", "search"]

ROLES = ("system", "developer", "user", "assistant", "tool")
#: What wraps a matched word in the table (never in stored text: a private-use pair).
_MARK = ("\ue000", "\ue001")


def _count(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer {low}-{high}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def add_command(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``memstore search`` to the parser (``command`` of `memstore.cli._app`)."""
    p = command(
        "search", "find stored messages by their words (all conversations, or some)", "search",
        module="_search",
        description=(
            "Find stored messages by their words, best match first: their text, tool-call "
            "names and arguments, and tool results. Plain words must all appear; \"a quoted "
            "phrase\" matches in order; OR between two terms matches either; -word excludes. "
            "Case and Latin diacritics are ignored. --rebuild-index drops the search index "
            "and builds it again from the stored messages."),
    )
    p.add_argument("query", nargs="?", metavar="QUERY",
                   help="what to look for (quote it: one shell word)")
    p.add_argument("--conversation", action="append", metavar="ID",
                   help="only this conversation (repeatable)")
    p.add_argument("--where", action="append", type=where_item, metavar="KEY=VALUE",
                   help="only conversations whose metadata has KEY=VALUE (repeatable; VALUE "
                        "is JSON when it is a JSON scalar, else text)")
    p.add_argument("--role", action="append", choices=ROLES, metavar="ROLE",
                   help=f"only messages of this role ({', '.join(ROLES)}; repeatable)")
    p.add_argument("--since", type=instant, metavar="DATE",
                   help="only messages written at or after DATE (ISO 8601; no offset: UTC)")
    p.add_argument("--until", type=instant, metavar="DATE",
                   help="only messages written before DATE (ISO 8601; no offset: UTC)")
    p.add_argument("--limit", type=_count(1, 1000), default=10, metavar="N",
                   help="most hits shown, 1-1000 (default: 10)")
    p.add_argument("--context", type=_count(0, 50), default=0, metavar="N",
                   help="messages shown around each hit, on each side (default: 0)")
    p.add_argument("--format", choices=("table", "json"), default=None,
                   help="table (default on a terminal) or json: one hit per line (default "
                        "otherwise)")
    p.add_argument("--rebuild-index", action="store_true",
                   help="drop the search index and build it again from the stored messages "
                        "(after a SQLite restore from a SQL dump, or to change --language)")
    p.add_argument("--language", choices=("simple", "english"), default=None,
                   help="with --rebuild-index: the new index's configuration (default: the "
                        "current one)")


def search(args: argparse.Namespace) -> int:
    """Run ``memstore search``."""
    from memstore.cli._commands import open_store
    from memstore.cli._errors import UsageError
    from memstore.cli._lifecycle_args import where_filter

    if args.rebuild_index:
        if args.query is not None:
            raise UsageError("--rebuild-index takes no QUERY")
        return _rebuild(args)
    if args.language is not None:
        raise UsageError("--language goes with --rebuild-index")
    if args.query is None:
        raise UsageError("search needs a QUERY (or --rebuild-index)")
    conversation: Any = None
    if args.conversation:
        conversation = args.conversation[0] if len(args.conversation) == 1 else args.conversation
    with open_store(args) as store:
        hits = store.search(args.query, conversation_id=conversation,
                            where=where_filter(args.where) or None, roles=args.role,
                            since=args.since, until=args.until, limit=args.limit,
                            context=args.context, mark=_MARK)
    _print(hits, args)
    return 0


def _rebuild(args: argparse.Namespace) -> int:
    from memstore import migrate
    from memstore.cli import _output as out
    from memstore.cli._commands import open_store, url_of

    url = url_of(args)
    total = None
    if out.progress_shown():
        with open_store(args) as store:
            total = store.stats().messages
    with out.progress_bar("indexing", total, unit="messages") as bar:
        indexed = migrate.rebuild_search_index(
            url, args.language, progress=lambda done, _: bar(done - bar.done))
    language = migrate.search_index_language(url)
    out.status(f"search index rebuilt ({language}): {out.counted(indexed, 'message')}")
    return 0


def _print(hits: list[Any], args: argparse.Namespace) -> None:
    from memstore.cli import _output as out

    form = args.format or ("table" if out.default_format() == "table" else "json")
    if form == "json":
        out.print_jsonl([_json_line(h) for h in hits])
        return
    from rich.text import Text

    def row(message: Any, cid: str, cell: Any) -> list[Any]:
        return [cid, str(message.seq), message.role,
                message.created_at.strftime("%Y-%m-%d %H:%M"), cell]

    rows = []
    for hit in hits:
        text = Text()
        for i, piece in enumerate(_marked(hit.snippet)):
            text.append(out.safe(piece), style="bold reverse" if i % 2 else "")
        rows += [row(m, "", Text(out.preview(m.text or _calls(m), 200), style="dim"))
                 for m in hit.before]
        rows.append(row(hit.message, hit.conversation_id, text))
        rows += [row(m, "", Text(out.preview(m.text or _calls(m), 200), style="dim"))
                 for m in hit.after]
    console = out.console()
    if not hits:
        out.status("no message matches")
        return
    console.print(out.table(
        ["conversation", ("seq", {"justify": "right"}), "role", "created", "match"], rows,
        caption=out.counted(len(hits), "hit")))


def _marked(snippet: str) -> list[str]:
    """The snippet split at the marks: even pieces plain, odd pieces matched."""
    pieces: list[str] = []
    rest = snippet
    while True:
        start = rest.find(_MARK[0])
        if start < 0:
            pieces.append(rest)
            return pieces
        end = rest.find(_MARK[1], start)
        end = len(rest) if end < 0 else end
        pieces += [rest[:start], rest[start + 1:end]]
        rest = rest[end + 1:]


def _calls(message: Any) -> str:
    return " ".join(f"{c.name}({c.arguments})" for c in message.tool_calls or ())


def _json_line(hit: Any) -> str:
    import json

    m = hit.message
    pieces = _marked(hit.snippet)
    snippet = "".join(f"[{p}]" if i % 2 else p for i, p in enumerate(pieces))
    return json.dumps({
        "conversation_id": hit.conversation_id, "seq": m.seq, "role": m.role,
        "created_at": m.created_at.isoformat(), "rank": hit.rank, "snippet": snippet,
        "matched": pieces[1::2],
        "message": m.to_openai(),
        "before": [n.seq for n in hit.before], "after": [n.seq for n in hit.after],
    }, ensure_ascii=False, separators=(",", ":"))
