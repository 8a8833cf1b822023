"""What `llamaspec verify` runs: the built-in reference models, a recipe, or the user's files.

- Built-in (`--model embedded|hybrid`): the strict tier on the F32 reference copy of each
  model, every method the binary supports, sequential and parallel; and the oracle tier on
  the quantized embedded model.
- A recipe (`--recipe NAME`) or files (`--target FILE [--draft FILE] --spec TYPE`): those
  exact settings, after the same download and compatibility checks as `serve`, in the tiers
  the target's precision allows (`tiers_for`): the strict tier when it is F32, F16 or BF16,
  the oracle tier otherwise (`--strict` adds the strict tier on an F32 copy). A recipe's
  oracle tier also runs it under its own flags (the server's defaults, no determinism
  flags), judged against the same envelope.
- `--prompts FILE` (config.load_prompts) replaces the built-in prompts in any of these.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError, choose
from llamaspec.models import catalog as models
from llamaspec.models import compat, dialects, gguf_header, recipes
from llamaspec.models.methods import EMBEDDED_TYPES, KNOWN, Method
from llamaspec.models.precision import Precision, read_precision
from llamaspec.paths import project_root
from llamaspec.proof import verify
from llamaspec.proof.coverage import Coverage
from llamaspec.proof.defects import defects_for, explaining
from llamaspec.proof.prompts import choose_prompts
from llamaspec.proof.reference import Reference, reference_copy
from llamaspec.proof.refmodels import registry
from llamaspec.proof.traffic import TrafficPlan
from llamaspec.proof.verify_report import VerifyReport
from llamaspec.runtime.client import Prompt

# Options a verify run sets itself (its own model files, slots, context, loopback port).
SPEC_TYPES = ("draft", "ngram-simple", "ngram-map-k", "ngram-mod", "mtp")
OWN_OPTIONS = {"-m": 1, "--host": 1, "--port": 1, "-c": 1, "-np": 1, "-fa": 1}


@dataclass(frozen=True)
class Outcome:
    reports: tuple[VerifyReport, ...]
    coverage: Coverage | None = None
    quantized: tuple[str, ...] = ()  # tags of the reports that served a quantized model

    @property
    def failed(self) -> list[str]:
        return [f"{r.tag} ({r.tier})" for r in self.reports if not r.passed]

    def raise_if_failed(self, artifact: Artifact, reports: Path) -> None:
        """Refuse a failed run: what failed, where its reports are, and the build's
        catalogued defects (which may explain it)."""
        if not self.failed:
            return
        quantized = any(r.tag in self.quantized for r in self.reports if not r.passed)
        known = " ".join(
            f"This build has a catalogued defect: {d.describe()}."
            for d in explaining(artifact.manifest, quantized)
        )
        raise LlamaspecError(
            f"verify failed: {', '.join(self.failed)}. The reports in {reports}/ show "
            "both continuations and the per-token gaps at each difference."
            + (f" {known}" if known else "")
        )


BUILTIN = ("embedded", "hybrid")  # and the reference families (proof.refmodels.registry)
# What the hybrid model (a recurrent target and a draft with other weights) exercises.
HYBRID_TYPES = ("draft", *registry.NGRAM)


def default_models(artifact: Artifact, dialect: str = "", help_text: str = "") -> list[str]:
    """The embedded model, the hybrid one unless the build is known to corrupt hybrid
    speculation (ik_llama.cpp before its checkpoint series; `--model hybrid` still runs it),
    and every reference family the build can serve (with `dialect` and `help_text`)."""
    engine = str(artifact.manifest.get("engine"))
    broken = [d for d in defects_for(artifact.manifest) if d.targets == "hybrid"]
    out = ["embedded"] if broken and engine != "llama.cpp" else ["embedded", "hybrid"]
    return out + (registry.usable(engine, dialect, help_text) if dialect else [])


def check_models(which: Sequence[str], artifact: Artifact, dialect: str, help_text: str) -> None:
    """Every named model known and servable by this build, before anything is written."""
    engine = str(artifact.manifest.get("engine"))
    for name in which:
        choose("built-in model", name, (*BUILTIN, *registry.BY_NAME))
        if name in BUILTIN:
            continue
        build = f"this build ({artifact.id})"
        why = registry.refusal(name, engine, dialect, help_text, build=build, also=BUILTIN)
        if why:
            raise LlamaspecError(why)


# The spec types each method verify knows stacks (models.methods.KNOWN).
NEEDS = {name: set(types) for name, types, _ in KNOWN}


def _methods_of(
    methods: Sequence[str] | None, types: Sequence[str], several: bool
) -> tuple[str, ...] | None:
    """The methods named (None: all) that a model exercising `types` runs. With several
    models each runs those it can; a method none of them runs is refused by check_methods."""
    if methods is None:
        return None
    if not several:
        return tuple(methods)
    return tuple(m for m in methods if m == "plain" or NEEDS.get(m, {m}) <= set(types))


def check_methods(methods: Sequence[str] | None, which: Sequence[str]) -> None:
    """Each method named runs on at least one of the models named."""
    kinds = {"embedded": EMBEDDED_TYPES, "hybrid": HYBRID_TYPES}
    types = {t for n in which for t in kinds.get(n) or registry.BY_NAME[n].types}
    idle = [m for m in methods or () if m != "plain" and not NEEDS.get(m, {m}) <= types]
    if idle:
        raise LlamaspecError(
            f"Method(s) {', '.join(idle)} run on none of the models named "
            f"({', '.join(which)}); each model runs the methods of its spec types "
            f"({', '.join(sorted(types))}). Add a model that has them, or drop the method."
        )


def _not_run(which: Sequence[str], engine: str, dialect: str, help_text: str) -> dict[str, str]:
    """Why each type of a reference family this run did not serve is not covered."""
    out: dict[str, str] = {}
    if not {"embedded", "hybrid"} & set(which):
        out = {t: "not run: add --model embedded or --model hybrid" for t in EMBEDDED_TYPES}
    for f in registry.FAMILIES:
        if f.name in which:
            continue
        why = registry.runnable(f, engine, dialect, help_text)
        reason = f"{f.name} reference model: {why}" if why else f"not run: add --model {f.name}"
        for t in f.types:
            out.setdefault(t, reason)
    return out


def load_prompts(path: Path) -> tuple[Prompt, ...]:
    """`--prompts FILE` as verify's prompts (validated by config.load_prompts)."""
    from llamaspec import config

    return tuple(
        Prompt(
            line.name or "",
            line.text or "",
            line.n_predict,
            tuple((m.role, m.content) for m in line.messages or ()),
        )
        for line in config.load_prompts(path)
    )


