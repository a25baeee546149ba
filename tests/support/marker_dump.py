"""A pytest plugin for one collection run: writes every collected test's node
id and marker names, one ``id<TAB>marker,...`` line each, to the file named by
$MARLAAS_MARKER_DUMP (``-p tests.support.marker_dump``)."""

from __future__ import annotations

import os


def pytest_collection_finish(session) -> None:
    lines = [
        f"{item.nodeid}\t{','.join(sorted({m.name for m in item.iter_markers()}))}"
        for item in session.items
    ]
    with open(os.environ["MARLAAS_MARKER_DUMP"], "w") as f:
        f.write("\n".join(lines) + "\n")
