"""The job store: the one place that reads and writes the service's tables.

Who writes what (the one-writer rule):

* the operator's commands (``service/cli.py``): tenants and API keys
  (``tenants.py``);
* the API (many threads): files, job creation and cancel/pause/resume *requests*
  (``job_actions`` rows) (``files.py``, ``jobs.py``); everything else it only
  reads. It never changes a job's progress or status;
* the scheduler (``service/runner.py``, one process: its poller thread and the
  runtime's callbacks): the only writer of progress. It moves jobs through their
  statuses, records steps, checkpoints, events, errors and result files, and marks
  the requests it applied as handled (``progress.py``);
* the operator's commands also register tenants' webhooks, and the webhook
  dispatcher (``service/webhooks.py``, in the scheduler's process) is the only
  writer of their delivery log; the deliveries themselves are inserted by the
  scheduler's terminal status change, in its transaction (``webhooks.py``);
* the scheduler also writes jobs' evals, their runs and output items, which the
  API reads (``evals.py``).

Every call is one short transaction; SQLite write transactions take the write lock
up front (``BEGIN IMMEDIATE``), PostgreSQL ones lock the tenant row where a limit
is checked. Methods that take a ``tenant_id`` only ever see that tenant's rows: an
object of another tenant is :class:`NotFound`, exactly like a missing one.
Returned ORM objects are detached snapshots (reading them issues no SQL).

``JobStore`` is the parts as mixins over one :class:`StoreBase` (engine and
sessions): callers hold one object that opens one engine, and a part calls
another's methods directly (result files go through ``add_file``).
"""

from __future__ import annotations

from areal_marlaas.service.store.base import (
    Conflict,
    InvalidAction,
    InvalidTransition,
    LimitExceeded,
    NotFound,
    Page,
    StoreBase,
    StoreError,
)
from areal_marlaas.service.store.evals import EvalStore
from areal_marlaas.service.store.files import FileStore
from areal_marlaas.service.store.jobs import (
    WAITING,
    ApiJobStore,
    NewJob,
    effective_status,
    task_name_of,
)
from areal_marlaas.service.store.progress import (
    TRANSITIONS,
    ProgressStore,
    StepUsage,
    checkpoint_name,
    fine_tuned_model_name,
)
from areal_marlaas.service.store.tenants import (
    KEY_PREFIX,
    TENANT_NAME,
    TenantInfo,
    TenantStore,
    hash_key,
    key_prefix,
    new_api_key,
)
from areal_marlaas.service.store.webhooks import Claimed, WebhookStore


class JobStore(TenantStore, ApiJobStore, ProgressStore, WebhookStore, EvalStore):
    """SQL job store at ``url``; file bodies and adapters live under ``root``."""


__all__ = [
    "KEY_PREFIX",
    "TENANT_NAME",
    "TRANSITIONS",
    "WAITING",
    "ApiJobStore",
    "Claimed",
    "Conflict",
    "EvalStore",
    "FileStore",
    "InvalidAction",
    "InvalidTransition",
    "JobStore",
    "LimitExceeded",
    "NewJob",
    "NotFound",
    "Page",
    "ProgressStore",
    "StepUsage",
    "StoreBase",
    "StoreError",
    "TenantInfo",
    "TenantStore",
    "WebhookStore",
    "checkpoint_name",
    "effective_status",
    "fine_tuned_model_name",
    "hash_key",
    "key_prefix",
    "new_api_key",
    "task_name_of",
]
