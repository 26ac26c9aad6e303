"""The memories API over real HTTP against a real PostgreSQL: every gesture, its answers,
and bad input refused with a stable code while the database stays exactly as it was.

Fingerprints come from the fake embeddings server (over HTTP, scripted cosines where a test
needs two texts close), so search results, recognition and the contradiction guard are
deterministic.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import orjson
import pytest

from actors.clock import ManualClock
from actors.memory.keeper import MemoryKeeper
from actors.messages import Attach
from tests.conftest import Harness
from tests.fakes.embeddings_server import FakeEmbeddings, Late
from tests.memory_support import MODEL, Script

OWEN = {
    "text": "My brother Owen lives in Bristol.",
    "type": "fact",
    "people": ["owen"],
    "themes": ["family", "bristol"],
}
LISBON = {"text": "The trip is to Lisbon.", "type": "fact", "themes": ["trip"]}
PORTO = {"text": "The trip is to Porto.", "type": "fact", "themes": ["trip"]}


class Api:
    """One person's HTTP client for the memories API (device secret in a header)."""

    def __init__(self, harness: Harness, device: str | None = None) -> None:
        self.harness = harness
        self.device = device or "device-" + uuid.uuid4().hex
        self.person = harness.server.identity.person(device=self.device)

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        sent = {"X-Stillhere-Device": self.device} if headers is None else headers
        data = raw if raw is not None else (orjson.dumps(body) if body is not None else None)
        async with self.harness.http.request(
            method, self.harness.url(path), data=data, params=params, headers=sent
        ) as response:
            return response.status, orjson.loads(await response.read())

    async def create(self, memory: dict[str, Any]) -> dict[str, Any]:
        status, answer = await self.call("POST", "/v1/memories", memory)
        assert status in (200, 201), answer
        return answer

    async def listed(self, **params: str) -> list[str]:
        """The texts a list answers, in order."""
        status, answer = await self.call("GET", "/v1/memories", params=params)
        assert status == 200, answer
        return [m["text"] for m in answer["memories"]]


@pytest.fixture
async def api(harness: Harness, fake_embeddings: FakeEmbeddings) -> Api:
    await harness.start(embed_url=fake_embeddings.url, embed_model=MODEL)
    return Api(harness)


def keeper_of(api: Api) -> MemoryKeeper:
    memory = api.harness.server.runtime.memory
    assert memory is not None
    return memory


async def found(api: Api, query: str) -> list[str]:
    """What a search by meaning finds (what the model would be handed)."""
    return [f.memory.text for f in await keeper_of(api).search(api.person, query)]


async def snapshot(db: asyncpg.Connection) -> tuple[list[Any], ...]:
    """Everything a gesture could change, to assert that a refused one changed nothing."""
    return (
        [tuple(r) for r in await db.fetch("SELECT * FROM cards ORDER BY id")],
        [tuple(r) for r in await db.fetch("SELECT * FROM memory_links ORDER BY source, kind")],
        [tuple(r) for r in await db.fetch("SELECT * FROM reinforcements ORDER BY id")],
        [tuple(r) for r in await db.fetch("SELECT * FROM memory_generations ORDER BY person")],
    )


async def insert(
    db: asyncpg.Connection, person: str, text: str, kind: str = "memo", **columns: Any
) -> uuid.UUID:
    """A memory written straight into the table, with whatever columns the test needs."""
    values = {
        "id": uuid.uuid4(),
        "person": person,
        "kind": kind,
        "text": text,
        "created_at": datetime(2026, 5, 1, tzinfo=UTC),
        **columns,
    }
    names = ", ".join(values)
    marks = ", ".join(f"${i}" for i in range(1, len(values) + 1))
    await db.execute(f"INSERT INTO cards ({names}) VALUES ({marks})", *values.values())
    return values["id"]


def move_to(clock: ManualClock, when: datetime) -> None:
    clock.advance((when - clock.now()).total_seconds())


# -- creating ---------------------------------------------------------------------------------


