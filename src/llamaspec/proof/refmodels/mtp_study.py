"""Plain vs draft-mtp greedy output on the MTP reference model's F32 and quantized copies.

Issue 43 item 4 (upstream #25618): `study()` serves each copy of
`llamaspec.proof.refmodels.mtp.pair()` with and without `--spec-type draft-mtp`, compares
the greedy outputs request by request, and at each divergence asks a plain one-slot server
for the log-probabilities of both tokens (reports/mtp-quantized-oracle). Run as
`python -m llamaspec.proof.refmodels.mtp_study SERVER QUANTIZE OUT.json`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llamaspec.proof.refmodels import Say
from llamaspec.proof.refmodels.common import vocabulary
from llamaspec.proof.refmodels.mtp import VERSION, pair, quantized

# --- the greedy comparison on quantized copies (upstream #25618) -------------------------

STUDY_PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a little house by the river.",
    "It is a truth universally acknowledged, that",
    "Speculative decoding drafts tokens that the target model verifies.",
)
STUDY_N_PREDICT = (64, 128)
SERVER_FLAGS = ("-c", "16384", "-np", "4", "--no-kv-unified", "-fa", "off", "--no-warmup")
SPEC_N_MAX = 3  # the pinned server's default draft length


def spec_flags() -> list[str]:
    """draft-mtp in the pinned upstream server's spelling (no draft file)."""
    from llamaspec.models.dialects import SpecSettings, spec_args

    return spec_args("upstream", SpecSettings("mtp", n_max=SPEC_N_MAX))


@dataclass(frozen=True)
class Run:
    """One greedy request: its tokens and the server's draft counters."""

    mode: str  # "sequential" | "parallel" (4 requests at once on 4 slots)
    prompt: str
    n_predict: int
    tokens: tuple[int, ...]
    draft_n: int
    accepted: int


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where `a` and `b` differ (a length difference counts), else None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def greedy_runs(
    server_bin: Path, model: Path, extra: Sequence[str], log: Path, threads: int = 2
) -> list[Run]:
    """Every study prompt × n_predict, one request at a time, then four at a time, on one
    server (`SERVER_FLAGS` + `extra`)."""
    from concurrent.futures import ThreadPoolExecutor

    from llamaspec.runtime.client import request, running

    args = ["-m", str(model), *SERVER_FLAGS, "-t", str(threads), *extra]
    jobs = [(p, n) for n in STUDY_N_PREDICT for p in STUDY_PROMPTS]
    runs: list[Run] = []

    def one(srv, mode: str, prompt: str, n: int) -> Run:
        reply = srv.post("/completion", request(prompt, n_predict=n))
        t = reply.get("timings", {})
        return Run(
            mode,
            prompt,
            n,
            tuple(int(x) for x in reply["tokens"]),
            int(t.get("draft_n") or 0),
            int(t.get("draft_n_accepted") or 0),
        )

    with running(server_bin, args, log, ready_timeout=300) as srv:
        runs += [one(srv, "sequential", p, n) for p, n in jobs]
        with ThreadPoolExecutor(4) as pool:
            for n in STUDY_N_PREDICT:
                batch = [pool.submit(one, srv, "parallel", p, n) for p in STUDY_PROMPTS]
                runs += [f.result() for f in batch]
    return runs


def matched(plain: list[Run], spec: list[Run]) -> list[tuple[Run, Run]]:
    """Each speculative run with the plain run of the same mode, prompt and n_predict."""
    base = {(r.mode, r.prompt, r.n_predict): r for r in plain}
    return [(base[(r.mode, r.prompt, r.n_predict)], r) for r in spec]


def divergences(
    server_bin: Path, model: Path, plain: list[Run], spec: list[Run], log: Path
) -> list[dict]:
    """For each speculative run that differs from the plain run of the same mode, prompt and
    n_predict: the first differing index, both tokens, and a plain one-slot server's
    log-probabilities of both after exactly prompt + the common prefix (whole vocabulary)."""
    from llamaspec.runtime.client import request, running

    found: list[dict] = []
    pending = [
        (p, s, i)
        for p, s in matched(plain, spec)
        if (i := first_difference(p.tokens, s.tokens)) is not None
    ]
    if not pending:
        return found
    n_vocab = len(vocabulary()[0])
    args = ["-m", str(model), "-c", "4096", "-np", "1", "-fa", "off", "--no-warmup", "-t", "2"]
    with running(server_bin, args, log, ready_timeout=300) as srv:
        for p, s, i in pending:
            ids = srv.tokenize(p.prompt)
            reply = srv.post(
                "/completion",
                request([*ids, *p.tokens[:i]], n_predict=1, n_probs=n_vocab),
            )
            entry = (reply.get("completion_probabilities") or [{}])[0]
            top = {int(t["id"]): float(t["logprob"]) for t in entry.get("top_logprobs", [])}
            a = p.tokens[i] if i < len(p.tokens) else None
            b = s.tokens[i] if i < len(s.tokens) else None
            found.append(
                {
                    "mode": s.mode,
                    "prompt": s.prompt,
                    "n_predict": s.n_predict,
                    "index": i,
                    "plain_token": a,
                    "plain_piece": srv.detokenize([a]) if a is not None else None,
                    "spec_token": b,
                    "spec_piece": srv.detokenize([b]) if b is not None else None,
                    "reference_choice": int(entry["id"]) if "id" in entry else None,
                    "logprob_plain_token": top.get(a) if a is not None else None,
                    "logprob_spec_token": top.get(b) if b is not None else None,
                }
            )
    return found


