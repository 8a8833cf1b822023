"""The project's engine patches through the real server: each defect shows on the stock build
of the pin (`build --no-default-patches`) and is gone on the default (patched) build. One
observation function per patch runs unchanged on both builds; the assertions say what stock
does and what the patch changes."""

from __future__ import annotations

import io
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from llamaspec.engine.artifact import Artifact
from llamaspec.models import dialects
from llamaspec.models.server_help import server_help
from llamaspec.perf.costmodel import counters
from llamaspec.perf.workloads import INVENTORY_MODULE
from llamaspec.proof.hybrid import hybrid_model
from llamaspec.proof.refmodels import eagle3, qwen35
from llamaspec.runtime.client import base_args, request, running

pytestmark = pytest.mark.integration

PROMPT = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
    "    if n < 2:\n        return n\n"
)
N_PREDICT = 48


def _applied(artifact: Artifact) -> set[str]:
    return {p["id"] for p in artifact.manifest["patches"] if p["status"] == "applied"}


def test_the_two_builds_differ_only_by_the_project_patches(
    upstream_artifact: Artifact, upstream_stock_artifact: Artifact
) -> None:
    assert upstream_artifact.id != upstream_stock_artifact.id
    from llamaspec import config

    ours = {p.id for p in config.load_series() if p.engine == "llama.cpp" and p.state == "project"}
    assert len(ours) >= 5 and ours <= _applied(upstream_artifact)
    assert not _applied(upstream_stock_artifact)
    for key in ("engine", "commit", "backend", "variants"):
        assert upstream_artifact.manifest[key] == upstream_stock_artifact.manifest[key], key

    def defines(a: Artifact) -> dict[str, str]:
        return {d["name"]: d["value"] for d in a.manifest["defines"]}

    patched, stock = defines(upstream_artifact), defines(upstream_stock_artifact)
    # the version stamp says how many patches a build carries; every other define is equal
    assert patched.pop("LLAMA_BUILD_COMMIT") == f"0c1e570+{len(ours)}p"
    assert stock.pop("LLAMA_BUILD_COMMIT") == "0c1e570"
    assert patched == stock


@dataclass(frozen=True)
class NMaxSeen:
    plain: list[int]  # a plain server's greedy tokens
    off: list[int]  # speculative server, request with speculative.n_max = 0
    off_drafted: int
    capped_drafted: int  # speculative.n_max = 2
    capped_steps: int
    default_drafted: int  # no per-request field
    default_steps: int
    negative_status: int  # speculative.n_max = -1


def _n_max_seen(artifact: Artifact, gemma: Path, logs: Path) -> NMaxSeen:
    base = base_args(gemma)
    spec = [*base, "-md", str(gemma), "--spec-type", "draft-simple", "--spec-draft-n-max", "8"]
    with running(artifact.server, base, logs / f"plain-{artifact.id}.log") as srv:
        plain = srv.post("/completion", request(PROMPT, N_PREDICT))["tokens"]
    with running(artifact.server, [*spec, "--metrics"], logs / f"spec-{artifact.id}.log") as srv:

        def ask(extra: dict) -> tuple[list[int], int, int]:
            before = counters(srv)
            reply = srv.post("/completion", {**request(PROMPT, N_PREDICT), **extra})
            delta = counters(srv) - before
            assert delta.available
            return reply["tokens"], int(delta.drafted), int(delta.drafts)

        off, off_drafted, _ = ask({"speculative.n_max": 0})
        _, capped_drafted, capped_steps = ask({"speculative.n_max": 2})
        _, default_drafted, default_steps = ask({})
        bad = httpx.post(
            srv.url + "/completion",
            json={**request(PROMPT, 4), "speculative.n_max": -1},
            timeout=120,
        )
    return NMaxSeen(
        plain, off, off_drafted, capped_drafted, capped_steps, default_drafted, default_steps,
        bad.status_code,
    )  # fmt: skip