async def test_create_answers_created_or_which_memory_it_reinforced(
    api: Api, script: Script, db: asyncpg.Connection
) -> None:
    script.close_to(LISBON["text"], PORTO["text"], 0.9)
    created = await api.create(OWEN)
    status, again = await api.call("POST", "/v1/memories", {**OWEN, "text": OWEN["text"].upper()})
    await api.create(LISBON)
    status_porto, porto = await api.call("POST", "/v1/memories", PORTO)

    memory = created["memory"]
    assert created["result"] == "created" and created["conflicts"] == []
    assert memory["text"] == OWEN["text"] and memory["type"] == "fact"
    assert memory["people"] == ["owen"] and memory["themes"] == ["family", "bristol"]
    assert memory["status"] == "active" and memory["mention_count"] == 1
    assert memory["corrected_by"] is None and memory["all_day"] is False
    assert memory["first_mentioned"] == memory["last_mentioned"] == "2026-05-19T09:00:00+00:00"
    for field in ("starts_at", "ends_at", "due_at", "resolved_at"):
        assert memory[field] is None
    assert (status, again["result"], again["reinforced"]) == (200, "reinforced", memory["id"])
    assert again["memory"]["mention_count"] == 2 and again["tier"] == "exact"
    # Porto is as close as a rewording, but says another place: stored beside, linked.
    assert status_porto == 201 and porto["result"] == "created"
    assert [c["text"] for c in porto["conflicts"]] == [LISBON["text"]]
    assert await db.fetchval("SELECT count(*) FROM cards") == 3
    assert await db.fetchval("SELECT kind FROM memory_links") == "contradicts"


async def test_calendar_fields_are_stored_and_an_all_day_time_is_its_date(api: Api) -> None:
    answer = await api.create(
        {
            "text": "Owen's birthday party",
            "type": "appointment",
            "people": ["owen"],
            "starts_at": "2026-05-23T00:00:00+02:00",
            "all_day": True,
        }
    )
    timed = await api.create(
        {"text": "Dentist", "type": "appointment", "starts_at": "2026-05-20T15:00:00+01:00"}
    )

    assert answer["memory"]["starts_at"] == "2026-05-23T00:00:00+00:00"
    assert answer["memory"]["all_day"] is True
    assert timed["memory"]["starts_at"] == "2026-05-20T14:00:00+00:00"


async def test_a_slow_embedder_never_holds_the_request_the_memory_is_stored_first(
    harness: Harness, fake_embeddings: FakeEmbeddings, db: asyncpg.Connection
) -> None:
    await harness.start(embed_url=fake_embeddings.url, embed_model=MODEL, fingerprint_wait=0.05)
    api = Api(harness)
    release = asyncio.Event()
    fake_embeddings.queue(Late(release))

    async with asyncio.timeout(10):  # answered while the embedder still holds the request
        created = await api.create(OWEN)

    row = await db.fetchrow("SELECT text, fingerprint, fingerprint_model FROM cards")
    assert created["result"] == "created" and row["text"] == OWEN["text"]
    assert row["fingerprint"] is None and row["fingerprint_model"] is None
    release.set()
    await until(lambda: db.fetchval("SELECT fingerprint_model FROM cards"), MODEL)
    assert await found(api, OWEN["text"]) == [OWEN["text"]]


async def until(read: Any, expected: Any) -> None:
    """Wait until `read()` gives `expected`: for what the server finishes on its own."""
    async with asyncio.timeout(10):
        while await read() != expected:
            await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({}, "text"),
        ({"text": "  "}, "text"),
        ({"text": 12}, "text"),
        ({"text": "x" * 4001}, "4000"),
        ({"text": "ok", "type": "two words"}, "type"),
        ({"text": "ok", "type": 3}, "type"),
        ({"text": "ok", "people": "owen"}, "people"),
        ({"text": "ok", "themes": [1]}, "themes"),
        ({"text": "ok", "due_at": "next Tuesday"}, "ISO 8601"),
        ({"text": "ok", "due_at": 5}, "due_at"),
        ({"text": "ok", "all_day": "yes"}, "all_day"),
    ],
)
async def test_a_bad_memory_is_refused_and_nothing_stored(
    api: Api, db: asyncpg.Connection, body: dict[str, Any], why: str
) -> None:
    status, answer = await api.call("POST", "/v1/memories", body)

    assert status == 400 and answer["type"] == "error" and answer["code"] == "invalid_field"
    assert why in answer["message"]
    assert await db.fetchval("SELECT count(*) FROM cards") == 0


# -- listing ----------------------------------------------------------------------------------


async def test_list_filters_newest_mentioned_first(api: Api, db: asyncpg.Connection) -> None:
    start = datetime(2026, 5, 1, tzinfo=UTC)
    for day in range(5):
        await insert(db, api.person, f"memo {day}", created_at=start + timedelta(days=day))
    earlier = start - timedelta(days=1)
    await insert(db, api.person, "Dentist on Tuesday", "appointment", created_at=earlier)
    await insert(db, api.person, "muted memo", status="muted", created_at=start)
    await insert(db, api.person, "wrong memo", status="erroneous", created_at=start)
    # Mentioned again lately: first in the list, whenever it was created.
    await db.execute(
        "UPDATE cards SET last_mentioned = $1 WHERE text = 'memo 1'", start + timedelta(days=9)
    )
    await insert(db, Api(api.harness).person, "someone else's memo")

    assert await api.listed() == [
        "memo 1", "memo 4", "memo 3", "memo 2", "memo 0", "Dentist on Tuesday",
    ]  # fmt: skip
    assert await api.listed(status="muted") == ["muted memo"]
    both = await api.listed(status="erroneous,muted")
    assert sorted(both) == ["muted memo", "wrong memo"]  # one time: the order is by id
    assert await api.listed(status="erroneous", type="memo") == ["wrong memo"]
    assert await api.listed(type="Appointment") == ["Dentist on Tuesday"]
    assert await api.listed(text="DENTIST") == ["Dentist on Tuesday"]
    assert await api.listed(text="memo", status="muted") == ["muted memo"]
    assert await api.listed(text="nothing like it") == []


