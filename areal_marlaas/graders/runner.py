"""Running graders: one (sample, item) pair or a batch of them.

Grading never raises for anything a tenant controls: a missing template key, a
failing judge, a python grader that raises or is killed, a formula that divides
by zero all score 0, with the reason in ``metadata.errors`` (the SDK's flags,
plus ``messages``: sub-grader key -> reason).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx
from areal.utils import logging

from areal_marlaas.graders import model_backed, similarity
from areal_marlaas.graders.context import GradingContext
from areal_marlaas.graders.errors import GraderError
from areal_marlaas.graders.formula import FormulaError
from areal_marlaas.graders.result import (
    DETAIL_FIELDS,
    GraderGrade,
    GraderResult,
    LeafResult,
    empty_errors,
)
from areal_marlaas.graders.sandbox import run_python_batch, sandbox_status
from areal_marlaas.graders.spec import (
    ExtensionGrader,
    Grader,
    MultiGrader,
    PythonGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
    extension_run_fn,
    grader_to_dict,
    parse_grader,
)
from areal_marlaas.graders.templates import TemplateError

logger = logging.getLogger("MARLaaSGraders")


def build_sample(output_text: str, **extra: Any) -> dict:
    """The ``sample`` namespace for a model output: ``output_json`` is the parsed
    text when it is a JSON object, else None."""
    sample = {"output_text": output_text, "output_json": None, **extra}
    if sample["output_json"] is None:
        try:
            parsed = json.loads(output_text)
        except (ValueError, TypeError):
            parsed = None
        sample["output_json"] = parsed if isinstance(parsed, dict) else None
    return sample


def _normalize_sample(sample: dict | str) -> dict:
    if isinstance(sample, str):
        return build_sample(sample)
    sample = dict(sample)
    text = sample.get("output_text")
    sample["output_text"] = "" if text is None else str(text)
    if sample.get("output_json") is None:
        sample = build_sample(sample.pop("output_text"), **sample)
    return sample


# --- validation against this server ---------------------------------------


def check_grader(grader: Grader, ctx: GradingContext | None, param: str = "grader"):
    """Raise GraderError if ``grader`` cannot run on this server (no judge, no
    embedding model, no sandbox, unsupported image_tag)."""
    ctx = ctx or GradingContext()
    if isinstance(grader, MultiGrader):
        for key, sub in grader.graders.items():
            check_grader(sub, ctx, f"{param}.graders.{key}")
        return
    problem = _unavailable(grader, ctx)
    if problem is not None:
        field, message = problem
        raise GraderError(f"{param}.{field}: {message}", f"{param}.{field}")


def _unavailable(grader: Grader, ctx: GradingContext) -> tuple[str, str] | None:
    """(field, why) when ``grader`` (not multi) cannot run here."""
    if isinstance(grader, TextSimilarityGrader):
        metric = grader.evaluation_metric
        if metric == "cosine" and not (ctx.embedding_base_url and ctx.embedding_model):
            return "evaluation_metric", (
                "cosine needs an embedding model and this server has none "
                "configured; use fuzzy_match, bleu, gleu, meteor or rouge_*"
            )
        if metric == "meteor":
            ok, why = similarity.meteor_available()
            if not ok:
                return "evaluation_metric", f"meteor is unavailable here: {why}"
    elif isinstance(grader, PythonGrader):
        if grader.image_tag is not None and grader.image_tag not in (
            ctx.python_image_tags
        ):
            allowed = ", ".join(ctx.python_image_tags) or "none: leave it out"
            return "image_tag", (
                f"image {grader.image_tag!r} is not available; python graders run "
                f"in one stdlib-only sandbox (allowed image_tag: {allowed})"
            )
        ok, why = sandbox_status()
        if not ok:
            return "type", f"python graders cannot run on this server: {why}"
    elif isinstance(grader, ScoreModelGrader):
        if not ctx.judge_base_url:
            return (
                "model",
                "score_model graders need a judge model and none is configured",
            )
        if not ctx.judge_allows(grader.model):
            allowed = ", ".join(ctx.judge_models) or "none"
            return "model", (
                f"model {grader.model!r} is not available as a judge here; use one "
                f"of: {allowed}"
            )
    return None


def validate_grader(
    spec: dict, ctx: GradingContext | None = None, param: str = "grader"
) -> Grader:
    """Parse ``spec`` and check it against this server (GraderError if not)."""
    ctx = ctx or GradingContext()
    ctx.load_extensions()
    grader = parse_grader(spec, param)
    check_grader(grader, ctx, param)
    return grader


def validate_response(grader: Grader) -> dict:
    """The ``/fine_tuning/alpha/graders/validate`` response body."""
    return {"grader": grader_to_dict(grader)}


# --- running leaves -----------------------------------------------------------


def _template_failure(e: TemplateError) -> LeafResult:
    if e.sample_parse:
        return LeafResult.fail("sample_parse_error", str(e))
    return LeafResult.fail("invalid_variable_error", str(e))


def _string_check(g: StringCheckGrader, sample: dict, item: dict) -> LeafResult:
    try:
        a, b = g.input.render(sample, item), g.reference.render(sample, item)
    except TemplateError as e:
        return _template_failure(e)
    if g.operation == "eq":
        ok = a == b
    elif g.operation == "ne":
        ok = a != b
    elif g.operation == "like":
        ok = b in a  # the input contains the reference
    else:
        ok = b.casefold() in a.casefold()
    return LeafResult(1.0 if ok else 0.0)


def _local_similarity(
    g: TextSimilarityGrader, samples: list[dict], items: list[dict]
) -> list[LeafResult]:
    out = []
    for sample, item in zip(samples, items, strict=True):
        start = time.perf_counter()
        try:
            a, b = g.input.render(sample, item), g.reference.render(sample, item)
        except TemplateError as e:
            out.append(_template_failure(e))
            continue
        try:
            res = LeafResult(similarity.similarity(g.evaluation_metric, a, b))
        except similarity.MetricUnavailable as e:
            res = LeafResult.fail("other_error", str(e))
        res.seconds = time.perf_counter() - start
        out.append(res)
    return out


async def _cosine(
    g: TextSimilarityGrader, sample: dict, item: dict, ctx, client, sem
) -> LeafResult:
    try:
        a, b = g.input.render(sample, item), g.reference.render(sample, item)
    except TemplateError as e:
        return _template_failure(e)
    if not a or not b:
        return LeafResult(0.0)
    async with sem:
        try:
            ea, eb = await model_backed.embed([a, b], ctx, client)
            return LeafResult(similarity.cosine(ea, eb))
        except Exception as e:  # noqa: BLE001 - endpoint failures score 0
            why = f"embedding failed: {type(e).__name__}: {e}"
            return LeafResult.fail(
                "model_grader_server_error",
                why,
                model_grader_server_error_details=why,
            )


async def _score_model(
    g: ScoreModelGrader, sample: dict, item: dict, ctx, client, sem
) -> LeafResult:
    try:
        messages = [
            {"role": m.role, "content": m.render(sample, item)} for m in g.input
        ]
    except TemplateError as e:
        return _template_failure(e)
    async with sem:
        return await model_backed.score_model(g, messages, ctx, client)


def _python_results(g: PythonGrader, samples, items, ctx) -> list[LeafResult]:
    batch = run_python_batch(
        g.source, list(zip(samples, items, strict=True)), ctx.sandbox
    )
    share = (batch.seconds - sum(s.seconds for s in batch.samples)) / max(
        len(samples), 1
    )
    out = []
    for s in batch.samples:
        if s.kind == "":
            res = LeafResult(s.score)
        elif s.kind in ("timeout", "cpu"):
            res = LeafResult.fail(
                "unresponsive_reward_error",
                s.reason,
                python_grader_runtime_error_details=s.reason,
            )
        elif s.kind == "server":
            res = LeafResult.fail(
                "python_grader_server_error",
                s.reason,
                python_grader_server_error_type="sandbox_unavailable",
            )
        else:
            details = s.reason
            if batch.stderr:
                details += f"\n[stderr]\n{batch.stderr[-2000:]}"
            res = LeafResult.fail(
                "python_grader_runtime_error",
                s.reason,
                python_grader_runtime_error_details=details,
            )
        res.seconds = s.seconds + max(share, 0.0)
        out.append(res)
    return out


async def _extension(g: ExtensionGrader, sample, item, ctx) -> LeafResult:
    try:
        value = extension_run_fn(g.type_name)(g.config, sample, item, ctx)
        if inspect.isawaitable(value):
            value = await value
    except TemplateError as e:
        return _template_failure(e)
    except Exception as e:  # noqa: BLE001 - any grader failure scores 0
        # A type may name its flag (an endpoint that stays down: unresponsive).
        flag = getattr(e, "grader_flag", "other_error")
        return LeafResult.fail(flag, f"{type(e).__name__}: {e}")
    return _checked(value)


def _checked(value: object) -> LeafResult:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return LeafResult.fail(
            "other_error", f"grader returned {value!r}, not a number"
        )
    if not math.isfinite(value):
        return LeafResult.fail("other_error", f"grader returned {value}")
    return LeafResult(float(value))


async def _run_leaf(
    g: Grader, samples: list[dict], items: list[dict], ctx, client, sem
) -> list[LeafResult]:
    n = len(samples)
    start = time.perf_counter()
    problem = None if isinstance(g, ExtensionGrader) else _unavailable_at_run(g, ctx)
    if problem is not None:
        flag, why, details = problem
        return [LeafResult.fail(flag, why, **details) for _ in range(n)]
    if isinstance(g, StringCheckGrader):
        out = [_string_check(g, s, i) for s, i in zip(samples, items, strict=True)]
        each = (time.perf_counter() - start) / max(n, 1)
        for r in out:
            r.seconds = each
        return out
    if isinstance(g, TextSimilarityGrader):
        if g.evaluation_metric == "cosine":
            return await _timed(
                [
                    _cosine(g, s, i, ctx, client, sem)
                    for s, i in zip(samples, items, strict=True)
                ]
            )
        # Off the event loop: METEOR's first call loads WordNet (about 2 s).
        return await asyncio.to_thread(_local_similarity, g, samples, items)
    if isinstance(g, PythonGrader):
        return await asyncio.to_thread(_python_results, g, samples, items, ctx)
    if isinstance(g, ScoreModelGrader):
        return await _timed(
            [
                _score_model(g, s, i, ctx, client, sem)
                for s, i in zip(samples, items, strict=True)
            ]
        )
    if isinstance(g, ExtensionGrader):
        return await _timed(
            [_extension(g, s, i, ctx) for s, i in zip(samples, items, strict=True)]
        )
    raise AssertionError(f"not a leaf grader: {g!r}")


async def _timed(coros: list) -> list[LeafResult]:
    async def one(c):
        start = time.perf_counter()
        res = await c
        res.seconds = time.perf_counter() - start
        return res

    return list(await asyncio.gather(*(one(c) for c in coros)))


def _unavailable_at_run(g: Grader, ctx) -> tuple[str, str, dict] | None:
    """Config problems found at run time (a grader run without validation)."""
    if isinstance(g, PythonGrader):
        return None  # the sandbox fails closed by itself
    problem = _unavailable(g, ctx)
    if problem is None:
        return None
    why = problem[1]
    if isinstance(g, ScoreModelGrader):
        return (
            "model_grader_server_error",
            why,
            {"model_grader_server_error_details": why},
        )
    return ("other_error", why, {})


# --- composing results -------------------------------------------------------


def _compose(grader: Grader, leaves: dict[str, LeafResult]) -> GraderResult:
    errors = empty_errors()
    messages: dict[str, str] = {}
    usage_per_model: dict[str, dict[str, int]] = {}
    token_usage: int | None = None
    sampled = None
    seconds = 0.0
    for key, leaf in leaves.items():
        seconds += leaf.seconds
        for flag, message in leaf.errors.items():
            errors[flag] = True
            messages[key] = message
        for name in DETAIL_FIELDS:
            if leaf.details.get(name) and errors[name] is None:
                errors[name] = leaf.details[name]
        if leaf.token_usage is not None:
            token_usage = (token_usage or 0) + leaf.token_usage["total_tokens"]
            model = leaf.sampled_model_name or "unknown"
            acc = usage_per_model.setdefault(
                model,
                {
                    "prompt_tokens": 0,
                    "completion_tokens": 0,
                    "total_tokens": 0,
                    "cached_tokens": 0,
                },
            )
            for k, v in leaf.token_usage.items():
                acc[k] = acc.get(k, 0) + v
        sampled = sampled or leaf.sampled_model_name
    if isinstance(grader, MultiGrader):
        sub = {k: leaf.score for k, leaf in leaves.items()}
        try:
            reward = grader.calculate_output.evaluate(sub)
        except FormulaError as e:
            reward = 0.0
            errors["other_error"] = True
            messages["calculate_output"] = str(e)
        scores: dict[str, float] = dict(sub)
    else:
        (leaf,) = leaves.values()
        reward, sub, scores = leaf.score, {}, {}
    if messages:
        errors["messages"] = messages
    per_grader = [_grade(key, g, leaves[key]) for key, g in _leaf_graders(grader)]
    metadata = {
        "name": grader.name,
        "type": grader.type,
        "errors": errors,
        "execution_time": seconds,
        "scores": scores,
        "token_usage": token_usage,
        "sampled_model_name": sampled,
    }
    return GraderResult(reward, sub, metadata, usage_per_model, per_grader)


def _leaf_graders(grader: Grader) -> list[tuple[str, Grader]]:
    if isinstance(grader, MultiGrader):
        return list(grader.graders.items())
    return [(grader.name, grader)]


def _grade(key: str, g: Grader, leaf: LeafResult) -> GraderGrade:
    grade: GraderGrade = {
        "name": key,
        "type": g.type,
        "score": leaf.score,
        "errors": sorted(leaf.errors),
        "seconds": leaf.seconds,
    }
    if leaf.token_usage is not None:
        grade["prompt_tokens"] = int(leaf.token_usage.get("prompt_tokens", 0))
        grade["completion_tokens"] = int(leaf.token_usage.get("completion_tokens", 0))
    return grade


async def grade_batch(
    grader: Grader,
    pairs: Sequence[tuple[dict | str, dict | None]],
    ctx: GradingContext | None = None,
) -> list[GraderResult]:
    """Grade every (sample, item) pair; a python grader runs all of them in one
    sandbox process. ``sample`` is ``{"output_text": ..., ...}`` or the text."""
    ctx = ctx or GradingContext()
    samples = [_normalize_sample(s) for s, _ in pairs]
    items = [dict(i or {}) for _, i in pairs]
    if not pairs:
        return []
    leaves = dict(_leaf_graders(grader))
    needs_http = any(
        isinstance(g, ScoreModelGrader)
        or (isinstance(g, TextSimilarityGrader) and g.evaluation_metric == "cosine")
        for g in leaves.values()
    )
    sem = asyncio.Semaphore(max(1, ctx.judge_concurrency))
    client = httpx.AsyncClient() if needs_http else None
    try:
        per_leaf = await asyncio.gather(
            *(_guarded(g, samples, items, ctx, client, sem) for g in leaves.values())
        )
    finally:
        if client is not None:
            await client.aclose()
    by_key = dict(zip(leaves, per_leaf, strict=True))
    return [
        _compose(grader, {k: by_key[k][j] for k in leaves}) for j in range(len(pairs))
    ]


async def _guarded(g, samples, items, ctx, client, sem) -> list[LeafResult]:
    try:
        return await _run_leaf(g, samples, items, ctx, client, sem)
    except Exception as e:  # noqa: BLE001 - a bug here must not fail training
        logger.exception(f"grader {g.name!r} failed")
        why = f"internal grading error: {type(e).__name__}: {e}"
        return [LeafResult.fail("other_error", why) for _ in samples]


async def run_grader(
    grader: Grader,
    sample: dict | str,
    item: dict | None = None,
    ctx: GradingContext | None = None,
) -> GraderResult:
    """Grade one sample against one dataset item."""
    return (await grade_batch(grader, [(sample, item)], ctx))[0]


def _run_sync(coro):
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # Called from inside an event loop: run on a private loop in a thread.
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    t = threading.Thread(target=target, name="grader-sync")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def run_grader_sync(
    grader: Grader,
    sample: dict | str,
    item: dict | None = None,
    ctx: GradingContext | None = None,
) -> GraderResult:
    return _run_sync(run_grader(grader, sample, item, ctx))


def grade_batch_sync(
    grader: Grader,
    pairs: Sequence[tuple[dict | str, dict | None]],
    ctx: GradingContext | None = None,
) -> list[GraderResult]:
    return _run_sync(grade_batch(grader, pairs, ctx))
