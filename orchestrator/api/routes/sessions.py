"""Sessions: create one, read its events and state, post a message and stream the agent's answer (SSE), delete one
(its workspace goes with it).

The stream's events, each ``event: <kind>`` with a JSON ``data`` line:
``text_delta`` / ``thought_delta`` (partial text), ``tool_call_delta`` (a streaming tool's argument delta),
``tool_call`` and ``tool_result`` (complete), ``message`` (the agent's final answer), ``error``, and ``done``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, HTTPException, Path, Response, status
from fastapi.sse import EventSourceResponse, ServerSentEvent

from orchestrator.api.auth import current_team
from orchestrator.api.deps import get_services
from orchestrator.api.responses import (
    ErrorPublic,
    error_responses,
    stream_error_responses,
)
from orchestrator.errors import SessionError
from orchestrator.events import Event
from orchestrator.models.constants import TOOL_STREAMING_ARGS
from orchestrator.schemas import SESSION_ID, MessageCreate, SessionCreate, SessionPublic
from orchestrator.services import Services, remove_workspace
from orchestrator.skills.tools import workspace_id_for
from orchestrator.teams import Team

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], responses=error_responses(401, 422))

SessionId = Path(pattern=SESSION_ID, description="The session's id.")


@router.post("", response_model=SessionPublic, status_code=status.HTTP_201_CREATED, responses=error_responses(400, 409, 413))
async def create_session(
    body: SessionCreate, team: Team = Depends(current_team), services: Services = Depends(get_services)
) -> SessionPublic:
    """Start a conversation with the skill assistant."""
    try:
        session = await services.session_service.create_session(
            app_name=services.app_name, user_id=team.id, session_id=body.session_id, state=body.state
        )
    except SessionError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
    return SessionPublic(**session.model_dump())


@router.get("/{session_id}", response_model=SessionPublic, responses=error_responses(404))
async def get_session(
    session_id: str = SessionId, team: Team = Depends(current_team), services: Services = Depends(get_services)
) -> SessionPublic:
    """A session's events and state."""
    session = await services.session_service.get_session(app_name=services.app_name, user_id=team.id, session_id=session_id)
    if session is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no session {session_id!r}")
    return SessionPublic(**session.model_dump())


@router.delete(
    "/{session_id}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response,
    responses={**error_responses(404), 409: {"model": ErrorPublic, "description": "Runs of the session are queued or "
                                                                                   "running in its workspace."}},
)
async def delete_session(
    session_id: str = SessionId, team: Team = Depends(current_team), services: Services = Depends(get_services)
) -> Response:
    """Delete a session and its workspace (removed now, or by a worker of its runtime); refused while its runs are
    queued or running."""
    session = await services.session_service.get_session(app_name=services.app_name, user_id=team.id, session_id=session_id)
    if session is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no session {session_id!r}")
    workspace = await services.dispatcher.get_workspace(workspace_id_for(team.id, session_id))
    if workspace is not None:
        await remove_workspace(services, workspace)
    await services.session_service.delete_session(app_name=services.app_name, user_id=team.id, session_id=session_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


async def existing_session(session_id: str = SessionId, team: Team = Depends(current_team),
                           services: Services = Depends(get_services)) -> str:
    """The id of the team's session ``session_id``, checked before a stream starts (404 as an answer)."""
    session = await services.session_service.get_session(app_name=services.app_name, user_id=team.id, session_id=session_id)
    if session is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no session {session_id!r}")
    return session_id


@router.post(
    "/{session_id}/messages",
    response_class=EventSourceResponse,
    responses={200: {"content": {EventSourceResponse.media_type: {}}, "description": "The agent's events as server-sent events."},
               **stream_error_responses(400, 404, 413)},
)
async def post_message(
    body: MessageCreate, session_id: str = Depends(existing_session), team: Team = Depends(current_team),
    services: Services = Depends(get_services),
) -> AsyncIterator[ServerSentEvent]:
    """Send a message; the answer streams back as server-sent events while the agent works."""
    async for event in services.turn(team, session_id, body.text):
        for kind, data in sse_items(event):
            yield ServerSentEvent(event=kind, data=data)
    yield ServerSentEvent(event="done", data={})


def sse_items(event: Event) -> list[tuple[str, dict]]:
    """How one agent event is told on the stream."""
    base = {"event_id": event.id, "author": event.author}
    if event.error_message:
        return [("error", {**base, "code": event.error_code, "message": event.error_message})]
    if event.content is None:
        return []
    items: list[tuple[str, dict]] = []
    for part in event.content.parts:
        if event.partial:
            if part.function_call is not None and event.streaming_tool_call:
                items.append(("tool_call_delta", {**base, "id": part.function_call.id, "name": part.function_call.name,
                                                  "delta": part.function_call.args.get(TOOL_STREAMING_ARGS, "")}))
            elif part.text:
                items.append(("thought_delta" if part.thought else "text_delta", {**base, "text": part.text}))
        elif part.function_call is not None:
            items.append(("tool_call", {**base, **part.function_call.model_dump()}))
        elif part.function_response is not None:
            items.append(("tool_result", {**base, **part.function_response.model_dump()}))
    if event.is_final_response():
        items.append(("message", {**base, "text": event.content.text, "usage": event.usage.model_dump() if event.usage else None}))
    return items