async def test_list_pages_by_cursor_or_offset(api: Api, db: asyncpg.Connection) -> None:
    start = datetime(2026, 5, 1, tzinfo=UTC)
    same = start + timedelta(days=3)
    for n in range(7):  # three share one time: the id breaks the tie, nothing is lost
        when = same if n in (2, 3, 4) else start + timedelta(days=n)
        await insert(db, api.person, f"memo {n}", created_at=when)
    everything = await api.listed(limit="500")

    pages: list[list[str]] = []
    params = {"limit": "3"}
    while True:
        status, answer = await api.call("GET", "/v1/memories", params=params)
        assert status == 200, answer
        pages.append([m["text"] for m in answer["memories"]])
        if answer["next_cursor"] is None:
            break
        params = {"limit": "3", "cursor": answer["next_cursor"]}

    assert len(everything) == 7
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [t for p in pages for t in p] == everything
    assert await api.listed(limit="3", offset="3") == everything[3:6]
    assert await api.listed(offset="6") == everything[6:]


@pytest.mark.parametrize(
    "params",
    [
        {"limit": "0"},
        {"limit": "501"},
        {"limit": "ten"},
        {"offset": "-1"},
        {"offset": "1" + "0" * 30},
        {"status": "forgotten"},
        {"status": "active,bogus"},
        {"type": "not a type"},
        {"cursor": "not-a-cursor"},
        {"cursor": "MjAyNnwx", "offset": "3"},
        {"text": "x" * 1001},
    ],
)
async def test_bad_list_filters_are_refused(api: Api, params: dict[str, str]) -> None:
    status, answer = await api.call("GET", "/v1/memories", params=params)
    assert (status, answer["code"]) == (400, "invalid_field"), answer


# -- mute, unmute, forget: and what search finds --------------------------------------------


async def test_mute_unmute_and_forget_change_what_search_finds(
    api: Api, db: asyncpg.Connection
) -> None:
    owen = (await api.create(OWEN))["memory"]["id"]
    await api.create(LISBON)
    assert OWEN["text"] in await found(api, OWEN["text"])  # the index is built and warm

    status, muted = await api.call("POST", f"/v1/memories/{owen}/mute")
    assert status == 200 and muted["changed"] is True and muted["memory"]["status"] == "muted"
    assert OWEN["text"] not in await found(api, OWEN["text"])
    assert await api.listed() == [LISBON["text"]]
    assert await api.listed(status="muted") == [OWEN["text"]]
    _, again = await api.call("POST", f"/v1/memories/{owen}/mute")
    assert again["changed"] is False  # muting twice is harmless

    status, unmuted = await api.call("POST", f"/v1/memories/{owen}/unmute")
    assert status == 200 and unmuted["changed"] is True
    assert unmuted["memory"]["status"] == "active"
    assert OWEN["text"] in await found(api, OWEN["text"])

    status, gone = await api.call("DELETE", f"/v1/memories/{owen}", params={"confirm": "forget"})
    assert (status, gone) == (200, {"forgotten": owen})
    assert OWEN["text"] not in await found(api, OWEN["text"])
    assert await db.fetchval("SELECT count(*) FROM cards WHERE id = $1", uuid.UUID(owen)) == 0
    status, answer = await api.call("GET", f"/v1/memories/{owen}")
    assert (status, answer["code"]) == (404, "unknown_memory")


async def test_an_index_built_before_a_mute_never_serves_it(api: Api) -> None:
    """The index follows a gesture at once (by generation), not at its next rebuild."""
    owen = (await api.create(OWEN))["memory"]["id"]
    index = keeper_of(api).index
    await found(api, OWEN["text"])
    builds = index.builds

    await api.call("POST", f"/v1/memories/{owen}/mute")

    assert await found(api, OWEN["text"]) == []
    assert index.builds == builds  # followed in place, not rebuilt