def sha256_file(path: Path, console: Console) -> str:
    """sha256 of a model file, remembered for this exact state of the file (models.hub)."""
    from llamaspec.models.hub import sha256_of

    return sha256_of(path, console.print)


def builtin(
    artifact: Artifact,
    dialect: str,
    which: Sequence[str],
    tiers: Sequence[str],
    methods: Sequence[str] | None,
    modes: Sequence[str],
    reports: Path,
    console: Console,
    repeat: int = 1,
    prompt_names: Sequence[str] = (),
    prompts: Sequence[Prompt] = (),
    server_defaults: bool = False,
    traffic_slots: Sequence[int] = (),
    traffic_requests: int | None = None,
    busy_max: int | None = None,
) -> Outcome:
    """The built-in models: strict on their F32 copies, oracle on the quantized embedded one.

    `prompts` (a prompts file's) replace the built-in ones; `server_defaults` runs every
    server without the determinism flags, into reports tagged `<model>-defaults`. The
    traffic mode (in `modes`: its slot counts and requests per slot, else TrafficPlan's) is
    the strict tier's: the oracle tier runs the other modes asked for, or none. `busy_max`
    adds `--spec-busy-max N` to every speculative server, into reports tagged `-busyN`."""
    from llamaspec.models.embedded import EMBEDDED_SHA256, embedded_model
    from llamaspec.proof import coverage as cov_mod
    from llamaspec.proof.hybrid import hybrid_model
    from llamaspec.runtime.client import server_help

    help_text = server_help(artifact.server)
    engine = str(artifact.manifest.get("engine"))
    which = list(which) or default_models(artifact, dialect, help_text)
    check_models(which, artifact, dialect, help_text)
    check_methods(methods, which)
    prompts = tuple(prompts) or choose_prompts(prompt_names)
    classic = tuple(m for m in modes if m != "traffic")
    traffic_on = len(classic) < len(modes)
    traffic = TrafficPlan(
        slots=tuple(traffic_slots) or TrafficPlan.slots,
        per_slot=traffic_requests or TrafficPlan.per_slot,
    )
    if modes and not classic and "oracle" in tiers:
        console.print("verify: oracle tier not run: the traffic mode is the strict tier's")
        tiers = [t for t in tiers if t != "oracle"]
    out = []
    for name in which:
        types: tuple[str, ...] = EMBEDDED_TYPES
        if name == "embedded":
            model, sha = embedded_model(console.print), EMBEDDED_SHA256
            draft, draft_sha = model, sha
        elif name == "hybrid":
            # The target is a random hybrid (recurrent + attention) model and its draft
            # another one with other weights: drafts get rejected, and every rejection
            # restores a context checkpoint. The n-gram types draft from the context.
            model = hybrid_model(artifact, console, seed=1)
            draft = hybrid_model(artifact, console, seed=2)
            sha, draft_sha = sha256_file(model, console), sha256_file(draft, console)
            types = HYBRID_TYPES
        else:
            pair = registry.pair_for(name, engine, dialect, help_text, console.print)
            model, draft = pair.target, pair.draft  # None: the target's own heads draft
            sha = sha256_file(model, console)
            draft_sha = sha256_file(draft, console) if draft else None
            types = registry.BY_NAME[name].types
        mine = _methods_of(methods, types, len(which) > 1)
        if mine == ():
            console.print(f"verify: {name}: none of the methods named runs on it; skipped")
            continue
        plan = functools.partial(
            verify.VerifyPlan,
            out_dir=reports,
            methods=mine,
            types=types,
            tag=name
            + ("-defaults" if server_defaults else "")
            + (f"-busy{busy_max}" if busy_max is not None else "")
            + ("-traffic" if traffic_on else ""),
            modes=tuple(modes),
            repeat=repeat,
            prompts=prompts,
            server_defaults=server_defaults,
            traffic=traffic,
            spec_extra=(dialects.SERVER_FLAGS["busy_max"], str(busy_max))
            if busy_max is not None
            else (),
        )
        if "strict" in tiers:
            ref, ref_draft = _references(model, draft, console, sha, draft_sha)
            exact = plan(
                ref.path,
                tier="strict",
                draft=ref_draft.path if ref_draft else None,
                reference_sha256=ref.sha256,
            )
            out.append(verify.verify(artifact, dialect, exact, console))
        if (
            "oracle" in tiers
            and name == "embedded"
            and artifact.manifest.get("engine") != "llama.cpp"
        ):
            console.print(
                f"verify: oracle tier skipped: {artifact.manifest.get('engine')} returns no token "
                "ids, which the per-token oracle needs (the strict tier ran)"
            )
        elif "oracle" in tiers and name == "embedded":
            oracle = plan(model, tier="oracle", draft=draft, modes=classic)
            out.append(verify.verify(artifact, dialect, oracle, console))
    # the oracle tier serves the embedded Q4_K_M file itself
    quantized = tuple(r.tag for r in out if r.tier == "oracle")
    if "strict" not in tiers or (modes and not classic):  # coverage: sequential and parallel
        return Outcome(tuple(out), quantized=quantized)
    cov = cov_mod.coverage(
        artifact.id, engine, dialect, help_text, out, _not_run(which, engine, dialect, help_text)
    )
    console.print(f"verify: coverage: {cov_mod.write(cov, reports)}")
    cov_mod.print_table(cov, console)
    return Outcome(tuple(out), cov, quantized)


