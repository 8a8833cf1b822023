"""The oracle's power: defects planted into real speculative outputs, judged by both tiers.

On a quantized target (where only the oracle can judge a user's model), each planted defect
makes outputs with tokens the target did not choose, through the real server:

- `random-acceptance`: the speculative server accepts n-gram drafts by coin flip (the
  engine's own synthetic acceptance, `--spec-synth-rates`; benchmarking only upstream);
- `accept-one-too-many`: every verification round also accepts the first rejected draft
  token (n-gram drafts over the context, checked against the plain server's greedy choices);
- `rank-2`, `rank-3`, `rank-10`, `outside-top-10`: one token swapped for the target's 2nd,
  3rd or 10th choice, or for a token outside its top 10, at a quarter, half and three
  quarters of the output, the real server continuing after it;
- `slot-2-of-4`: four prompts on four parallel slots of a speculative server; only the
  second one's output takes, at its middle, a token of another slot's output outside its
  own top 10, and the server continues after it.

Every planted output is compared with plain decoding (the strict tier: any difference
fails) and judged by the oracle exactly as `verify --tier oracle` judges (the envelope per
prompt and mode, near-ties within the prompt's measured noise), and again under the rule
before it (near-ties: the first three choices within 1.0 nat). A planted output is a true
near-tie when every wrong token the plant made has a gap, where it was planted, within the
prompt's measured noise: noise alone could have chosen it (coin-flip acceptance, whose
wrong tokens only the engine knows: its first token that differs from plain decoding). Clean
speculative runs of every method the build offers on the same target give the oracle's
false-alarm rate. proof.planted_report writes the report.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console

from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects
from llamaspec.models.embedded import embedded_model
from llamaspec.models.methods import EMBEDDED_TYPES, Method, determinism_args, methods_for
from llamaspec.proof import oracle as oracle_mod
from llamaspec.proof import planted_report
from llamaspec.proof import verify as verify_mod
from llamaspec.proof.envelope import judge_gaps, measured_noise, with_noise
from llamaspec.proof.planted_report import (
    LEGACY_NATS,
    LEGACY_RANK,
    Clean,
    Planted,
    PowerRun,
)
from llamaspec.proof.prompts import VERIFY_PROMPTS
from llamaspec.proof.verify_report import FAILED_KINDS, Case, Envelope
from llamaspec.runtime.client import (
    Completion,
    Prompt,
    Server,
    base_args,
    complete,
    decode_with_top,
    request,
    running,
    server_help,
)

SHORT_PROMPTS = ("short", "code")
SWAP_RANKS = {"rank-2": 2, "rank-3": 3, "rank-10": 10, "outside-top-10": None}
SWAP_AT = (0.25, 0.5, 0.75)  # where in an output a swap is planted
SYNTH_DRAFT = 4
SYNTH_RATES = tuple(0.5 ** (i + 1) for i in range(SYNTH_DRAFT))
NGRAM_N, NGRAM_DRAFT = 2, 4  # the emulated drafter: a 2-token match proposes 4 tokens


def _ranked(top: dict[int, float]) -> list[int]:
    return sorted(top, key=lambda t: -top[t])


def _gap(top: dict[int, float], token: int) -> float:
    return max(top.values()) - top[token] if token in top else math.inf


def _continue(server: Server, ids: Sequence[int], n: int) -> list[int]:
    """The server's greedy tokens after exactly `ids` (prompt cache off)."""
    if n <= 0:
        return []
    reply = server.post("/completion", request(list(ids), n_predict=n))
    return [int(t) for t in reply.get("tokens") or []]


def _outside(top: dict[int, float], pool: Sequence[int], rng: random.Random) -> int:
    """A token outside `top`, drawn from `pool` (the prompt's and output's own tokens:
    always in the model's vocabulary)."""
    choices = sorted({int(t) for t in pool} - set(top))
    if not choices:
        raise LlamaspecError("no token outside the top-k to plant: give a longer prompt")
    return rng.choice(choices)


