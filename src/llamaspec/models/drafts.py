"""Find a draft for any target: search the Hub, judge each candidate by its header, rank.

The target (a Hub repo and file, a local GGUF, or a catalog model) is read from its
header alone (range requests for a remote file). Its family (`general.basename`, else the
architecture) is the Hub search term; every GGUF repo the search returns is listed (file
names, sizes: the quantizations on offer), one file of each is read the same way, and the
engine's rules (`compat.check`) judge it. Nothing is downloaded beyond headers.
`find_and_show` is `draft find`'s search, with what it prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import huggingface_hub as hf
from huggingface_hub import errors as hf_errors
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llamaspec import config
from llamaspec.config import ModelFile, ModelsFile, Recipe
from llamaspec.errors import LlamaspecError
from llamaspec.models import compat, gguf_header, heads, hub
from llamaspec.models.recipes import load_all
from llamaspec.paths import project_root

# The draft size the ranking aims at, as a share of the target's parameters: small enough
# to cost little per token, large enough to agree with the target often.
IDEAL_RATIO = 1 / 16
QUANT = re.compile(r"(?i)(?:^|[-_.])((?:I?Q\d(?:_[A-Z0-9]+)*)|BF16|F16|F32)(?=[-_.])")
SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
# Quantizations read first when a repo has several (the header is the same in all).
PREFERRED = ("Q8_0", "Q4_K_M", "Q4_0", "F16")


@dataclass(frozen=True)
class Source:
    """A GGUF on the Hub (repo and file) or on this machine (path)."""

    repo: str | None
    file: str
    size: int | None
    path: Path | None = None
    handle: str | None = None  # the catalog model it is, if any

    @property
    def label(self) -> str:
        return f"{self.repo}/{self.file}" if self.repo else str(self.path)


@dataclass(frozen=True)
class Candidate:
    source: Source
    quants: tuple[str, ...] = ()
    info: gguf_header.TokenizerInfo | None = None
    verdict: compat.Verdict | None = None
    error: str = ""
    recipes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.verdict is not None and self.verdict.ok

    def ratio(self, target: gguf_header.TokenizerInfo) -> float | None:
        if self.info is None or not self.info.params or not target.params:
            return None
        return self.info.params / target.params


@dataclass(frozen=True)
class Found:
    target: Source
    info: gguf_header.TokenizerInfo
    terms: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    searched: int  # repos the search returned
    skipped: tuple[str, ...] = field(default=())  # repos left out, with why


def quant_of(filename: str) -> str:
    m = QUANT.search(Path(filename).name)
    return m[1].upper() if m else "?"


# ---------------------------------------------------------------- the Hub


@contextlib.contextmanager
def hub_calls(what: str) -> Iterator[None]:
    """The Hub's exceptions around a search or listing, as one paragraph each."""
    try:
        yield
    except hf_errors.GatedRepoError:
        raise LlamaspecError(
            f"{what}: the repository is gated. Accept its license on {hub.endpoint()}, then "
            "`export HF_TOKEN=hf_...` and run again."
        ) from None
    except hf_errors.RepositoryNotFoundError:
        raise LlamaspecError(
            f"{what}: no such repository on {hub.endpoint()} (or it is private and no valid "
            "HF_TOKEN is set). Check the name (owner/name, as in the repo's URL)."
        ) from None
    except hf_errors.RevisionNotFoundError:
        raise LlamaspecError(f"{what}: the revision does not exist on {hub.endpoint()}.") from None
    except hf_errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise LlamaspecError(
            f"{what}: {hub.endpoint()} answered HTTP {status} ({exc.server_message or exc}). "
            "Try again later, or check HF_ENDPOINT."
        ) from None
    except Exception as exc:
        if not hub.unreachable(exc):
            raise
        raise offline(what, exc) from None