async def test_unmuting_a_merged_memory_undoes_the_merge(
    api: Api, script: Script, db: asyncpg.Connection
) -> None:
    from actors.memory.consolidation import consolidate

    short = {**OWEN, "text": "Owen lives in Bristol."}
    script.close_to(OWEN["text"], short["text"], 0.95)
    await insert(db, api.person, short["text"], "fact", people=["owen"], themes=["family"])
    await api.create(OWEN)  # recognised? no: the inserted one has no fingerprint yet
    await keeper_of(api).backfill()
    [merge] = await consolidate(keeper_of(api), api.person)
    [absorbed] = merge.muted

    status, bulk = await api.call(
        "POST", "/v1/memories/bulk", {"action": "unmute", "ids": [str(absorbed)]}
    )
    assert status == 200 and bulk["changed"] == 0 and bulk["merged"] == [str(absorbed)]
    status, answer = await api.call("POST", f"/v1/memories/{absorbed}/unmute")

    assert status == 200 and answer["changed"] is True
    assert answer["memory"]["status"] == "active"
    kinds = {r["kind"] for r in await db.fetch("SELECT kind FROM memory_links")}
    assert kinds == {"distinct"}  # the pass keeps them apart from now on


async def test_forgetting_takes_the_trace_of_merges_along(
    api: Api, script: Script, db: asyncpg.Connection
) -> None:
    from actors.memory.consolidation import consolidate

    short = {**OWEN, "text": "Owen lives in Bristol."}
    script.close_to(OWEN["text"], short["text"], 0.95)
    await insert(db, api.person, short["text"], "fact", people=["owen"], themes=["family"])
    reference = (await api.create(OWEN))["memory"]["id"]
    await keeper_of(api).backfill()
    [merge] = await consolidate(keeper_of(api), api.person)
    [absorbed] = merge.muted
    assert await db.fetchval("SELECT count(*) FROM reinforcements WHERE new_id = $1", absorbed)

    status, _ = await api.call("DELETE", f"/v1/memories/{absorbed}", params={"confirm": "forget"})

    assert status == 200
    assert await db.fetchval("SELECT count(*) FROM reinforcements") == 0
    assert [str(r["id"]) for r in await db.fetch("SELECT id FROM cards")] == [reference]


async def test_forget_needs_the_exact_confirmation(api: Api, db: asyncpg.Connection) -> None:
    owen = (await api.create(OWEN))["memory"]["id"]
    before = await snapshot(db)

    for params in ({}, {"confirm": "yes"}, {"confirm": "FORGET"}):
        status, answer = await api.call("DELETE", f"/v1/memories/{owen}", params=params)
        assert (status, answer["code"]) == (400, "confirmation_required")
        assert '"confirm": "forget"' in answer["message"]
    assert await snapshot(db) == before


# -- erroneous ---------------------------------------------------------------------------------


async def test_an_erroneous_memory_stays_reachable_through_its_link(
    api: Api, script: Script, db: asyncpg.Connection
) -> None:
    script.close_to(LISBON["text"], PORTO["text"], 0.9)
    lisbon = (await api.create(LISBON))["memory"]["id"]
    porto = (await api.create(PORTO))["memory"]["id"]

    status, answer = await api.call(
        "POST", f"/v1/memories/{lisbon}/erroneous", {"corrected_by": porto}
    )
    assert status == 200 and answer["changed"] is True
    assert answer["memory"]["status"] == "erroneous"
    assert answer["memory"]["corrected_by"] == porto

    assert await api.listed() == [PORTO["text"]]
    assert await api.listed(status="erroneous") == [LISBON["text"]]
    # "Why did you think it was Lisbon?": from the right one to the wrong one, and back.
    _, right = await api.call("GET", f"/v1/memories/{porto}")
    corrects = [link for link in right["links"] if link["kind"] == "corrects"]
    assert corrects == [
        {
            "kind": "corrects",
            "source": porto,
            "target": lisbon,
            "memory": {"id": lisbon, "type": "fact", "text": LISBON["text"], "status": "erroneous"},
        }
    ]
    status, wrong = await api.call("GET", f"/v1/memories/{lisbon}")
    assert status == 200 and wrong["memory"]["status"] == "erroneous"
    assert {link["kind"] for link in wrong["links"]} == {"contradicts", "corrects"}
    # Search finds the right one by meaning, and the wrong one through its link.
    assert await found(api, PORTO["text"]) == [PORTO["text"], LISBON["text"]]


async def test_a_muted_memory_is_reachable_by_its_id(api: Api) -> None:
    owen = (await api.create(OWEN))["memory"]["id"]
    await api.call("POST", f"/v1/memories/{owen}/mute")

    status, answer = await api.call("GET", f"/v1/memories/{owen}")

    assert status == 200 and answer["memory"]["status"] == "muted" and answer["links"] == []


