r"""Formatters: inject facts or retrieved documents into a system message.

A formatter is any callable that turns a list of item texts into one string.
[`inject_into_system()`][memstore.inject_into_system] appends that string to a system (or developer)
message as one more text part, so a context builder can fold short, always-wanted
items (facts, a user profile, retrieved snippets) into the system block instead of
sending them as separate messages::

    from memstore import Message, XMLFormatter, inject_into_system

    system = inject_into_system(
        Message.system("You are a support agent."),
        XMLFormatter(tag="facts", item_tag="fact"),
        ["The customer is on the Pro plan.", "Refunds take 5 < 7 days."],
    )
    # system.text ==
    # 'You are a support agent.\n<facts>\n  <fact>The customer is on the Pro plan.</fact>\n'
    # '  <fact>Refunds take 5 &lt; 7 days.</fact>\n</facts>'

Pure functions: no I/O, no token counting (the builder counts the result like any
other message).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memstore._validate import short_repr, text_problem
from memstore.errors import ConfigurationError, InvalidInputError
from memstore.models import ANCHOR_ROLES, Message, TextPart

__all__ = [
    "Formatter",
    "MarkdownListFormatter",
    "XMLFormatter",
    "inject_into_system",
]

#: A formatter turns item texts into the text appended to the system message.
Formatter = Callable[[Sequence[str]], str]

#: What `inject_into_system()` accepts as an item: a string, or a message
#: (its text parts are used).
Item = str | Message

# An XML name: a letter or underscore, then letters, digits, ``-``, ``_``, ``.`` (no
# colon: namespaces are not needed for a prompt tag).
_XML_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")

_XML_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&apos;"}


def _xml_escape(text: str) -> str:
    """Escape the five XML special characters."""
    return "".join(_XML_ESCAPES.get(ch, ch) for ch in text)


def _check_tag(formatter: str, name: str, value: object) -> None:
    if not isinstance(value, str) or not _XML_NAME.match(value):
        raise ConfigurationError(
            f"{formatter} {name} must be an XML name (a letter or '_', then letters, digits, "
            f"'-', '_' or '.'), got {short_repr(value)}"
        )


@dataclass(frozen=True)
class XMLFormatter:
    """Items as XML elements inside one wrapping element, with the text escaped.

    ``XMLFormatter("context", "fact")(["a < b", "c"])`` gives::

        <context>
          <fact>a &lt; b</fact>
          <fact>c</fact>
        </context>

    The five XML special characters (``& < > " '``) are escaped in every item, so
    an item can never close the wrapping element or inject markup.

    Args:
        tag: the wrapping element's name (an XML name).
        item_tag: each item's element name (an XML name).

    Raises:
        ConfigurationError: (a ``ValueError``) a tag is not an XML name.
    """

    tag: str = "context"
    item_tag: str = "fact"

    def __post_init__(self) -> None:
        _check_tag("XMLFormatter", "tag", self.tag)
        _check_tag("XMLFormatter", "item_tag", self.item_tag)

    def __call__(self, items: Sequence[str]) -> str:
        """Format ``items`` (already plain strings)."""
        lines = [f"<{self.tag}>"]
        lines.extend(f"  <{self.item_tag}>{_xml_escape(item)}</{self.item_tag}>" for item in items)
        lines.append(f"</{self.tag}>")
        return "\n".join(lines)


@dataclass(frozen=True)
class MarkdownListFormatter:
    r"""Items as a Markdown bullet list under a ``###`` heading.

    ``MarkdownListFormatter("Facts")(["one", "two\nlines"])`` gives::

        ### Facts
        - one
        - two
          lines

    Continuation lines of an item are indented by two spaces so they stay inside
    their bullet. An empty ``heading`` leaves the heading line out.

    Args:
        heading: the heading text (one line).

    Raises:
        ConfigurationError: (a ``ValueError``) the heading is not a one-line string.
    """

    heading: str

    def __post_init__(self) -> None:
        if not isinstance(self.heading, str) or "\n" in self.heading or "\r" in self.heading:
            raise ConfigurationError(
                "MarkdownListFormatter heading must be a one-line string, "
                f"got {short_repr(self.heading)}"
            )

    def __call__(self, items: Sequence[str]) -> str:
        """Format ``items`` (already plain strings)."""
        lines = [f"### {self.heading}"] if self.heading else []
        for item in items:
            lines.append("- " + "\n  ".join(item.splitlines() or [""]))
        return "\n".join(lines)


def _item_text(item: object, index: int) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, Message):
        return item.text
    raise InvalidInputError(
        f"item {index} is a {type(item).__name__}; items must be strings or Messages"
    )


def inject_into_system(
    system_message: Message,
    formatter: Formatter,
    items: Sequence[Item],
) -> Message:
    """Return a new system message with ``items`` appended under the formatter's tag.

    The new message keeps the role (``system`` or ``developer``), name, metadata,
    score, pinned flag and every text part of ``system_message``; the formatted items
    are appended as one more text part (preceded by a newline when the message
    already has text). It carries no ``id``: it is a different message from the one
    given (and never a [`StoredMessage`][memstore.StoredMessage], whose stored token
    count would no longer be right). With no items the message is returned unchanged.

    Args:
        system_message: a ``system`` or ``developer`` message.
        formatter: turns the item texts into one string, e.g.
            [`XMLFormatter`][memstore.XMLFormatter]
            or [`MarkdownListFormatter`][memstore.MarkdownListFormatter].
        items: strings, or messages whose text parts are used.

    Returns:
        The new message (or ``system_message`` itself when ``items`` is empty).

    Raises:
        InvalidInputError: (a ``ValueError``) the message is not a system/developer
            message, the formatter is not callable, an item is neither a string nor a
            Message, or the formatter does not return a string (or returns one holding a
            NUL character or a surrogate code point).
    """
    if not isinstance(system_message, Message) or system_message.role not in ANCHOR_ROLES:
        role = getattr(system_message, "role", type(system_message).__name__)
        raise InvalidInputError(
            f"inject_into_system needs a system or developer message, got {short_repr(role)}"
        )
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise InvalidInputError(
            f"items must be a list of strings or Messages, not {type(items).__name__}"
        )
    if not callable(formatter):
        raise InvalidInputError(
            f"formatter must be a callable (list[str]) -> str such as XMLFormatter() or "
            f"MarkdownListFormatter(heading), got {short_repr(formatter)}"
        )
    texts = [_item_text(item, i) for i, item in enumerate(items)]
    if not texts:
        return system_message
    formatted = formatter(texts)
    if not isinstance(formatted, str):
        raise InvalidInputError(
            f"the formatter returned a {type(formatted).__name__}, not a string"
        )
    problem = text_problem(formatted)
    if problem is not None:
        raise InvalidInputError(f"the formatter's text {problem}")
    content = system_message.content
    if content is None:
        parts: list[TextPart] = []
    elif isinstance(content, str):
        parts = [TextPart(text=content)] if content else []
    else:
        parts = [part for part in content if isinstance(part, TextPart)]
    separator = "\n" if any(part.text for part in parts) else ""
    parts.append(TextPart(text=separator + formatted))
    return Message(
        role=system_message.role,
        content=list(parts),
        name=system_message.name,
        score=system_message.score,
        pinned=system_message.pinned,
        metadata=dict(system_message.metadata),
    )