def study(
    server_bin: Path,
    models: dict[str, Path],
    workdir: Path,
    threads: int = 2,
    say: Say | None = None,
) -> dict:
    """Plain vs draft-mtp greedy outputs for each model (label -> GGUF): per mode the
    identical count, drafted/accepted, and every divergence with its log-probabilities."""
    out: dict = {"prompts": list(STUDY_PROMPTS), "n_predict": list(STUDY_N_PREDICT)}
    out["server_flags"] = [*SERVER_FLAGS, "-t", str(threads)]
    out["spec_flags"] = spec_flags()
    out["models"] = {}
    for label, model in models.items():
        if say:
            say(f"study: {label} plain")
        plain = greedy_runs(server_bin, model, [], workdir / f"{label}-plain.log", threads)
        if say:
            say(f"study: {label} draft-mtp")
        spec = greedy_runs(server_bin, model, spec_flags(), workdir / f"{label}-mtp.log", threads)
        seq = {(r.prompt, r.n_predict): r.tokens for r in plain if r.mode == "sequential"}
        modes = {}
        for mode in ("sequential", "parallel"):
            ours = [(p, r) for p, r in matched(plain, spec) if r.mode == mode]
            same = [r for p, r in ours if first_difference(p.tokens, r.tokens) is None]
            ours = [r for _, r in ours]
            drafted, accepted = sum(r.draft_n for r in ours), sum(r.accepted for r in ours)
            modes[mode] = {
                "requests": len(ours),
                "identical_to_plain": len(same),
                "drafted": drafted,
                "accepted": accepted,
                "acceptance": round(accepted / drafted, 3) if drafted else None,
            }
        plain_par_same = sum(
            1 for r in plain if r.mode == "parallel" and r.tokens == seq[(r.prompt, r.n_predict)]
        )
        out["models"][label] = {
            "file": model.name,
            "bytes": model.stat().st_size,
            "plain_parallel_identical_to_plain_sequential": plain_par_same,
            "modes": modes,
            "divergences": divergences(
                server_bin, model, plain, spec, workdir / f"{label}-oracle.log"
            ),
        }
    return out


def study_markdown(result: dict) -> str:
    """The study's JSON as a Markdown table (one row per model and mode) and its divergences."""
    rows = [
        "| copy | file (bytes) | mode | identical / requests | drafted | accepted | acceptance |",
        "|---|---|---|---|---|---|---|",
    ]
    diffs = []
    for label, m in result["models"].items():
        for mode, v in m["modes"].items():
            acc = f"{v['acceptance']:.1%}" if v["acceptance"] is not None else "-"
            rows.append(
                f"| {label} | `{m['file']}` ({m['bytes']}) | {mode} | "
                f"{v['identical_to_plain']} / {v['requests']} | {v['drafted']} | "
                f"{v['accepted']} | {acc} |"
            )
        for d in m["divergences"]:
            diffs.append(
                f"| {label} | {d['mode']} | {d['prompt'][:32]}... | {d['n_predict']} | "
                f"{d['index']} | {d['plain_token']} {d['plain_piece']!r} | "
                f"{d['spec_token']} {d['spec_piece']!r} | {d['logprob_plain_token']} | "
                f"{d['logprob_spec_token']} |"
            )
    out = "\n".join(rows) + "\n"
    if diffs:
        head = [
            "| copy | mode | prompt | n_predict | first differing index | plain token | "
            "draft-mtp token | logprob(plain) | logprob(draft-mtp) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        out += "\nDivergences (log-probabilities from a plain one-slot server after the "
        out += "prompt and the common prefix):\n\n" + "\n".join(head + diffs) + "\n"
    else:
        out += "\nNo divergence: every draft-mtp output equals the plain output.\n"
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m llamaspec.proof.refmodels.mtp_study SERVER QUANTIZE OUT.json`: the study on
    the F32, Q8_0 and Q4_K_M copies of `pair(seed)`, written as JSON."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m llamaspec.proof.refmodels.mtp_study")
    ap.add_argument("server", type=Path, help="the pinned llama-server")
    ap.add_argument("quantize", type=Path, help="the pinned llama-quantize")
    ap.add_argument("out", type=Path, help="the JSON report to write")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--copies", default="F32,Q8_0,Q4_K_M", help="which copies, in order")
    a = ap.parse_args(argv)
    ref = pair(a.seed, say=print)
    models = {
        c: ref.target if c == "F32" else quantized(ref, c, a.quantize, say=print)
        for c in a.copies.split(",")
    }
    work = a.out.with_suffix(".logs")
    work.mkdir(parents=True, exist_ok=True)
    result = study(a.server, models, work, a.threads, say=print)
    result["generator"] = f"llamaspec.proof.refmodels.mtp.pair(seed={a.seed}), VERSION {VERSION}"
    result["quantized_with"] = {"Q8_0": "gguf.quants.quantize", "Q4_K_M": "llama-quantize"}
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    a.out.with_suffix(".table.md").write_text(study_markdown(result))


if __name__ == "__main__":
    main()