def test_request_n_max_turns_drafting_off_or_shortens_it(
    upstream_artifact: Artifact, upstream_stock_artifact: Artifact, gemma_path: Path, tmp_path
) -> None:
    """server-request-spec-n-max: stock ignores `speculative.n_max` (every request drafts 8
    a step); patched, 0 drafts nothing and answers exactly as a plain server, 2 drafts at
    most 2 a step, and -1 is refused."""
    stock = _n_max_seen(upstream_stock_artifact, gemma_path, tmp_path)
    assert stock.off_drafted > 0, stock  # the defect: the request cannot turn drafting off
    assert stock.capped_drafted > 2 * stock.capped_steps, stock
    assert stock.negative_status == 200, stock  # the field is not read at all

    patched = _n_max_seen(upstream_artifact, gemma_path, tmp_path)
    assert patched.off_drafted == 0, patched
    assert patched.off == patched.plain  # plain decoding, token for token
    assert 0 < patched.capped_drafted <= 2 * patched.capped_steps, patched
    assert patched.default_drafted > 2 * patched.default_steps, patched  # default unchanged
    assert patched.negative_status == 400, patched


def _drafts_without_type(artifact: Artifact, gemma: Path, logs: Path) -> tuple[int, str]:
    """(tokens drafted, server log) for `-md FILE` with no --spec-type."""
    log = logs / f"no-type-{artifact.id}.log"
    args = [*base_args(gemma), "-md", str(gemma), "--metrics"]
    with running(artifact.server, args, log) as srv:
        before = counters(srv)
        srv.post("/completion", request(PROMPT, N_PREDICT))
        delta = counters(srv) - before
    return int(delta.drafted), log.read_text(errors="replace")


def test_a_draft_model_without_a_spec_type_drafts(
    upstream_artifact: Artifact, upstream_stock_artifact: Artifact, gemma_path: Path, tmp_path
) -> None:
    """spec-type-from-plain-draft (upstream #25345): stock loads the draft and never drafts;
    patched infers draft-simple from the draft GGUF and drafts."""
    drafted, _ = _drafts_without_type(upstream_stock_artifact, gemma_path, tmp_path)
    assert drafted == 0
    drafted, log = _drafts_without_type(upstream_artifact, gemma_path, tmp_path)
    assert drafted > 0
    assert "auto-detected speculative type 'draft-simple'" in log


@dataclass(frozen=True)
class HybridSeen:
    tokens: list[int]
    drafted: int
    restores: int  # whole-state checkpoint restores of the target (server log, -v)
    n_rs_seq: list[str]  # every context's `n_rs_seq = N` line


def _hybrid_seen(artifact: Artifact, target: Path, draft: Path, logs: Path) -> HybridSeen:
    log = logs / f"hybrid-{artifact.id}.log"
    args = [*base_args(target), "-md", str(draft), "--spec-type", "draft-simple",
            "--spec-draft-n-max", "4", "--metrics", "-v"]  # fmt: skip
    with running(artifact.server, args, log) as srv:
        before = counters(srv)
        reply = srv.post("/completion", request(PROMPT, 32))
        drafted = int((counters(srv) - before).drafted)
    text = log.read_text(errors="replace")
    return HybridSeen(
        reply["tokens"],
        drafted,
        text.count("restoring speculative checkpoint"),
        re.findall(r"llama_context: n_rs_seq\s*=\s*\d+", text),
    )


def test_draft_simple_on_a_hybrid_target_rolls_back_instead_of_restoring(
    upstream_artifact: Artifact, upstream_stock_artifact: Artifact, tmp_path
) -> None:
    """draft-simple-recurrent-rollback: on the random Qwen3.5-style hybrid target with a
    hybrid draft of other weights (most drafts rejected), stock restores a whole-state
    checkpoint after partial acceptances; patched gives both contexts recurrent-state
    snapshots (n_rs_seq = n_max) and restores none. Both give the plain server's tokens."""
    console = Console(file=io.StringIO())
    target = hybrid_model(upstream_artifact, console, seed=1)
    draft = hybrid_model(upstream_artifact, console, seed=2)
    with running(upstream_artifact.server, base_args(target), tmp_path / "plain.log") as srv:
        plain = srv.post("/completion", request(PROMPT, 32))["tokens"]

    stock = _hybrid_seen(upstream_stock_artifact, target, draft, tmp_path)
    assert stock.drafted > 0 and stock.restores > 0, stock
    assert all(line.endswith("= 0") for line in stock.n_rs_seq), stock.n_rs_seq

    patched = _hybrid_seen(upstream_artifact, target, draft, tmp_path)
    assert patched.drafted > 0 and patched.restores == 0, patched
    assert patched.n_rs_seq and all(line.endswith("= 4") for line in patched.n_rs_seq), patched
    assert stock.tokens == plain and patched.tokens == plain