def spec_method(argv: Sequence[str], name: str, keep: Sequence[str] = ()) -> Method:
    """A recipe's rendered command as a verify method: its own options minus what verify sets
    (but those in `keep`: the recipe's own flash-attention setting, under its own flags)."""
    rest, skip = [], 0
    for a in argv[1:]:
        if skip:
            skip -= 1
            continue
        if a in OWN_OPTIONS and a not in keep:
            skip = OWN_OPTIONS[a]
            continue
        rest.append(a)
    return Method(name, tuple(rest))


def for_recipe(
    artifact: Artifact,
    dialect: str,
    name: str,
    tier: str | None,
    modes: Sequence[str],
    reports: Path,
    console: Console,
    prompts: Sequence[Prompt] = (),
) -> Outcome:
    """A recipe's own settings on the user's build, in the tiers `tier` names (None: those its
    target's precision allows, `tiers_for`); the oracle tier under the determinism flags and
    again under the recipe's own flags."""
    root = project_root()
    recipe, catalog = recipes.find(name, root)
    files = models.pull(catalog, recipe.pair, root, console)

    def method(target: Path, draft: Path | None) -> Method:
        argv = recipes.render_for(recipe, artifact, dialect, target, draft).argv
        return spec_method(argv, recipe.name)

    def own(target: Path, draft: Path | None) -> Method:
        argv = recipes.render_for(recipe, artifact, dialect, target, draft).argv
        return spec_method(argv, recipe.name, keep=("-fa",))

    return _own_settings(
        artifact,
        dialect,
        f"recipe-{recipe.name}",
        files.target,
        files.draft,
        method,
        tier,
        modes,
        reports,
        console,
        prompts,
        own,
    )


