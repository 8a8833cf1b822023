"""The one llama-server client: start a server on loopback, wait for it, talk to it, stop it.

Smoke, verify and bench all speak to servers through this module: `/health`, greedy
`/completion` (token ids where the engine returns them, per-token probabilities where it
does not), top-k log-probabilities, `/tokenize`, `/detokenize`, `/metrics` and the
OpenAI-compatible chat endpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from llamaspec import env as envvars
from llamaspec import procs
from llamaspec.errors import LlamaspecError, missing_extra
from llamaspec.models.server_help import server_help
from llamaspec.procs import kill_group
from llamaspec.runtime import loopback, metrics

__all__ = [
    "HOST",
    "Completion",
    "Prompt",
    "Server",
    "Token",
    "base_args",
    "complete",
    "free_port",
    "log_acceptance",
    "render_chat",
    "request",
    "running",
    "server_help",
    "tail",
    "token_key",
    "top_logprobs_at",
]

HOST = "127.0.0.1"
TOP_K = 10
N_PREDICT = 64

Token = int | str


@dataclass(frozen=True)
class Prompt:
    """A named greedy request: its text and how many tokens to generate. A chat prompt has
    `messages` ((role, content) pairs) and no text until `render_chat` asks the server."""

    name: str
    text: str
    n_predict: int = N_PREDICT
    messages: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Completion:
    """One greedy reply: the tokens (ids, or texts where the server gives no ids) and stats."""

    tokens: tuple[Token, ...]
    text: str
    predicted_per_second: float
    draft_n: int | None
    draft_accepted: int | None
    tokens_predicted: int | None = None  # as the server reports it
    draft_source: str | None = None  # where draft_n came from: "timings" or "log"


LOOPBACK_FIX = (
    "The loopback interface is down or has no address, as in a fresh network namespace: "
    "bring it up (`ip link set lo up`; `ip addr show lo` should list 127.0.0.1), or run "
    "where 127.0.0.1 is reachable."
)


def free_port() -> int:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            return s.getsockname()[1]
    except OSError as exc:
        raise LlamaspecError(
            f"Cannot bind a port on {HOST} for llama-server ({exc.strerror or exc}). "
            + LOOPBACK_FIX
        ) from None


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


@dataclass
class Server:
    """A running llama-server process."""

    argv: list[str]
    port: int
    log: Path
    proc: subprocess.Popen
    returns_tokens: bool | None = None  # learnt from the first /completion reply
    host: str = HOST

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def failure(self, what: str) -> LlamaspecError:
        return LlamaspecError(
            f"{what}. Command: {' '.join(self.argv)}",
            details=f"Last 40 lines of {self.log}:\n{tail(self.log)}",
        )

    def post(self, path: str, payload: dict, timeout: float = 600) -> dict:
        """POST JSON and return the JSON reply; a dead server or error reply is an error."""
        try:
            r = loopback.post(self.url + path, payload, timeout)
        except httpx.HTTPError as exc:
            if self.proc.poll() is not None:
                raise self.failure(f"llama-server died (exit {self.proc.returncode})") from None
            raise self.failure(f"request to {path} failed: {exc}") from None
        if r.status_code != 200:
            raise self.failure(f"{path} answered HTTP {r.status_code}: {r.text[:500]}")
        return r.json()

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of `text` as the server's /completion would see it (BOS included)."""
        reply = self.post("/tokenize", {"content": text, "add_special": add_special})
        return [int(t["id"]) if isinstance(t, dict) else int(t) for t in reply.get("tokens", [])]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return str(self.post("/detokenize", {"tokens": list(tokens)}).get("content", ""))

    def slot_ctx(self) -> int | None:
        """The context a slot really has (/slots `n_ctx`; the engine rounds a small one up
        and caps it at the model's training context); None where /slots does not say."""
        try:
            reply = loopback.get(self.url + "/slots", 10)
            slots = reply.json() if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        if isinstance(slots, list) and slots and isinstance(slots[0], dict):
            n = slots[0].get("n_ctx")
            return int(n) if isinstance(n, int) and n > 0 else None
        return None

    def metrics(self) -> dict[str, float]:
        """The Prometheus counters of /metrics (server started with --metrics), by name."""
        try:
            text = loopback.get(self.url + "/metrics", 10).text
        except httpx.HTTPError:
            return {}
        try:
            samples = metrics.parse(text)
        except metrics.MetricsFormatError:
            return {}
        return {name: by[()] for name, by in samples.items() if () in by}

    def chat_stream(self, content: str, max_tokens: int = 32) -> tuple[str, dict]:
        """A streamed greedy chat request through the OpenAI client: (text, last timings)."""
        try:
            from openai import OpenAI
        except ImportError:
            raise missing_extra(
                "smoke", "openai", "The smoke test's check of the OpenAI-compatible endpoint"
            ) from None
        client = OpenAI(
            base_url=self.url + "/v1",
            api_key="llamaspec",
            timeout=300,
            http_client=loopback.client(300),
        )
        text, timings = "", {}
        try:
            stream = client.chat.completions.create(
                model="target",
                temperature=0,
                max_tokens=max_tokens,
                stream=True,
                messages=[{"role": "user", "content": content}],
                extra_body={"timings_per_token": True},
            )
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                timings = (chunk.model_extra or {}).get("timings") or timings
        except Exception as exc:  # the client raises many types; all mean the same here
            raise self.failure(
                f"the OpenAI-compatible /v1/chat/completions failed: {exc}"
            ) from None
        return text, timings