async def test_bad_corrections_are_refused_and_nothing_changes(
    api: Api, db: asyncpg.Connection
) -> None:
    lisbon = (await api.create(LISBON))["memory"]["id"]
    porto = (await api.create(PORTO))["memory"]["id"]
    theirs = (await Api(api.harness).create(OWEN))["memory"]["id"]
    await api.call("POST", f"/v1/memories/{porto}/erroneous", {"corrected_by": lisbon})
    before = await snapshot(db)
    nobody = str(uuid.uuid4())

    cases = [
        (lisbon, {}, 400, "invalid_field", None),
        (lisbon, {"corrected_by": 7}, 400, "invalid_field", None),
        (lisbon, {"corrected_by": lisbon}, 400, "invalid_field", None),
        (lisbon, {"corrected_by": porto}, 400, "invalid_field", None),  # itself erroneous
        (lisbon, {"corrected_by": nobody}, 404, "unknown_memory", [nobody]),
        (lisbon, {"corrected_by": theirs}, 404, "unknown_memory", [theirs]),
        (lisbon, {"corrected_by": "not-an-id"}, 404, "unknown_memory", ["not-an-id"]),
        (theirs, {"corrected_by": lisbon}, 404, "unknown_memory", [theirs]),
        (nobody, {"corrected_by": theirs}, 404, "unknown_memory", None),
    ]
    for target, body, status, code, ids in cases:
        got, answer = await api.call("POST", f"/v1/memories/{target}/erroneous", body)
        assert (got, answer["code"]) == (status, code), (target, body, answer)
        if ids is not None:
            assert answer["ids"] == ids
    assert await snapshot(db) == before


# -- another person's memories are nobody's ------------------------------------------------


async def test_another_persons_ids_are_answered_like_unknown_ids(
    api: Api, db: asyncpg.Connection
) -> None:
    mine = (await api.create(LISBON))["memory"]["id"]
    theirs = (await Api(api.harness).create(OWEN))["memory"]["id"]
    before = await snapshot(db)

    async def answers(target: str) -> list[tuple[int, dict[str, Any]]]:
        got = [
            await api.call("GET", f"/v1/memories/{target}"),
            await api.call("POST", f"/v1/memories/{target}/mute"),
            await api.call("POST", f"/v1/memories/{target}/unmute"),
            await api.call("POST", f"/v1/memories/{target}/erroneous", {"corrected_by": mine}),
            await api.call("DELETE", f"/v1/memories/{target}", params={"confirm": "forget"}),
        ]
        for action in ("mute", "unmute"):
            got.append(
                await api.call(
                    "POST", "/v1/memories/bulk", {"action": action, "ids": [mine, target]}
                )
            )
        body = {"action": "forget", "ids": [target, mine], "confirm": "forget"}
        got.append(await api.call("POST", "/v1/memories/bulk", body))
        return got

    nobody = str(uuid.uuid4())
    for (status, theirs_answer), (_, nobody_answer) in zip(
        await answers(theirs), await answers(nobody), strict=True
    ):
        assert status == 404 and theirs_answer["code"] == "unknown_memory"
        assert theirs_answer["ids"] == [theirs] and nobody_answer["ids"] == [nobody]
        assert {**theirs_answer, "ids": None} == {**nobody_answer, "ids": None}
    assert await snapshot(db) == before


# -- bulk ----------------------------------------------------------------------------------------