def _ngram_draft(context: Sequence[int]) -> list[int]:
    """The tokens after the latest earlier occurrence of the context's last NGRAM_N."""
    key = list(context[-NGRAM_N:])
    for start in range(len(context) - NGRAM_N - 1, -1, -1):
        if list(context[start : start + NGRAM_N]) == key:
            follow = list(context[start + NGRAM_N : start + NGRAM_N + NGRAM_DRAFT])
            if follow:
                return follow
    return []


# A planted wrong token: (position, its gap in the target's top-k where it was planted).
Plant = tuple[int, float]


def one_too_many(orc: oracle_mod.Oracle, prompt: Prompt, n: int) -> tuple[list[int], list[Plant]]:
    """An engine that accepts one draft token too many: per round, n-gram drafts over the
    context are checked against the target's greedy choices (the oracle's), and the first
    rejected one is emitted as if accepted; a round with no draft emits the target's. The
    output, and each rejected token it kept."""
    ids = orc.prompt_ids(prompt)
    out: list[int] = []
    plants: list[Plant] = []
    while len(out) < n:
        draft = _ngram_draft([*ids, *out])
        accepted: list[int] = []
        for d in draft:
            chosen, top = orc.top(prompt, out + accepted)
            if d != chosen and len(out) + len(accepted) < n:
                plants.append((len(out) + len(accepted), _gap(top, d)))
            accepted.append(d)
            if d != chosen:
                break  # the defect: the rejected token stays
        else:
            accepted.append(orc.top(prompt, out + accepted)[0])
        out += accepted
    return out[:n], plants


class _Study:
    """The servers and the judges of one run."""

    def __init__(
        self, artifact: Artifact, setup: verify_mod.Setup, orc: oracle_mod.Oracle, env: Envelope
    ) -> None:
        self.artifact, self.setup, self.orc, self.env = artifact, setup, orc, env
        self.refs: dict[str, tuple[list[int], list[dict[int, float]]]] = {}
        self.ref_server: Server | None = None

    def judge(self, prompt: Prompt, mode: str, tokens: Sequence[int]) -> tuple[Case, Case]:
        """(the strict comparison, the oracle's verdict) on one output."""
        ref_tokens, _ = self.refs[prompt.name]
        ref = Completion(tuple(ref_tokens), "", 0.0, None, None, len(ref_tokens))
        out = Completion(tuple(tokens), "", 0.0, None, None, len(tokens))
        assert self.ref_server is not None
        case = verify_mod.compare(prompt, mode, ref, out, self.ref_server, None)
        gaps = self.orc.gaps(prompt, tokens)
        allowance = self.env.allowance(prompt.name, mode)
        judged = judge_gaps(case, gaps, allowance, self.env.near_tie_for(prompt.name))
        return case, judged

    def planted(
        self,
        defect: str,
        prompt: Prompt,
        mode: str,
        tokens: Sequence[int],
        plants: Sequence[Plant] | None = None,
    ) -> Planted:
        """One planted output judged; its truth from `plants` (the wrong tokens the plant
        made and their gaps where it made them) where the planting code knows them, else
        (the engine's own coin) from the first token that differs from plain decoding, at
        its gap in plain decoding's own top-k."""
        case, judged = self.judge(prompt, mode, tokens)
        tops = self.refs[prompt.name][1]
        pos = case.position if case.kind != "identical" else None
        gap: float | None = None
        if plants:
            pos = plants[0][0] if pos is not None else None
            gap = max(g for _, g in plants)
        elif pos is not None and pos < len(tokens) and pos < len(tops):
            gap = _gap(tops[pos], int(tokens[pos]))
        noise = self.env.near_tie_for(prompt.name)
        gaps = self.orc.gaps(prompt, tokens)
        allowance = self.env.allowance(prompt.name, mode)
        legacy_over = [
            g
            for g in gaps
            if g.gap > allowance
            and not (g.rank is not None and g.rank <= LEGACY_RANK and g.gap <= LEGACY_NATS)
        ]
        legacy = case.kind == "short" or (
            case.kind in ("different", "longer") and bool(legacy_over)
        )
        return Planted(
            defect,
            prompt.name,
            mode,
            pos,
            None if gap is None else round(gap, 4),
            gap is not None and gap <= noise,
            case.kind != "identical",
            judged.kind in FAILED_KINDS,
            legacy,
            judged.kind,
        )


