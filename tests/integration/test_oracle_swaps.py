"""The oracle against itself on a real plain server: swapped tokens are judged over the
envelope, the unmodified greedy output at gap 0 (tests/unit/test_oracle.py does the same
against a table, near-ties included)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from llamaspec.engine.artifact import Artifact
from llamaspec.models.methods import determinism_args
from llamaspec.proof import verify, verify_report
from llamaspec.proof.oracle import Oracle
from llamaspec.runtime.client import (
    Completion,
    Prompt,
    base_args,
    next_token_logprobs,
    running,
    server_help,
)

pytestmark = pytest.mark.integration

PROMPT = Prompt("short", "The capital of France is", 16)
# The embedded model's envelope as `verify --tier oracle` measured it on a CPU build
# (reports/verify-llamacpp-cpu-2a65556682b3-embedded-oracle.md).
ENVELOPE = 0.826


def test_the_oracle_judges_real_swaps_over_the_envelope(
    upstream_artifact: Artifact, gemma_path: Path, tmp_path: Path
) -> None:
    server = upstream_artifact.server
    args = [*base_args(gemma_path), *determinism_args(server_help(server))]
    with running(server, args, tmp_path / "plain.log") as srv:
        # The greedy output token by token, with the real top-10 at every step, on the
        # oracle's own path (a token-id prompt, prompt cache on): /completion's own output
        # decodes one token at a time, where these prefixes are evaluated in small batches,
        # and may take the other side of a near-tie (0.04 nats at token 11 here), which is
        # what the envelope allows for.
        ids = srv.tokenize(PROMPT.text)
        tokens: tuple[int, ...] = ()
        tops: list[dict[int, float]] = []
        for _ in range(PROMPT.n_predict):
            chosen, top = next_token_logprobs(srv, [*ids, *tokens])
            tokens, tops = (*tokens, chosen), [*tops, top]
        greedy = Completion(tokens, "", 0.0, None, None, len(tokens))
        oracle = Oracle(srv)  # its own requests, nothing shared with the loop above

        def judged(output: tuple[int, ...]) -> verify_report.Case:
            spec = Completion(output, "", 0.0, None, None, len(output))
            case = verify.compare(PROMPT, "sequential", greedy, spec, srv, None)
            return verify.judge_gaps(case, oracle.gaps(PROMPT, output), ENVELOPE)

        same = judged(tokens)
        assert (same.kind, same.max_gap, same.over) == ("identical", 0.0, [])
        # swap at the position where the first choice leads the second the most
        ranked = [sorted(top, key=lambda t, top=top: -top[t]) for top in tops]
        pos = max(range(len(tokens)), key=lambda i: tops[i][ranked[i][0]] - tops[i][ranked[i][1]])
        top, order = tops[pos], ranked[pos]
        assert len(order) == 10 and order[0] == tokens[pos], (pos, top)
        lead = top[order[0]] - top[order[1]]
        assert lead > ENVELOPE, f"no position leads by more than the envelope: {tops}"
        outside = next(t for t in range(1000, 2000) if t not in top)  # any id not in it
        for swap in (order[1], order[2], order[9], outside):  # 2nd, 3rd, 10th, none
            case = judged((*tokens[:pos], swap, *tokens[pos + 1 :]))
            assert (case.kind, case.position) == ("over-envelope", pos), case
            gap = top[order[0]] - top[swap] if swap in top else math.inf
            where = "outside the top-10" if math.isinf(gap) else f"{gap:.3f} nats"
            assert gap > ENVELOPE and case.max_gap is not None and case.max_gap >= gap
            first = f"token {pos}: emitted {swap}, oracle chose {tokens[pos]} ({where})"
            assert case.over[0] == first, case.over