async def test_bulk_gestures_on_ten_thousand_memories_are_one_atomic_statement(
    api: Api, db: asyncpg.Connection
) -> None:
    ids = [
        str(r["id"])
        for r in await db.fetch(
            "INSERT INTO cards (id, person, kind, text, created_at) "
            "SELECT gen_random_uuid(), $1, 'memo', 'memo ' || n, "
            "$2::timestamptz + n * interval '1 second' "
            "FROM generate_series(1, 10000) AS n RETURNING id",
            api.person,
            datetime(2026, 5, 1, tzinfo=UTC),
        )
    ]
    theirs = (await Api(api.harness).create(OWEN))["memory"]["id"]

    async def generation() -> int:
        return await db.fetchval(
            "SELECT generation FROM memory_generations WHERE person = $1", api.person
        )

    async def statuses() -> dict[str, int]:
        rows = await db.fetch(
            "SELECT status, count(*) FROM cards WHERE person = $1 GROUP BY status", api.person
        )
        return {r["status"]: r["count"] for r in rows}

    # Refused, all or nothing: one id unknown, another person's, or not an id at all.
    before = await snapshot(db)
    nobody = str(uuid.uuid4())
    for extra in ([nobody], [theirs], ["not-an-id", nobody]):
        status, answer = await api.call(
            "POST", "/v1/memories/bulk", {"action": "mute", "ids": [*ids, *extra]}
        )
        assert (status, answer["code"], answer["ids"]) == (404, "unknown_memory", extra)
    status, answer = await api.call("POST", "/v1/memories/bulk", {"action": "forget", "ids": ids})
    assert (status, answer["code"]) == (400, "confirmation_required")
    assert await snapshot(db) == before

    # Done: one statement each (the generation trigger fires once per statement).
    first = await generation()
    status, answer = await api.call("POST", "/v1/memories/bulk", {"action": "mute", "ids": ids})
    assert (status, answer) == (200, {"action": "mute", "asked": 10_000, "changed": 10_000})
    assert await statuses() == {"muted": 10_000} and await generation() == first + 1
    assert await api.listed() == []

    status, answer = await api.call(
        "POST", "/v1/memories/bulk", {"action": "unmute", "ids": ids[:4000] + ids[:10]}
    )
    assert answer == {"action": "unmute", "asked": 4000, "changed": 4000, "merged": []}
    assert await statuses() == {"active": 4000, "muted": 6000}

    body = {"action": "forget", "ids": ids, "confirm": "forget"}
    status, answer = await api.call("POST", "/v1/memories/bulk", body)
    assert (status, answer) == (200, {"action": "forget", "asked": 10_000, "changed": 10_000})
    assert await statuses() == {} and await generation() == first + 3
    assert await db.fetchval("SELECT count(*) FROM cards WHERE id = $1", uuid.UUID(theirs)) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"ids": ["x"]},
        {"action": "delete", "ids": ["x"]},
        {"action": "mute"},
        {"action": "mute", "ids": []},
        {"action": "mute", "ids": "x"},
        {"action": "mute", "ids": [1, 2]},
        {"action": "mute", "ids": [str(uuid.uuid4())] * 20_001},
    ],
)
async def test_bad_bulk_requests_are_refused(api: Api, body: dict[str, Any]) -> None:
    status, answer = await api.call("POST", "/v1/memories/bulk", body)
    assert (status, answer["code"]) == (400, "invalid_field"), answer


# -- the clean-up sweep ----------------------------------------------------------------------


async def test_the_sweep_takes_what_the_calendar_judges_past(
    api: Api, db: asyncpg.Connection, clock: ManualClock
) -> None:
    now = datetime(2026, 5, 19, 14, 0, tzinfo=UTC)
    move_to(clock, now)
    hour, day = timedelta(hours=1), timedelta(days=1)
    midnight = datetime(2026, 5, 19, tzinfo=UTC)
    me = api.person
    past = {
        await insert(db, me, "dentist, ended an hour ago", "appointment", ends_at=now - hour),
        await insert(db, me, "call, began 2 hours ago", "appointment", starts_at=now - 2 * hour),
        await insert(db, me, "tax return, due yesterday", "task", due_at=now - day),
        await insert(db, me, "done early", "task", due_at=now + day, resolved_at=now - hour),
        await insert(db, me, "ticked off", "task", status="done"),
        await insert(db, me, "yesterday, all day", "appointment", starts_at=midnight - day,
                     all_day=True),
        await insert(db, me, "archived, ended", "appointment", status="archived",
                     ends_at=now - hour),
        await insert(db, me, "muted, due", "reminder", status="muted", due_at=now - hour),
    }  # fmt: skip
    future = {
        await insert(db, me, "party tonight", "appointment", starts_at=now + 5 * hour,
                     ends_at=now + 8 * hour),
        await insert(db, me, "today, all day", "appointment", starts_at=midnight, all_day=True),
        await insert(db, me, "call mum tomorrow", "reminder", due_at=now + day),
        await insert(db, me, "meeting running now", "appointment", starts_at=now - hour,
                     ends_at=now + hour),
        await insert(db, me, "a task with no date", "task"),
    }  # fmt: skip
    untouched = {
        await insert(db, me, "a memo", "memo"),
        await insert(db, me, "a fact that ended", "fact", ends_at=now - day),
        await insert(db, me, "a muted fact", "fact", status="muted"),
        await insert(db, Api(api.harness).person, "theirs, past", "task", due_at=now - day),
    }
    categories = ["appointment", "reminder", "task"]
    before = await snapshot(db)

    status, dry = await api.call(
        "POST", "/v1/memories/cleanup", {"categories": categories, "dry_run": True}
    )
    assert status == 200 and dry["dry_run"] is True and dry["scope"] == "past"
    assert {uuid.UUID(m["id"]) for m in dry["memories"]} == past and dry["count"] == len(past)
    assert {m["text"] for m in dry["memories"]} >= {"dentist, ended an hour ago"}
    assert await snapshot(db) == before

    status, answer = await api.call("POST", "/v1/memories/cleanup", {"categories": categories})
    assert (status, answer["code"]) == (400, "confirmation_required")
    assert await snapshot(db) == before

    status, done = await api.call(
        "POST", "/v1/memories/cleanup", {"categories": categories, "confirm": "cleanup"}
    )
    assert status == 200 and done["dry_run"] is False
    assert {uuid.UUID(m["id"]) for m in done["memories"]} == past
    left = {r["id"] for r in await db.fetch("SELECT id FROM cards")}
    assert left == future | untouched


