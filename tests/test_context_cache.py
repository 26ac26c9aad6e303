"""The context cache on its own: what it gives back, for how long, and how much it holds.
(test_context.py covers it end to end: generations bumped by the database, reads skipped.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from actors.context_cache import ContextCache

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_answers_hold_for_their_generation_and_ttl() -> None:
    cache = ContextCache(ttl_s=60)
    cache.put("p", 3, T0, {"rules": ["Be brief."]})
    assert cache.get("p", 3, T0 + timedelta(seconds=59)) == {"rules": ["Be brief."]}
    assert cache.get("p", 4, T0) == {}  # something changed since
    assert cache.get("p", 3, T0 + timedelta(seconds=60)) == {}  # too old
    assert cache.get("p", 3, T0 - timedelta(seconds=1)) == {}  # a clock set back
    assert cache.get("q", 3, T0) == {}


def test_answers_of_one_generation_add_up_and_a_new_one_replaces_them() -> None:
    cache = ContextCache(ttl_s=60)
    cache.put("p", 1, T0, {"rules": []})
    cache.put("p", 1, T0 + timedelta(seconds=5), {"sample": ["x"]})  # a read that failed before
    assert cache.get("p", 1, T0 + timedelta(seconds=59)) == {"rules": [], "sample": ["x"]}
    cache.put("p", 2, T0, {"recent": ["y"]})
    assert cache.get("p", 2, T0) == {"recent": ["y"]}


def test_the_least_recently_used_person_goes_first() -> None:
    cache = ContextCache(ttl_s=60, max_persons=2)
    cache.put("a", 1, T0, {"rules": []})
    cache.put("b", 1, T0, {"rules": []})
    assert cache.get("a", 1, T0)  # a is now the more recent
    cache.put("c", 1, T0, {"rules": []})
    assert len(cache) == 2
    assert cache.get("b", 1, T0) == {} and cache.get("a", 1, T0) and cache.get("c", 1, T0)
    cache.drop("a")
    assert cache.get("a", 1, T0) == {} and len(cache) == 1


def test_a_ttl_of_zero_keeps_nothing() -> None:
    cache = ContextCache(ttl_s=0)
    cache.put("p", 1, T0, {"rules": []})
    assert len(cache) == 0 and cache.get("p", 1, T0) == {}