def measure(
    artifact: Artifact, dialect: str, reports: Path, console: Console, short: bool = False
) -> PowerRun:
    """`run` on the embedded quantized model and the built-in prompts (`short`: two of them,
    one swap position, one clean method: CI's version); the report written into `reports`."""
    model = embedded_model(console.print)
    prompts = [p for p in VERIFY_PROMPTS if not short or p.name in SHORT_PROMPTS]
    stem = f"oracle-power-{artifact.id}{'-short' if short else ''}"
    result = run(artifact, dialect, model, prompts, reports / f"{stem}-logs", console, short)
    js, md = planted_report.write(result, reports)
    r = planted_report.rates(result)
    console.print(
        f"oracle power: strict {r['strict_detected']}/{r['expressed']}; oracle "
        f"{r['oracle_detected']}/{r['expressed'] - r['near_ties']} of those not true "
        f"near-ties (before: {r['legacy_detected']}); {r['near_ties']} true near-ties; false "
        f"alarms {r['false_alarms']}/{r['clean']} clean outputs"
    )
    console.print(f"oracle power: report {md} ({js.name})")
    if not planted_report.goals_met(result):
        raise LlamaspecError(
            f"The planted defects were not all caught: strict {r['strict_rate']}, oracle "
            f"{r['oracle_rate']} of the outputs that are not true near-ties (goals 1.0 and "
            f"{planted_report.GOAL_ORACLE}). Each planted output and its verdicts are in {md}."
        )
    return result


def run(
    artifact: Artifact,
    dialect: str,
    model: Path,
    prompts: Sequence[Prompt],
    logs: Path,
    console: Console,
    short: bool = False,
    seed: int = 0,
) -> PowerRun:
    """Plant every defect, run the clean methods, judge everything (see the module doc)."""
    t0 = time.monotonic()
    help_text = server_help(artifact.server)
    synth = dialects.synthetic_steps(dialect, help_text, SYNTH_DRAFT, SYNTH_RATES)
    if synth is None:
        raise LlamaspecError(
            f"{artifact.id} has no synthetic acceptance (`--spec-synth-rates`, upstream "
            "llama.cpp from b9590), which the random-acceptance defect is planted with. Measure "
            "the oracle's power on a current upstream build (`llamaspec build`)."
        )
    det = tuple(determinism_args(help_text))
    slots = verify_mod.PARALLEL_SLOTS
    base = (*base_args(model, ctx=verify_mod.SLOT_CTX * slots, slots=slots), *det)
    setup = verify_mod.Setup(model, model, base, tuple(prompts), 1, det)
    logs.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    say = console.print
    with verify_mod.oracle_server(artifact, setup, logs) as osrv:
        setup = verify_mod.prepared(osrv, setup)
        orc = oracle_mod.Oracle(osrv)
        say(f"oracle power: envelope of {model.name} ({len(setup.prompts)} prompts)")
        env = verify_mod.measure_envelope(artifact, setup, help_text, orc, logs, say)
        with running(artifact.server, list(setup.base), logs / "reference.log") as ref:
            env = with_noise(env, measured_noise(orc, ref, setup.prompts))
            say(f"oracle power: near-ties within measured noise {dict(env.noise)}")
            study = _Study(artifact, setup, orc, env)
            study.ref_server = ref
            for p in setup.prompts:
                study.refs[p.name] = decode_with_top(ref, p)
            planted = _swaps(study, ref, rng, short)
            planted += [
                study.planted(
                    "accept-one-too-many", p, "sequential", *one_too_many(orc, p, p.n_predict)
                )
                for p in setup.prompts
            ]
            say("oracle power: random acceptance (synthetic, n-gram drafts)")
            with running(artifact.server, [*setup.base, *synth], logs / "random.log") as srv:
                for mode, parallel in (("sequential", False), ("parallel", True)):
                    outs = verify_mod.run_prompts(srv, setup.prompts, parallel)
                    planted += [
                        study.planted("random-acceptance", p, mode, o.tokens)  # type: ignore[arg-type]
                        for p, o in zip(setup.prompts, outs, strict=True)
                    ]
            methods = [
                m
                for m in methods_for(dialect, help_text, model, EMBEDDED_TYPES)
                if isinstance(m, Method) and (not short or m.name == "ngram-mod")
            ]
            clean: list[Clean] = []
            for m in methods:
                say(f"oracle power: clean {m.name}, sequential and on {slots} slots")
                log = logs / f"clean-{m.name}.log"
                with running(artifact.server, [*setup.base, *m.argv], log) as srv:
                    for mode, parallel in (("sequential", False), ("parallel", True)):
                        outs = verify_mod.run_prompts(srv, setup.prompts, parallel)
                        for p, o in zip(setup.prompts, outs, strict=True):
                            _, judged = study.judge(p, mode, o.tokens)  # type: ignore[arg-type]
                            clean.append(Clean(m.name, p.name, mode, judged.kind))
                    if m.name == "ngram-mod":
                        slot2, others = _slot_2_of_4(study, srv, setup.prompts, rng)
                        planted += slot2
                        clean += others
    return PowerRun(
        artifact.id,
        model.name,
        tuple(p.name for p in setup.prompts),
        env,
        tuple(planted),
        tuple(clean),
        orc.requests,
        time.monotonic() - t0,
        short,
    )


