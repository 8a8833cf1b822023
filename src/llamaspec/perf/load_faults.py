"""The faults of a load run (perf.load) that need more than a signal: a client that stops
reading a stream (`stall`: when the stall began, when the server's slot was free again, and
whether the client had to close the connection for that), and the records of a kill
(`Outage`) and a stall (`Stall`). Also the request body every load request sends."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from llamaspec.perf.load_plan import LoadPrompt
from llamaspec.runtime import loopback, metrics


@dataclass
class Outage:
    """A kill: when (run clock), what was in flight, when the restarted server was healthy."""

    phase: int
    mode: str
    at: float
    in_flight: int
    healthy_at: float | None = None
    error: str = ""

    @property
    def window(self) -> tuple[float, float | None]:
        return self.at, self.healthy_at


@dataclass
class Stall:
    """A stream that stopped being read, and when its slot came back."""

    phase: int
    mode: str
    began: float | None = None
    slot_free_at: float | None = None
    closed_at: float | None = None
    tokens_read: int = 0
    how: str = ""
    watched_with: str = "/slots"


def body(p: LoadPrompt, stream: bool, n_predict: int | None = None) -> dict:
    """Greedy, uncached, a fixed budget (EOS ignored), token ids returned."""
    return {
        "prompt": p.prompt if isinstance(p.prompt, str) else list(p.prompt),
        "n_predict": n_predict or p.n_predict,
        "temperature": 0.0,
        "top_k": 1,
        "seed": 0,
        "cache_prompt": False,
        "ignore_eos": True,
        "return_tokens": True,
        "stream": stream,
    }


def reply_json(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def stall(
    url: str,
    clock: Callable[[], float],
    prompt: LoadPrompt,
    budget: int,
    bound: float,
    timeout: float,
    phase: int,
    mode: str,
) -> Stall:
    """Open a stream of `budget` tokens, read one token, stop reading (the connection stays
    open); watch the slots until none is busy; close after `bound` seconds if one still is.
    Run it when no other client is busy, so a busy slot is the stalled one."""
    st = Stall(phase, mode)
    client = loopback.client(httpx.Timeout(timeout, connect=5.0))
    try:
        req = client.build_request("POST", url + "/completion", json=body(prompt, True, budget))
        r = client.send(req, stream=True)
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: ") and (reply_json(line[6:]) or {}).get("tokens"):
                st.tokens_read = 1
                break
        st.began = round(clock(), 2)

        def busy() -> bool | None:
            try:
                reply = loopback.get(url + "/slots", 5)
                if reply.status_code == 200:
                    return any(s.get("is_processing") for s in reply.json())
                st.watched_with = "/metrics llamacpp:requests_processing"
                page = metrics.parse(loopback.get(url + "/metrics", 5).text)
                return page.get("llamacpp:requests_processing", {}).get((), 0.0) > 0
            except (httpx.HTTPError, ValueError, metrics.MetricsFormatError):
                return None

        def wait(limit: float) -> bool:
            end = time.monotonic() + limit
            while time.monotonic() < end:
                if busy() is False:
                    st.slot_free_at = round(clock(), 2)
                    return True
                time.sleep(0.2)
            return False

        if wait(bound):
            st.how = (
                "the server freed the slot while the client was not reading (it finished the "
                f"{budget}-token answer into the connection's buffers)"
            )
        else:
            r.close()
            st.closed_at = round(clock(), 2)
            st.how = (
                f"the slot was still busy after {bound:g}s; the client closed the connection"
                + (", and the server freed it" if wait(bound) else ", and it stayed busy")
            )
        r.close()
    except httpx.HTTPError as exc:
        st.how = f"the stall request failed: {type(exc).__name__}: {exc}"[:300]
    finally:
        client.close()
    return st