def _pool_wipes(artifact: Artifact, gemma: Path, logs: Path) -> tuple[int, int, int]:
    """(pool wipes in the server log, tokens drafted, accepted) over six short requests on a
    prompt that repeats itself, so that each request drafts once and the draft is cut to
    the request's remaining budget. LLAMA_TRACE makes ngram-mod log its wipes."""
    # cut where Gemma 3 tokenizes the prefix as the start of the whole module, so the last
    # tokens of the prompt are an n-gram of its first copy
    prompt = f"{INVENTORY_MODULE}\n\nThe same module once more:\n\n{INVENTORY_MODULE[:701]}"
    log = logs / f"ngram-mod-{artifact.id}.log"
    args = [*base_args(gemma), "--spec-type", "ngram-mod", "--metrics", "-lv", "4"]
    with running(artifact.server, args, log, env={"LLAMA_TRACE": "1"}) as srv:
        before = counters(srv)
        for _ in range(6):
            srv.post("/completion", request(prompt, 12))
        delta = counters(srv) - before
    wipes = log.read_text(errors="replace").count("resetting ngram_mod")
    return wipes, int(delta.drafted), int(delta.accepted)


def test_ngram_mod_does_not_wipe_its_pool_for_fully_accepted_short_drafts(
    upstream_artifact: Artifact, upstream_stock_artifact: Artifact, gemma_path: Path, tmp_path
) -> None:
    """ngram-mod-truncated-draft-acceptance: every draft is cut to the request's remaining
    budget and accepted whole; stock counts each such round against the draft's uncut
    length (10 of 64: "low") and wipes the shared pool after five; patched wipes nothing."""
    wipes, drafted, accepted = _pool_wipes(upstream_stock_artifact, gemma_path, tmp_path)
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    assert wipes >= 1
    wipes, drafted, accepted = _pool_wipes(upstream_artifact, gemma_path, tmp_path)
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    assert wipes == 0


EAGLE_PROMPTS = (
    "The quick brown fox jumps over the lazy dog. ",
    "Hello world, this is a test of speculative decoding. ",
    "abcdefghijklmnopqrstuvwxyz 0123456789 ",
    "Once upon a time there was a small program that ",
)


def _eagle3_seen(artifact: Artifact, logs: Path) -> tuple[tuple[int, int], tuple[int, int], bool]:
    """((drafted, accepted) one request at a time, (drafted, accepted) four at once, whether
    every output is the same both ways) on the EAGLE-3 reference pair, -np 4."""
    ref = eagle3.pair()
    args = [*base_args(ref.target, slots=4), "-md", str(ref.draft), "--spec-type", "draft-eagle3",
            "--no-kv-unified", "-fa", "off"]  # fmt: skip
    with running(artifact.server, args, logs / f"eagle3-{artifact.id}.log") as srv:

        def ask(prompt: str) -> tuple[int, int, list[int]]:
            reply = srv.post("/completion", request(prompt, 128))
            t = reply["timings"]
            return int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0)), reply["tokens"]

        one = [ask(p) for p in EAGLE_PROMPTS]
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(ask, EAGLE_PROMPTS))

    def total(rs: list) -> tuple[int, int]:
        return sum(r[0] for r in rs), sum(r[1] for r in rs)

    return total(one), total(together), [r[2] for r in one] == [r[2] for r in together]


