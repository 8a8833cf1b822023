"""Speculative-decoding CLI dialects: every engine flag spelling, and the one renderer.

The engines spell speculative flags differently, and so do different pins of one engine.
`DIALECTS` holds one table per dialect: which engine-neutral spec types it can express and
how each engine-neutral setting is spelled. `render` turns engine-neutral settings (a
recipe's `config.SpecSettings` and `config.ServerSettings`) into argv through that table;
`spec_args` (smoke, verify, bench) goes through the same renderer. One rule drops the
options that only mean something when the build can offload (`OFFLOAD_ONLY`).

The truth for a given binary is its own `--help`, read by `server_help`:
`check_against_help` compares a rendered command against it, and `dialect_for` (through
`probe_dialect` for pins engines.yaml does not record) tells which dialect a build speaks.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from llamaspec import config
from llamaspec.engine import backends
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError, choose
from llamaspec.models.server_help import (
    help_flags,
    server_help,
)

Method = Literal["draft", "ngram-simple", "ngram-map-k", "ngram-mod", "mtp"]

# Spec types that read a separate draft model file (EAGLE-3 heads, DFlash and DSpark
# drafters ship as one; `assistant`: an MTP drafter in a file of its own, e.g. Gemma 4's,
# which upstream runs as draft-mtp with --spec-draft-model).
MODEL_TYPES = frozenset({"draft", "eagle3", "dflash", "dspark", "assistant"})
# Spec types that draft token runs of a configurable length (draft n_max/n_min/p_min).
DRAFTING_TYPES = MODEL_TYPES | {"mtp"}
NGRAM_TYPES = frozenset(t for t in config.SPEC_TYPES if t.startswith("ngram-"))
# The architectures whose MTP heads ik_llama.cpp loads at its default pin 55d3c05 (GLM-4.5
# and its kin: src/llama-hparams.cpp reads nextn_predict_layers for these alone).
IK_MTP_ARCHS = frozenset({"glm4moe", "bailingmoe2", "glm-dsa"})

# Server settings are spelled the same by every dialect.
SERVER_FLAGS: Mapping[str, str] = {
    "model": "-m",
    "host": "--host",
    "port": "--port",
    "ctx": "-c",
    "parallel": "-np",
    "gpu_layers": "-ngl",
    "flash_attn": "-fa",
    "ctx_checkpoints": "--ctx-checkpoints",
    "checkpoint_min_step": "--checkpoint-min-step",
    "cache_ram": "--cache-ram",
    "metrics": "--metrics",
    # llamaspec's patch server-spec-busy-max (its default llama.cpp build): no drafting
    # while more slots than this are busy
    "busy_max": "--spec-busy-max",
    "rpc": "--rpc",
    "device": "-dev",
}


@dataclass(frozen=True)
class Dialect:
    """How one engine at a range of pins spells speculative decoding.

    A spec type is expressed in one of three ways: by giving a draft model alone
    (`by_model`), as a value of the spec-type flag (`type_names`: neutral name → the
    engine's), or by a switch flag of its own (`switches`). A setting missing from
    `flags` cannot be expressed: it is dropped with a note."""

    name: str
    engine: str
    pins: str  # which pins speak it, in words
    type_names: Mapping[str, str]
    flags: Mapping[str, str]
    by_model: frozenset[str] = frozenset()
    switches: Mapping[str, str] = field(default_factory=dict)
    stacks: bool = False  # several spec types in one run
    params_in_type: bool = False  # `--spec-type TYPE:n_max=…,n_min=…,p_min=…`, repeated
    checkpoints: bool = True  # has --ctx-checkpoints / --checkpoint-min-step
    # Flags the engine parses although its --help never lists them (read from its source).
    unlisted: frozenset[str] = frozenset()
    later: str = ""  # what offers more, for refusals
    # architectures whose own MTP heads the engine loads (None: any with nextn tensors);
    # ik_llama.cpp at 55d3c05 reads nextn_predict_layers for these alone (llama-hparams.cpp)
    mtp_archs: frozenset[str] | None = None
    # The name the engine gives the device of the i-th `--rpc` server (one device each),
    # read from its ggml-rpc source: upstream at b11312 says `RPC0`, ik `RPC0[host:port]`.
    rpc_device: str = "RPC{index}"
    # Flags that select a chat template built into the engine by name; the name follows.
    # Upstream reads `--chat-template` as Jinja source unless --no-jinja (its server
    # default has been Jinja on: common/chat.cpp, common_chat_templates_init, at b11312);
    # ik_llama.cpp at 55d3c05 has Jinja off unless --jinja, and looks the name up.
    builtin_template: tuple[str, ...] = ("--no-jinja", "--chat-template")

    @property
    def types(self) -> frozenset[str]:
        return frozenset(self.type_names) | self.by_model | frozenset(self.switches)


_LEGACY_DRAFT = {
    "draft_model": "-md",
    "n_max": "--draft-max",
    "n_min": "--draft-min",
    "p_min": "--draft-p-min",
    "draft_ngl": "-ngld",
    "draft_type_k": "-ctkd",
    "draft_type_v": "-ctvd",
    "draft_device": "-devd",
}

DIALECTS: Mapping[str, Dialect] = {
    d.name: d
    for d in (
        Dialect(
            name="upstream",
            engine="llama.cpp",
            pins="llama.cpp from 2026-04-28 (PRs #22397, #22964)",
            type_names={
                "draft": "draft-simple",
                "eagle3": "draft-eagle3",
                "mtp": "draft-mtp",
                "assistant": "draft-mtp",
                "dflash": "draft-dflash",
                "dspark": "draft-dspark",
                **{t: t for t in sorted(NGRAM_TYPES)},
            },
            flags={
                "spec_type": "--spec-type",
                "draft_model": "--spec-draft-model",
                "n_max": "--spec-draft-n-max",
                "n_min": "--spec-draft-n-min",
                "p_min": "--spec-draft-p-min",
                "draft_ngl": "--spec-draft-ngl",
                "draft_type_k": "--spec-draft-type-k",
                "draft_type_v": "--spec-draft-type-v",
                "draft_device": "--spec-draft-device",
                "ngram_mod_n_min": "--spec-ngram-mod-n-min",
                "ngram_mod_n_max": "--spec-ngram-mod-n-max",
                "ngram_mod_n_match": "--spec-ngram-mod-n-match",
                "synth_rates": "--spec-synth-rates",
                "synth_len": "--spec-synth-len",
            },
            stacks=True,
        ),
        Dialect(
            name="upstream-legacy",
            engine="llama.cpp",
            pins="llama.cpp before 2026-04-28 (PR #22397)",
            type_names={t: t for t in sorted(NGRAM_TYPES)},
            by_model=frozenset({"draft"}),
            flags={"spec_type": "--spec-type", **_LEGACY_DRAFT},
            later="llama.cpp from 2026-04-28 (dialect 'upstream') offers every spec type, stacked",
        ),
        Dialect(
            name="ik-legacy",
            engine="ik_llama.cpp",
            pins="ik_llama.cpp before its PR #1908, e.g. the default pin 55d3c05",
            # `--spec-type` takes one draft-free type; its --help spells them "ngram - mod".
            type_names={t: t for t in sorted(NGRAM_TYPES)},
            by_model=frozenset({"draft"}),
            switches={"mtp": "-mtp"},
            flags={
                "spec_type": "--spec-type",
                **_LEGACY_DRAFT,
                # ngram-mod: lookup length, and draft lengths shared with the draft model
                "ngram_mod_n_match": "--spec-ngram-size-n",
                "ngram_mod_n_max": "--draft-max",
                "ngram_mod_n_min": "--draft-min",
            },
            checkpoints=False,
            mtp_archs=IK_MTP_ARCHS,
            unlisted=frozenset({"-ot", "--override-tensor"}),
            rpc_device="RPC{index}[{endpoint}]",
            builtin_template=("--chat-template",),
            later="an ik_llama.cpp pin after its PR #1908 (dialect 'ik-spec-type') stacks "
            "methods with `--spec-type TYPE:key=val`",
        ),
        Dialect(
            name="ik-spec-type",
            engine="ik_llama.cpp",
            pins="ik_llama.cpp after its PR #1908",
            # every n-gram type by its own name (8337e4c of 2026-08-15 lists all five)
            type_names={"draft": "draft", "mtp": "mtp", **{t: t for t in sorted(NGRAM_TYPES)}},
            flags={
                "spec_type": "--spec-type",
                "draft_model": "-md",
                "draft_ngl": "-ngld",
                "draft_type_k": "-ctkd",
                "draft_type_v": "-ctvd",
            },
            stacks=True,
            params_in_type=True,
            checkpoints=False,
            rpc_device="RPC{index}[{endpoint}]",
            builtin_template=("--chat-template",),
            later="upstream llama.cpp (dialect 'upstream') offers eagle3, assistant, dflash, "
            "dspark, ngram-map-k4v and ngram-cache",
        ),
    )
}

# Every flag that switches speculation on or tunes it, in any dialect, with the engines'
# long aliases (for splitting a command into its plain and speculative parts): SPEC_FLAGS
# take one value, SPEC_SWITCHES none.
SPEC_SWITCHES: frozenset[str] = frozenset(
    {f for d in DIALECTS.values() for f in d.switches.values()} | {"--multi-token-prediction"}
)
SPEC_FLAGS: frozenset[str] = frozenset(
    {f for d in DIALECTS.values() for f in d.flags.values()}
    | {
        "--model-draft",
        "--draft",
        "--draft-n",
        "--draft-n-min",
        "--gpu-layers-draft",
        "--n-gpu-layers-draft",
        "--cache-type-k-draft",
        "--cache-type-v-draft",
        "--device-draft",
        "-cd",
        "--ctx-size-draft",
    }
)

# For reading a command line back (the speculation gate): the flags, in any dialect and with
# the engines' long aliases, that load a draft model, name spec types, switch an MTP head on
# or off, and set the draft length and p-min.
DRAFT_MODEL_FLAGS: frozenset[str] = frozenset(
    {d.flags["draft_model"] for d in DIALECTS.values() if "draft_model" in d.flags}
    | {"-md", "--model-draft", "--spec-draft-model"}
)
SPEC_TYPE_FLAGS: frozenset[str] = frozenset(d.flags["spec_type"] for d in DIALECTS.values())
MTP_SWITCHES: frozenset[str] = frozenset(
    {d.switches["mtp"] for d in DIALECTS.values() if "mtp" in d.switches}
    | {"--multi-token-prediction"}
)
MTP_OFF: frozenset[str] = frozenset({"-no-mtp", "--no-multi-token-prediction"})
N_MAX_FLAGS: frozenset[str] = frozenset(
    {d.flags["n_max"] for d in DIALECTS.values() if "n_max" in d.flags} | {"--draft", "--draft-n"}
)
P_MIN_FLAGS: frozenset[str] = frozenset(
    d.flags["p_min"] for d in DIALECTS.values() if "p_min" in d.flags
)

# Options that only mean something when the build can offload (a GPU backend or RPC), with
# how many values each takes. One rule, every engine and dialect: dropped with a note when
# the build has nothing to offload to.
OFFLOAD_ONLY: Mapping[str, int] = {
    **dict.fromkeys(("-ngl", "--gpu-layers", "--n-gpu-layers"), 1),
    **dict.fromkeys(("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"), 1),
    "--spec-draft-ngl": 1,
    **dict.fromkeys(("-ot", "--override-tensor"), 1),
    **dict.fromkeys(("-otd", "--override-tensor-draft", "--spec-draft-override-tensor"), 1),
    **dict.fromkeys(("-dev", "--device", "-devd", "--device-draft"), 1),
    "--spec-draft-device": 1,
    **dict.fromkeys(("-sm", "--split-mode", "-mg", "--main-gpu", "-ts", "--tensor-split"), 1),
    **dict.fromkeys(("-ncmoe", "--n-cpu-moe", "-ncmoed", "--n-cpu-moe-draft"), 1),
    "--spec-draft-n-cpu-moe": 1,
    **dict.fromkeys(("-cmoe", "--cpu-moe", "-cmoed", "--cpu-moe-draft"), 0),
    "--spec-draft-cpu-moe": 0,
}
# Options that need RPC in the build (upstream exits on --rpc without it).
RPC_ONLY: Mapping[str, int] = {"--rpc": 1}


def find_dialect(name: str) -> Dialect:
    if name not in DIALECTS:
        raise LlamaspecError(
            f"Unknown speculative CLI dialect {name!r}; the dialects are "
            f"{', '.join(DIALECTS)}. Pass one of them, or leave --dialect out to take it "
            "from the engine and pin."
        )
    return DIALECTS[name]


def can_offload(backend: str, variants: Sequence[str] | None, rpc: Sequence[str] = ()) -> bool:
    """Whether a build has anything to offload to: a GPU backend, or RPC. Where the build's
    variants are unknown (no artifact), servers named in `rpc` stand for the rpc variant."""
    has_rpc = "rpc" in variants if variants is not None else bool(rpc)
    return backends.backend(backend).gpu or has_rpc


@dataclass(frozen=True)
class Rendered:
    argv: tuple[str, ...]
    notes: tuple[str, ...] = ()


def refusal(d: Dialect, types: Sequence[str], subject: str, where: str, server=None) -> str | None:
    """Why `d` cannot express `types` (and the server's checkpoints), or None when it can.
    `subject` names what asks ("Recipe 'x'"), `where` the engine and pin."""
    lacking = [t for t in types if t not in d.types]
    if lacking:
        free = sorted(t for t in d.types if t not in MODEL_TYPES)
        return (
            f"{subject} asks for spec type {', '.join(lacking)}, which {where} (dialect "
            f"{d.name!r}: {d.pins}) does not offer; it offers {', '.join(sorted(d.types))}"
            f"{'' if free else ' (no draft-free type)'}. What would work: "
            f"{d.later or 'a newer pin'}; or a recipe whose types this pin offers."
        )
    if not d.stacks and len(types) > 1:
        return (
            f"{subject} stacks {', '.join(types)}, but {where} (dialect {d.name!r}) runs one "
            f"speculative method at a time. What would work: {d.later}; or override `types` "
            "for this engine under `engines:` in the recipe."
        )
    sets_checkpoints = server is not None and (
        server.ctx_checkpoints is not None or server.checkpoint_min_step is not None
    )
    if sets_checkpoints and not d.checkpoints:
        return (
            f"{subject} sets context checkpoints, which {where} (dialect {d.name!r}) has "
            f"no flags for. Set `ctx_checkpoints: null` under `engines: {{{d.engine}: ...}}`."
        )
    return None


def render(
    name: str,
    spec: config.SpecSettings,
    server: config.ServerSettings | None = None,
    *,
    draft: Path | str | None = None,
    target: Path | str | None = None,
    binary: str = "llama-server",
    host: str = "127.0.0.1",
    port: int | str = 8080,
    offload: bool | None = None,
    rpc_build: bool | None = None,
    subject: str = "This run",
    where: str | None = None,
) -> Rendered:
    """The one renderer: engine-neutral settings → argv in dialect `name`.

    With `server`, the full command (binary, model, host, port, server settings, spec,
    `server.extra`); without it, the speculative arguments alone. `offload=False` drops
    every `OFFLOAD_ONLY` option (also inside `server.extra`) with a note; `rpc_build=False`
    refuses a server that names rpc hosts (its layers would all stay on this host) and
    drops `--rpc` from `server.extra`. None keeps them."""
    d = find_dialect(name)
    why = refusal(d, spec.types, subject, where or d.engine, server)
    if why:
        raise LlamaspecError(why)
    if rpc_build is False and server is not None and server.rpc:
        raise LlamaspecError(no_rpc_build(subject, server.rpc))
    notes: list[str] = []
    argv: list[str] = []
    if server is not None:
        argv += [binary, SERVER_FLAGS["model"], str(target)]
        argv += [SERVER_FLAGS["host"], host, SERVER_FLAGS["port"], str(port)]
        argv += _opt(SERVER_FLAGS["ctx"], server.ctx)
        argv += _opt(SERVER_FLAGS["parallel"], server.parallel)
        argv += _opt(SERVER_FLAGS["gpu_layers"], server.gpu_layers)
        argv += _opt(SERVER_FLAGS["flash_attn"], server.flash_attn)
        argv += _opt(SERVER_FLAGS["ctx_checkpoints"], server.ctx_checkpoints)
        argv += _opt(SERVER_FLAGS["checkpoint_min_step"], server.checkpoint_min_step)
        argv += _opt(SERVER_FLAGS["cache_ram"], server.cache_ram)
        if server.chat_template is not None:
            argv += [*d.builtin_template, server.chat_template]
        if server.rpc:
            argv += [SERVER_FLAGS["rpc"], ",".join(server.rpc)]
        if server.placement is not None and server.placement.target:
            names = [rpc_device_name(d, server.rpc, w) for w in server.placement.target]
            argv += [SERVER_FLAGS["device"], ",".join(n for n in names if n) or "none"]
        if server.placement is not None and server.placement.draft is not None:
            where = rpc_device_name(d, server.rpc, server.placement.draft) or "none"
            spec = spec.model_copy(update={"draft_device": where})
    argv += _spec(d, spec, draft, subject, notes)
    if server is not None:
        argv += list(server.extra)
    if offload is False:
        argv = _drop(
            argv,
            OFFLOAD_ONLY,
            notes,
            "the build has nothing to offload to (a cpu "
            "backend without the rpc variant); a GPU backend or --variant rpc keeps them",
        )
    if rpc_build is False:
        argv = _drop(argv, RPC_ONLY, notes, "the build has no RPC (build with --variant rpc)")
    return Rendered(tuple(argv), tuple(notes))


def no_rpc_build(subject: str, hosts: Sequence[str]) -> str:
    """Why a build without the rpc variant cannot serve a recipe that names rpc hosts."""
    return (
        f"{subject} puts layers on rpc hosts ({', '.join(hosts)}), but the build has no RPC "
        "(it was built without the rpc variant): llama-server would load every layer on this "
        "host, which a model split across hosts need not fit. Build with `llamaspec build "
        "--variant rpc` (the same backend and pin), or use a recipe without `rpc:`."
    )


def rpc_device_name(d: Dialect, rpc: Sequence[str], where: str) -> str | None:
    """A placement entry as dialect `d` names the device: an rpc endpoint → that server's
    device, `local` → None (the host CPU, which is no offload device), a device name as is."""
    if where == "local":
        return None
    if where in rpc:
        return d.rpc_device.format(index=list(rpc).index(where), endpoint=where)
    return where


def _spec(
    d: Dialect, spec: config.SpecSettings, draft: Path | str | None, subject: str, notes: list
) -> list[str]:
    types = spec.types
    f = d.flags
    uses_model = any(t in MODEL_TYPES for t in types)
    if uses_model and draft is None:
        raise LlamaspecError(
            f"{subject} drafts with a draft model "
            f"({', '.join(t for t in types if t in MODEL_TYPES)}), but no draft model was given. "
            "Use a pair with a draft, or a draft-free spec "
            f"type this dialect offers ({', '.join(sorted(d.types - MODEL_TYPES))})."
        )
    lengths = [f"n_max={spec.draft_n_max}", f"n_min={spec.draft_n_min}"]
    if spec.draft_p_min is not None:
        lengths.append(f"p_min={spec.draft_p_min}")
    out: list[str] = []
    if not d.params_in_type:
        named = [d.type_names[t] for t in types if t in d.type_names and t not in d.by_model]
        if named:
            out += [f["spec_type"], ",".join(named)]
        out += [d.switches[t] for t in types if t in d.switches]
    if uses_model:
        out += [f["draft_model"], str(draft)]
    if not d.params_in_type and any(t in DRAFTING_TYPES for t in types):
        out += [f["n_max"], str(spec.draft_n_max), f["n_min"], str(spec.draft_n_min)]
        out += _opt(f["p_min"], spec.draft_p_min)
    if uses_model:
        for key, value in (
            ("draft_ngl", spec.draft_gpu_layers),
            ("draft_type_k", spec.draft_cache_type_k),
            ("draft_type_v", spec.draft_cache_type_v),
            ("draft_device", spec.draft_device),
        ):
            out += _setting(d, key, value, notes)
    if "ngram-mod" in types:
        for key in ("ngram_mod_n_min", "ngram_mod_n_max", "ngram_mod_n_match"):
            out += _setting(d, key, getattr(spec, key), notes)
    if d.params_in_type:
        # ik_llama.cpp's chain wants its self-speculative (n-gram) stage first: 8337e4c
        # refuses a draft stage ahead of it ("requires a self-spec stage first")
        for t in sorted(types, key=lambda t: t not in NGRAM_TYPES):
            out += [f["spec_type"], f"{d.type_names[t]}:{','.join(lengths)}"]
    return out


# The n-gram lookup length of a synthetic timing run: short, so drafts are found often.
SYNTH_MATCH = 4


def synthetic_steps(dialect: str, help_text: str, drafted: int, rates=None) -> list[str] | None:
    """Speculative flags for a timing run (benchmarking only; its output is not valid):
    n-gram drafts of exactly `drafted` tokens, position i accepted with probability `rates[i]`
    (all when None). None where the build lacks synthetic acceptance (upstream PR #27711)."""
    d = find_dialect(dialect)
    flag = d.flags.get("synth_rates")
    if flag is None or flag not in help_flags(help_text) or "ngram-mod" not in d.types:
        return None
    spec = config.SpecSettings(
        types=("ngram-mod",),
        ngram_mod_n_min=drafted,
        ngram_mod_n_max=drafted,
        ngram_mod_n_match=SYNTH_MATCH,
    )
    shown = ",".join("1" * drafted) if rates is None else ",".join(f"{r:.6g}" for r in rates)
    return [*_spec(d, spec, None, "a synthetic timing run", []), flag, shown]


def _setting(d: Dialect, key: str, value: object, notes: list[str]) -> list[str]:
    if value is None:
        return []
    if key not in d.flags:
        notes.append(f"{key} {value} dropped: the {d.name!r} dialect has no flag for it")
        return []
    return [d.flags[key], str(value)]


def _opt(flag: str, value: object) -> list[str]:
    return [] if value is None else [flag, str(value)]


def _drop(argv: list[str], which: Mapping[str, int], notes: list[str], why: str) -> list[str]:
    kept: list[str] = []
    dropped: list[str] = []
    i = 0
    while i < len(argv):
        flag, eq, _ = argv[i].partition("=")
        if flag in which:
            n = 0 if eq else which[flag]
            dropped.append(shlex.join(argv[i : i + 1 + n]))
            i += 1 + n
            continue
        kept.append(argv[i])
        i += 1
    if dropped:
        notes.append(f"dropped {', '.join(dropped)}: {why}")
    return kept


@dataclass(frozen=True)
class SpecSettings:
    """What speculation a run wants, independent of any engine's flag spelling."""

    method: Method
    draft_model: Path | None = None
    n_max: int = 8
    n_min: int = 0
    p_min: float | None = None
    draft_ngl: int | None = None

    def neutral(self) -> config.SpecSettings:
        """The same settings as a recipe's engine-neutral `spec:` block."""
        return config.SpecSettings(
            types=(self.method,),
            draft_n_max=self.n_max,
            draft_n_min=min(self.n_min, self.n_max),
            draft_p_min=self.p_min,
            draft_gpu_layers=self.draft_ngl,
        )


def spec_args(dialect: str, s: SpecSettings) -> list[str]:
    """Render `s` for `dialect` (through `render`); raise when the dialect cannot express it."""
    if s.method == "draft" and s.draft_model is None:
        raise LlamaspecError("Speculation with a draft model needs a draft model path.")
    return list(render(dialect, s.neutral(), draft=s.draft_model).argv)


@dataclass(frozen=True)
class ServerCommand:
    """argv for llama-server, the dialect it is written in, and notes on what was left out."""

    argv: tuple[str, ...]
    dialect: str
    notes: tuple[str, ...] = ()

    def shell(self) -> str:
        return shlex.join(self.argv)


def probe_dialect(engine: str, help_text: str) -> str:
    """Tell the speculative dialect from a binary's --help (for pins engines.yaml lacks)."""
    flags = help_flags(help_text)
    if engine == "llama.cpp":
        return "upstream" if "--spec-draft-n-max" in flags else "upstream-legacy"
    return "ik-legacy" if "--draft-max" in flags else "ik-spec-type"


def dialect_for(artifact: Artifact, say=None, root: Path | None = None) -> str:
    """The engine's recorded dialect at its default pin; otherwise probe the binary's --help."""
    engines = config.load_engines(root)
    engine = engines[choose("engine", artifact.manifest["engine"], engines)]
    if artifact.manifest.get("commit") == engine.pin:
        return engine.dialect
    dialect = probe_dialect(engine.name, server_help(artifact.server))
    if say is not None:
        say(
            f"dialect: {engine.name}@{(artifact.manifest.get('commit') or 'local')[:12]} is not "
            f"the default pin; its --help speaks the {dialect!r} dialect"
        )
    return dialect
