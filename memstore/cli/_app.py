"""The ``memstore`` command's parser and entry point (argparse, so no extra dependency).

Exit status: 0 success; 1 a runtime error (one line on standard error, the traceback
only with ``--debug``); 2 bad usage (one line naming the option). A closed pipe
(``memstore messages c | head``) ends the command quietly with status 0.

Start-up is kept short: this module imports only the standard library. A command's
module (and with it SQLAlchemy, pydantic, the store, Rich) is imported when the
command runs, so ``--help``, ``--version`` and a usage error answer at once.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from memstore.cli import _lifecycle_args as lifecycle  # standard library only, as here
from memstore.cli import _search as search_cli  # standard library only at import

__all__ = ["EPILOG", "Command", "build_parser", "main"]

VIEW_CHOICES = ("token-limited", "score-based", "buffered", "head-and-tail", "recent-turns",
                "unbounded")

EPILOG = (
    "Every command takes --url (default: $MEMSTORE_URL, else sqlite:///./memstore.db) and "
    "--debug, before or after the command name. Data goes to standard output (--format "
    "table on a terminal, jsonl otherwise), status and progress to standard error. A "
    "command that reads one conversation (messages, window, conversations show, state "
    "save, export CONV) fails when it was never written: \"conversation 'x' does not "
    "exist\", status 1. Exit status: 0 ok, 1 runtime error, 2 bad usage."
)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (exit status 2).

    A mistyped choice (a command, a view, a role) or long option gets the closest
    valid one: ``memstore windw c`` says "did you mean 'window'?".
    """

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments: "):
            message += _option_hint(self, message.removeprefix("unrecognized arguments: "))
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is not None and isinstance(value, str) and value not in choices:
            close = _closest(value, [c for c in choices if isinstance(c, str)])
            if close is not None:
                listed = ", ".join(map(repr, choices))
                raise argparse.ArgumentError(
                    action, f"invalid choice: {value!r}; did you mean {close!r}? "
                            f"(choose from {listed})")
        super()._check_value(action, value)


def _closest(word: str, candidates: Sequence[str]) -> str | None:
    """The candidate most like ``word`` (difflib), if one is close enough."""
    import difflib

    found = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return found[0] if found else None


