"""``/v1/files``: upload (validated JSONL), list, retrieve, content, delete."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from starlette.datastructures import UploadFile

from areal_marlaas.config.service import ServiceConfig
from areal_marlaas.service.deps import state, tenant_of
from areal_marlaas.service.errors import APIError, bad_request
from areal_marlaas.service.objects import file_object, list_object
from areal_marlaas.service.tables import Tenant
from areal_marlaas.service.uploads import (
    UploadError,
    sanitize_filename,
    validate_training_jsonl,
)

# Multipart framing and the purpose field on top of the file itself.
MULTIPART_OVERHEAD = 64 * 1024
FILES_LIST_MAX = 10000


def files_router(cfg: ServiceConfig) -> APIRouter:
    router = APIRouter(prefix="/v1")

    # Body size: api._BodyLimit (max_file_bytes + MULTIPART_OVERHEAD).
    @router.post("/files")
    async def create_file(request: Request, tenant: Tenant = Depends(tenant_of)):
        if not request.headers.get("content-type", "").startswith(
            "multipart/form-data"
        ):
            raise bad_request(
                "Uploads are multipart/form-data with a 'file' and a 'purpose'."
            )
        async with request.form(max_files=1, max_fields=4) as form:
            purpose = form.get("purpose")
            upload = form.get("file")
            if not isinstance(purpose, str) or not purpose:
                raise bad_request("purpose is required ('fine-tune').", "purpose")
            if purpose != "fine-tune":
                raise bad_request(
                    f"purpose {purpose!r} is not supported; this service stores "
                    "'fine-tune' files only.",
                    "purpose",
                )
            if not isinstance(upload, UploadFile):
                raise bad_request("file is required: the JSONL to upload.", "file")
            body = await upload.read(cfg.max_file_bytes + 1)
            filename = sanitize_filename(upload.filename)
        if len(body) > cfg.max_file_bytes:
            raise APIError(
                413,
                f"The file is larger than {cfg.max_file_bytes} bytes (max_file_bytes).",
                param="file",
                code="file_too_large",
            )
        try:
            lines = validate_training_jsonl(body)
        except UploadError as e:
            raise bad_request(str(e), "file", code="invalid_file") from e
        st = state(request)
        f = await run_in_threadpool(
            st.store.add_file,
            tenant.id,
            filename,
            purpose,
            body,
            lines,
            max_files=cfg.max_files,
        )
        return file_object(f)

    @router.get("/files")
    def list_files(
        request: Request,
        after: str | None = None,
        limit: int = Query(FILES_LIST_MAX),
        order: str = "desc",
        purpose: str | None = None,
        tenant: Tenant = Depends(tenant_of),
    ):
        check_limit(limit, FILES_LIST_MAX)
        if order not in ("asc", "desc"):
            raise bad_request("order must be 'asc' or 'desc'.", "order")
        page = state(request).store.list_files(
            tenant.id, after=after, limit=limit, order=order, purpose=purpose
        )
        return list_object([file_object(f) for f in page.items], page.has_more)

    @router.get("/files/{file_id}")
    def retrieve_file(
        request: Request, file_id: str, tenant: Tenant = Depends(tenant_of)
    ):
        return file_object(state(request).store.get_file(tenant.id, file_id))

    @router.get("/files/{file_id}/content")
    def file_content(
        request: Request, file_id: str, tenant: Tenant = Depends(tenant_of)
    ):
        store = state(request).store
        f = store.get_file(tenant.id, file_id)
        return FileResponse(
            store.file_path(f),
            media_type="application/octet-stream",
            # The stored name is display metadata; quote it, never a path.
            content_disposition_type="attachment",
            filename=f.filename,
        )

    @router.delete("/files/{file_id}")
    def delete_file(
        request: Request, file_id: str, tenant: Tenant = Depends(tenant_of)
    ):
        f = state(request).store.delete_file(tenant.id, file_id)
        return {"id": f.id, "object": "file", "deleted": True}

    return router


def check_limit(limit: int, hi: int) -> None:
    if not 1 <= limit <= hi:
        raise bad_request(f"limit must be between 1 and {hi}, got {limit}.", "limit")
