"""A gateway app in process, with chosen routers and no workers."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from omnilive.config import Settings
from omnilive.gateway.catalogs import Catalogs
from omnilive.gateway.http_errors import install_error_handlers
from omnilive.gateway.pool import Pool
from omnilive.gateway.state import Gateway


def gateway_app(settings: Settings, *routers: APIRouter) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    for router in routers:
        app.include_router(router)
    app.state.gateway = Gateway(settings=settings, pool=Pool(settings))
    app.state.catalogs = Catalogs.open(settings)
    return app