@contextlib.contextmanager
def running(
    server_bin: Path,
    args: Sequence[str],
    log: Path,
    ready_timeout: float | None = None,
    env: dict[str, str] | None = None,
    prefix: Sequence[str] = (),
) -> Iterator[Server]:
    """Start `server_bin args` on a free loopback port; yield once /health says ok; stop it.

    The start-up limit defaults to LLAMASPEC_SERVER_READY_TIMEOUT seconds, else 900.
    `prefix`: a program that runs the server (e.g. an emulator: `qemu-x86_64 -cpu Nehalem`)."""
    if ready_timeout is None:
        ready_timeout = envvars.seconds(envvars.SERVER_READY_TIMEOUT, 900.0)
    port = free_port()
    argv = [*prefix, str(Path(server_bin).resolve()), *args, "--host", HOST, "--port", str(port)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        proc = procs.spawn(  # dies with llamaspec, however llamaspec dies
            argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=log.parent,  # servers that write llama.log leave it beside their log
            start_new_session=True,
        )
    server = Server(argv=argv, port=port, log=log, proc=proc)
    try:
        _wait_ready(server, ready_timeout)
        yield server
    finally:
        _stop(proc)


# Connection errors that waiting does not heal: the network stack cannot reach the address
# at all (loopback down, no address). A refused connection is the server still loading.
UNHEALABLE = frozenset({errno.ENETUNREACH, errno.ENETDOWN, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT})
STRIKES = 4  # consecutive unhealable errors before the start is given up


def unhealable(exc: BaseException) -> OSError | None:
    """The OS error under a failed request (httpx wraps it twice) when it is one that
    waiting does not heal, else None."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in UNHEALABLE:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _wait_ready(server: Server, timeout: float) -> None:
    """Until /health answers 200 (the model is loaded). A refused connection is waited on
    while the process lives; a process that exits, or a health check that fails again and
    again with an error waiting cannot heal, ends the wait at once with the cause."""
    deadline = time.monotonic() + timeout
    last, strikes = "no health check answered", 0
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise server.failure(
                f"llama-server exited during start-up (exit {server.proc.returncode})"
            )
        try:
            status = loopback.get(server.url + "/health", 5).status_code
            if status == 200:
                return
            last, strikes = f"/health answered HTTP {status}", 0
        except httpx.HTTPError as exc:
            cause = unhealable(exc)
            last = f"{exc}" or type(exc).__name__
            strikes = strikes + 1 if cause is not None else 0
            if cause is not None and strikes >= STRIKES:
                name = errno.errorcode.get(cause.errno or 0, "")
                raise server.failure(
                    f"llama-server's health check cannot reach {server.url}: "
                    f"{cause.strerror or cause} ({name}), {strikes} times in a row while the "
                    f"server runs; waiting does not heal that. {LOOPBACK_FIX}"
                ) from None
        time.sleep(0.25)
    raise server.failure(
        f"llama-server was not healthy after {timeout:.0f}s (the last health check: {last})"
    )


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server and anything it started (its own process group)."""
    if proc.poll() is None:
        kill_group(proc, grace=20)


def base_args(model: Path, ctx: int = 4096, slots: int = 1) -> list[str]:
    """Server settings for reproducible greedy runs (requests also turn off prompt reuse)."""
    return ["-m", str(model), "-c", str(ctx), "-np", str(slots), "--no-warmup"]


def request(
    prompt: Prompt | str | Sequence[int],
    n_predict: int | None = None,
    n_probs: int = 0,
    cache_prompt: bool = False,
) -> dict:
    """A greedy /completion request that returns token ids (prompt: text or token ids)."""
    text = prompt.text if isinstance(prompt, Prompt) else prompt
    default = prompt.n_predict if isinstance(prompt, Prompt) else N_PREDICT
    return {
        "prompt": text if isinstance(text, str) else list(text),
        "n_predict": n_predict if n_predict is not None else default,
        "temperature": 0.0,
        "top_k": 1,
        "seed": 0,
        "cache_prompt": cache_prompt,
        "return_tokens": True,
        "n_probs": n_probs,
        "stream": False,
    }


_ACCEPT = re.compile(r"draft acceptance rate = [\d.]+ \(\s*(\d+) accepted /\s*(\d+) generated\)")


def log_acceptance(log_text: str) -> tuple[int, int] | None:
    """(accepted, drafted) from server-log acceptance lines (ik_llama.cpp reports it there)."""
    found = _ACCEPT.findall(log_text)
    if not found:
        return None
    return sum(int(a) for a, _ in found), sum(int(g) for _, g in found)


def token_key(entry: dict) -> Token:
    """A generated token's identity: its id, or its text where the server gives no ids
    (older probability format: {"content", "probs": [{"tok_str", "prob"}]})."""
    return int(entry["id"]) if "id" in entry else str(entry.get("content", entry.get("tok_str")))


def complete(server: Server, prompt: Prompt) -> Completion:
    """One greedy request; token ids come from `tokens`, or (engines without
    `return_tokens`, e.g. ik_llama.cpp) from per-token `completion_probabilities`."""
    n_probs = 0 if server.returns_tokens is not False else 1
    before = server.log.stat().st_size if server.log.exists() else 0
    reply = server.post("/completion", request(prompt, n_probs=n_probs))
    if reply.get("tokens") is None:
        if n_probs == 0:
            server.returns_tokens = False
            return complete(server, prompt)
        probs = reply.get("completion_probabilities")
        if probs is None:
            raise server.failure("the server returned neither token ids nor token probabilities")
        reply["tokens"] = [token_key(p) for p in probs]
    timings = reply.get("timings", {})
    draft_n, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
    source = None if draft_n is None else "timings"
    if draft_n is None:
        time.sleep(0.2)  # the slot's summary is logged just after the reply
        with server.log.open(errors="replace") as fh:
            fh.seek(before)
            counts = log_acceptance(fh.read())
        if counts:
            accepted, draft_n = counts
            source = "log"
    return Completion(
        tokens=tuple(reply["tokens"]),
        text=reply.get("content", ""),
        predicted_per_second=float(timings.get("predicted_per_second", 0.0)),
        draft_n=draft_n,
        draft_accepted=accepted,
        tokens_predicted=reply.get("tokens_predicted"),
        draft_source=source,
    )


def render_chat(server: Server, prompt: Prompt) -> Prompt:
    """A chat prompt with its text: the messages through the model's own chat template
    (`/apply-template`), less a leading BOS text the server adds again when it tokenizes."""
    if not prompt.messages or prompt.text:
        return prompt
    messages = [{"role": role, "content": content} for role, content in prompt.messages]
    text = server.post("/apply-template", {"messages": messages}).get("prompt")
    if not isinstance(text, str) or not text:
        raise server.failure(f"/apply-template gave no prompt text for chat prompt {prompt.name!r}")
    bos = server.tokenize("", add_special=True)
    if bos and server.tokenize(text, add_special=False)[:1] == bos:
        text = text.removeprefix(server.detokenize(bos))
    return dataclasses.replace(prompt, text=text)


def _top(entry: dict) -> dict[Token, float]:
    if "top_logprobs" in entry:
        return {int(t["id"]): float(t["logprob"]) for t in entry["top_logprobs"]}
    return {
        str(t["tok_str"]): math.log(t["prob"]) if t["prob"] > 0 else -math.inf
        for t in entry.get("probs", [])
    }


def top_logprobs_at(
    server: Server, prompt: Prompt, position: int
) -> tuple[Token, dict[Token, float]]:
    """The reference's chosen token and its top-k {token: logprob} at `position`."""
    reply = server.post("/completion", request(prompt, n_predict=position + 1, n_probs=TOP_K))
    probs = reply.get("completion_probabilities") or []
    if len(probs) <= position:
        raise server.failure(f"the reference returned no probabilities for token {position}")
    entry = probs[position]
    return token_key(entry), _top(entry)


def decode_with_top(
    server: Server, prompt: Prompt | Sequence[int], n_predict: int | None = None
) -> tuple[list[int], list[dict[int, float]]]:
    """One greedy request decoded one token at a time, with its top-k log-probabilities at
    every emitted token: (token ids, [{token: logprob}] per position)."""
    reply = server.post("/completion", request(prompt, n_predict=n_predict, n_probs=TOP_K))
    probs = reply.get("completion_probabilities") or []
    tokens = [int(token_key(p)) for p in probs]
    if reply.get("tokens") is not None and list(reply["tokens"]) != tokens:
        raise server.failure("the server's token ids and its per-token probabilities disagree")
    return tokens, [{int(k): v for k, v in _top(p).items()} for p in probs]


def next_token_logprobs(server: Server, tokens: Sequence[int]) -> tuple[int, dict[int, float]]:
    """The server's greedy next token after exactly `tokens`, and its top-k log-probabilities.

    The prompt cache is on, so consecutive prefixes of one output evaluate one new token each."""
    reply = server.post(
        "/completion", request(tokens, n_predict=1, n_probs=TOP_K, cache_prompt=True)
    )
    probs = reply.get("completion_probabilities") or []
    if not probs:
        raise server.failure("the reference returned no probabilities for the next token")
    top = _top(probs[0])
    return int(token_key(probs[0])), {int(k): v for k, v in top.items()}


def list_devices(server: Path, timeout: float) -> str | None:
    """What `llama-server --list-devices` prints, or None when it cannot be run."""
    from llamaspec import procs

    try:
        proc = procs.run(
            [str(server), "--list-devices"],
            timeout=timeout,
            check=False,
            what=f"{server.name} --list-devices",
        )
    except LlamaspecError:
        return None
    return proc.stdout
