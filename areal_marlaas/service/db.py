"""Engines and migrations for the job store.

SQLite (the default) runs in WAL mode with foreign keys on and a busy timeout, so
the scheduler (one writer) and the API's threads (readers, short inserts) share one
file. Write transactions start with ``BEGIN IMMEDIATE``: they take the write lock
up front instead of failing to upgrade a read lock half-way. Any other SQLAlchemy
URL (``postgresql+psycopg://...``) works as is. The schema comes from Alembic
(``upgrade_to_head``), never from ``create_all``.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

MIGRATIONS = Path(__file__).resolve().parent / "migrations"

# Execution option that makes a SQLite transaction BEGIN IMMEDIATE.
WRITE = "marlaas_write"
# PostgreSQL advisory lock key held while migrating (any fixed 64-bit number).
MIGRATION_LOCK = 0x6D61726C616173


def make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    # 30 s busy timeout: a writer waits for the other one instead of failing.
    engine = create_engine(url, connect_args={"timeout": 30})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Let SQLAlchemy's begin event (below) emit BEGIN, not the sqlite3 module.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        write = conn.get_execution_options().get(WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def alembic_config(connection=None):
    """An Alembic config pointing at the packaged migrations (no alembic.ini)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        # Passed as an object: URLs with %-escaped passwords break ini parsing.
        cfg.attributes["connection"] = connection
    return cfg


def upgrade_to_head(url_or_engine: str | Engine) -> None:
    """Create or upgrade the schema to the newest migration."""
    from alembic import command

    engine = (
        make_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
    )
    # Two processes starting at once (API, scheduler) migrate one after the other:
    # SQLite by its write lock, PostgreSQL by a transaction-scoped advisory lock.
    with engine.execution_options(**{WRITE: True}).begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        command.upgrade(alembic_config(conn), "head")
    if isinstance(url_or_engine, str):
        engine.dispose()


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
