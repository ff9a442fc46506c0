"""Recorded sessions: metadata, timeline, files, a streamed zip, browser-side
uploads, comments, and the viewer page's route.

The recording id is the capability: ids are minted from ``secrets``, and an
unknown or unsafe id is a plain 404. File work runs off the event loop.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, Response, StreamingResponse
from pydantic import BaseModel

from omnilive.gateway.http_body import json_body
from omnilive.gateway.http_errors import HttpRefusal
from omnilive.gateway.multipart_stream import FilePartStream, MultipartError, is_multipart
from omnilive.gateway.routes.pages import viewer_page
from omnilive.gateway.state import gateway_of
from omnilive.protocol.common import ErrorCode
from omnilive.recording.archive import iter_zip
from omnilive.recording.files import RECORDING
from omnilive.recording.store import (
    NotFound,
    Upload,
    UploadRejected,
    find_session,
    read_comment,
    read_meta,
    resolve_asset,
    write_comment,
)

router = APIRouter()
# Room for a multipart upload's boundaries and part headers.
MULTIPART_MARGIN = 64 * 1024


async def _session(request: Request, recording_id: str) -> Path:
    data_dir = gateway_of(request).settings.data_dir
    try:
        return await asyncio.to_thread(find_session, data_dir, recording_id)
    except NotFound:
        raise HTTPException(404, "no such session") from None


@router.get("/api/sessions/{recording_id}")
async def session_meta(request: Request, recording_id: str) -> dict[str, Any]:
    directory = await _session(request, recording_id)
    try:
        return await asyncio.to_thread(read_meta, directory)
    except NotFound:
        raise HTTPException(404, "no such session") from None


@router.get("/api/sessions/{recording_id}/recording")
async def session_recording(request: Request, recording_id: str) -> Response:
    directory = await _session(request, recording_id)
    # Read whole, not streamed from a stat'd size: a live session's file is
    # replaced (renamed over) every second or so.
    try:
        body = await asyncio.to_thread((directory / RECORDING).read_bytes)
    except FileNotFoundError:
        raise HTTPException(404, "no recording yet") from None
    return Response(body, media_type="application/json")


@router.get("/api/sessions/{recording_id}/assets/{path:path}")
@router.head("/api/sessions/{recording_id}/assets/{path:path}")
async def session_asset(request: Request, recording_id: str, path: str) -> FileResponse:
    directory = await _session(request, recording_id)
    try:
        return FileResponse(await asyncio.to_thread(resolve_asset, directory, path))
    except NotFound:
        raise HTTPException(404, "no such file in this session") from None


@router.get("/api/sessions/{recording_id}/download")
async def session_download(request: Request, recording_id: str) -> StreamingResponse:
    directory = await _session(request, recording_id)
    return StreamingResponse(
        iter_zip(directory),
        media_type="application/zip",
        headers={"Content-Disposition": f'attachment; filename="{directory.name}.zip"'},
    )


@router.post("/api/sessions/{recording_id}/upload-recording")
async def session_upload(request: Request, recording_id: str) -> dict[str, Any]:
    """The browser's own recording of the session (webm / mp4 / wav, told by
    its magic bytes), as the raw request body or as the reference's multipart
    ``file`` field; streamed to disk, capped at ``max_upload_mb``."""
    directory = await _session(request, recording_id)
    max_bytes = int(gateway_of(request).settings.recording.max_upload_mb * 1024 * 1024)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes + MULTIPART_MARGIN:
        raise HTTPException(413, f"upload exceeds {max_bytes} bytes")
    upload = await asyncio.to_thread(Upload, directory, max_bytes)
    content_type = request.headers.get("content-type", "")
    form = None
    if is_multipart(content_type):
        try:
            form = FilePartStream(content_type, "file", upload.write)
        except MultipartError as exc:
            await asyncio.to_thread(upload.abort)
            raise HttpRefusal(422, ErrorCode.INVALID_REQUEST, str(exc)) from None
    name = None
    try:
        async for chunk in request.stream():
            if chunk:
                await asyncio.to_thread(form.write if form else upload.write, chunk)
        if form is not None:
            form.finish()
        name = await asyncio.to_thread(upload.commit)
    except UploadRejected as exc:
        raise HTTPException(exc.status, exc.message) from None
    except MultipartError as exc:
        raise HttpRefusal(422, ErrorCode.INVALID_REQUEST, str(exc)) from None
    finally:
        if name is None:  # refused, client gone, cancelled: leave no partial file
            await asyncio.to_thread(upload.abort)
    # The reference's {status, path, size_bytes}, and ours.
    return {
        "status": "ok",
        "path": name,
        "size_bytes": upload.size,
        "success": True,
        "file": name,
        "size": upload.size,
    }


class CommentBody(BaseModel):
    comment: str | None = None


@router.get("/api/sessions/{recording_id}/comment")
async def get_comment(request: Request, recording_id: str) -> dict[str, Any]:
    directory = await _session(request, recording_id)
    return {"session_id": recording_id, "comment": await asyncio.to_thread(read_comment, directory)}


@router.post("/api/sessions/{recording_id}/comment")
async def set_comment(
    request: Request, recording_id: str, body: Annotated[CommentBody, json_body(CommentBody)]
) -> dict[str, Any]:
    """Save the comment (surrounding whitespace dropped; an empty one clears it)."""
    directory = await _session(request, recording_id)
    limit = gateway_of(request).settings.recording.max_comment_chars
    comment = (body.comment or "").strip()
    if len(comment) > limit:
        raise HTTPException(413, f"comment of {len(comment)} characters exceeds {limit}")
    await asyncio.to_thread(write_comment, directory, comment)
    return {
        "status": "ok",
        "len": len(comment),
        "success": True,
        "session_id": recording_id,
        "comment": comment,
    }


@router.get("/s/{recording_id}", response_class=HTMLResponse)
async def viewer(request: Request, recording_id: str) -> HTMLResponse:
    """The session viewer page (``web/pages/session.html``) for an existing recording."""
    directory = await _session(request, recording_id)
    return await asyncio.to_thread(viewer_page, directory.name)
