"""Parts the context views share (internal).

Checks of their arguments, the ledger of what a window kept and left out, first-page
sizing and the budget check. `memstore.views` and `memstore.views.summary`
build their views from these. Pure: no SQL, no I/O.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

from memstore._validate import MAX_VIEW_INT, check_flag, check_json, short_repr, text_problem
from memstore.errors import ConfigurationError, ContextBudgetError
from memstore.models import Message, StoredMessage, build_trusted
from memstore.tokens import TokenCounter, counter_priming, validate_counter
from memstore.views.base import ContextView
from memstore.views.history import HistorySource
from memstore.views.units import (
    DEFAULT_FIRST_PAGE,
    DEFAULT_MAX_PAGE,
    AnchorSet,
    Unit,
    resolve_anchors,
)
from memstore.views.window import ContextWindow, Omission, OmissionReason, WindowReport

__all__ = [
    "BUDGET_MAX_FIRST_PAGE",
    "MAX_PLACEHOLDER_CHARS",
    "MAX_VIEW_INT",
    "check_format_template",
]

#: Longest placeholder text a HeadAndTailView template may produce (characters).
MAX_PLACEHOLDER_CHARS = 2000

#: Largest width or precision a placeholder template's format spec may ask for.
_MAX_SPEC_NUMBER = 200


# ---- validation helpers ----------------------------------------------------------------


_short = short_repr


def _check_int(view: str, name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigurationError(f"{view} {name} must be an int, got {_short(value)}")
    if value < minimum:
        raise ConfigurationError(f"{view} {name} must be >= {minimum}, got {_short(value)}")
    if value > MAX_VIEW_INT:
        raise ConfigurationError(
            f"{view} {name} must be <= 2**53 - 1 ({MAX_VIEW_INT}), got {_short(value)}"
        )


def _check_bool(view: str, name: str, value: object) -> None:
    check_flag(value, f"{view} {name}", ConfigurationError)


def _check_real(view: str, name: str, value: object) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigurationError(f"{view} {name} must be a number, got {_short(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ConfigurationError(f"{view} {name} must be finite, got {_short(value)}")
    return number


def _field_list(fields: Sequence[str]) -> str:
    """``{a}``, ``{a} and {b}``, ``{a}, {b} and {c}``: the fields a template may use."""
    names = [f"{{{name}}}" for name in fields]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def check_format_template(
    where: str,
    template: object,
    fields: Sequence[str],
    samples: Sequence[Mapping[str, object]],
    *,
    bound_output: bool,
) -> None:
    """Validate a user template: only ``fields``, bounded format specs, storable text.

    The template is at most ``MAX_PLACEHOLDER_CHARS`` characters of storable text,
    uses no attribute or index access, and no format spec asks for widths or
    precisions above 200. It must format with every mapping in ``samples``; with
    ``bound_output`` the text it produces for each is at most
    ``MAX_PLACEHOLDER_CHARS`` characters too.

    Raises:
        ConfigurationError: naming ``where`` and what is wrong.
    """
    if not isinstance(template, str):
        raise ConfigurationError(f"{where} must be a str, got {_short(template)}")
    if len(template) > MAX_PLACEHOLDER_CHARS:
        raise ConfigurationError(
            f"{where} is {len(template)} characters long; the maximum is {MAX_PLACEHOLDER_CHARS}"
        )
    problem = text_problem(template)
    if problem is not None:
        raise ConfigurationError(f"{where} {problem}")
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigurationError(f"{where} {template!r} is not a format string: {exc}") from exc
    available = _field_list(fields)
    for _literal, field_name, spec, _conversion in parsed:
        if field_name is None:
            continue
        if field_name not in fields:
            raise ConfigurationError(
                f"{where} {template!r} has the field {{{field_name}}}; only {available} "
                "are available"
            )
        if spec and ("{" in spec or any(
                len(d) > 3 or int(d) > _MAX_SPEC_NUMBER for d in re.findall(r"\d+", spec))):
            raise ConfigurationError(
                f"{where} {template!r}: the format spec {spec!r} asks for more than "
                f"{_MAX_SPEC_NUMBER} characters (or nests a field)"
            )
    for sample in samples:
        try:
            text = template.format(**sample)
        except (KeyError, IndexError, ValueError, AttributeError, TypeError,
                OverflowError) as exc:  # OverflowError: ``{n:c}`` past U+10FFFF
            raise ConfigurationError(
                f"{where} {template!r} does not format with {available}: {exc!r}"
            ) from exc
        problem = text_problem(text)
        if problem is not None:  # ``{n:c}`` of a surrogate's number, say
            raise ConfigurationError(
                f"{where} {template!r} makes text that cannot be stored for "
                f"{_short(dict(sample))}: it {problem}"
            )
        if bound_output and len(text) > MAX_PLACEHOLDER_CHARS:
            raise ConfigurationError(
                f"{where} {template!r} produces {len(text)} characters; the maximum is "
                f"{MAX_PLACEHOLDER_CHARS}"
            )


def _check_template(view: str, template: object) -> None:
    """Validate a placeholder template: ``{n}``/``{messages}`` fields, bounded output."""
    check_format_template(
        f"{view} placeholder_template", template, ("n", "messages"),
        [{"n": count, "messages": "message" if count == 1 else "messages"}
         for count in (0, 1, 2, 0xD800, MAX_VIEW_INT)],
        bound_output=True,
    )


def _check_budget_params(view: str, token_limit: object, reserve: object) -> None:
    _check_int(view, "token_limit", token_limit, 1)
    _check_int(view, "reserve", reserve, 0)
    if cast(int, reserve) >= cast(int, token_limit):
        raise ConfigurationError(
            f"{view} reserve ({reserve}) must be smaller than token_limit ({token_limit})"
        )


def _normalize_tools(view: str, tools: object) -> tuple[dict[str, Any], ...] | None:
    if tools is None:
        return None
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ConfigurationError(
            f"{view} tools must be a list of JSON objects, got {_short(tools)}"
        )
    try:
        check_json(list(tools), f"{view} tools")
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    try:
        copied = json.loads(json.dumps(list(tools), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{view} tools must be JSON-serialisable: {exc}") from exc
    if not all(isinstance(item, dict) for item in copied):
        raise ConfigurationError(f"{view} tools must be a list of JSON objects")
    return tuple(copied) if copied else None


def _check_counter(view: str, counter: object, tools: object = None) -> None:
    if counter is None:
        return
    validate_counter(counter, f"{view} counter")
    if tools and not callable(getattr(counter, "count_tools", None)):
        raise ConfigurationError(
            f"{view} counter {cast(TokenCounter, counter).name!r} has no count_tools method, "
            "so it cannot count the schemas given as tools=; implement count_tools(tools) -> "
            "int (or subclass memstore.BaseTokenCounter, which provides it), or leave "
            "tools= unset and add their tokens to reserve="
        )


# ---- the ledger: what a window kept, what it left out and why ------------------------------


class _Ledger:
    """Collects kept messages and per-seq omission reasons; builds the window."""

    def __init__(
        self,
        view: ContextView,
        source: HistorySource,
        counter: TokenCounter,
        default: OmissionReason | None,
    ) -> None:
        self.view = view
        self.source = source
        self.counter = counter
        self.default = default
        self.kept: dict[int, StoredMessage] = {}
        self.reasons: dict[int, OmissionReason] = {}

    def keep(self, unit: Unit) -> None:
        kept, reasons = self.kept, self.reasons
        for m in unit.messages:
            kept[m.seq] = m
            if reasons:
                reasons.pop(m.seq, None)

    def omit(self, unit: Unit, reason: OmissionReason) -> None:
        for m in unit.messages:
            self.kept.pop(m.seq, None)
            self.reasons[m.seq] = reason

    def anchor(self) -> AnchorSet:
        anchors = resolve_anchors(self.source)
        for unit in anchors.units:
            self.keep(unit)
        for unit in anchors.incomplete:
            self.omit(unit, "incomplete_unit")
        return anchors

    def candidates(self, units: Iterator[Unit]) -> Iterator[Unit]:
        """Complete, non-anchored units of ``units``; incomplete ones are recorded."""
        for unit in units:
            if not unit.complete:
                self.omit(unit, "incomplete_unit")
            elif not unit.anchored:
                yield unit

    def unread(self, first: int, last: int) -> list[tuple[int, int, OmissionReason]]:
        """The omission runs of ``first..last``, seqs the view neither kept nor omitted.

        A view that stops reading early reports them with its ``default`` reason.
        """
        if self.default is None:  # pragma: no cover - a view that reads everything
            raise AssertionError(f"seqs {first}..{last} were neither kept nor omitted")
        return [(first, last, self.default)]

    def omissions(self) -> list[Omission]:
        runs: list[Omission] = []

        def add(first: int, last: int, reason: OmissionReason) -> None:
            if runs and runs[-1].reason == reason and runs[-1].last_seq == first - 1:
                first = runs.pop().first_seq
            runs.append(build_trusted(Omission, {
                "first_seq": first, "last_seq": last, "count": last - first + 1,
                "reason": reason,
            }))

        if self.source.message_count == 0:
            return runs
        kept, reasons = self.kept, self.reasons
        prev = self.source.first_seq - 1
        for seq in sorted(kept.keys() | reasons.keys()):
            if seq > prev + 1:
                for run in self.unread(prev + 1, seq - 1):
                    add(*run)
            if seq not in kept:
                add(seq, seq, reasons[seq])
            prev = seq
        if prev < self.source.last_seq:
            for run in self.unread(prev + 1, self.source.last_seq):
                add(*run)
        return runs

    def build(
        self,
        *,
        budget: int | None = None,
        placeholder: Message | None = None,
        placeholder_after: int = 0,
        skipped: int = 0,
    ) -> ContextWindow:
        kept = self.kept
        stored = [kept[s] for s in sorted(kept)]
        # No copy unless a placeholder goes in (``stored`` is not changed afterwards).
        messages = list[StoredMessage | Message](stored) if placeholder is not None else cast(
            list[StoredMessage | Message], stored
        )
        counter = self.counter
        name = counter.name
        tokens = 0
        for m in stored:
            tokens += m.token_count if m.token_counter == name else counter.count_message(m)
        if placeholder is not None:
            index = sum(1 for m in stored if m.seq <= placeholder_after)
            messages.insert(index, placeholder)
            tokens += counter.count_message(placeholder)
        if messages:
            tokens += counter_priming(counter)
        return self.result(messages, len(stored), tokens, budget, self.omissions(),
                           placeholder=placeholder.text if placeholder is not None else None,
                           skipped=skipped)

    def result(
        self,
        messages: list[StoredMessage | Message],
        included: int,
        tokens: int,
        budget: int | None,
        omitted: list[Omission],
        *,
        placeholder: str | None = None,
        skipped: int = 0,
        summary_range: tuple[int, int] | None = None,
        unsummarized: int = 0,
    ) -> ContextWindow:
        """The window and its report, from values computed by the view."""
        # Every value is computed from validated models: build the result without
        # re-validating it (this runs once per window read).
        report = build_trusted(WindowReport, {
            "view": type(self.view).__name__,
            "counter": self.counter.name,
            "conversation_message_count": self.source.message_count,
            "included_count": included,
            "omitted": omitted,
            "placeholder": placeholder,
            "skipped": skipped,
            "rows_read": self.source.rows_read,
            "summary_range": summary_range,
            "unsummarized": unsummarized,
            "conversation_exists": True,
        })
        return build_trusted(ContextWindow, {
            "conversation_id": self.source.conversation_id,
            "messages": messages,
            "token_count": tokens,
            "budget": budget,
            "report": report,
        })


def _start_on_user(ledger: _Ledger, units: Sequence[Unit]) -> list[Unit]:
    """What ``start_on_user=True`` keeps of a window's non-anchored units.

    ``units`` are the complete, non-anchored units a view kept, chronological: the
    last one is the newest unit. They are left out (reason ``"start_on_user"``) from
    the oldest until the first starts with a user message, never the newest one: when
    no other unit starts with a user message, only the newest remains. Anchored
    messages are not turns and are kept wherever they are.
    """
    k = 0
    while k < len(units) - 1 and not units[k].starts_with_user:
        ledger.omit(units[k], "start_on_user")
        k += 1
    return list(units[k:])


def _first_page(size_hint: int) -> int:
    """A first page big enough for a count-based view to finish in one read, usually."""
    return min(max(size_hint + 2, 8), DEFAULT_MAX_PAGE)


#: Cap of a budgeted view's first page (rows).
BUDGET_MAX_FIRST_PAGE = 2048


def _budget_page(source: HistorySource, token_limit: int) -> int:
    """A first page that usually holds a whole budgeted window, from the mean message size.

    ``token_total / message_count`` estimates tokens per message, so about
    ``token_limit / mean`` messages fit; 20 % and a few rows of slack make one read the
    common case. A wrong estimate costs only an extra page: later pages double.
    """
    prefetched = getattr(source, "first_page_for", None)  # optional: see HistorySource
    if prefetched is not None:
        page: int | None = prefetched(token_limit)
        if page is not None:
            return page
    count = source.message_count
    total = getattr(source, "token_total", 0)  # tolerate sources written before it existed
    if count <= 0 or total <= 0:
        return DEFAULT_FIRST_PAGE
    expected = token_limit * count / total
    return min(max(int(expected * 1.2) + 8, 8), BUDGET_MAX_FIRST_PAGE)


def _budget_check(
    view: ContextView,
    counter: TokenCounter,
    token_limit: int,
    reserve: int,
    tools_tokens: int,
    anchored_tokens: int,
    newest_tokens: int,
) -> int:
    """Return the budget left after the required part, or raise ContextBudgetError.

    ``tools_tokens`` is `count_tool_schemas()` of the view's
    tools, computed once per window.
    """
    priming = counter_priming(counter)
    required = anchored_tokens + newest_tokens + priming + reserve + tools_tokens
    if required > token_limit:
        raise ContextBudgetError(
            f"{type(view).__name__}: the anchored messages ({anchored_tokens} tokens) and the "
            f"newest unit ({newest_tokens}) with reply priming ({priming}), reserve ({reserve}) "
            f"and tool schemas ({tools_tokens}) need {required} tokens; "
            f"token_limit is {token_limit}",
            required=required,
            budget=token_limit,
        )
    return token_limit - required
