"""Every error code the server documents has its exception."""

from __future__ import annotations

from omnilive.client import errors
from omnilive.protocol.common import ErrorCode
from omnilive.protocol.realtime import CloseReason, RealtimeErrorCode
from omnilive.protocol.realtime_v2 import V2Reason


def test_every_documented_code_has_a_class_named_after_it():
    codes = {str(c) for c in ErrorCode} | {str(c) for c in RealtimeErrorCode} | {"not_found"}
    missing = codes - errors.known_codes()
    assert not missing
    for code in codes:
        error = errors.error_for(code, "why")
        assert type(error) is not errors.OmniliveError and error.code == code
        assert code.replace("_", "") in type(error).__name__.lower()


def test_failing_close_reasons_have_classes_and_unknown_codes_keep_theirs():
    assert errors.error_for(str(V2Reason.BACKEND_ERROR), "x").code == "backend_error"
    assert isinstance(errors.error_for(str(CloseReason.ERROR), "x"), errors.SessionFailedError)
    future = errors.error_for("brand_new_code", "from a newer server", status=418)
    assert type(future) is errors.OmniliveError and future.code == "brand_new_code"
    assert (
        future.details == {"status": 418} and str(future) == "brand_new_code: from a newer server"
    )
    assert isinstance(errors.error_for("timeout", "late"), TimeoutError)
