"""Multi-turn search agent: the policy reasons, calls ``<search>query</search>``,
reads ``<information>...</information>`` from a BM25 index (in process, or a
``marlaas search-server`` over HTTP) and ends with ``<answer>...</answer>``.

The trajectory is AReaL's RLVR layout (``input_ids``, ``loss_mask``, ``logprobs``,
``versions``, ``attention_mask`` as [1, L], ``rewards`` as [1]) plus ``task``, so
the trainer takes it unchanged. Generated tokens are kept exactly as the server
returned them; tool-output tokens are appended with loss_mask 0, logprob 0 and
version -1, so only the policy's own tokens are trained on.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from areal import workflow_context
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest
from areal.api.reward_api import AsyncRewardWrapper
from areal.api.workflow_api import RolloutWorkflow
from areal.utils import logging, stats_tracker
from areal.utils.dynamic_import import import_from_string
from areal.utils.hf_utils import apply_chat_template, load_hf_tokenizer
from transformers import PreTrainedTokenizerFast

from areal_marlaas.rollout.seeding import seeded_sampling
from areal_marlaas.tasks.answer_judge import JudgeClient
from areal_marlaas.tasks.search import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    INFO_CLOSE,
    INFO_OPEN,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    Passage,
    format_passages,
    get_index,
)
from areal_marlaas.tools.search_client import SearchClient, SearchError
from areal_marlaas.trajectory import EpisodeTokens, collect_served_adapters
from areal_marlaas.workflows.base import TaskWorkflow, grader_reward

if TYPE_CHECKING:
    from areal_marlaas.config import FaultToleranceConfig, TaskSpec

logger = logging.getLogger("MARLaaSSearchAgent")

STOP_STRINGS = (SEARCH_CLOSE, ANSWER_CLOSE)
# Searches run here, off the event loop, so tool time overlaps other requests.
_TOOL_POOL = ThreadPoolExecutor(8, thread_name_prefix="marlaas-search")


@dataclass(frozen=True)
class Turn:
    """What one generated turn asks for: kind is search, answer or error."""

    kind: str
    value: str = ""


def parse_turn(text: str) -> Turn:
    """Read one turn; generation stops at the first ``</search>``/``</answer>``."""
    s_end, a_end = text.find(SEARCH_CLOSE), text.find(ANSWER_CLOSE)
    if s_end != -1 and (a_end == -1 or s_end < a_end):
        start = text.rfind(SEARCH_OPEN, 0, s_end)
        if start == -1:
            return Turn("error", "</search> without <search>")
        query = text[start + len(SEARCH_OPEN) : s_end].strip()
        return Turn("search", query) if query else Turn("error", "empty search query")
    if a_end != -1:
        start = text.rfind(ANSWER_OPEN, 0, a_end)
        if start == -1:
            return Turn("error", "</answer> without <answer>")
        answer = text[start + len(ANSWER_OPEN) : a_end].strip()
        return Turn("answer", answer) if answer else Turn("error", "empty answer")
    last_search, last_answer = text.rfind(SEARCH_OPEN), text.rfind(ANSWER_OPEN)
    if last_search > last_answer:
        return Turn("error", "unclosed <search> tag")
    if last_answer != -1:
        return Turn("error", "unclosed <answer> tag")
    return Turn("error", "no answer (no <search> or <answer> tag)")


def information_text(body: str) -> str:
    return f"\n{INFO_OPEN}\n{body}\n{INFO_CLOSE}\n"


class SearchAgentWorkflow(TaskWorkflow, RolloutWorkflow):
    """One task's search agent; requests route to the task's adapter.

    ``gconfig.max_new_tokens`` is the episode's response budget: generated and
    tool tokens together, so prompt + response fits the task's KV estimate.
    """

    def __init__(
        self,
        task: str,
        reward_fn: Callable[..., Any] | str,
        gconfig: GenerationHyperparameters,
        tokenizer: PreTrainedTokenizerFast | str,
        corpus_path: str = "",
        top_k: int = 3,
        max_tool_calls: int = 5,
        tool_timeout_s: float = 10.0,
        passage_chars: int = 300,
        scorer: str = "em",
        judge_url: str = "",
        judge_model: str = "",
        judge_timeout_s: float = 30.0,
        judge_retries: int = 2,
        search_fn: Callable[[str, int], list[Passage]] | str | None = None,
        server_url: str = "",
        server_retries: int = 2,
        server_backoff_s: float = 0.2,
        response_prefix: str = "",
        enable_thinking: bool = False,
        sampling_seed: int | None = None,
        grader: dict | None = None,
        grading: dict | None = None,
    ):
        reward_fn = grader_reward(grader, grading, reward_fn)
        if isinstance(tokenizer, str):
            tokenizer = load_hf_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.task = task
        self.sampling_seed = sampling_seed
        stop = list(dict.fromkeys([*(gconfig.stop or []), *STOP_STRINGS]))
        self.gconfig = gconfig.new(lora_name=task, stop=stop)
        self.gconfig = self.gconfig.new_with_stop_and_pad_token_ids(tokenizer)
        self.reward_fn = reward_fn
        self.async_reward_fn = None
        if not corpus_path and search_fn is None and not server_url:
            raise ValueError(
                "SearchAgentWorkflow needs corpus_path, search_fn or server_url"
            )
        self.corpus_path = corpus_path
        # A dotted path names the function.
        self.search_fn: Callable[[str, int], list[Passage]] | None = (
            import_from_string(search_fn) if isinstance(search_fn, str) else search_fn
        )
        # Searches go over HTTP when a server is given (search_fn is then unused).
        self.client = (
            SearchClient(server_url, server_retries, server_backoff_s)
            if server_url
            else None
        )
        self.top_k = top_k
        self.max_tool_calls = max_tool_calls
        self.tool_timeout_s = tool_timeout_s
        self.passage_chars = passage_chars
        self.scorer = scorer
        self.judge = (
            JudgeClient(judge_url, judge_model, judge_timeout_s, judge_retries)
            if scorer == "judge"
            else None
        )
        # Text the reply starts with (prompt tokens, never trained on).
        self.response_prefix = response_prefix
        self.enable_thinking = enable_thinking
        # Recent episode outcomes (reward, reason, tool calls), for logs and tests.
        self.outcomes: deque[dict[str, Any]] = deque(maxlen=256)

    @classmethod
    def workflow_kwargs(
        cls,
        task: TaskSpec,
        tokenizer_path: str,
        fault: FaultToleranceConfig | None = None,
        grading: dict | None = None,
    ) -> dict[str, Any]:
        s = task.search
        # Absolute: rollout workers may run in another working directory.
        corpus = (
            str(Path(s.corpus_path).expanduser().resolve()) if s.corpus_path else ""
        )
        url = s.server_url
        if url == "auto":
            # Started here, in the process that runs the tasks (see local_search).
            from areal_marlaas.tools.local_search import (
                LocalSearchSpec,
                local_search_server,
            )

            url = local_search_server(
                LocalSearchSpec(
                    corpus,
                    s.server_workers,
                    s.latency_median_s,
                    s.latency_sigma,
                    s.latency_seed,
                )
            )
        return {
            **super().workflow_kwargs(task, tokenizer_path, fault, grading),
            "corpus_path": corpus,
            "server_url": url,
            "server_retries": s.server_retries,
            "server_backoff_s": s.server_backoff_s,
            "top_k": s.top_k,
            "max_tool_calls": s.max_tool_calls,
            "tool_timeout_s": s.tool_timeout_s,
            "passage_chars": s.passage_chars,
            "response_prefix": s.response_prefix,
            "scorer": s.scorer,
            "judge_url": s.judge_url,
            "judge_model": s.judge_model,
            "judge_timeout_s": s.judge_timeout_s,
            "judge_retries": s.judge_retries,
        }

    # -- tools ------------------------------------------------------------------
    async def _search_fn(self) -> Callable[[str, int], list[Passage]]:
        if self.search_fn is None:
            # Built once per corpus and process, outside the per-search timeout.
            index = await asyncio.to_thread(get_index, self.corpus_path)
            self.search_fn = index.search
        return self.search_fn

    async def _lookup(self, query: str) -> list[Passage]:
        if self.client is not None:
            # Retries and their pauses share the one tool_timeout_s budget.
            return await self.client.search(query, self.top_k, self.tool_timeout_s)
        fn = await self._search_fn()
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(
            loop.run_in_executor(_TOOL_POOL, fn, query, self.top_k),
            timeout=self.tool_timeout_s,
        )

    async def search(self, query: str) -> tuple[str, str]:
        """The tool's reply text and, on a timeout or error, why it failed."""
        try:
            passages = await self._lookup(query)
        except TimeoutError as e:
            why = f"search timed out after {self.tool_timeout_s}s"
            return "Search timed out.", f"{why} ({e})" if str(e) else why
        except SearchError as e:
            logger.warning(f"task {self.task}: search {query!r} failed: {e}")
            return "Search failed.", f"search error: {e}"
        except Exception as e:  # a broken tool must not end the run
            logger.warning(f"task {self.task}: search {query!r} failed: {e}")
            return "Search failed.", f"search error: {type(e).__name__}: {e}"
        return format_passages(passages, self.passage_chars), ""

    # -- scoring ----------------------------------------------------------------
    async def score(
        self, data: dict[str, Any], answer: str, prompt: str, completion: str, ids
    ) -> tuple[float, str]:
        if self.judge is not None:
            result = await self.judge.score(
                str(data.get("question", "")), str(data.get("answer", "")), answer
            )
            return result.score, result.reason
        if self.async_reward_fn is None:
            fn = self.reward_fn
            fn = import_from_string(fn) if isinstance(fn, str) else fn
            self.async_reward_fn = AsyncRewardWrapper(fn)
        prompt_ids, completion_ids = ids
        reward = await self.async_reward_fn(
            prompt, completion, prompt_ids, completion_ids, **data
        )
        return float(reward), ""

    # -- episode ----------------------------------------------------------------
    def _decode(self, ids: list[int]) -> str:
        # One sequence decodes to a str; transformers' stub adds a batch's list.
        return cast(str, self.tokenizer.decode(ids))

    async def arun_episode(self, engine, data: dict[str, Any]) -> dict[str, Any] | None:
        with seeded_sampling(self.sampling_seed), collect_served_adapters() as served:
            traj = await self._episode(engine, data)
        traj["served_adapters"] = list(served)
        return traj

    async def _episode(self, engine, data: dict[str, Any]) -> dict[str, Any]:
        prompt_ids = apply_chat_template(
            self.tokenizer,
            data["messages"],
            tokenize=True,
            add_generation_prompt=True,
            enable_thinking=self.enable_thinking,
        )
        prefix = self.response_prefix
        if prefix:
            prompt_ids = list(prompt_ids) + self.tokenizer.encode(
                prefix, add_special_tokens=False
            )
        tokens = EpisodeTokens(list(prompt_ids))
        budget = self.gconfig.max_new_tokens
        rid = uuid.uuid4().hex
        pieces: list[str] = []
        answer, reason = None, ""
        calls = timeouts = 0
        tool_errors: list[str] = []
        env: list[float] = []  # start, end of each tool call (the env phase)
        while True:
            room = budget - len(tokens.response)
            if room <= 0:
                reason = "token budget used up before an answer"
                break
            req = ModelRequest(
                rid=rid,
                input_ids=list(tokens.ids),
                gconfig=self.gconfig.new(n_samples=1, max_new_tokens=room),
                tokenizer=self.tokenizer,
            )
            out = tokens.generated(await engine.agenerate(req))
            text = self._decode(out)
            if not pieces:
                text = prefix + text  # the first turn continues the prefix
            pieces.append(text)
            turn = parse_turn(text)
            if turn.kind == "answer":
                answer = turn.value
                break
            if turn.kind == "error":
                reason = turn.value
                break
            calls += 1
            if calls > self.max_tool_calls:
                reason = f"more than max_tool_calls={self.max_tool_calls} searches"
                break
            t0 = time.time()
            body, tool_error = await self.search(turn.value)
            env += [t0, time.time()]
            if tool_error:
                timeouts += tool_error.startswith("search timed out")
                tool_errors.append(tool_error)
                logger.info(f"task {self.task}: {tool_error} (query {turn.value!r})")
            room = budget - len(tokens.response)
            info = self.tokenizer.encode(
                information_text(body), add_special_tokens=False
            )
            info = info[:room]
            tokens.context(info)
            pieces.append(self._decode(info))

        reward = 0.0
        if answer is not None:
            reward, reason = await self.score(
                data,
                answer,
                self._decode(tokens.prompt),
                "".join(pieces),
                (tokens.prompt, tokens.response),
            )
        if reason:
            logger.info(f"task {self.task}: reward {reward} ({reason})")
        self.outcomes.append(
            {
                "reward": reward,
                "reason": reason,
                "answer": answer,
                "tool_calls": calls,
                "tool_timeouts": timeouts,
                "tool_errors": tool_errors,
            }
        )
        traj = tokens.trajectory(self.task, reward)
        scope = f"{workflow_context.stat_scope()}/{self.task}"
        stats_tracker.get(scope).scalar(
            reward=reward,
            tool_calls=float(calls),
            tool_timeouts=float(timeouts),
            tool_failures=float(len(tool_errors)),
            answered=float(answer is not None),
        )
        traj["env_intervals"] = env
        return traj
