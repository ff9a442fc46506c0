"""``GET /api/apps``: the modes this server offers now (the admin side is in ``admin.py``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from omnilive.gateway.catalogs import catalogs_of

router = APIRouter()


@router.get("/api/apps")
async def enabled_apps(request: Request) -> dict[str, Any]:
    apps = catalogs_of(request).apps.apps(only_enabled=True)
    return {"apps": [app.model_dump() for app in apps]}
