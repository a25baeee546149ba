"""A tool-agent task's environment: the tenant's tool endpoints (OpenAI's Agent
RFT job shape) and the limits of one episode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from areal_marlaas.errors import ConfigError


@dataclass
class AgentConfig:
    tools: list[dict[str, Any]] = field(
        default_factory=list,
        metadata={
            "help": "Tool endpoints {name, server_url, headers}: each call is POSTed "
            "to server_url as a Responses-API function_call item (+ item, trace_id). "
            "Non-empty: the task runs the tool agent, and its rows carry messages "
            "and tools (function schemas)."
        },
    )
    max_episode_steps: int = field(
        default=10,
        metadata={"help": "Model turns per episode (the last one's calls not run)."},
    )
    max_turn_tokens: int = field(
        default=0,
        metadata={
            "help": "Tokens one turn may generate (0: what is left of the "
            "episode's max_new_tokens)."
        },
    )
    tool_timeout_s: float = field(
        default=600.0,
        metadata={"help": "One tool call's limit; past it the model reads a timeout."},
    )
    tool_retries: int = field(
        default=3,
        metadata={
            "help": "Retries of a 5xx or failed connection; then the rollout is "
            "discarded."
        },
    )
    egress_allow: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Networks (CIDR) or hostnames the tools may reach although not "
            "public, e.g. 127.0.0.0/8 for tools on this machine (agents/egress.py)."
        },
    )

    egress_only_allowed: bool = field(
        default=False,
        metadata={"help": "True: the tools reach nothing but egress_allow."},
    )

    @property
    def enabled(self) -> bool:
        return bool(self.tools)

    def check(self, where: str) -> None:
        """Raise ``ConfigError`` naming the first bad ``agent.*`` field."""
        from areal_marlaas.agents.protocol import ToolSpecError, parse_job_tools

        if self.tools:
            try:
                parse_job_tools(list(self.tools), "agent.tools")
            except ToolSpecError as e:
                raise ConfigError(f"{where}: {e}") from None
        if self.max_episode_steps < 1:
            raise ConfigError(f"{where}: agent.max_episode_steps must be >= 1.")
        if self.max_turn_tokens < 0:
            raise ConfigError(f"{where}: agent.max_turn_tokens must be >= 0.")
        if self.tool_timeout_s <= 0:
            raise ConfigError(f"{where}: agent.tool_timeout_s must be > 0.")
        if self.tool_retries < 0:
            raise ConfigError(f"{where}: agent.tool_retries must be >= 0.")
