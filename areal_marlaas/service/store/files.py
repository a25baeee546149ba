"""Uploaded and produced files: their rows and their bodies under the service root."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from sqlalchemy import func, select

from areal_marlaas.service.store.base import (
    Conflict,
    LimitExceeded,
    NotFound,
    Page,
    StoreBase,
)
from areal_marlaas.service.tables import TERMINAL, File, Job, new_id


class FileStore(StoreBase):
    """The ``files`` table; a body is written before its row and removed with it."""

    def file_path(self, f: File) -> Path:
        return self.root / f.path

    def add_file(
        self,
        tenant_id: str,
        filename: str,
        purpose: str,
        body: bytes,
        lines: int,
        *,
        max_files: int | None = None,
    ) -> File:
        """Store a validated upload: the body under ``files/<tenant>/<id>.jsonl``
        (never a path built from the uploaded name), then its row."""
        file_id = new_id("file")
        # Uploads are JSONL; results (archives, CSVs) keep no misleading suffix.
        suffix = ".jsonl" if purpose == "fine-tune" else ""
        rel = Path("files") / tenant_id / f"{file_id}{suffix}"
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        tmp.write_bytes(body)
        os.replace(tmp, path)
        row = File(
            id=file_id,
            tenant_id=tenant_id,
            filename=filename,
            purpose=purpose,
            bytes=len(body),
            sha256=hashlib.sha256(body).hexdigest(),
            lines=lines,
            created_at=time.time(),
            path=str(rel),
        )
        try:
            with self._write() as s:
                self._lock_tenant(s, tenant_id)
                if max_files is not None:
                    stored = s.scalar(
                        select(func.count())
                        .select_from(File)
                        .where(File.tenant_id == tenant_id, File.deleted_at.is_(None))
                    )
                    assert stored is not None  # count(*) returns a row
                    if stored >= max_files:
                        raise LimitExceeded(
                            f"You have {stored} stored files, the limit is "
                            f"{max_files} (max_files); delete some first.",
                            param="file",
                        )
                s.add(row)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return row

    def get_file(
        self, tenant_id: str, file_id: str, *, param: str | None = None
    ) -> File:
        with self._read() as s:
            f = s.scalar(
                select(File).where(
                    File.id == file_id,
                    File.tenant_id == tenant_id,
                    File.deleted_at.is_(None),
                )
            )
        if f is None:
            raise NotFound("file", file_id, param)
        return f

    def list_files(
        self,
        tenant_id: str,
        *,
        after: str | None = None,
        limit: int = 10000,
        order: str = "desc",
        purpose: str | None = None,
    ) -> Page[File]:
        with self._read() as s:
            q = select(File).where(File.tenant_id == tenant_id)
            if after is not None:
                seq = self._cursor_seq(s, File, tenant_id, after, "file")
                q = q.where(File.seq < seq if order == "desc" else File.seq > seq)
            q = q.where(File.deleted_at.is_(None))
            if purpose:
                q = q.where(File.purpose == purpose)
            q = q.order_by(File.seq.desc() if order == "desc" else File.seq.asc())
            return self._page(s, q, limit)

    def delete_file(self, tenant_id: str, file_id: str) -> File:
        """Soft-delete (the row stays for cursors and jobs); the body goes. A file
        that an unfinished job trains on cannot be deleted."""
        with self._write() as s:
            f = s.scalar(
                select(File).where(
                    File.id == file_id,
                    File.tenant_id == tenant_id,
                    File.deleted_at.is_(None),
                )
            )
            if f is None:
                raise NotFound("file", file_id)
            user = s.scalar(
                select(Job.id).where(
                    Job.tenant_id == tenant_id,
                    Job.status.not_in(TERMINAL),
                    (Job.training_file == file_id) | (Job.validation_file == file_id),
                )
            )
            if user is not None:
                raise Conflict(
                    f"File {file_id} is used by job {user}, which has not finished; "
                    "cancel the job or wait for it to end.",
                    param="file_id",
                    code="file_in_use",
                )
            f.deleted_at = time.time()
        self.file_path(f).unlink(missing_ok=True)
        return f
