"""The signalling request of a call, without I/O: its body (an SDP offer,
raw or in OpenAI's multipart form with a ``session`` beside it, or the Live
API's JSON) checked before any peer connection is made, every refusal a
documented code."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omnilive.protocol.common import ProtocolError, load_json

MAX_OFFER_BYTES = 64 * 1024  # a browser's offer with audio, video and data is ~5 kB


class OfferErrorCode(StrEnum):
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"  # 415
    INVALID_SDP = "invalid_sdp"  # 400: not an SDP offer at all
    NO_AUDIO = "offer_without_audio"  # 400: nothing to talk over
    NO_DATA_CHANNEL = "offer_without_data_channel"  # 400: the events have no way through
    INVALID_SESSION = "invalid_session"  # 400: the multipart ``session`` is not a JSON object
    INVALID_REQUEST = "invalid_request"  # 400: a Live body that is not its JSON shape


_STATUS = {OfferErrorCode.UNSUPPORTED_MEDIA_TYPE: 415}


class CallRefused(Exception):
    """A call refused, as its signalling request's HTTP answer."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


# The HTTP status of a session refused before it began (the code it was
# refused with, as the auth middleware closes a WebSocket it denies).
_SESSION_REFUSAL_STATUS = {"unauthorized": 401, "forbidden": 403, "origin_not_allowed": 403,
                           "not_found": 404, "rate_limited": 429,
                           "too_many_sessions": 429}  # fmt: skip


def session_refused(code: int, reason: str) -> CallRefused:
    """A call whose session's route closed it before accepting it
    (WebSocket close ``code``, ``reason`` its refusal's code)."""
    status = _SESSION_REFUSAL_STATUS.get(reason, 503)
    return CallRefused(status, reason or "refused", f"the session was refused: {reason or code}")


