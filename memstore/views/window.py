"""What a view returns: the window, its report and the runs of left-out seqs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from memstore import formats
from memstore.models.common import (
    _FROZEN,
)
from memstore.models.message import (
    Message,
    StoredMessage,
)

OmissionReason = Literal[
    "budget",  # did not fit the token budget
    "buffer_size",  # beyond BufferedView's message count
    "head_tail_gap",  # between HeadAndTailView's head and tail
    "max_turns",  # older than RecentTurnsView's turn limit
    "score",  # ScoreBasedView: a higher-scored unit took the room
    "incomplete_unit",  # an unanswered tool call or a tool result whose call is not stored
    "tool_messages_removed",  # RecentTurnsView(remove_tool_messages=True)
    "start_on_user",  # a view's start_on_user=True trimmed the window to a user message
    "summarized",  # SummaryView: inside the range its summary stands for
]


class Omission(BaseModel):
    """A run of stored messages a window left out, all for the same reason.

    Attributes:
        first_seq: first seq of the run.
        last_seq: last seq of the run (inclusive).
        count: how many stored messages of ``[first_seq, last_seq]`` were left out
            (anchored messages inside the range are kept and not counted).
        reason: why they were left out.
    """

    model_config = _FROZEN

    first_seq: int
    last_seq: int
    count: int
    reason: OmissionReason


class WindowReport(BaseModel):
    """What a window kept and left out, and why.

    Attributes:
        view: the view's class name.
        conversation_exists: ``False`` when the conversation was never written: the
            window is empty (a first turn needs no special case), as are
            ``messages()`` and ``count_tokens()``.
        counter: the name of the token counter used.
        conversation_message_count: messages stored in the conversation.
        included_count: stored messages in the window (placeholder excluded).
        omitted: runs of left-out seqs with their reasons (chronological).
        placeholder: the placeholder text, when one was inserted.
        skipped: the number of messages the placeholder stands for (0 when none).
        rows_read: messages the view read to build the window, counted at every read
            (a message read twice counts twice; a cost measure: it
            grows with the window, not the history). Whether they came from the
            database or the store's row cache does not change the report (see
            ``store.cache_info()``); nor do the few rows past the last one taken that
            the store's last page fetched but never turned into messages.
        summary_range: ``(first_seq, last_seq)`` of the stored summary the window
            shows (``SummaryView``), else ``None``.
        unsummarized: stored messages after the summary's range (or, with no
            summary, anywhere) that the window neither shows nor summarizes (its
            ``"budget"`` omissions): about what the next ``summarize`` would fold in.
            Incomplete units among them are counted too (the view does not read that
            far), though ``summarize`` never folds them. 0 for views without summaries.
    """

    model_config = _FROZEN

    view: str
    counter: str
    conversation_message_count: int
    included_count: int
    omitted: list[Omission] = Field(default_factory=list)
    placeholder: str | None = None
    skipped: int = 0
    rows_read: int = 0
    summary_range: tuple[int, int] | None = None
    unsummarized: int = 0
    conversation_exists: bool = True

    @property
    def omitted_count(self) -> int:
        """Total number of stored messages left out."""
        return sum(o.count for o in self.omitted)

    def omitted_seqs(self, reason: OmissionReason | None = None) -> list[int]:
        """The left-out seqs, optionally only those left out for ``reason``.

        Omission runs never span a kept message, so this is exact; it materialises
        every seq, so prefer ``omitted`` for long histories.
        """
        seqs: list[int] = []
        for o in self.omitted:
            if reason is None or o.reason == reason:
                seqs.extend(range(o.first_seq, o.last_seq + 1))
        return seqs




class ContextWindow(BaseModel):
    """A view's result: the messages to send, their token count and a report.

    Attributes:
        conversation_id: the conversation the window was read from.
        messages: chronological; a plain [`Message`][memstore.Message] only for a placeholder.
        token_count: the whole list as the provider counts it (reply priming included).
        budget: the token limit of a budgeted view, else ``None``.
        report: what was left out and why.
    """

    model_config = ConfigDict(frozen=True)

    conversation_id: str
    messages: list[StoredMessage | Message]
    token_count: int
    budget: int | None = None
    report: WindowReport

    def to_openai(self) -> list[dict[str, Any]]:
        """Return the messages as OpenAI Chat Completions message dicts."""
        return [m.to_openai() for m in self.messages]

    def to_anthropic(self, *, leading_assistant: formats.LeadingAssistant = "insert",
                     leading_text: str = formats.LEADING_USER_TEXT) -> dict[str, Any]:
        """Return ``{"system": [...], "messages": [...]}`` for the Anthropic Messages API.

        The request starts with a user turn: when the window starts with an assistant
        turn, a ``"(continued)"`` user turn goes first by default (nothing is left
        out, so the report stays exact). ``leading_assistant="drop"`` leaves the
        leading assistant units out instead (the report does not list them: read the
        window with ``start_on_user=True`` for that), ``"raise"`` refuses, ``"keep"``
        sends it as it is. See `memstore.formats.to_anthropic()` for the mapping.

        Raises:
            InvalidInputError: see `memstore.formats.to_anthropic()`.
        """
        return formats.to_anthropic(self.messages, leading_assistant=leading_assistant,
                                    leading_text=leading_text)

    def to_responses(self) -> list[dict[str, Any]]:
        """Return the messages as OpenAI Responses API input items.

        See `memstore.formats.to_responses()` for the mapping.
        """
        return formats.to_responses(self.messages)

    @property
    def seqs(self) -> list[int]:
        """Seqs of the stored messages in the window (placeholder excluded)."""
        return [m.seq for m in self.messages if isinstance(m, StoredMessage)]

    def __len__(self) -> int:
        return len(self.messages)


