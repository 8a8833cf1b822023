"""The per-token oracle and the oracle tier's judgement, against swapped tokens.

A real oracle needs a running llama-server; here a small stand-in answers the three
requests the oracle and the comparison make (/tokenize, /completion with top-k
log-probabilities, /detokenize) from a fixed table, in the upstream server's reply format.
tests/integration/test_oracle_swaps.py makes the same swaps on a real server.
"""

from __future__ import annotations

import math

import pytest

from llamaspec.proof import verify, verify_report
from llamaspec.proof.oracle import Oracle
from llamaspec.runtime.client import Completion, Prompt, next_token_logprobs

pytestmark = pytest.mark.unit

PROMPT = Prompt("p", "text", 8)
PROMPT_IDS = [1, 2, 3]
# The embedded model's envelope as measured by `verify --tier oracle` on the CPU build
# (reports/verify-llamacpp-cpu-2a65556682b3-embedded-oracle.md): 0.826 nats.
ENVELOPE = 0.826
# Log-probabilities of the ten ranks at a confident position, at a near-tie (0.05 nats
# between the first two) and at a position whose second choice is just over the envelope.
CLEAR = (-0.05, -3.2, -4.0, -4.6, -5.0, -5.3, -5.6, -5.9, -6.2, -6.5)
NEAR_TIE = (-0.70, -0.75, -3.0, -3.5, -4.0, -4.5, -5.0, -5.5, -6.0, -6.5)
JUST_OVER = (-0.30, -1.15, -3.0, -3.5, -4.0, -4.5, -5.0, -5.5, -6.0, -6.5)
TABLE = (CLEAR, CLEAR, CLEAR, CLEAR, CLEAR, NEAR_TIE, JUST_OVER, CLEAR)
OUTSIDE = 999  # in no position's top-10


class TableServer:
    """The oracle's view of a server: at output position i its top-10 are tokens
    10*(i+1) + rank, with TABLE[i]'s log-probabilities, whatever came before."""

    def __init__(self) -> None:
        self.completions = 0

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return list(PROMPT_IDS)

    def detokenize(self, tokens: list[int]) -> str:
        return "".join(f"<{t}>" for t in tokens)

    def post(self, path: str, payload: dict) -> dict:
        assert path == "/completion" and payload["n_predict"] == 1 and payload["cache_prompt"]
        self.completions += 1
        position = len(payload["prompt"]) - len(PROMPT_IDS)
        top = [
            {"id": 10 * (position + 1) + rank, "logprob": lp}
            for rank, lp in enumerate(TABLE[position])
        ]
        return {"completion_probabilities": [{**top[0], "top_logprobs": top}]}


GREEDY = tuple(10 * (i + 1) for i in range(len(TABLE)))


def _judged(tokens: tuple[int, ...], server: TableServer | None = None) -> verify_report.Case:
    """`tokens` compared with the greedy output, then judged by the oracle tier's rule."""
    server = server or TableServer()
    ref = Completion(GREEDY, "", 1.0, None, None, len(GREEDY))
    spec = Completion(tokens, "", 1.0, None, None, len(tokens))
    case = verify.compare(PROMPT, "sequential", ref, spec, server, None)  # type: ignore[arg-type]
    return verify.judge_gaps(case, Oracle(server).gaps(PROMPT, tokens), ENVELOPE)  # type: ignore[arg-type]


def _swapped(position: int, token: int) -> tuple[int, ...]:
    return (*GREEDY[:position], token, *GREEDY[position + 1 :])


def _ranked(server: TableServer, position: int) -> list[int]:
    """The reference's choices at `position`, best first, as the oracle reads them."""
    _, top = next_token_logprobs(server, [*PROMPT_IDS, *GREEDY[:position]])  # type: ignore[arg-type]
    return sorted(top, key=lambda t: -top[t])


def test_the_unmodified_output_is_judged_at_gap_zero() -> None:
    case = _judged(GREEDY)
    assert (case.kind, case.max_gap, case.over) == ("identical", 0.0, [])


@pytest.mark.parametrize(("rank", "gap"), [(2, 3.15), (3, 3.95), (10, 6.45)])
def test_a_lower_choice_of_the_reference_is_over_the_envelope(rank: int, gap: float) -> None:
    server = TableServer()
    token = _ranked(server, 2)[rank - 1]
    case = _judged(_swapped(2, token), server)
    assert (case.kind, case.position) == ("over-envelope", 2)
    assert case.max_gap == pytest.approx(gap)
    assert case.over == [f"token 2: emitted {token}, oracle chose 30 ({gap:.3f} nats)"]
    m = verify_report.MethodResult("draft", (), cases=(case,))
    assert not verify_report.VerifyReport("id", "t", "oracle", "m", (m,)).passed


def test_a_token_outside_the_top_k_is_over_the_envelope() -> None:
    case = _judged(_swapped(2, OUTSIDE))
    assert (case.kind, case.position) == ("over-envelope", 2)
    assert case.max_gap is not None and math.isinf(case.max_gap)
    assert case.over == [f"token 2: emitted {OUTSIDE}, oracle chose 30 (outside the top-10)"]


def test_a_near_tie_inside_the_envelope_is_within_and_passes() -> None:
    server = TableServer()
    second = _ranked(server, 5)[1]
    case = _judged(_swapped(5, second), server)
    assert (case.kind, case.position, case.over) == ("within", 5, [])
    assert case.max_gap == pytest.approx(0.05)
    m = verify_report.MethodResult("draft", (), cases=(case,))
    assert verify_report.VerifyReport("id", "t", "oracle", "m", (m,)).passed


def test_the_second_choice_just_over_the_envelope_fails() -> None:
    server = TableServer()
    second = _ranked(server, 6)[1]
    case = _judged(_swapped(6, second), server)
    assert case.kind == "over-envelope" and case.max_gap == pytest.approx(0.85)


def test_a_near_tie_does_not_hide_a_later_token_over_the_envelope() -> None:
    """Every token is judged, not only the first difference."""
    tokens = list(_swapped(5, 61))  # the near-tie's second choice...
    tokens[7] = 82  # ...then the reference's 3rd choice two tokens later
    case = _judged(tuple(tokens))
    assert (case.kind, case.position) == ("over-envelope", 5)
    assert [o.split(":")[0] for o in case.over] == ["token 7"]


def test_prefixes_shared_with_an_output_already_checked_cost_nothing() -> None:
    server = TableServer()
    oracle = Oracle(server)  # type: ignore[arg-type]
    oracle.gaps(PROMPT, GREEDY)
    assert oracle.requests == server.completions == len(GREEDY)
    oracle.gaps(PROMPT, _swapped(5, 61))
    assert oracle.requests == len(GREEDY) + 2  # positions 6 and 7 follow a new prefix