def _swaps(study: _Study, ref: Server, rng: random.Random, short: bool) -> list[Planted]:
    """Each rank swapped in at SWAP_AT of every prompt's plain output, the plain server
    continuing after it."""
    out: list[Planted] = []
    for p in study.setup.prompts:
        tokens, tops = study.refs[p.name]
        ids = study.orc.prompt_ids(p)
        for at in SWAP_AT[1:2] if short else SWAP_AT:
            pos = min(len(tokens) - 1, int(len(tokens) * at))
            if pos < 0:
                continue
            top = tops[pos]
            order = _ranked(top)
            for defect, rank in SWAP_RANKS.items():
                if rank is None:
                    token = _outside(top, [*ids, *tokens], rng)
                elif rank <= len(order):
                    token = order[rank - 1]
                else:
                    continue
                prefix = [*tokens[:pos], token]
                rest = _continue(ref, [*ids, *prefix], len(tokens) - len(prefix))
                plant = [(pos, _gap(top, token))]
                out.append(study.planted(defect, p, "sequential", [*prefix, *rest], plant))
    return out


def _slot_2_of_4(
    study: _Study, srv: Server, prompts: Sequence[Prompt], rng: random.Random
) -> tuple[list[Planted], list[Clean]]:
    """Four requests together on a speculative server; the second one's output takes, at its
    middle, a token of another slot's output that is outside its own top-10 there (content
    of another request, as upstream #28286 reports; the server continuing after it); the
    other three are clean."""
    four = [prompts[i % len(prompts)] for i in range(verify_mod.PARALLEL_SLOTS)]
    with ThreadPoolExecutor(max_workers=len(four)) as pool:
        outs = list(pool.map(lambda p: complete(srv, p), four))
    p, mine = four[1], list(outs[1].tokens)
    pos = len(mine) // 2
    others = [int(t) for o in (outs[2], outs[3], outs[0]) for t in o.tokens]
    top = study.orc.top(p, mine[:pos])[1]
    token = _outside(top, others, rng)
    prefix = [*mine[:pos], token]
    rest = _continue(srv, [*study.orc.prompt_ids(p), *prefix], len(mine) - len(prefix))
    plant = [(pos, _gap(top, token))]
    planted = [study.planted("slot-2-of-4", p, "parallel", [*prefix, *rest], plant)]
    clean = []
    for i in (0, 2, 3):
        _, judged = study.judge(four[i], "parallel", outs[i].tokens)  # type: ignore[arg-type]
        clean.append(Clean("ngram-mod, 4 slots", four[i].name, "parallel", judged.kind))
    return planted, clean