def check_gguf(path: Path, flag: str) -> None:
    """`path` must be a readable GGUF file (its magic), checked before any server starts."""
    fix = (
        "Give the path of a local GGUF file (download a catalog pair with `llamaspec models "
        "pull PAIR`)."
    )
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.gguf"))[:3]
        hint = f" It holds {', '.join(inside)}: give one of them." if inside else ""
        raise LlamaspecError(f"{flag} {path} is a directory, not a GGUF file.{hint} {fix}")
    if not path.exists():
        raise LlamaspecError(f"{flag} {path} does not exist. {fix}")
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
    except OSError as err:
        raise LlamaspecError(f"{flag} {path} cannot be read ({err.strerror}). {fix}") from None
    if head != gguf_header.MAGIC:
        what = "it is empty" if not head else f"it starts with {head!r}, not {gguf_header.MAGIC!r}"
        raise LlamaspecError(
            f"{flag} {path} is not a GGUF file ({what}). llama-server loads GGUF only: "
            "convert the model (llama.cpp's convert_hf_to_gguf.py) or download its GGUF. " + fix
        )


def for_files(
    artifact: Artifact,
    dialect: str,
    target: Path,
    draft: Path | None,
    spec_types: Sequence[str],
    tier: str | None,
    modes: Sequence[str],
    reports: Path,
    console: Console,
    prompts: Sequence[Prompt] = (),
) -> Outcome:
    """The user's own GGUF files: compatibility first, then the tiers `tier` names (None:
    those the target's precision allows, `tiers_for`)."""
    check_gguf(target, "--target")
    if draft is not None:
        check_gguf(draft, "--draft")
    target_info = gguf_header.read_local(target)  # a truncated header is refused before any server
    if draft is not None:
        verdict = compat.check(target_info, gguf_header.read_local(draft))
        if not verdict.ok:
            raise LlamaspecError(compat.explain(verdict) + " Nothing was run.")
    types = list(spec_types) or (["draft"] if draft is not None else ["ngram-mod"])
    if len(types) != 1:
        raise LlamaspecError(
            "verify --target takes one --spec type at a time (stacked types: write a recipe)."
        )
    kind = choose("spec type", types[0], SPEC_TYPES)
    if kind == "draft" and draft is None:
        raise LlamaspecError("--spec draft needs --draft FILE (a compatible draft model).")

    def method(t: Path, d: Path | None) -> Method:
        p_min = 0.0 if kind == "draft" else None
        s = dialects.SpecSettings(kind, d, n_max=8, p_min=p_min)  # type: ignore[arg-type]
        return Method(kind, tuple(dialects.spec_args(dialect, s)))

    return _own_settings(
        artifact,
        dialect,
        f"file-{target.stem}",
        target,
        draft,
        method,
        tier,
        modes,
        reports,
        console,
        prompts,
    )


def _own_settings(
    artifact: Artifact,
    dialect: str,
    tag: str,
    target: Path,
    draft: Path | None,
    method: Callable[[Path, Path | None], Method],
    tier: str | None,
    modes: Sequence[str],
    reports: Path,
    console: Console,
    prompts: Sequence[Prompt] = (),
    own: Callable[[Path, Path | None], Method] | None = None,
) -> Outcome:
    """One configuration, `method(target, draft)`, in the tiers `tiers_for` picks: the oracle
    tier on the files as they are (unless the engine has no token ids and the strict tier
    runs), with `own(target, draft)` (the recipe under its own flags) beside it; the strict
    tier on F32 references (the target itself when it is F32). `prompts` replace the
    built-in ones."""
    spec = method(target, draft)  # rendered first: a refusal comes before any work
    mine = own(target, draft) if own else None
    precision = read_precision(target)  # the header only, before any server
    choice = tiers_for(precision, target.name, tier, recipe=own is not None)
    console.print(f"verify: {choice.plan}")
    plan = functools.partial(
        verify.VerifyPlan,
        out_dir=reports,
        tag=tag,
        modes=tuple(modes),
        **({"prompts": tuple(prompts)} if prompts else {}),
    )
    out = []
    if choice.oracle and not (choice.strict and _no_token_ids(artifact, console)):
        oracle = plan(target, tier="oracle", draft=draft, spec=spec, own=mine)
        out.append(verify.verify(artifact, dialect, oracle, console))
    if choice.strict:
        sha = sha256_file(target, console)
        own_ref = precision.kind == "f32"
        ref, ref_draft = _references(target, draft, console, sha, own_ref=own_ref)
        ref_draft_path = ref_draft.path if ref_draft else None
        exact = plan(
            ref.path,
            tier="strict",
            draft=ref_draft_path,
            spec=method(ref.path, ref_draft_path),
            reference_sha256=ref.sha256,
        )
        out.append(verify.verify(artifact, dialect, exact, console))
    if choice.after:
        console.print(f"verify: {choice.after}")
    quantized = tuple(r.tag for r in out if r.tier == "oracle" and precision.quantized)
    return Outcome(tuple(out), quantized=quantized)