def offline(what: str, exc: BaseException) -> LlamaspecError:
    detail = str(exc).splitlines()[0] if str(exc) else "no detail"
    return LlamaspecError(
        f"{what}: could not reach {hub.endpoint()} ({type(exc).__name__}: {detail}). "
        "`draft find` searches the Hub and reads each candidate's header there, so it needs "
        "the network (headers only: no model is downloaded). Check the connection, a proxy "
        "(HTTPS_PROXY) or HF_ENDPOINT, and run again; `llamaspec models check --target-file "
        "T.gguf --draft-file D.gguf` judges two local files without the network."
    )


def _api() -> hf.HfApi:
    return hf.HfApi(endpoint=hub.endpoint(), token=hub.token())


def gguf_files(repo: str) -> list[tuple[str, int | None]]:
    """The GGUF files of a Hub repo (a split model as its first part, sized as all its
    parts together; no vision projectors), with their sizes."""
    with hub_calls(f"Listing the files of {repo}"):
        tree = list(_api().list_repo_tree(repo, recursive=True))
    sizes: dict[str, list[int | None]] = {}
    for entry in tree:
        name = getattr(entry, "path", "")
        if not name.endswith(".gguf") or "mmproj" in name.lower():
            continue
        part = SPLIT_PART.search(name)
        first = f"{name[: part.start()]}-00001-of-{part[2]}.gguf" if part else name
        sizes.setdefault(first, []).append(getattr(entry, "size", None))
    out = []
    for name, found in sizes.items():
        part = SPLIT_PART.search(name)
        whole = len(found) == (int(part[2]) if part else 1) and None not in found
        out.append((name, sum(found) if whole else None))  # type: ignore[arg-type]
    return out


def search(terms: Sequence[str], limit: int) -> list[str]:
    """GGUF repos whose names hold a term, most downloaded first, `limit` per term."""
    found: dict[str, None] = {}
    for term in terms:
        with hub_calls(f"Searching {hub.endpoint()} for {term!r}"):
            models = _api().list_models(search=term, filter="gguf", sort="downloads", limit=limit)
            for m in models:
                found[m.id] = None
    return list(found)


def _model(source: Source) -> ModelFile:
    return ModelFile(repo=source.repo, file=source.file, tokenizer="?", license="?")


def read(source: Source) -> gguf_header.TokenizerInfo:
    """The header of `source`: a local read, or HTTP range reads of its first megabytes; a
    split GGUF is measured over all its parts (one more small header read per part)."""
    return read_sized(source)[0]


def read_sized(source: Source) -> tuple[gguf_header.TokenizerInfo, int | None]:
    """`read`, and the bytes of the whole model (every part of a split; None: unknown)."""
    if source.path is not None:
        return gguf_header.read_local_split(source.path), local_size(source.path)
    info, size = hub.remote_split(_model(source), source.file, source.label)
    return info, size or None


# ---------------------------------------------------------------- the target


