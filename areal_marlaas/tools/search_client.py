"""The search agent's side of ``marlaas search-server``: async HTTP (aiohttp, one
pooled session per event loop), retries with backoff for connection errors and
5xx/429 replies, all within one time budget."""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator

import aiohttp

from areal_marlaas.tools.bm25 import Passage

# One connection pool per event loop: a session belongs to the loop it was made
# on, and AReaL runs every workflow of a rollout worker on one loop. aiohttp, not
# httpx: measured on 2 cores, httpx's pool added 0.9 s per search at 64 searches
# in flight (4.6 s at 200; encode/httpx#3215), aiohttp 21 ms (72 ms).
_SESSIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple] = (
    weakref.WeakKeyDictionary()
)


class SearchError(RuntimeError):
    """A search that failed for good (the message says why)."""


async def _closes_with_the_loop(
    loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession
) -> AsyncIterator[None]:
    # A suspended async generator: the loop's shutdown_asyncgens() (asyncio.run,
    # uvloop) closes it, and with it the session, when the loop ends.
    try:
        yield
    finally:
        _SESSIONS.pop(loop, None)  # the entry refers to the loop: never a weak key
        await session.close()


async def loop_session() -> aiohttp.ClientSession:
    """The running loop's shared session (made on first use)."""
    loop = asyncio.get_running_loop()
    held = _SESSIONS.get(loop)
    if held is None or held[0].closed:
        session = aiohttp.ClientSession(
            # No aiohttp timeout: the caller's budget (asyncio.timeout) bounds it.
            timeout=aiohttp.ClientTimeout(total=None),
            # Idle connections expire before the server's keep-alive (30s) would
            # close them under a request (a spurious disconnect).
            connector=aiohttp.TCPConnector(limit=1024, keepalive_timeout=10.0),
        )
        keeper = _closes_with_the_loop(loop, session)
        await keeper.__anext__()
        held = _SESSIONS[loop] = (session, keeper)
    return held[0]


def is_remote(url: str) -> bool:
    return url.startswith(("http://", "https://"))


class SearchClient:
    """``search(query, k, timeout_s)`` against ``url`` (``http://host:port``).

    A connection error, a 5xx or a 429 reply is retried up to ``retries`` times,
    pausing ``backoff_s``, then twice that, ...; a 4xx or a malformed reply is not. All
    attempts and pauses share ``timeout_s``: past it the search raises
    ``TimeoutError`` (with the last error, if any); when the retries run out it
    raises ``SearchError``."""

    def __init__(self, url: str, retries: int = 2, backoff_s: float = 0.2):
        if not is_remote(url):
            raise ValueError(f"search server url must be http(s)://..., got {url!r}")
        self.url = url.rstrip("/") + "/search"
        self.retries = retries
        self.backoff_s = backoff_s

    async def search(self, query: str, k: int, timeout_s: float) -> list[Passage]:
        last = ""
        try:
            async with asyncio.timeout(timeout_s):
                attempt = 0
                while True:
                    attempt += 1
                    try:
                        return await self._once(query, k)
                    except _Retryable as e:
                        last = str(e)
                    if attempt > self.retries:
                        raise SearchError(f"{last} (after {attempt} attempts)")
                    await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        except TimeoutError:
            raise TimeoutError(f"last error: {last}" if last else "") from None

    async def _once(self, query: str, k: int) -> list[Passage]:
        session = await loop_session()
        try:
            async with session.post(self.url, json={"query": query, "k": k}) as resp:
                status, body = resp.status, await resp.read()
        except aiohttp.ClientError as e:  # refused, reset, disconnected
            raise _Retryable(f"{type(e).__name__}: {e}") from e
        if status >= 500 or status == 429:  # the server is down or overloaded
            raise _Retryable(f"HTTP {status}")
        if status != 200:
            raise SearchError(f"HTTP {status}: {body[:200].decode(errors='replace')}")
        try:
            return [
                Passage(str(p["id"]), p.get("title", ""), p["text"], float(p["score"]))
                for p in json.loads(body)["passages"]
            ]
        except (ValueError, KeyError, TypeError) as e:
            raise SearchError(f"malformed reply: {type(e).__name__}: {e}") from e


class _Retryable(Exception):
    pass
