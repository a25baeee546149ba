"""OpenAI-style graders for tenant rewards.

Parse and validate (``parse_grader``, ``validate_grader``), run
(``run_grader``, ``run_grader_sync``, ``grade_batch``), and train with them
(``GraderReward``). Types: string_check, text_similarity, python (in the
sandbox), score_model, multi, endpoint (a tenant's reward service), plus operator
types from ``register_grader_type``.
"""

from areal_marlaas.graders.context import GradingContext
from areal_marlaas.graders.endpoint import EndpointDown, endpoint_failure, public_grader
from areal_marlaas.graders.errors import GraderError
from areal_marlaas.graders.result import GraderResult, LeafResult
from areal_marlaas.graders.reward import GraderReward, Score
from areal_marlaas.graders.runner import (
    build_sample,
    check_grader,
    grade_batch,
    grade_batch_sync,
    run_grader,
    run_grader_sync,
    validate_grader,
    validate_response,
)
from areal_marlaas.graders.sandbox import SandboxLimits, sandbox_status
from areal_marlaas.graders.spec import (
    ExtensionGrader,
    Grader,
    MultiGrader,
    PythonGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
    grader_to_dict,
    grader_types,
    parse_grader,
    register_grader_type,
    unregister_grader_type,
)

__all__ = [
    "EndpointDown",
    "ExtensionGrader",
    "Grader",
    "GraderError",
    "GraderResult",
    "GraderReward",
    "GradingContext",
    "LeafResult",
    "MultiGrader",
    "PythonGrader",
    "SandboxLimits",
    "Score",
    "ScoreModelGrader",
    "StringCheckGrader",
    "TextSimilarityGrader",
    "build_sample",
    "endpoint_failure",
    "check_grader",
    "grade_batch",
    "grade_batch_sync",
    "grader_to_dict",
    "grader_types",
    "parse_grader",
    "public_grader",
    "register_grader_type",
    "run_grader",
    "run_grader_sync",
    "sandbox_status",
    "unregister_grader_type",
    "validate_grader",
    "validate_response",
]