def resolve_target(text: str, catalog: ModelsFile) -> Source:
    """TARGET as a local file, a catalog model, `owner/name/file.gguf`, `owner/name:file.gguf`
    or `owner/name` (then the repo's GGUF, preferring Q8_0 / Q4_K_M where it has several)."""
    if text in catalog.models:
        model = catalog.models[text]
        if model.source == "embedded":
            from llamaspec.models.embedded import embedded_model

            path = embedded_model()
            return Source(None, path.name, path.stat().st_size, path, handle=text)
        if model.source == "derived":
            from llamaspec.models.catalog import derived_made

            made = derived_made(model)
            if made is None:
                raise LlamaspecError(
                    f"{text} is made here from {model.derived_from} ({model.dtype}) and has not "
                    f"been made yet; `llamaspec models pull` with a pair that names it makes "
                    f"it, or give {model.derived_from} as the target."
                )
            return Source(None, made.name, made.stat().st_size, made, handle=text)
        return Source(model.repo, model.file, model.size, handle=text)
    path = Path(text).expanduser()
    if path.is_file() or (text.endswith(".gguf") and not re.match(r"^[\w.-]+/[\w.-]+[:/]", text)):
        if not path.is_file():
            raise LlamaspecError(
                f"The target {text} is not a file here. Give a local GGUF, a Hub repo "
                "(owner/name, or owner/name:file.gguf) or a model name from `llamaspec models "
                "list`."
            )
        return Source(None, path.name, local_size(path), path.resolve())
    repo, sep, file = text.partition(":")
    if not sep:
        parts = text.split("/")
        repo, file = "/".join(parts[:2]), "/".join(parts[2:])
    check_repo(repo, text)
    parts = file.split("/") if file else []
    if file and (not file.endswith(".gguf") or any(p in ("", ".", "..") for p in parts)):
        raise LlamaspecError(
            f"The target {text!r} names {file!r} in {repo}, which is not a GGUF file path (a "
            "relative path inside the repo, ending in .gguf, without '..'). Write owner/name, "
            "owner/name:file.gguf or owner/name/dir/file.gguf."
        )
    files = gguf_files(repo)
    if not files:
        raise LlamaspecError(
            f"{repo} on {hub.endpoint()} has no GGUF file (llama-server runs GGUF models only). "
            "Pick a GGUF conversion of the model: repos named like …-GGUF usually are, e.g. "
            f"search {hub.endpoint()}/models?library=gguf&search={repo.split('/')[1]}."
        )
    sizes = dict(files)
    if file:
        if file not in sizes:
            raise LlamaspecError(
                f"{file} is not in {repo}; its GGUF files are: {', '.join(sorted(sizes))}."
            )
        return Source(repo, file, sizes[file])
    return Source(repo, _pick(files), sizes[_pick(files)])


def check_repo(repo: str, text: str) -> None:
    """A Hub repo id as the Hub accepts it (huggingface_hub's own validator), in the
    `owner/name` form: else one paragraph, before anything is asked of the Hub."""
    why = "" if re.fullmatch(r"[^/\s]+/[^/\s]+", repo) else "it is not of the form owner/name"
    if not why:
        try:
            validate_repo_id(repo)
        except HFValidationError as exc:
            why = str(exc).splitlines()[0] if str(exc) else "the Hub refuses it"
    if why:
        raise LlamaspecError(
            f"{text!r} is neither a file here nor a Hub repo id ({repo!r}: {why}), nor a "
            "model from `llamaspec models list`. Give a local GGUF, a model name, or a repo as "
            "owner/name (letters, digits, '-', '_' and '.', as in the repo's URL), optionally "
            "with :file.gguf."
        )


