"""Refusing sessions of a disabled app: WebSocket close 1008, HTTP 403."""

from __future__ import annotations

from fastapi import Request, WebSocket

from omnilive.apps import APPS
from omnilive.gateway.catalogs import catalogs_of
from omnilive.gateway.client_ws import fail
from omnilive.protocol.common import ErrorCode

CLOSE_POLICY_VIOLATION = 1008


class AppDisabled(Exception):
    """The session belongs to an app an operator has switched off."""

    def __init__(self, app_id: str) -> None:
        name = next((app.name for app in APPS if app.id == app_id), app_id)
        super().__init__(f"{name} ({app_id}) is disabled on this server")
        self.app_id = app_id
        self.message = str(self)


def require_enabled(connection: Request | WebSocket, app_id: str) -> None:
    """Raise :class:`AppDisabled` unless ``app_id`` is enabled."""
    if not catalogs_of(connection).apps.is_enabled(app_id):
        raise AppDisabled(app_id)


async def refuse(ws: WebSocket, exc: AppDisabled) -> None:
    """The chat, half-duplex and duplex refusal: ``error{code: app_disabled}``, close 1008."""
    await fail(ws, exc.message, ErrorCode.APP_DISABLED, CLOSE_POLICY_VIOLATION)
