"""``memstore demo``: a realistic conversation, and what each view (and the builder) keeps.

The same table is rendered into the documentation (``scripts/gen_demo_svg.py``), so the
picture in the docs is always what the command prints. Each row shows the start of
the message's text; the footer row is the tokens each view sends; a message a
token-limited view leaves out only because a newer unit did not fit is marked
``blocked``, with the numbers below the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from memstore.cli import _output as out
from memstore.cli._commands import message_preview, open_store
from memstore.context.builder import Block, ContextBuilder, Drop, HistoryBlock, Tier, TruncateOldest
from memstore.errors import ContextBudgetError, ConversationNotFoundError
from memstore.models import Message, StoredMessage, ToolCall
from memstore.store import MemoryStore
from memstore.views import (
    BufferedView,
    ContextView,
    HeadAndTailView,
    RecentTurnsView,
    ScoreBasedView,
    TokenLimitedView,
    UnboundedView,
)
from memstore.views.window import ContextWindow, WindowReport

__all__ = ["CONVERSATION_ID", "DROP_FIRST", "MIN_TEXT", "BuilderColumn", "DemoLayout",
           "DemoResult", "demo", "demo_builder", "demo_layout", "demo_messages",
           "demo_min_width", "demo_table", "run_demo", "write_demo"]

CONVERSATION_ID = "demo"
DEFAULT_BUDGET = 1000



def _tracking_log() -> str:
    """A carrier's tracking history for one parcel: a ~2,000-token tool output."""
    hubs = ["Portland, OR", "Salem, OR", "Eugene, OR", "Medford, OR", "Redding, CA",
            "Sacramento, CA", "Reno, NV"]
    events = []
    for day in range(14):
        for step, status in enumerate(("arrived at facility", "processed", "departed facility")):
            hub = hubs[min(day // 2 + (step == 2), len(hubs) - 1)]
            events.append({
                "time": f"2026-03-{day + 2:02d}T{8 + step * 4:02d}:{(day * 7) % 60:02d}:00Z",
                "location": hub, "status": status,
                "scan_id": f"NW{1138 * (day + 3) + step:08d}",
            })
    events.append({"time": "2026-03-14T09:12:00Z", "location": "Reno, NV",
                   "status": "held: weather delay", "scan_id": "NW00099871"})
    return json.dumps({"order": 1138, "carrier": "Cascade Freight", "events": events})


def demo_messages() -> list[Message]:
    """The sample conversation: a support chat with tools, a long output, a pending call."""
    lookup = [ToolCall(id="call_a", name="lookup_order", arguments='{"order": 1138}'),
              ToolCall(id="call_b", name="lookup_order", arguments='{"order": 1142}')]
    return [
        Message.system("You are Atlas, the support agent of Northwind Outfitters. Be brief, "
                       "cite order numbers, and never promise a delivery date."),
        Message.developer("Tools: lookup_order, track_shipment, refund_shipping. Refunds over "
                          "$50 need a human; shipping refunds are always allowed."),
        Message.user("For the record: I'm Dana Reyes, account DR-20931, and I want updates by "
                     "email only, never by phone.", pinned=True),
        Message.assistant("Noted, Dana: email only. How can I help today?", score=0.5),
        Message.user("Order 1138 was due Tuesday and hasn't arrived. Can you check it, and "
                     "1142 too?"),
        Message.assistant(tool_calls=lookup),
        Message.tool('{"order": 1138, "status": "in transit", "carrier": "Cascade Freight", '
                     '"due": "2026-03-10"}', tool_call_id="call_a"),
        Message.tool('{"order": 1142, "status": "packing", "warehouse": "Portland"}',
                     tool_call_id="call_b"),
        Message.assistant("1138 is in transit with Cascade Freight (it was due March 10); "
                          "1142 is still being packed in Portland.", score=2.0),
        Message.user("Can I see the full tracking history for 1138?"),
        Message.assistant(tool_calls=[ToolCall(id="call_c", name="track_shipment",
                                               arguments='{"order": 1138}')]),
        Message.tool(_tracking_log(), tool_call_id="call_c", score=0.5),
        Message.assistant("It left Portland on March 2 and has been held in Reno since March "
                          "14 by a weather delay."),
        Message.user("That's too slow. Please refund the shipping on 1138."),
        Message.assistant("I'll refund the shipping on 1138 now.", tool_calls=[
            ToolCall(id="call_d", name="refund_shipping", arguments='{"order": 1138}')]),
    ]


def demo_views(budget: int) -> list[tuple[str, str, ContextView]]:
    """``(name, setting, view)`` for the six views under one budget."""
    return [
        ("token-limited", f"budget {budget:,}", TokenLimitedView(budget)),
        ("score-based", f"budget {budget:,}", ScoreBasedView(budget)),
        ("buffered", "6 messages", BufferedView(6)),
        ("head-and-tail", "head 2 + tail 4", HeadAndTailView(2, 4)),
        ("recent-turns", "2 turns", RecentTurnsView(2)),
        ("unbounded", "everything", UnboundedView()),
    ]


POLICY = Message.system(
    "Refund policy (retrieved): shipping refunds are always allowed; refunds over $50 need a "
    "human; delays caused by weather do not extend the return window.")


def demo_builder(store: MemoryStore, budget: int) -> ContextBuilder:
    """The builder column: a retrieved policy document, then the history in what remains."""
    return (ContextBuilder(max_tokens=budget)
            .add_block(Block("policy", tier=Tier.RAG, strategy=Drop(), messages=[POLICY]))
            .add_block(Block("history", tier=Tier.HISTORY, strategy=TruncateOldest(),
                             history=HistoryBlock(store, CONVERSATION_ID,
                                                  ScoreBasedView(budget)))))


@dataclass
class BuilderColumn:
    """What the builder kept of the stored conversation (and the tokens it used)."""

    token_count: int
    budget: int
    seqs: list[int]
    report: WindowReport | None


@dataclass
class DemoResult:
    """The stored demo conversation and each column's window (or its budget error)."""

    budget: int
    messages: list[StoredMessage]
    columns: list[tuple[str, str]] = field(default_factory=list)
    windows: list[ContextWindow | BuilderColumn | ContextBudgetError] = field(
        default_factory=list)

    def decision(self, column: int, seq: int) -> str:
        """``kept`` or the omission reason of ``seq`` in a column's window."""
        win = self.windows[column]
        if isinstance(win, ContextBudgetError):
            return "error"
        if seq in win.seqs:
            return "kept"
        for o in (win.report.omitted if win.report is not None else ()):
            if o.first_seq <= seq <= o.last_seq:
                return o.reason
        return "budget"  # trimmed by a builder strategy after the view

    def blocking_unit(self, column: int) -> tuple[int, int, int] | None:
        """``(first_seq, last_seq, tokens)`` of the unit that stopped a token-limited view.

        `TokenLimitedView` keeps a contiguous suffix: walking back from the newest
        message, the first unit that does not fit ends the window, and every older
        message is left out with reason ``budget`` too, however small. That unit is the
        newest one left out for the budget (a tool call with its results is one unit).
        None for another view, or when nothing was left out for the budget.
        """
        win = self.windows[column]
        if not isinstance(win, ContextWindow) or win.report.view != "TokenLimitedView":
            return None
        last = max((o.last_seq for o in win.report.omitted if o.reason == "budget"),
                   default=None)
        if last is None:
            return None
        by_seq = {m.seq: m for m in self.messages}
        first = last
        while first > 1 and by_seq[first].role == "tool":  # back to the call that asked
            first -= 1
        tokens = sum(by_seq[seq].token_count for seq in range(first, last + 1))
        return first, last, tokens

    def shown_decision(self, column: int, seq: int) -> str:
        """`decision()`, or ``blocked`` behind a token-limited view's `blocking_unit()`.

        Such a message was left out for the budget, but not because of its own size.
        """
        decision = self.decision(column, seq)
        unit = self.blocking_unit(column) if decision == "budget" else None
        return "blocked" if unit is not None and seq < unit[0] else decision


def write_demo(store: MemoryStore) -> list[StoredMessage]:
    """(Re)write conversation ``demo``: the old one, if any, is deleted first."""
    with contextlib.suppress(ConversationNotFoundError):
        store.delete_conversation(CONVERSATION_ID)
    return store.extend(CONVERSATION_ID, demo_messages())


def run_demo(store: MemoryStore, budget: int = DEFAULT_BUDGET) -> DemoResult:
    """Write the demo conversation and read it through every view."""
    result = DemoResult(budget, write_demo(store))
    for name, setting, view in demo_views(budget):
        result.columns.append((name, setting))
        try:
            result.windows.append(store.window(CONVERSATION_ID, view))
        except ContextBudgetError as exc:
            result.windows.append(exc)
    result.columns.append(("builder", f"a retrieved policy document, then the history "
                                      f"through score-based, in one budget of {budget:,}"))
    try:
        compiled = demo_builder(store, budget).compile()
    except ContextBudgetError as exc:
        result.windows.append(exc)
    else:
        kept = [m.seq for m in compiled.messages if isinstance(m, StoredMessage)]
        result.windows.append(BuilderColumn(compiled.token_count, budget, kept,
                                            compiled.report.history_reports.get("history")))
    return result


#: Short column headers and reason words, so the table fits an 80-column terminal.
_HEADERS = {"token-limited": "token\nlimited", "score-based": "score\nbased",
            "buffered": "buffered", "head-and-tail": "head &\ntail",
            "recent-turns": "recent\nturns", "unbounded": "unbounded", "builder": "builder"}
_SHORT = {"budget": "budget", "buffer_size": "buffer", "head_tail_gap": "gap",
          "max_turns": "turns", "score": "score", "incomplete_unit": "open",
          "tool_messages_removed": "tools", "start_on_user": "user", "blocked": "blocked"}

#: View columns left out, in this order, when the terminal is too narrow for them and
#: a text preview of `MIN_TEXT` characters: what a message said is worth more than
#: the views that count messages (the others show what budgets do).
DROP_FIRST = ("unbounded", "recent-turns", "buffered")
MIN_TEXT = 22
MAX_TEXT = 48
_FIXED = 3 + 9 + 6  # seq, role, tokens


def _cell(decision: str) -> Text:
    if decision == "kept":
        return Text("✓", style="green")
    if decision == "error":
        return Text("—", style="dim")
    return Text(f"✗ {_SHORT.get(decision, decision)}", style="red")


def _layout(result: DemoResult) -> tuple[list[tuple[StoredMessage, str, list[Text]]],
                                          list[Text], list[str], list[int], list[int]]:
    """Rows, footers, headers, and each view column's least and one-line widths."""
    rows = []
    for m in result.messages:
        cells = [_cell(result.shown_decision(i, m.seq)) for i in range(len(result.windows))]
        rows.append((m, f"{m.role}*" if m.pinned else m.role, cells))
    footers = [Text("too small", style="red") if isinstance(w, ContextBudgetError)
               else Text(f"{w.token_count:,}") for w in result.windows]
    headers = [_HEADERS.get(name, name) for name, _ in result.columns]
    # A view column is as wide as its widest cell; its header and footer wrap at spaces
    # when the console is narrow (minimum), and stay on one line when there is room (best).
    least = [max(*(len(x) for x in h.split()), *(len(x) for x in f.plain.split()),
                 *(len(r[2][i]) for r in rows))
             for i, (h, f) in enumerate(zip(headers, footers))]
    widths = [max(*(len(x) for x in h.split("\n")), len(f), w)
              for h, f, w in zip(headers, footers, least)]
    return rows, footers, headers, least, widths


@dataclass
class DemoLayout:
    """How the table fits a console: the view columns shown and the text's width."""

    shown: list[int]
    """Indexes of the view columns shown (all of them when there is room)."""
    text_width: int
    """Characters of the text preview."""
    wrap: bool
    """View columns at their least width, their headers and footers wrapped at spaces."""
    width: int
    """The console width the table needs: the console's, unless that is too narrow."""


def demo_layout(result: DemoResult, width: int) -> DemoLayout:
    """The layout of the table on a console ``width`` columns wide.

    Every view column and a text preview of up to `MAX_TEXT` characters when they
    fit. On a narrower console the view columns' headers and footers wrap first, then
    the columns of `DROP_FIRST` are left out, one by one, until the text keeps
    `MIN_TEXT` characters: at 80 columns a reader still sees what each message said.
    Narrower still, the table needs more than ``width`` (``layout.width``).
    """
    least, widths = _layout(result)[3:]
    names = [name for name, _ in result.columns]
    shown = list(range(len(names)))
    choices = [list(shown)]
    for name in DROP_FIRST:
        if name in names:
            shown = [i for i in shown if names[i] != name]
            choices.append(list(shown))
    for columns in choices:
        for wrap in (False, True):
            sizes = least if wrap else widths
            fixed = _FIXED + sum(sizes[i] for i in columns) + len(columns) + 3
            text = min(MAX_TEXT, width - fixed - 1)
            if text >= MIN_TEXT:
                return DemoLayout(columns, text, wrap, width)
    columns = choices[-1]
    fixed = _FIXED + sum(least[i] for i in columns) + len(columns) + 3
    return DemoLayout(columns, MIN_TEXT, True, fixed + 1 + MIN_TEXT)


def demo_min_width(result: DemoResult) -> int:
    """The narrowest console the table fits (with the fewest view columns)."""
    return demo_layout(result, 0).width


def _blocked_note(result: DemoResult) -> str:
    """Why a token-limited view left out small messages, in numbers (or "")."""
    for i, win in enumerate(result.windows):
        unit = result.blocking_unit(i)
        if unit is None or not isinstance(win, ContextWindow) or win.budget is None:
            continue
        first, last, tokens = unit
        if not any(result.shown_decision(i, m.seq) == "blocked" for m in result.messages):
            return ""
        seqs = f"seq {first}" if first == last else f"seqs {first}-{last}"
        return (f" Why blocked: {result.columns[i][0]} keeps a contiguous suffix of the "
                f"history, so once {seqs} ({out.counted(tokens, 'token')}) did not fit in "
                f"the {win.budget - win.token_count:,} tokens left of its {win.budget:,}, "
                f"every older message was left out, however small (it sent "
                f"{win.token_count:,} of {win.budget:,} tokens; score-based skips such a "
                f"unit and goes on).")
    return ""


def demo_table(result: DemoResult, width: int = 100) -> Table:
    """The side-by-side table: one row per message, one column per view.

    ``width`` is the console's (see `demo_layout()`: on a narrow console the less
    useful view columns are left out so that a text preview stays). Every row stays on
    one line. The footer row is each view's tokens sent (the window's token count).
    """
    total = sum(m.token_count for m in result.messages)
    rows, footers, headers, least, widths = _layout(result)
    layout = demo_layout(result, width)
    names = [name for name, _ in result.columns]
    settings = "; ".join(f"{name}: {setting}" for name, setting in result.columns)
    hidden = [names[i] for i in range(len(names)) if i not in layout.shown]
    blocked = _blocked_note(result)
    legend = ("budget: over the token budget; blocked: older than a unit that did not "
              "fit; " if blocked else "budget: over the token budget; ")
    caption = (f"✓ sent to the model; ✗ left out, and why ({legend}score: a higher-scored "
               f"unit took the room; buffer, gap, turns: outside the view's message, "
               f"head-and-tail or turn limit; open: a tool call still waiting for its "
               f"result, never sent). Anchored messages (system, developer, pinned*) are "
               f"always kept; a tool call and its results are kept or left out together."
               f"{blocked} Settings: {settings}.")
    if hidden:
        need = _FIXED + sum(least) + len(least) + 3 + 1 + MIN_TEXT  # every column, wrapped
        caption += (f" Not shown at this width: {', '.join(hidden)} (every view fits in "
                    f"{need} columns; --format json has every decision).")
    table = Table(
        title=f"What each view keeps of conversation {CONVERSATION_ID!r} "
              f"({out.counted(len(result.messages), 'message')}, "
              f"{out.counted(total, 'token')} stored)",
        caption=caption, caption_justify="left", show_footer=True, box=box.SIMPLE_HEAD,
        pad_edge=False, padding=(0, 0), show_edge=False, title_justify="left")
    table.add_column("seq", justify="right", min_width=3)
    table.add_column("role", no_wrap=True, min_width=9)
    table.add_column("tokens", justify="right", min_width=6)
    table.add_column("text", width=layout.text_width, no_wrap=True,
                     footer=Text("tokens sent:", justify="right"))
    # Rich cannot shrink columns below their minimum widths itself (it would overflow, and
    # the console crop the lines and the legend): when one-line headers and footers do not
    # fit, each view column gets exactly its widest cell and they wrap.
    for i in layout.shown:
        if layout.wrap:
            table.add_column(headers[i], footer=footers[i], width=least[i], overflow="fold")
        else:
            table.add_column(headers[i], footer=footers[i], no_wrap=True, min_width=widths[i])
    for m, role, cells in rows:
        table.add_row(str(m.seq), role, f"{m.token_count:,}",
                      Text(message_preview(m, layout.text_width)),
                      *(cells[i] for i in layout.shown))
    return table


def demo_json(result: DemoResult) -> dict[str, Any]:
    """The demo's decisions as JSON (``--format json``)."""
    views: dict[str, Any] = {}
    for i, ((name, setting), win) in enumerate(zip(result.columns, result.windows)):
        if isinstance(win, ContextBudgetError):
            views[name] = {"setting": setting, "error": str(win)}
        else:
            placeholder = win.report.placeholder if win.report is not None else None
            views[name] = {"setting": setting, "token_count": win.token_count,
                           "budget": win.budget, "seqs": win.seqs,
                           "placeholder": placeholder,
                           "decisions": {m.seq: result.decision(i, m.seq)
                                         for m in result.messages}}
            unit = result.blocking_unit(i)
            if unit is not None:  # the unit that stopped the contiguous suffix
                views[name]["blocked_by"] = {"first_seq": unit[0], "last_seq": unit[1],
                                             "tokens": unit[2]}
    return {"conversation_id": CONVERSATION_ID, "budget": result.budget,
            "messages": [{"seq": m.seq, "role": m.role, "tokens": m.token_count,
                          "pinned": m.pinned, "anchored": m.anchored} for m in result.messages],
            "views": views}


def demo(args: argparse.Namespace) -> int:
    """``memstore demo [--budget N]``."""
    with open_store(args, write=True, create=True) as store:
        result = run_demo(store, args.budget)
    if args.format == "json":
        out.print_json(demo_json(result))
        return 0
    console = out.console()
    needed = demo_layout(result, console.width).width
    if console.width < needed:
        # Narrower, words would be cut: render it this wide (the terminal wraps the
        # lines), and say so.
        out.status(f"memstore demo: the table needs {needed} columns and the terminal has "
                   f"{console.width}; widen it, or use --format json")
        console = out.console(width=needed)
    console.print(demo_table(result, console.width))
    # The hint's budget is one the score-based view can serve (the demo's, unless too small).
    scored = result.windows[[name for name, _ in result.columns].index("score-based")]
    budget = scored.required if isinstance(scored, ContextBudgetError) else result.budget
    console.print(f"Stored as conversation {CONVERSATION_ID!r} (run again to replace it).")
    console.print(f"Next: memstore window {CONVERSATION_ID} --view score-based --budget "
                  f"{budget}", overflow="fold")
    return 0