class OfferError(Exception):
    """A signalling request refused before any peer connection exists."""

    def __init__(self, code: OfferErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return _STATUS.get(self.code, 400)


@dataclass(frozen=True)
class Offer:
    sdp: str
    media: tuple[str, ...]  # the kinds of its m= sections, in order
    session: dict[str, Any] | None = field(default=None)  # OpenAI's multipart ``session``

    @property
    def has_video(self) -> bool:
        return "video" in self.media


def check_sdp(sdp: str) -> Offer:
    """An SDP offer with audio and a data channel, or :class:`OfferError`."""
    lines = [line.strip() for line in sdp.replace("\r\n", "\n").split("\n") if line.strip()]
    if not lines or lines[0] != "v=0" or not any(line.startswith("o=") for line in lines):
        raise OfferError(OfferErrorCode.INVALID_SDP, "the body is not an SDP offer (v=0, o=...)")
    media = tuple(line[2:].split(" ", 1)[0] for line in lines if line.startswith("m="))
    if not any(line.startswith("a=fingerprint:") for line in lines):
        raise OfferError(OfferErrorCode.INVALID_SDP, "the offer has no DTLS fingerprint")
    if "audio" not in media:
        raise OfferError(OfferErrorCode.NO_AUDIO, "the offer has no audio (m=audio) section")
    if "application" not in media:
        message = "the offer has no data channel (m=application); create one before the offer"
        raise OfferError(OfferErrorCode.NO_DATA_CHANNEL, message)
    for number, section in enumerate(_sections(lines)):
        _check_section(number, section)
    return Offer(sdp="\r\n".join(lines) + "\r\n", media=media)


def _sections(lines: list[str]) -> list[list[str]]:
    """The offer's media sections, each from its ``m=`` line on."""
    sections: list[list[str]] = []
    for line in lines:
        if line.startswith("m="):
            sections.append([])
        if sections:
            sections[-1].append(line)
    return sections


_DIRECTIONS = ("a=sendrecv", "a=sendonly", "a=recvonly", "a=inactive")


def _check_section(number: int, section: list[str]) -> None:
    """What every media section of a browser's offer has and aiortc relies
    on without checking: a well-formed ``m=`` line, a ``mid`` (its
    transports are looked up by it), and for audio and video a direction."""
    fields = section[0][2:].split(" ")
    kind = fields[0]
    where = f"media section {number} ({kind})"
    if len(fields) < 4 or not fields[1].isdigit():
        raise OfferError(OfferErrorCode.INVALID_SDP, f"{where}: a malformed m= line")
    if not any(line.startswith("a=mid:") and len(line) > 6 for line in section):
        raise OfferError(OfferErrorCode.INVALID_SDP, f"{where} has no a=mid")
    if kind in ("audio", "video") and not any(line in _DIRECTIONS for line in section):
        message = f"{where} has no direction (a=sendrecv, a=sendonly, a=recvonly, a=inactive)"
        raise OfferError(OfferErrorCode.INVALID_SDP, message)


def parse_offer(body: bytes, content_type: str, form: dict[str, str] | None = None) -> Offer:
    """The offer of a signalling request: ``application/sdp`` (the body is the
    SDP), or ``multipart/form-data`` already read into ``form`` (``sdp``, and
    optionally ``session``, a JSON object of ``session.update``'s shape)."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "multipart/form-data" and form is not None:
        if "sdp" not in form:
            raise OfferError(OfferErrorCode.INVALID_SDP, "the form has no sdp field")
        offer = check_sdp(_text(form["sdp"].encode()))
        session = None
        if form.get("session"):
            try:  # the one decoder of client JSON: its depth rule holds here too
                session = load_json(form["session"])
            except ProtocolError:
                session = None
            if not isinstance(session, dict):
                message = "the form's session field must be a JSON object"
                raise OfferError(OfferErrorCode.INVALID_SESSION, message)
        return Offer(offer.sdp, offer.media, session)
    if kind not in ("application/sdp", "text/plain", ""):
        message = "send the offer as application/sdp or multipart/form-data (sdp, session)"
        raise OfferError(OfferErrorCode.UNSUPPORTED_MEDIA_TYPE, message)
    return check_sdp(_text(body))


def parse_live_offer(body: bytes, content_type: str) -> Offer:
    """The Live API's ``POST /v1/live/sessions`` body (``client.live.create``):
    ``{"session": {...}, "transport": {"type": "webrtc", "sdp": "..."}}``;
    the session is ``session.start``'s, checked by the session itself."""
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        message = "send the Live session as application/json (session, transport)"
        raise OfferError(OfferErrorCode.UNSUPPORTED_MEDIA_TYPE, message)
    try:  # the one decoder of client JSON: its depth rule holds here too
        request = load_json(_text(body))
    except ProtocolError:
        request = None
    if not isinstance(request, dict):
        raise OfferError(OfferErrorCode.INVALID_REQUEST, "the body must be a JSON object")
    transport = request.get("transport")
    if not isinstance(transport, dict) or transport.get("type") != "webrtc":
        message = 'transport must be {"type": "webrtc", "sdp": ...}'
        raise OfferError(OfferErrorCode.INVALID_REQUEST, message)
    if not isinstance(transport.get("sdp"), str):
        raise OfferError(OfferErrorCode.INVALID_SDP, "transport.sdp must be the SDP offer")
    session = request.get("session")
    if not isinstance(session, dict):
        raise OfferError(OfferErrorCode.INVALID_SESSION, "session must be a JSON object")
    offer = check_sdp(transport["sdp"])
    return Offer(offer.sdp, offer.media, session)


def _text(body: bytes) -> str:
    if len(body) > MAX_OFFER_BYTES:
        raise OfferError(OfferErrorCode.INVALID_SDP, f"the offer exceeds {MAX_OFFER_BYTES} bytes")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise OfferError(OfferErrorCode.INVALID_SDP, "the offer is not UTF-8 text") from None


_MAX_MESSAGE_SIZE = re.compile(r"^a=max-message-size:\d+$", re.MULTILINE)


def with_max_message_size(answer: str, max_bytes: int) -> str:
    """``answer`` advertising data-channel messages up to ``max_bytes``: a
    prepare with a reference voice or system audio outgrows aiortc's 256 KiB
    (aiortc reassembles any size; the WebSocket's limit is the one that holds)."""
    return _MAX_MESSAGE_SIZE.sub(
        f"a=max-message-size:{max_bytes}", answer.replace("\r\n", "\n")
    ).replace("\n", "\r\n")
