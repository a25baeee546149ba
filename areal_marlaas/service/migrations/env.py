"""Alembic environment of the job store.

Run programmatically by ``areal_marlaas.service.db.upgrade_to_head``, which hands
over a connection in ``config.attributes["connection"]``; a ``sqlalchemy.url``
main option also works (offline SQL generation, ad-hoc use).
"""

from __future__ import annotations

from alembic import context

from areal_marlaas.service.db import make_engine
from areal_marlaas.service.tables import Base

target_metadata = Base.metadata


def _configure(**kw) -> None:
    # Batch mode: SQLite can only ALTER a table by copying it.
    context.configure(target_metadata=target_metadata, render_as_batch=True, **kw)


def run_offline() -> None:
    _configure(url=context.config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.config.get_main_option("sqlalchemy.url")
    assert url is not None  # the store sets it before running migrations
    engine = make_engine(url)
    with engine.begin() as conn:
        _configure(connection=conn)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