@dataclass(frozen=True)
class Tiers:
    """The tiers a --target or --recipe run takes, what it says before (`plan`) and, when
    only the oracle runs, after (`after`: what that means and how to get the strict tier)."""

    strict: bool
    oracle: bool
    plan: str
    after: str = ""


def tiers_for(precision: Precision, name: str, tier: str | None, recipe: bool = False) -> Tiers:
    """`tier` (strict, oracle, both) as asked, or None: by the target's precision. An F32
    target is its own strict reference (a recipe's oracle tier still runs, for its own flags;
    on a file the strict tier already proves token-identical it would add nothing); F16 and
    BF16 widen to F32 without loss, so the strict tier runs on that copy and the oracle on
    the file as served; a quantized target gets the oracle tier only, and the F32 copy with
    --strict (a dequantized copy costs 4 bytes a weight on disk and the time to write it)."""
    what = precision.describe()
    gib = precision.f32_bytes / (1 << 30)
    if tier is None:
        full = not precision.quantized
        strict, oracle = full, precision.kind != "f32" or recipe
    else:
        strict, oracle = tier in ("strict", "both"), tier in ("oracle", "both")
    on = {
        "f32": f"{name} itself (F32)",
        "half": f"its F32 copy ({what} widens to F32 without loss; {gib:.2f} GiB in the cache)",
        "quantized": f"an F32 copy of {name} ({what} dequantized; {gib:.2f} GiB in the cache)",
    }[precision.kind]
    said = []
    if strict:
        said.append(f"the strict tier (token identity, no threshold) on {on}")
    if oracle:
        said.append(f"the oracle tier on {name} as it is")
    plan = f"{name} is {what}: " + " and ".join(said)
    if strict:
        return Tiers(strict, oracle, plan)
    if precision.quantized:
        fix = (
            "For the strict tier (speculative output token-identical to plain output, no "
            "allowance), give an F32, F16 or BF16 file of the same model as --target, or add "
            f"--strict to run it on an F32 copy of this one ({gib:.2f} GiB, written once in "
            "the cache)."
        )
    else:
        fix = f"Drop --tier oracle to run the strict tier on {on}."
    after = (
        f"only the oracle tier ran on {name}. The oracle judges each emitted token against "
        "the plain server's choice for the same prefix and allows the noise it measures "
        "without speculation, so it can pass a wrong token where the two choices are a "
        f"near-tie; a pass here is weaker than token identity. {fix}"
    )
    return Tiers(strict, oracle, plan, after)


def _references(
    target: Path,
    draft: Path | None,
    console: Console,
    target_sha: str | None = None,
    draft_sha: str | None = None,
    own_ref: bool = False,
) -> tuple[Reference, Reference | None]:
    """F32 reference copies of the target and the draft (one copy when they are one file);
    a sha256 not given is computed (and remembered, see `sha256_file`). `own_ref`: the
    target is F32 (models.precision), its own reference, as reference_copy would find
    after parsing the whole header with gguf's slower reader."""
    sha = target_sha or sha256_file(target, console)
    if own_ref:
        ref = Reference(target, target.name, sha, sha, target.stat().st_size)
    else:
        ref = reference_copy(target, sha, console.print)
    if draft is None:
        return ref, None
    if draft == target:
        return ref, ref
    return ref, reference_copy(draft, draft_sha or sha256_file(draft, console), console.print)


def _no_token_ids(artifact: Artifact, console: Console) -> bool:
    """Engines whose server returns no token ids cannot run the oracle tier (say so)."""
    if artifact.manifest.get("engine") == "llama.cpp":
        return False
    console.print(
        f"verify: oracle tier skipped: {artifact.manifest.get('engine')} returns no token ids, "
        "which the per-token oracle needs; the strict tier runs"
    )
    return True
