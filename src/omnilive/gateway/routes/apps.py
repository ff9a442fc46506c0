"""What the pages start from: ``GET /api/apps``, the modes this server offers
now (the admin side is in ``admin.py``), and ``GET /api/frontend_defaults``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from omnilive.gateway.catalogs import catalogs_of
from omnilive.gateway.state import gateway_of

router = APIRouter()


@router.get("/api/apps")
async def enabled_apps(request: Request) -> dict[str, Any]:
    apps = catalogs_of(request).apps.apps(only_enabled=True)
    return {"apps": [app.model_dump() for app in apps]}


@router.get("/api/frontend_defaults")
async def frontend_defaults(request: Request) -> dict[str, Any]:
    """``playback_delay_ms``, and ``default_lang`` when one is configured."""
    pages = gateway_of(request).settings.pages
    defaults: dict[str, Any] = {"playback_delay_ms": pages.playback_delay_ms}
    if pages.default_lang is not None:
        defaults["default_lang"] = pages.default_lang
    return defaults