def _option_hint(parser: argparse.ArgumentParser, unrecognized: str) -> str:
    """The suffix "; did you mean '--budget'?" for a mistyped long option, else ''.

    Unrecognized options reach the top parser, which does not know which command's
    options were meant: every command's long options are candidates.
    """
    word = next((w.partition("=")[0] for w in unrecognized.split() if w.startswith("--")),
                None)
    if word is None:
        return ""
    options: set[str] = set()
    stack = [parser]
    while stack:
        current = stack.pop()
        for action in current._actions:
            options.update(o for o in action.option_strings if o.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
    close = _closest(word, sorted(options))
    return f"; did you mean {close!r}?" if close is not None else ""


def _version() -> str:
    from memstore import __version__

    return __version__


class _VersionAction(argparse.Action):
    """``--version``: the version is looked up (package metadata) only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default,
                         nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> NoReturn:
        sys.stdout.write(f"memstore {_version()}\n")
        parser.exit()


class Command:
    """A command's function, imported when the command runs (``args.func(args)``).

    ``module`` is a module of `memstore.cli`; keeping the parser free of the commands'
    imports is what makes ``memstore --help`` quick.
    """

    def __init__(self, name: str, module: str = "_commands") -> None:
        self.name = name
        self.module = f"memstore.cli.{module}"

    def __call__(self, args: argparse.Namespace) -> int:
        return int(getattr(importlib.import_module(self.module), self.name)(args))

    def __repr__(self) -> str:
        return f"Command({self.module}.{self.name})"


# ---- argument types: each error names the option (argparse adds its name) ---------------


#: The largest budget (and size) a view takes: 2**53 - 1, exact in a JSON number.
MAX_VIEW_INT = 2**53 - 1


def _int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            shown = "2**53 - 1 (9007199254740991)" if maximum == MAX_VIEW_INT else maximum
            got = text if len(text) <= 30 else f"{text[:27]}..."
            raise argparse.ArgumentTypeError(f"must be an integer <= {shown}, got {got}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def _number(minimum: float, maximum: float | None = None,
            exclusive_min: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        low_ok = value > minimum if exclusive_min else value >= minimum
        if not low_ok or (maximum is not None and value > maximum) or value != value:
            bound = f"> {minimum}" if exclusive_min else f">= {minimum}"
            upper = f" and <= {maximum}" if maximum is not None else ""
            raise argparse.ArgumentTypeError(f"must be a number {bound}{upper}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


POSITIVE = _int_at_least(1)
NON_NEGATIVE = _int_at_least(0)
#: Budgets, reserves and sizes of views: their bounds (a larger value is a usage error).
VIEW_SIZE = _int_at_least(1, MAX_VIEW_INT)
VIEW_RESERVE = _int_at_least(0, MAX_VIEW_INT)
#: ``conversations --limit``: the library's page bound.
PAGE_LIMIT = _int_at_least(1, 10_000)


# ---- parser -----------------------------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    """Options every command accepts; SUPPRESS keeps values given before the command."""
    common = _Parser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS,
                        help="database URL (default: $MEMSTORE_URL, else sqlite:///./memstore.db)")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback of an error")
    return common


def _formats(p: argparse.ArgumentParser, choices: Sequence[str], default: Any = None) -> None:
    p.add_argument("--format", choices=choices, default=default,
                   help=f"output format: {', '.join(choices)} "
                        "(default: table on a terminal, jsonl otherwise)")


def _conversation(p: argparse.ArgumentParser, help: str = "the conversation id") -> None:
    p.add_argument("conversation_id", metavar="CONV", help=help)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``memstore`` command (its help is the CLI reference)."""
    common = _common()
    parser = _Parser(
        prog="memstore",
        description="Durable conversation memory for LLM agents: see what each view keeps "
                    "(demo), inspect and edit conversations, move them between databases, "
                    "and migrate the schema.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action=_VersionAction,
                        help="print memstore's version and exit")
    parser.add_argument("--url", default=None,
                        help="database URL (default: $MEMSTORE_URL, else sqlite:///./memstore.db)")
    parser.add_argument("--debug", action="store_true", default=False,
                        help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=_Parser)

    def command(name: str, help: str, func: str, parent: Any = sub,
                **kw: Any) -> argparse.ArgumentParser:
        """A command; ``func`` names its function in ``memstore.cli.<module>``."""
        module = kw.pop("module", "_commands")
        p: argparse.ArgumentParser = parent.add_parser(
            name, parents=[common], help=help, description=kw.pop("description", help[0].upper()
                                                                  + help[1:] + "."), **kw)
        p.set_defaults(func=Command(func, module))
        return p

    # demo
    p = command("demo", "write a sample conversation and show what each view keeps", "demo",
                module="_demo",
                description="Write a realistic sample conversation (system prompt, developer "
                            "note, a pinned user fact, parallel tool calls, a 2,000-token tool "
                            "output, a pending call) as conversation 'demo', replacing it if it "
                            "exists, and show side by side what every view, and a context "
                            "builder, keeps under one budget, and why it left the rest out. "
                            "Narrower than every column needs, the views that count "
                            "messages (unbounded, recent-turns, buffered) are left out "
                            "first, so that the text of each message still shows.")
    p.add_argument("--budget", type=VIEW_SIZE, default=1000, metavar="N",
                   help="token budget of the budgeted views (default: 1000)")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="table (default) or json (per message: each view's decision)")

    # db
    db = sub.add_parser("db", help="schema migrations (packaged Alembic revisions)",
                        description="Schema migrations (packaged Alembic revisions).")
    dbsub = db.add_subparsers(dest="db_command", metavar="DB_COMMAND", required=True,
                              parser_class=_Parser)
    p = command("upgrade", "upgrade the schema (default: to head)", "db_upgrade", dbsub)
    p.add_argument("revision", nargs="?", default="head", help="target revision (default: head)")
    p.add_argument("--sql", action="store_true", help="print the DDL instead of running it")
    p.add_argument("--search-language", choices=("simple", "english"), default=None,
                   help="the search index's configuration when this upgrade creates it "
                   "(revision 0005): simple (any language, no stemming) or english "
                   "(default: $MEMSTORE_SEARCH_LANGUAGE, else simple)")
    p = command("downgrade", "downgrade the schema ('base' drops memstore's tables)",
                "db_downgrade", dbsub)
    p.add_argument("revision", help="target revision, or base")
    p.add_argument("--sql", action="store_true", help="print the DDL instead of running it")
    command("current", "show the database's revision and memstore's head", "db_current",
            dbsub)
    command("check", "exit 1 unless the schema is at head", "db_check", dbsub)
    p = command("create-partitioned", "create the tables hash-partitioned by conversation id "
                "(PostgreSQL, empty database)", "db_create_partitioned", dbsub)
    p.add_argument("--partitions", type=POSITIVE, default=8, metavar="N",
                   help="hash partitions (default: 8)")
    p.add_argument("--sql", action="store_true", help="print the DDL instead of running it")
    p.add_argument("--search-language", choices=("simple", "english"), default=None,
                   help="the search index's configuration: simple or english (default: "
                   "$MEMSTORE_SEARCH_LANGUAGE, else simple)")

    # conversations
    conv = command("conversations", "list, show, update or delete conversations (default: "
                   "list)",
                   "conversations_list")
    conv.add_argument("--limit", type=PAGE_LIMIT, default=argparse.SUPPRESS, metavar="N",
                      help="conversations per page, 1-10000 (default: 100)")
    conv.add_argument("--after", default=argparse.SUPPRESS, metavar="ID",
                      help="start after this conversation id (keyset pagination)")
    # SUPPRESS: --format before 'list' or 'show' is kept (the sub-command's default
    # would overwrite it), as --limit and --after are.
    _formats(conv, ("table", "json", "jsonl"), argparse.SUPPRESS)
    lifecycle.add_listing_options(conv)
    csub = conv.add_subparsers(dest="conversations_command", metavar="ACTION",
                               parser_class=_Parser)
    p = command("list", "list conversations: id, messages, tokens, updated",
                "conversations_list", csub)
    p.add_argument("--limit", type=PAGE_LIMIT, default=argparse.SUPPRESS, metavar="N",
                   help="conversations per page, 1-10000 (default: 100)")
    p.add_argument("--after", default=argparse.SUPPRESS, metavar="ID",
                   help="start after this conversation id (keyset pagination)")
    _formats(p, ("table", "json", "jsonl"), argparse.SUPPRESS)
    lifecycle.add_listing_options(p)
    p = command("show", "show one conversation's row and metadata", "conversations_show",
                csub)
    _conversation(p)
    _formats(p, ("table", "json", "jsonl"), argparse.SUPPRESS)
    p = command("delete", "delete a conversation and all its messages", "delete", csub)
    _conversation(p)

    # writing
    p = command("append", "store one message at the end of a conversation", "append")
    _conversation(p, "the conversation id (created on first use)")
    p.add_argument("role", choices=("system", "developer", "user", "assistant", "tool"),
                   help="the message's role")
    p.add_argument("content", help="the message text, or - to read it from standard input")
    p.add_argument("--tool-call-id", metavar="ID",
                   help="the call a tool message answers (required for tool)")
    p.add_argument("--name", help="the participant name of the message")
    p.add_argument("--id", metavar="KEY",
                   help="client id: appending the same id again stores nothing new")
    p.add_argument("--score", type=_number(0.0), default=1.0, metavar="S",
                   help="base importance for score-based views, >= 0 (default: 1)")
    p.add_argument("--pin", action="store_true", help="pin it: every view keeps it")

    p = command("import", "store conversations from an export file, or OpenAI messages",
                "import_", module="_files", description=(
                    "Store conversations from a file written by 'memstore export' (or lines "
                    "printed by 'memstore messages --format jsonl', with --as), or a list of "
                    "OpenAI chat messages with --format openai --into CONV. Each conversation "
                    "is written all or nothing. Importing the same memstore file twice stores "
                    "nothing new; --format openai appends every time, so a second import "
                    "stores the messages again (except those with an \"id\" already "
                    "stored). On a terminal, a progress bar on standard error shows how "
                    "much of the file is read, and the time left (from a pipe: the "
                    "messages so far)."))
    p.add_argument("file", help="the file to read, or - for standard input")
    p.add_argument("extra", nargs="?", help=argparse.SUPPRESS)  # the old 'import CONV FILE'
    p.add_argument("--format", choices=("memstore", "openai"), default="memstore",
                   help="memstore: the export format (default), idempotent; openai: a JSON "
                        "list or JSON lines of OpenAI chat messages, appended to --into on "
                        "every import")
    p.add_argument("--as", "--into", dest="target", metavar="CONV",
                   help="the target conversation: renames the file's one conversation, or "
                        "receives the OpenAI messages")
    p.add_argument("--replace", action="store_true",
                   help="overwrite conversations that exist with other content")

    p = command("export", "write conversations to a JSON lines file (streaming)", "export",
                module="_files",
                description="Write conversations in memstore's versioned JSON lines format "
                            "(a header line per conversation, then one line per stored "
                            "message with every field), reading each in pages so memory "
                            "stays flat on any length. 'memstore import' reads it back. "
                            "A CONV that does not exist is an error before anything is "
                            "written. On a terminal, a progress bar on standard error "
                            "shows the messages written of the total, and the time left.")
    p.add_argument("conversation_ids", nargs="*", metavar="CONV",
                   help="conversations to export (default: all)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="file to write (default: standard output)")

    # reading
    p = command("messages", "print stored messages", "messages",
                description="Print stored messages. A conversation that was never written "
                            "is an error (exit status 1: a mistyped id says so); one that "
                            "exists, with no messages in the range, prints none.")
    _conversation(p)
    p.add_argument("--start", type=_int_at_least(1), metavar="SEQ", help="first seq (inclusive)")
    p.add_argument("--stop", type=_int_at_least(1), metavar="SEQ",
                   help="seq to stop before (exclusive)")
    p.add_argument("--limit", type=NON_NEGATIVE, metavar="N", help="at most this many messages")
    p.add_argument("--newest-first", action="store_true", help="newest message first")
    _formats(p, ("table", "json", "jsonl", "openai"))

    p = command("window", "assemble a context window and show its report", "window",
                description="Assemble a context window through a view and show what it kept, "
                            "why, and what it left out. A conversation that was never "
                            "written is an error (exit status 1), though the library "
                            "gives it an empty window; one that exists with no messages "
                            "has an empty window.")
    _conversation(p)
    p.add_argument("--view", choices=VIEW_CHOICES, default="token-limited",
                   help="the view (default: token-limited)")
    p.add_argument("--budget", "--tokens", dest="budget", type=VIEW_SIZE, default=4000,
                   metavar="N",
                   help="token limit of token-limited and score-based (default: 4000)")
    p.add_argument("--reserve", type=VIEW_RESERVE, default=0, metavar="N",
                   help="tokens of the budget kept free for the reply, less than --budget "
                        "(default: 0)")
    p.add_argument("--start-on-user", action="store_true",
                   help="token-limited: start the kept suffix at a user message")
    p.add_argument("--keep-rate", type=_number(0.0, 1.0), default=0.9, metavar="RATE",
                   help="score-based: decay per newer message, in [0, 1] (default: 0.9)")
    p.add_argument("--half-life", type=_number(0.0, exclusive_min=True), default=None,
                   metavar="SECONDS",
                   help="score-based: decay by age in seconds instead of --keep-rate")
    p.add_argument("--size", type=VIEW_SIZE, default=20, metavar="N",
                   help="buffer size (buffered), tail size (head-and-tail), turns "
                        "(recent-turns) (default: 20)")
    p.add_argument("--head", type=VIEW_SIZE, default=2, metavar="N",
                   help="head size of head-and-tail (default: 2)")
    p.add_argument("--remove-tool-messages", action="store_true",
                   help="recent-turns: leave out tool units but the newest")
    p.add_argument("--json", action="store_const", const="json", dest="format",
                   help="the same as --format json")
    _formats(p, ("table", "json", "jsonl", "openai"))

    p = command("stats", "conversations, messages, tokens, database size, schema revision",
                "stats")
    _formats(p, ("table", "json", "jsonl"))

    # destructive
    p = command("pop", "delete and print the newest messages", "pop")
    _conversation(p)
    p.add_argument("-n", type=POSITIVE, default=1, metavar="N", help="how many (default: 1)")
    _formats(p, ("table", "json", "jsonl", "openai"))
    p = command("clear", "delete every message of a conversation (it stays, empty)", "clear")
    _conversation(p)
    p = command("delete", "delete a conversation and all its messages", "delete")
    _conversation(p)

    # lifecycle: conversations update, fork, prune, forget, audit
    lifecycle.add_update_command(command, csub, _formats)
    lifecycle.add_commands(command, sub, _formats)

    # search
    search_cli.add_command(command)

    # state
    state = sub.add_parser("state", help="save or load a conversation snapshot (one JSON)",
                           description="Save or load a conversation snapshot (one JSON "
                                       "document; 'export' streams instead).")
    ssub = state.add_subparsers(dest="state_command", metavar="STATE_COMMAND", required=True,
                                parser_class=_Parser)
    p = command("save", "write a conversation snapshot", "state_save", ssub, module="_state")
    _conversation(p)
    p.add_argument("-o", "--output", metavar="FILE",
                   help="file to write (default: standard output)")
    p = command("load", "load a snapshot (--replace to overwrite a conversation)",
                "state_load", ssub, module="_state")
    p.add_argument("file", help="the snapshot file, or - for standard input")
    p.add_argument("--as", dest="conversation_id", metavar="CONV",
                   help="target conversation (default: the snapshot's id)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--replace", action="store_true",
                      help="overwrite the conversation if it exists (its messages, "
                      "summaries, metadata and creation time)")
    mode.add_argument("--append", action="store_true",
                      help="append the snapshot's messages after the stored ones")
    return parser


# ---- entry point ------------------------------------------------------------------------


def _exit_code(exc: BaseException) -> int:
    from pydantic import ValidationError

    from memstore.cli._errors import FileFormatError, UsageError
    from memstore.errors import ConfigurationError, InvalidInputError

    if isinstance(exc, FileFormatError):
        return 1
    if isinstance(exc, (UsageError, ValidationError, InvalidInputError, ConfigurationError)):
        return 2
    return 1


def _failed(exc: Exception, args: argparse.Namespace) -> int:
    """Report the error a command raised, in one line; its exit status.

    Called inside the ``except`` block (``--debug`` prints the traceback being handled).
    The error classes are imported here: a command that runs imported them already.
    """
    import traceback

    from pydantic import ValidationError

    from memstore.cli import _output as out
    from memstore.cli._errors import one_line
    from memstore.errors import MemstoreError, SchemaOutOfDateError

    if args.debug:
        traceback.print_exc()
    if isinstance(exc, (MemstoreError, ValidationError, OSError, UnicodeDecodeError)):
        text = one_line(exc)
        if isinstance(exc, SchemaOutOfDateError):
            from memstore.cli._commands import out_of_date_message

            # The command that fixes it, for this database (not the library's placeholder).
            text = one_line(Exception(out_of_date_message(args, exc)))
        sys.stderr.write(f"memstore: error: {out.safe(text)}\n")
        return _exit_code(exc)
    # a bug or an unforeseen failure: still one line
    sys.stderr.write(f"memstore: error: {type(exc).__name__}: {out.safe(one_line(exc))} "
                     "(--debug shows the traceback)\n")
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``memstore`` command; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C while starting: no traceback
        sys.stderr.write("memstore: interrupted\n")
        return 130
    try:
        from memstore.cli import _output as out

        out.prepare_stdout()
        return int(args.func(args))
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, and keep Python's exit-time
        # flush of standard output from raising again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        sys.stderr.write("memstore: interrupted\n")
        return 130
    except Exception as exc:
        return _failed(exc, args)