def test_eagle3_drafts_as_well_for_requests_at_once_as_one_at_a_time(
    upstream_artifact: Artifact, upstream_stock_artifact: Artifact, tmp_path
) -> None:
    """backend-sampling-outputs: with the default backend draft sampling, stock EAGLE-3
    drafts worse when four requests draft at once (every draft row reads the last
    sequence's top-k candidates); patched drafts exactly as one at a time. The target
    verifies, so outputs are the same either way."""

    def rate(seen: tuple[int, int]) -> float:
        return seen[1] / seen[0] if seen[0] else 0.0

    one, together, same = _eagle3_seen(upstream_stock_artifact, tmp_path)
    assert same and one[1] > 0
    # measured: 111 of 1177 at once against 237 of 799 one at a time
    assert rate(together) < 0.75 * rate(one), (one, together)
    one, together, same = _eagle3_seen(upstream_artifact, tmp_path)
    assert same and one[1] > 0
    # measured: 237 of 799 both ways; batch shapes may move a near-tie, not a third
    assert rate(together) >= 0.9 * rate(one), (one, together)


@dataclass(frozen=True)
class BusySeen:
    takes_flag: bool  # the build's --help lists --spec-busy-max
    plain: list[int]
    together: list[tuple[int, int, list[int]]]  # two requests at once: drafted, accepted, tokens
    alone: tuple[int, int, list[int]]  # then one alone: drafting resumes
    off: tuple[int, int, list[int]]  # slot 0, speculative.n_max 0: its draft context skips
    after: tuple[int, int, list[int]]  # slot 0 again: the draft catches up, then drafts
    caught_up: int  # the draft's catch-up lines in the server log (-v)


def _busy_seen(artifact: Artifact, gemma: Path, logs: Path) -> BusySeen:
    """Gemma as its own draft on two slots, with --spec-busy-max 1 where the build takes it."""
    takes = "--spec-busy-max" in server_help(artifact.server)
    with running(artifact.server, base_args(gemma), logs / f"busy-plain-{artifact.id}.log") as srv:
        plain = srv.post("/completion", request(PROMPT, N_PREDICT))["tokens"]
    busy = ["--spec-busy-max", "1"] if takes else []
    args = [*base_args(gemma, slots=2), "-md", str(gemma), "--spec-type", "draft-simple",
            "--spec-draft-n-max", "8", *busy, "-v"]  # fmt: skip
    log = logs / f"busy-{artifact.id}.log"
    with running(artifact.server, args, log) as srv:

        def ask(extra: dict) -> tuple[int, int, list[int]]:
            reply = srv.post("/completion", {**request(PROMPT, N_PREDICT), **extra})
            t = reply["timings"]
            return int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0)), reply["tokens"]

        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(ask, [{}, {}]))
        alone = ask({})
        off = ask({"id_slot": 0, "speculative.n_max": 0})
        after = ask({"id_slot": 0})
    caught = log.read_text(errors="replace").count("the draft caught up")
    return BusySeen(takes, plain, together, alone, off, after, caught)


def test_busy_max_stops_drafting_while_more_slots_are_busy_and_the_draft_skips_their_work(
    upstream_artifact: Artifact, upstream_stock_artifact: Artifact, gemma_path: Path, tmp_path
) -> None:
    """server-spec-busy-max: stock cannot stop drafting under load (no such option; two
    requests at once draft every step); patched with --spec-busy-max 1 drafts at most in a
    first step while both slots are busy, drafts again alone, and its draft context, which
    skipped the tokens of the slots that did not draft, catches up and drafts as well as
    before. Every output is the plain server's."""
    stock = _busy_seen(upstream_stock_artifact, gemma_path, tmp_path)
    assert not stock.takes_flag
    assert all(d > 2 * 8 for d, _, _ in stock.together), stock.together  # measured: 41 each

    patched = _busy_seen(upstream_artifact, gemma_path, tmp_path)
    assert patched.takes_flag
    for drafted, _, tokens in (*patched.together, patched.alone, patched.off, patched.after):
        assert tokens == patched.plain, drafted
    # at most the first step of each request drafts (measured: 8 each), not every step
    assert sum(d for d, _, _ in patched.together) <= 2 * 8, patched.together
    assert patched.alone[0] > 2 * 8, patched.alone  # one busy slot: drafting resumes
    assert patched.off[0] == 0, patched.off
    # slot 0's draft skipped the n_max-0 request and caught up: it drafts and accepts as alone
    drafted, accepted, _ = patched.after
    assert drafted > 2 * 8 and accepted >= 0.9 * drafted, patched.after
    assert patched.caught_up >= 1, patched.caught_up


