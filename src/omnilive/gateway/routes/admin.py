"""Administrator actions.

Every route of this module, and only these, changes what the server offers to
everyone: switching apps on and off, deleting stored voices. Authentication
wraps this one router (``include_router(admin.router, dependencies=[...])``),
so an admin route belongs here, whatever its path.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictBool

from omnilive.gateway.catalogs import catalogs_of
from omnilive.gateway.http_body import json_body
from omnilive.gateway.http_errors import error_response
from omnilive.voices.store import UnknownVoice

router = APIRouter(tags=["admin"])


class AppSwitch(BaseModel):
    """The body of ``PUT /api/admin/apps/{id}``."""

    model_config = ConfigDict(extra="forbid")
    enabled: StrictBool


def _not_found(message: str) -> JSONResponse:
    return error_response(404, message, "not_found")


@router.get("/api/admin/apps")
async def all_apps(request: Request) -> dict[str, Any]:
    return {"apps": [app.model_dump() for app in catalogs_of(request).apps.apps()]}


@router.put("/api/admin/apps/{app_id}", response_model=None)
async def switch_app(
    app_id: str, request: Request, body: Annotated[AppSwitch, json_body(AppSwitch)]
) -> dict[str, Any] | JSONResponse:
    """Enable or disable one app; saved at once, so it survives a restart.
    Sessions already running go on; new ones are refused."""
    apps = catalogs_of(request).apps
    if apps.get(app_id) is None:
        return _not_found(f"no app {app_id!r}")
    app = (await asyncio.to_thread(apps.set, app_id, body.enabled)).model_dump()
    # The reference answers {success, app}; our pages read the app's own fields.
    return {**app, "success": True, "app": app}


@router.delete("/api/assets/ref_audio/{voice_id}", response_model=None)
async def delete_voice(voice_id: str, request: Request) -> dict[str, Any] | JSONResponse:
    """Delete a stored voice. Sessions that already loaded it keep their copy."""
    try:
        voice = await asyncio.to_thread(catalogs_of(request).voices.delete, voice_id)
    except UnknownVoice as exc:
        return _not_found(str(exc))
    return {"success": True, "id": voice.id, "message": "Deleted", "deleted": voice.listing()}