async def test_the_sweep_of_everything_in_memos_and_muted(api: Api, db: asyncpg.Connection) -> None:
    me = api.person
    memo = await insert(db, me, "a memo", "memo")
    muted_fact = await insert(db, me, "a muted fact", "fact", status="muted")
    muted_task = await insert(db, me, "a muted task", "task", status="muted")
    await insert(db, me, "an active fact", "fact")
    await insert(db, me, "an active task", "task")

    _, only_past = await api.call(
        "POST", "/v1/memories/cleanup", {"categories": ["memo", "muted"], "dry_run": True}
    )
    body = {"categories": ["memo", "muted"], "scope": "all", "confirm": "cleanup"}
    _, everything = await api.call("POST", "/v1/memories/cleanup", body)

    assert only_past["memories"] == []  # no window, not resolved: nothing is past
    assert {uuid.UUID(m["id"]) for m in everything["memories"]} == {memo, muted_fact, muted_task}
    assert sorted(await api.listed()) == ["an active fact", "an active task"]


@pytest.mark.parametrize(
    ("tz", "local_end"),
    [
        ("Europe/London", datetime(2026, 5, 19, 23, 0, tzinfo=UTC)),  # BST: UTC+1
        ("UTC", datetime(2026, 5, 20, 0, 0, tzinfo=UTC)),
        ("America/New_York", datetime(2026, 5, 20, 4, 0, tzinfo=UTC)),  # EDT: UTC-4
        ("Asia/Tokyo", datetime(2026, 5, 19, 15, 0, tzinfo=UTC)),  # UTC+9
    ],
)
async def test_an_all_day_item_ends_at_midnight_in_the_persons_time_zone(
    api: Api, clock: ManualClock, tz: str, local_end: datetime
) -> None:
    await api.create(
        {"text": "Owen's birthday", "type": "appointment", "starts_at": "2026-05-19",
         "all_day": True}
    )  # fmt: skip
    body = {"categories": ["appointment"], "dry_run": True, "tz": tz}

    async def taken() -> int:
        status, answer = await api.call("POST", "/v1/memories/cleanup", body)
        assert status == 200, answer
        return answer["count"]

    move_to(clock, local_end - timedelta(minutes=1))  # 23:59 on the day, there
    assert await taken() == 0
    move_to(clock, local_end)  # 00:00 the next day, there
    assert await taken() == 1


@pytest.mark.parametrize(
    "body",
    [
        {"dry_run": True},
        {"categories": [], "dry_run": True},
        {"categories": ["appointments"], "dry_run": True},
        {"categories": "memo", "dry_run": True},
        {"categories": ["memo"], "scope": "future", "dry_run": True},
        {"categories": ["memo"], "dry_run": "yes"},
        {"categories": ["memo"], "dry_run": True, "tz": "Nowhere/Atlantis"},
        {"categories": ["memo"], "dry_run": True, "tz": "Europe"},
        {"categories": ["memo"], "dry_run": True, "tz": "../../etc/passwd"},
        {"categories": ["memo"], "dry_run": True, "tz": ""},
        {"categories": ["memo"], "dry_run": True, "tz": 1},
        {"categories": ["memo"], "confirm": "cleanup", "tz": "Mars/Olympus"},
    ],
)
async def test_bad_sweeps_are_refused_and_nothing_changes(
    api: Api, db: asyncpg.Connection, body: dict[str, Any]
) -> None:
    await insert(db, api.person, "a memo", "memo")
    before = await snapshot(db)

    status, answer = await api.call("POST", "/v1/memories/cleanup", body)

    assert (status, answer["code"]) == (400, "invalid_field"), answer
    assert await snapshot(db) == before


# -- credentials and malformed bodies ------------------------------------------------------


GESTURES = [
    ("GET", "/v1/memories/{id}"),
    ("POST", "/v1/memories/{id}/mute"),
    ("POST", "/v1/memories/{id}/unmute"),
    ("POST", "/v1/memories/{id}/erroneous"),
    ("DELETE", "/v1/memories/{id}"),
    ("GET", "/v1/memories"),
    ("POST", "/v1/memories"),
    ("POST", "/v1/memories/bulk"),
    ("POST", "/v1/memories/cleanup"),
]