# Four prompts of different lengths, each asked again with a changed ending on the same slot
# (its cached prompt is reused up to a context checkpoint): the traffic of verify's traffic
# mode that showed the MTP-on-hybrid divergence, made small enough to repeat many times.
MOVED_PROMPTS = (
    "Write a C function that reverses a singly linked list in place.\n```c\n",
    "The printing press changed how ideas travelled across Europe. Explain:\n\n",
    "Rewrite this Python code, renaming items to products.\n```python\ndef f(items):\n"
    "    return items\n```\n",
    "The capital of France is",
)
MOVED_TOKENS = 96


def _moved_seen(
    artifact: Artifact, logs: Path, rounds: int, stop_at_first: bool
) -> tuple[int, int]:
    """(outputs that differ from plain decoding, outputs compared): draft-mtp on the random
    Qwen3.5-style MoE hybrid, 8 slots, each used once; then each round sends the four prompts
    at once, each on its own slot with prompt reuse, then the four again with " and"
    appended."""
    target = qwen35.moe_pair().target
    base = [*base_args(target, ctx=8192, slots=8), "--no-kv-unified", "-fa", "off"]
    asked = [p + end for end in ("", " and") for p in MOVED_PROMPTS]
    with running(artifact.server, base, logs / f"moved-plain-{artifact.id}.log") as srv:
        plain = {p: srv.post("/completion", request(p, MOVED_TOKENS))["tokens"] for p in asked}
    # the speculation of the A/B's MTP-hybrid scenario, rendered for the build's dialect
    mtp = dialects.spec_args("upstream", dialects.SpecSettings("mtp", n_max=3, p_min=0.0))
    differ = compared = 0
    with running(artifact.server, [*base, *mtp], logs / f"moved-{artifact.id}.log") as srv:
        # every slot serves a request first (the server picks them), so that the cells of
        # eight sequences lie between those that the rounds use
        for p in asked * 2:
            srv.post("/completion", request(p, MOVED_TOKENS))

        def ask(slot_prompt: tuple[int, str]) -> bool:
            slot, prompt = slot_prompt
            body = {**request(prompt, MOVED_TOKENS, cache_prompt=True), "id_slot": slot}
            return srv.post("/completion", body)["tokens"] == plain[prompt]

        with ThreadPoolExecutor(len(MOVED_PROMPTS)) as pool:
            for _ in range(rounds):
                for end in ("", " and"):
                    same = list(pool.map(ask, enumerate(p + end for p in MOVED_PROMPTS)))
                    differ += same.count(False)
                    compared += len(same)
                if stop_at_first and differ:
                    break
    return differ, compared


def test_mtp_on_a_hybrid_rolls_back_from_its_own_snapshots_when_a_later_ubatch_moves_it(
    upstream_artifact: Artifact, upstream_stock_artifact: Artifact, tmp_path
) -> None:
    """recurrent-rollback-planes-move: under concurrent requests with prompt reuse, stock
    MTP on a Qwen3.5-style hybrid sometimes continues from another sequence's snapshot after a
    rollback, and its greedy output differs from plain decoding (measured by hand: 5 of 800
    requests; the six-patch build 2 to 10 of 1,200); patched, none of 1,200 differ."""
    differ, compared = _moved_seen(upstream_stock_artifact, tmp_path, 400, stop_at_first=True)
    assert differ >= 1, f"stock showed no divergence in {compared} outputs"
    differ, compared = _moved_seen(upstream_artifact, tmp_path, 150, stop_at_first=False)
    assert (differ, compared) == (0, 150 * 2 * len(MOVED_PROMPTS))
