"""What the service tells the graders about this server: judge and embedding
endpoints, the sandbox limits, operator extensions."""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field, fields

from areal_marlaas.graders.sandbox import SandboxLimits


@dataclass
class GradingContext:
    judge_base_url: str | None = field(
        default=None,
        metadata={
            "help": "OpenAI-compatible base URL for score_model graders, e.g. "
            "http://127.0.0.1:8000/v1 (an operator judge or the shared vLLM server); "
            "None: score_model graders are refused."
        },
    )
    judge_api_key: str | None = field(
        default=None, metadata={"help": "Bearer key for the judge endpoint."}
    )
    judge_models: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "Model names a score_model grader may use ('*': any name the "
            "endpoint serves)."
        },
    )
    judge_timeout_s: float = field(
        default=60.0, metadata={"help": "Timeout of one judge request."}
    )
    judge_retries: int = field(
        default=1,
        metadata={"help": "Extra tries after a connection error, 429 or 5xx."},
    )
    judge_concurrency: int = field(
        default=8, metadata={"help": "Judge requests in flight per grade_batch."}
    )
    embedding_base_url: str | None = field(
        default=None,
        metadata={
            "help": "OpenAI-compatible base URL with /embeddings for the cosine "
            "metric; None: cosine is refused."
        },
    )
    embedding_api_key: str | None = field(
        default=None, metadata={"help": "Bearer key for the embedding endpoint."}
    )
    embedding_model: str | None = field(
        default=None, metadata={"help": "Embedding model name sent to /embeddings."}
    )
    embedding_timeout_s: float = field(
        default=30.0, metadata={"help": "Timeout of one embeddings request."}
    )
    sandbox: SandboxLimits = field(
        default_factory=SandboxLimits,
        metadata={"help": "Limits of the python grader sandbox."},
    )
    python_image_tags: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "image_tag values python graders may name (all run in the one "
            "sandbox runtime); empty: image_tag must be left out."
        },
    )
    egress: dict = field(
        default_factory=dict,
        metadata={
            "help": "Where endpoint graders may connect ({allow, only_allowed}, "
            "agents/egress.py); the service sets the job's tenant's policy."
        },
    )
    endpoint_timeout_s: float = field(
        default=600.0,
        metadata={"help": "Timeout of one endpoint-grader request (OpenAI: 10 min)."},
    )
    extension_modules: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "Operator modules imported before parsing, whose import calls "
            "register_grader_type (so pool workers know the types too)."
        },
    )

    def __post_init__(self):
        if isinstance(self.sandbox, dict):
            self.sandbox = SandboxLimits.from_dict(self.sandbox)
        for name in ("judge_models", "python_image_tags", "extension_modules"):
            setattr(self, name, tuple(getattr(self, name) or ()))

    def judge_allows(self, model: str) -> bool:
        return "*" in self.judge_models or model in self.judge_models

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("judge_models", "python_image_tags", "extension_modules"):
            d[name] = list(d[name])
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> GradingContext:
        known = {f.name for f in fields(cls)}
        unknown = set(d or {}) - known
        if unknown:
            raise ValueError(f"unknown GradingContext fields: {sorted(unknown)}")
        return cls(**(d or {}))

    def load_extensions(self) -> None:
        for module in self.extension_modules:
            importlib.import_module(module)