async def test_every_gesture_needs_credentials(api: Api, db: asyncpg.Connection) -> None:
    owen = (await api.create(OWEN))["memory"]["id"]
    before = await snapshot(db)
    body = {
        "text": "x", "action": "forget", "ids": [owen], "confirm": "forget",
        "categories": ["memo", "muted"], "scope": "all", "corrected_by": owen,
    }  # fmt: skip
    refusals = [
        {},
        {"X-Stillhere-Device": "too-short"},
        {"Authorization": "Bearer not.a.token"},
    ]
    for method, path in GESTURES:
        for headers in refusals:
            status, answer = await api.call(
                method,
                path.format(id=owen),
                body if method == "POST" else None,
                params={"confirm": "forget"},
                headers=headers,
            )
            assert (status, answer["code"]) == (401, "unauthorized"), (method, path, answer)
    assert await snapshot(db) == before


async def test_a_token_a_body_or_a_query_may_carry_the_credentials(api: Api) -> None:
    token = api.harness.server.identity.issue("anna")
    anna = Api(api.harness)
    status, created = await anna.call(
        "POST", "/v1/memories", OWEN, headers={"Authorization": f"Bearer {token}"}
    )
    assert status == 201
    owen = created["memory"]["id"]

    status, listed = await anna.call("GET", "/v1/memories", params={"token": token}, headers={})
    assert status == 200 and [m["id"] for m in listed["memories"]] == [owen]
    status, muted = await anna.call(
        "POST", f"/v1/memories/{owen}/mute", {"token": token}, headers={}
    )
    assert status == 200 and muted["changed"] is True
    # The same phone as a device is another person: the account's memory is not there.
    status, answer = await api.call("GET", f"/v1/memories/{owen}")
    assert (status, answer["code"]) == (404, "unknown_memory")


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"text"', b"\xff\xfe"])
async def test_a_malformed_body_is_refused_and_nothing_changes(
    api: Api, db: asyncpg.Connection, raw: bytes
) -> None:
    owen = (await api.create(OWEN))["memory"]["id"]
    before = await snapshot(db)

    for path in ("/v1/memories", "/v1/memories/bulk", "/v1/memories/cleanup",
                 f"/v1/memories/{owen}/mute", f"/v1/memories/{owen}/erroneous"):  # fmt: skip
        status, answer = await api.call("POST", path, raw=raw)
        assert (status, answer["code"]) == (400, "bad_json"), (path, answer)
    assert await snapshot(db) == before


async def test_a_body_over_the_limit_is_refused(api: Api) -> None:
    raw = orjson.dumps({"action": "mute", "ids": ["x" * 1000] * 1100})
    status, answer = await api.call("POST", "/v1/memories/bulk", raw=raw)
    assert (status, answer["code"]) == (413, "body_too_large")


async def test_unknown_ids_in_paths(api: Api) -> None:
    for target in (str(uuid.uuid4()), "not-an-id", "bulk"):
        status, answer = await api.call("GET", f"/v1/memories/{target}")
        assert (status, answer["code"], answer["ids"]) == (404, "unknown_memory", [target])


async def test_the_generation_trigger_after_migration_003(api: Api, db: asyncpg.Connection) -> None:
    """003 replans the trigger's UPDATE branch on every run (a plan cached from a first run
    on no rows made a later 10,000-row mute take about 25 s); what it counts is unchanged."""
    other = Api(api.harness).person
    await db.execute(
        "INSERT INTO cards (id, person, kind, text, created_at) "
        "SELECT gen_random_uuid(), $1, 'memo', 'memo ' || n, now() "
        "FROM generate_series(1, 10000) AS n",
        api.person,
    )

    async def generations() -> dict[str, int]:
        rows = await db.fetch("SELECT person, generation FROM memory_generations")
        return {r["person"]: r["generation"] for r in rows}

    first = await generations()
    await db.execute("UPDATE cards SET status = 'muted' WHERE person = 'nobody'")
    await db.execute("UPDATE cards SET mention_count = 2 WHERE person = $1", api.person)
    assert await generations() == first  # nothing the index holds changed
    await db.execute("UPDATE cards SET status = 'muted' WHERE person = $1", api.person)
    assert await generations() == {api.person: first[api.person] + 1}
    await db.execute(
        "UPDATE cards SET person = $1 WHERE id = (SELECT min(id::text)::uuid FROM cards)", other
    )
    assert await generations() == {api.person: first[api.person] + 2, other: 1}


async def test_a_memory_muted_mid_conversation_leaves_the_model_s_reach_at_once(
    api: Api,
) -> None:
    phone = await api.harness.phone(api.device)
    await phone.say("Note that Owen arrives Friday evening")
    card = (await phone.expect("card"))["card"]
    await phone.reply()
    status, _ = await api.call("POST", f"/v1/memories/{card['id']}/mute")
    assert status == 200
    live = api.harness.server.directory.get(api.person)
    assert live is not None
    snapshot = await live.ask(Attach)  # what the next turn would hand the model
    assert [c.id for c in snapshot.cards] == []
    again = await api.harness.phone(api.device)
    assert again.welcome["resumed"] is True and again.welcome["cards"] == []
