"""``marlaas bench-service``'s agentic tenants: Agent RFT jobs of the secret-code
lookup (``bench/lookup_task.py``) whose ``search`` tool is a real
``marlaas search-server`` per tool latency, started by the bench, that answers
after a log-normal wait (the paper's tool-latency regime); and the table of
their tool time and how much of it other tenants' work hid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from areal_marlaas.bench.lookup_task import write_lookup_task
from areal_marlaas.tools.local_search import LocalSearchServer, LocalSearchSpec

# The grader of the lookup: exactly the demonstrations' answer, "The code is NNNN."
LOOKUP_GRADER = {
    "type": "string_check",
    "name": "exact_answer",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.answer }}",
    "operation": "eq",
}
MAX_EPISODE_STEPS = 3
# Service settings agent jobs need: tools on this machine's loopback.
AGENT_OVERRIDES = ("service.egress.allow=['127.0.0.0/8']",)
TOOL_KEYS = (
    "tool_s",
    "tool_hidden_share",
    "tool_behind_training_share",
    "train_busy_share",
)


class ToolServers:
    """One search server per tool latency over one code book; rows handed out
    in slices so that no two jobs train on the same keys."""

    def __init__(self, root: Path, latencies: list[float], rows: int, seed: int):
        self.root = root
        self.latencies = sorted({x for x in latencies if x > 0})
        self.rows_needed = rows
        self.seed = seed
        self.servers: dict[float, LocalSearchServer] = {}
        self.urls: dict[float, str] = {}
        self.rows: list[str] = []
        self.next = 0

    def __enter__(self) -> ToolServers:
        if not self.latencies:
            return self
        data = self.root / "lookup"
        write_lookup_task(data, self.rows_needed, 1, self.seed)
        self.rows = (data / "train.jsonl").read_text().splitlines()
        try:
            for lat in self.latencies:
                server = LocalSearchServer(
                    LocalSearchSpec(
                        str(data / "corpus.jsonl"),
                        workers=1,
                        latency_median_s=lat,
                        latency_seed=self.seed,
                    ),
                    log_file=self.root / f"search_{lat:g}s.log",
                )
                self.servers[lat] = server
                self.urls[lat] = server.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()

    def lines(self, n: int) -> bytes:
        """The next ``n`` rows (wrapping around the code book)."""
        out = [self.rows[(self.next + i) % len(self.rows)] for i in range(n)]
        self.next += n
        return ("\n".join(out) + "\n").encode()

    def reinforcement(self, latency: float, hp: dict[str, Any]) -> dict[str, Any]:
        """The ``method.reinforcement`` of an agent job at ``latency``."""
        return {
            "grader": dict(LOOKUP_GRADER),
            "tools": [
                {"name": "search", "server_url": f"{self.urls[latency]}/tools/search"}
            ],
            "max_episode_steps": MAX_EPISODE_STEPS,
            "hyperparameters": hp,
        }


def format_tool_table(rows: list[dict[str, Any]], ms) -> list[str]:
    """Markdown lines of the tool-time columns (rows with agent tenants)."""
    rows = [r for r in rows if r.get("tool_s") and r["tool_s"][0]]
    if not rows:
        return []
    lines = [
        "",
        "Agentic tenants: tool s = their tool calls' wall time (union per job, "
        "summed); hidden = the share of it during which another job trained or "
        "generated; behind training = the share the trainer trained another job; "
        "trainer busy = the trainer's busy share of the window.",
        "",
        "| service | jobs/min | tool s | hidden | behind training | trainer busy |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['service']} | {r['rate_per_min']:g} | {ms(r['tool_s'])} | "
            + " | ".join(ms(r[k], 2) for k in TOOL_KEYS[1:])
            + " |"
        )
    return lines
