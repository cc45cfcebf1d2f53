"""One behaviour, every session service: in memory, JSON files, Redis."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.errors import SessionError
from orchestrator.events import Event, EventActions
from orchestrator.sessions import FileSessionService, InMemorySessionService, RedisSessionService
from orchestrator.types import Content, Part


@pytest.fixture(params=["memory", "file", "redis"])
async def service(request, tmp_path):
    if request.param == "memory":
        svc = InMemorySessionService()
    elif request.param == "file":
        svc = FileSessionService(tmp_path / "sessions")
    else:
        svc = RedisSessionService(request.getfixturevalue("redis_url"))
    yield svc
    await svc.close()


def _event(text: str, delta: dict | None = None, partial: bool = False) -> Event:
    return Event(author="a", content=Content(role="model", parts=[Part.from_text(text)]),
                 actions=EventActions(state_delta=delta or {}), partial=partial)


async def test_create_get_list_delete(service):
    created = await service.create_session(app_name="app", user_id="u", session_id="s1", state={"k": 1, "temp:x": 2})
    assert created.state == {"k": 1}
    got = await service.get_session(app_name="app", user_id="u", session_id="s1")
    assert (got.id, got.state, got.events) == ("s1", {"k": 1}, [])
    await service.create_session(app_name="app", user_id="u", session_id="s2")
    assert sorted(s.id for s in await service.list_sessions(app_name="app", user_id="u")) == ["s1", "s2"]
    assert await service.list_sessions(app_name="app", user_id="other") == []
    await service.delete_session(app_name="app", user_id="u", session_id="s1")
    assert await service.get_session(app_name="app", user_id="u", session_id="s1") is None


async def test_creating_an_existing_session_is_an_error(service):
    await service.create_session(app_name="app", user_id="u", session_id="s1")
    with pytest.raises(SessionError, match="already exists"):
        await service.create_session(app_name="app", user_id="u", session_id="s1")


async def test_events_and_persistent_state_are_kept_temp_keys_and_partials_are_not(service):
    session = await service.create_session(app_name="app", user_id="u", session_id="s1")
    await service.append_event(session, _event("partial", partial=True))
    await service.append_event(session, _event("one", {"color": "red", "temp:skill:loaded:x": "1"}))
    await service.append_event(session, _event("two", {"color": None, "size": 3}))
    stored = await service.get_session(app_name="app", user_id="u", session_id="s1")
    assert [e.content.text for e in stored.events] == ["one", "two"]
    assert stored.state == {"size": 3}
    assert stored.events[0].actions.state_delta == {"color": "red"}
    assert session.state == stored.state


async def test_appending_to_a_missing_session_is_an_error(service):
    session = await service.create_session(app_name="app", user_id="u", session_id="s1")
    await service.delete_session(app_name="app", user_id="u", session_id="s1")
    with pytest.raises(SessionError, match="does not exist"):
        await service.append_event(session, _event("x"))


async def test_concurrent_appends_lose_nothing(service):
    await service.create_session(app_name="app", user_id="u", session_id="s1")
    views = [await service.get_session(app_name="app", user_id="u", session_id="s1") for _ in range(4)]
    await asyncio.gather(*(
        service.append_event(view, _event(f"{i}-{n}", {f"key{i}-{n}": n})) for i, view in enumerate(views) for n in range(5)
    ))
    stored = await service.get_session(app_name="app", user_id="u", session_id="s1")
    assert len(stored.events) == 20
    assert len(stored.state) == 20


async def test_odd_ids_are_stored_safely(service, tmp_path):
    session = await service.create_session(app_name="app/../x", user_id="u:1", session_id="../../etc")
    await service.append_event(session, _event("ok"))
    stored = await service.get_session(app_name="app/../x", user_id="u:1", session_id="../../etc")
    assert stored.events[0].content.text == "ok"
    assert not (tmp_path.parent / "etc.json").exists()
