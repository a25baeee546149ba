"""An LLM judge at an OpenAI-compatible endpoint: is a predicted answer correct?

Any failure (timeout, connection error, HTTP error, a reply that is neither yes
nor no) scores 0 with a reason; the judge never raises into a rollout.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

import aiohttp
from areal.utils import logging

logger = logging.getLogger("MARLaaSJudge")

JUDGE_PROMPT = (
    "You grade answers to questions. Reply with one word: yes if the predicted "
    "answer means the same as the gold answer, otherwise no.\n"
    "Question: {question}\nGold answer: {gold}\nPredicted answer: {pred}\n"
    "Is the predicted answer correct? Reply yes or no."
)
_VERDICT = re.compile(r"^\W*(yes|no|correct|incorrect|true|false|1|0)\b", re.I)
_POSITIVE = {"yes", "correct", "true", "1"}


def parse_verdict(reply: str) -> float | None:
    """1.0 / 0.0 from the reply's first word, None when it is not a verdict."""
    m = _VERDICT.match(reply.strip())
    if m is None:
        return None
    return 1.0 if m.group(1).lower() in _POSITIVE else 0.0


@dataclass
class JudgeResult:
    score: float
    reason: str  # "" when the judge gave a verdict
    attempts: int
    reply: str = ""


class JudgeClient:
    """POSTs to ``url`` (``.../v1/chat/completions`` or ``.../v1/completions``)."""

    def __init__(
        self,
        url: str,
        model: str,
        timeout_s: float = 30.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        max_tokens: int = 8,
    ):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"judge url must be http(s)://..., got {url!r}")
        self.url = url
        self.model = model
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_tokens = max_tokens
        self.chat = not url.rstrip("/").endswith("/v1/completions")

    def payload(self, prompt: str) -> dict:
        body = {"model": self.model, "max_tokens": self.max_tokens, "temperature": 0.0}
        if self.chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    def reply_text(self, data: dict) -> str:
        choice = data["choices"][0]
        if self.chat:
            return choice["message"]["content"] or ""
        return choice["text"]

    async def _post(self, session: aiohttp.ClientSession, body: dict) -> str:
        async with session.post(self.url, json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
            return self.reply_text(await resp.json())

    async def score(self, question: str, gold: str, pred: str) -> JudgeResult:
        body = self.payload(
            JUDGE_PROMPT.format(question=question, gold=gold, pred=pred)
        )
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        reason = ""
        attempts = 0
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for attempt in range(self.retries + 1):
                attempts = attempt + 1
                try:
                    reply = await self._post(session, body)
                except TimeoutError:
                    reason = f"judge timed out after {self.timeout_s}s"
                except (aiohttp.ClientError, RuntimeError, KeyError, ValueError) as e:
                    reason = f"judge request failed: {type(e).__name__}: {e}"
                else:
                    verdict = parse_verdict(reply)
                    if verdict is None:
                        reason = f"unparseable judge reply {reply[:80]!r}"
                        logger.info(reason)
                        return JudgeResult(0.0, reason, attempts, reply)
                    return JudgeResult(verdict, "", attempts, reply)
                if attempt < self.retries:
                    await asyncio.sleep(self.backoff_s * 2**attempt)
        logger.warning(f"{reason} ({attempts} attempts); scoring 0")
        return JudgeResult(0.0, reason, attempts)
