"""`python -m tests.stand_ins.gcs_emulator_main start ...`: gcp-storage-emulator with GCS's
upload preconditions played, so that a conditional create is not granted where GCS refuses it.

The rule played (GCS JSON API, "Request preconditions", cloud.google.com/storage/docs/
request-preconditions, and objects.insert's `ifGenerationMatch` parameter): an upload with
`ifGenerationMatch=0` succeeds only when no live object has that name; with `ifGenerationMatch=G`
only when the live object's generation is G; otherwise 412 Precondition Failed with reason
`conditionNotMet`, which google-cloud-storage raises as `PreconditionFailed`. The emulator
(handlers/objects.py, 2026.7.19) ignores every precondition; an upload carrying one this module
does not play (`ifGenerationNotMatch`, `ifMetagenerationMatch`, `ifMetagenerationNotMatch`) is
refused with 501 rather than granted.
"""

from __future__ import annotations

import sys
from http import HTTPStatus

from gcp_storage_emulator.__main__ import main
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_NOT_PLAYED = ("ifGenerationNotMatch", "ifMetagenerationMatch", "ifMetagenerationNotMatch")


def _refusal(request, storage) -> tuple[int, str] | None:
    for name in _NOT_PLAYED:
        if name in request.query:
            return HTTPStatus.NOT_IMPLEMENTED, f"the GCS stand-in does not play {name}"
    wanted = request.query.get("ifGenerationMatch")
    if not wanted:
        return None
    name = request.query.get("name", [None])[0]
    if name is None and isinstance(request.data, dict):
        name = (request.data.get("meta") or request.data).get("name")
    try:
        generation = storage.get_file_obj(request.params["bucket_name"], name)["generation"]
    except NotFound:
        generation = "0"
    if str(wanted[0]) != str(generation):
        return (
            HTTPStatus.PRECONDITION_FAILED,
            "At least one of the pre-conditions you " "specified did not hold.",
        )
    return None


def _checked(upload):
    def checked_upload(request, response, storage):
        refusal = _refusal(request, storage)
        if refusal is None:
            return upload(request, response, storage)
        status, message = refusal
        response.status = status
        reason = "conditionNotMet" if status == HTTPStatus.PRECONDITION_FAILED else "notImplemented"
        response.json({"error": {"code": int(status), "message": message,
                                 "errors": [{"message": message, "reason": reason}]}})  # fmt: skip

    return checked_upload


# insert() calls these through the module's globals, so replacing them here is enough.
for _name in ("_media_upload", "_multipart_upload", "_create_resumable_upload"):
    setattr(objects, _name, _checked(getattr(objects, _name)))

if __name__ == "__main__":
    sys.exit(main())