def local_size(path: Path) -> int:
    """The bytes of a local GGUF, every part of a split one together (the parts beside it;
    a missing part is left out here and named when the headers are read)."""
    m = gguf_header.SPLIT_NAME.match(path.name)
    if not m:
        return path.stat().st_size
    count = int(m["count"])
    names = (f"{m['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1))
    return sum(p.stat().st_size for p in (path.with_name(n) for n in names) if p.is_file())


def _pick(files: Sequence[tuple[str, int | None]]) -> str:
    by_quant = {quant_of(name): name for name, _ in sorted(files)}
    for q in PREFERRED:
        if q in by_quant:
            return by_quant[q]
    return sorted(files)[0][0]


def family_terms(info: gguf_header.TokenizerInfo, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """What to search the Hub for: the family's name (`general.basename`), the architecture,
    and the user's own terms."""
    terms = [*extra]
    for t in (info.basename, info.arch):
        if t and t != "?" and t.lower() not in (x.lower() for x in terms):
            terms.append(t)
    return tuple(terms)


# ---------------------------------------------------------------- finding


def used_by(catalog: ModelsFile, recipes: dict[str, Recipe], source: Source) -> tuple[str, ...]:
    """The recipes whose pair drafts with this file (same repo and file, or catalog model)."""
    handles = {
        h
        for h, m in catalog.models.items()
        if h == source.handle or (source.repo and m.repo == source.repo and m.file == source.file)
    }
    pairs = {p for p, pair in catalog.pairs.items() if pair.draft in handles}
    return tuple(sorted(r.name for r in recipes.values() if r.pair in pairs))


def find(
    target: Source,
    catalog: ModelsFile,
    recipes: dict[str, Recipe],
    *,
    limit: int = 20,
    extra_terms: Sequence[str] = (),
    say=lambda _m: None,
) -> Found:
    """Search, read and judge; the candidates ranked (see `rank`)."""
    try:
        info, size = read_sized(target)
    except LlamaspecError as exc:
        raise LlamaspecError(f"The target's header cannot be read: {exc}") from None
    if size and size != target.size:  # a catalog model without a size, a split one in parts
        target = dataclasses.replace(target, size=size)
    terms = family_terms(info, extra_terms)
    if not terms:
        raise LlamaspecError(
            f"The target {target.label} names neither its family (general.basename) nor its "
            "architecture, so there is nothing to search the Hub for; give a term with --search."
        )
    say(f"draft find: searching {hub.endpoint()} for GGUF repos matching {', '.join(terms)}")
    repos = [r for r in search(terms, limit) if r != target.repo]
    candidates, skipped = [], []
    for repo in repos:
        try:
            files = gguf_files(repo)
        except LlamaspecError as exc:
            skipped.append(f"{repo} ({exc})")
            continue
        if not files:
            skipped.append(f"{repo} (no GGUF file)")
            continue
        small = [(n, s) for n, s in files if target.size is None or (s or 0) < target.size]
        if not small:
            skipped.append(f"{repo} (every GGUF as large as the target or larger)")
            continue
        name = _pick(small)
        source = Source(repo, name, dict(small)[name])
        quants = tuple(sorted({quant_of(n) for n, _ in files}))
        say(f"draft find: reading the header of {source.label}")
        try:
            cinfo = read(source)
        except LlamaspecError as exc:
            candidates.append(Candidate(source, quants, error=str(exc)))
            continue
        verdict = heads.check(info, cinfo)
        candidates.append(
            Candidate(source, quants, cinfo, verdict, recipes=used_by(catalog, recipes, source))
        )
    return Found(target, info, terms, tuple(rank(candidates, info)), len(repos), tuple(skipped))


def rank(candidates: Sequence[Candidate], target: gguf_header.TokenizerInfo) -> list[Candidate]:
    """Compatible drafts smaller than the target first, nearest `IDEAL_RATIO` of its
    parameters first (one a recipe already uses wins a tie); then compatible ones not
    smaller; then refused ones (fewest failed rules first); then unreadable ones."""

    def key(c: Candidate) -> tuple:
        ratio = c.ratio(target)
        if c.ok:
            smaller = ratio is not None and ratio < 1
            distance = abs(math.log(ratio / IDEAL_RATIO)) if ratio else math.inf
            return (0 if smaller else 1, distance, not c.recipes, c.source.label)
        if c.verdict is not None:
            return (2, len(c.verdict.failed), 0.0, False, c.source.label)
        return (3, 0, 0.0, False, c.source.label)

    return sorted(candidates, key=key)


# ---------------------------------------------------------------- output


def human(n: int | None, unit: str = "") -> str:
    if not n:
        return "?"
    for scale, suffix in ((1e12, "T"), (1e9, "G" if unit else "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}{unit}"
    return f"{n}{unit}"


def verdict_text(c: Candidate) -> str:
    if c.verdict is None:
        return f"unreadable: {c.error}"
    if c.ok:
        kind = heads.draft_kind(c.info) if c.info else "draft"
        return "compatible" if kind == "draft" else f"compatible (spec type {kind})"
    first = c.verdict.failed[0]
    return f"refused: {first.name} ({first.detail})"


def table(found: Found) -> Table:
    info = found.info
    t = Table(
        title=f"drafts for {escape(found.target.label)} ({human(info.params)} parameters, vocab "
        f"{info.vocab_type} {info.n_vocab}; searched {', '.join(found.terms)})",
        caption="ranked: compatible and smaller first, nearest 1/16 of the target's parameters; "
        "then refused (the first rule the engine would fail). ratio = draft ÷ target "
        "parameters. No model was downloaded: headers only.",
    )
    for col in (
        "#",
        "draft (repo/file)",
        "verdict",
        "params",
        "ratio",
        "size",
        "quants",
        "recipes",
    ):
        t.add_column(col, overflow="fold")
    for i, c in enumerate(found.candidates, 1):
        ratio = c.ratio(info)
        t.add_row(
            str(i),
            escape(c.source.label),
            escape(verdict_text(c)),
            human(c.info.params) if c.info else "?",
            f"{ratio:.3f}" if ratio is not None else "?",
            human(c.source.size, "B"),
            " ".join(c.quants),
            ", ".join(c.recipes) or "-",
        )
    return t


def ngram_recipes(catalog: ModelsFile, recipes: dict[str, Recipe], target: Source) -> list[Recipe]:
    """Draft-free recipes with a measured result: the target's own first, then any."""
    ngram = [
        r
        for r in recipes.values()
        if r.measured and all(t.startswith("ngram") for t in r.spec.types)
    ]
    own = {
        p
        for p, pair in catalog.pairs.items()
        if pair.target == target.handle
        or (target.repo and catalog.models[pair.target].repo == target.repo)
    }
    return sorted(ngram, key=lambda r: (r.pair not in own, r.name))


def no_draft_advice(found: Found, catalog: ModelsFile, recipes: dict[str, Recipe]) -> str:
    """No compatible draft: say so, and what works without one (n-gram speculation)."""
    refused = [c for c in found.candidates if c.verdict is not None]
    why = (
        "; ".join(f"{c.source.repo}: {verdict_text(c)}" for c in refused[:3])
        if refused
        else "the search returned no readable candidate"
    )
    where = found.target.path or found.target.label
    text = (
        f"No compatible draft was found for {found.target.label} ({why}). Speculation without a "
        "draft model still works: the n-gram types draft from the text already in the context "
        "(code, edits, repeated passages gain most; prose little). "
    )
    ngram = ngram_recipes(catalog, recipes, found.target)
    if ngram:
        r = ngram[0]
        text += (
            f"Recipe {r.name!r} ({', '.join(r.spec.types)}) measured {r.measured.result} "  # type: ignore[union-attr]
            f"on {r.measured.hardware}. "  # type: ignore[union-attr]
        )
    text += (
        f"Measure it on your target with `llamaspec bench --target {where} --spec ngram-mod`, "
        "or try `--search TERM` for a draft published under another name."
    )
    return text


def mtp_line(info: gguf_header.TokenizerInfo) -> str:
    """Whether the target can draft with its own MTP heads (spec type mtp, no draft file)."""
    if heads.mtp_ready(info):
        return (
            f"target: carries MTP heads ({heads.mtp_summary(info)}): spec type mtp drafts without "
            "a draft file."
        )
    return f"target: no MTP heads the engine can load ({heads.mtp_summary(info)})."


def find_and_show(
    target: str,
    console: Console,
    *,
    limit: int = 20,
    extra_terms: Sequence[str] = (),
    root: Path | None = None,
) -> Found:
    """`draft find TARGET`: resolve the target (against the catalog), search and judge, and
    print the ranked table, what was skipped, how many fit, and (when none does) what works
    without a draft."""
    root = root or project_root()
    catalog = config.load_models(root)
    known = load_all(root, lambda _m: None)
    found = find(
        resolve_target(target, catalog),
        catalog,
        known,
        limit=limit,
        extra_terms=extra_terms,
        say=lambda m: console.print(m, style="dim"),
    )
    console.print(table(found))
    console.print(escape(mtp_line(found.info)))
    for s in found.skipped:
        console.print(escape(f"skipped: {s}"), style="dim")
    compatible = [c for c in found.candidates if c.ok]
    console.print(
        f"draft find: {found.searched} repo(s) found, {len(found.candidates)} header(s) read, "
        f"{len(compatible)} compatible."
    )
    if not compatible:
        console.print(escape(no_draft_advice(found, catalog, known)))
    return found
