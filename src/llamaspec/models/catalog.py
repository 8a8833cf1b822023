"""Model pairs: look up, judge compatibility before download, download and verify."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llamaspec import lock as lockfile
from llamaspec import progress
from llamaspec.config import ModelFile, ModelsFile, Pair
from llamaspec.errors import LlamaspecError, choose
from llamaspec.models import compat, derived, gguf_header, heads, hub
from llamaspec.models.embedded import embedded_model
from llamaspec.paths import writable_dir


@dataclass(frozen=True)
class PairFiles:
    """A pair on disk: the target's path and the draft's (None for MTP / n-gram pairs)."""

    name: str
    pair: Pair
    target: Path
    draft: Path | None


def get_pair(models: ModelsFile, name: str) -> Pair:
    return models.pairs[choose("model pair", name, models.pairs)]


def local_path(model: ModelFile, locked: dict | None) -> Path | None:
    """The model's first file if it is on disk already (embedded, or in the HF cache)."""
    files = local_files(model, locked)
    return files[0] if files else None


def local_files(
    model: ModelFile, locked: dict | None, known_only: bool = False
) -> list[Path] | None:
    """Every file of the model (each part of a split GGUF), if all are on disk already and
    unchanged since they were verified; else None. With `known_only`, also None when a
    file's sha256 is in neither models.yaml nor the lock: only such a model is used without
    asking the hub."""
    if model.source == "embedded":
        return [embedded_model()]
    if model.source == "derived":
        made = derived_made(model)
        return None if made is None else [made]
    paths = [hub.cached_path(model, part, locked) for part in model.parts]
    if not all(paths):
        return None
    for i, (part, path) in enumerate(zip(model.parts, paths, strict=True)):
        want = model.part_sha256(i) or ((locked or {}).get("sha256") or {}).get(part)
        if want is None and known_only:
            return None
        # a file changed since it was verified is not used (`models pull` replaces it);
        # the digest is remembered per file state, so an unchanged file is not read again
        if want and hub.sha256_of(path, lambda _m: None) != want:  # type: ignore[arg-type]
            return None
    return paths  # type: ignore[return-value]


def derived_made(model: ModelFile) -> Path | None:
    """A derived model's copy if it has been made and is unchanged: its sha256 is the one
    models.yaml records (else the one recorded when it was made); None otherwise."""
    path = derived.copies_dir() / model.file
    if not path.is_file():
        return None
    want = model.part_sha256(0) or derived.recorded_sha256(path)
    return path if want and hub.sha256_of(path, lambda _m: None) == want else None


def on_hand(models: ModelsFile, handle: str, locked: dict) -> bool:
    """Whether the model is on disk, or can be made here without a download (the embedded
    model, and a derived model whose source is on hand): what bench and tune fetch alone."""
    model = models.models[handle]
    if model.source == "embedded":
        return True
    if model.source == "derived":
        source = str(model.derived_from)
        return derived_made(model) is not None or on_hand(models, source, locked)
    return local_path(model, locked.get(handle)) is not None


def tokenizer(
    model: ModelFile, console: Console, locked: dict | None, local: Path | None = None
) -> gguf_header.TokenizerInfo:
    """Tokenizer metadata: from a local file when given/present, else the remote header."""
    if local is not None:
        return gguf_header.read_local(local)
    if model.source == "derived" and derived_made(model) is None:
        raise LlamaspecError(
            f"{model.file} has not been made yet; `llamaspec models pull` with a pair that "
            "names it makes it."
        )
    path = local_path(model, locked)
    if path is not None:
        try:
            return gguf_header.read_local(path)
        except LlamaspecError as exc:
            if model.source == "embedded":
                raise
            # a damaged cached copy: judge from the hub; the download then replaces the file
            console.print(f"model: the cached {path.name} is unreadable ({exc.message[:120]})")
    console.print(f"model: reading the GGUF header of {model.repo}/{model.parts[0]} (range read)")
    return hub.remote_tokenizer(model)


def check_pair(
    models: ModelsFile,
    name: str,
    root: Path,
    console: Console,
    target_file: Path | None = None,
    draft_file: Path | None = None,
) -> compat.Verdict | None:
    """Judge the pair with the engine's rules; None for pairs without a draft model.

    An MTP pair's target must carry MTP heads: its header is read (locally or by a range
    request) and a file without them is refused here, before anything is downloaded."""
    pair = get_pair(models, name)
    locked = lockfile.load(root)["models"]
    if pair.spec == "mtp":
        model = models.models[pair.target]
        info = tokenizer(model, console, locked.get(pair.target), target_file)
        if not heads.mtp_ready(info):
            where = where_of(model, target_file)
            raise LlamaspecError(
                f"Pair {name!r} speculates with the target's own MTP heads, but {where} has "
                "none: no tensor named *nextn* (blk.N.nextn.*) together with "
                f"nextn_predict_layers > 0 in its header ({heads.mtp_summary(info)}), so the "
                "engine would refuse --spec-type mtp. Nothing was downloaded. Plain "
                "conversions of MTP models often leave the heads out (llama.cpp issue "
                "#28196). Use a GGUF converted with its MTP layers kept (e.g. a repo with "
                "-MTP- in its name), or a recipe with a draft model or n-grams."
            )
        console.print(
            f"model: {where_of(model, target_file)} carries MTP heads "
            f"({info.mtp_layers or '?'} layer(s), {info.nextn_tensors} nextn tensors)"
        )
        return None
    if pair.draft is None:
        return None
    target = header(models, pair.target, console, locked, target_file)
    draft = header(models, pair.draft, console, locked, draft_file)
    # an EAGLE-3 head or a Gemma 4 assistant is also judged against the target's shape
    verdict = heads.check(target, draft)
    if verdict.ok:  # a draft the engine refuses is named as that first; then what it costs
        sizes(name, pair, target, draft, console)
    return verdict


def header(
    models: ModelsFile, handle: str, console: Console, locked: dict, local: Path | None = None
) -> gguf_header.TokenizerInfo:
    """`tokenizer` of a catalog model; a derived model not made yet is read from its
    source's header (the copy keeps every key), with the size its tensors will have."""
    model = models.models[handle]
    if model.source == "derived" and local is None and derived_made(model) is None:
        info = header(models, str(model.derived_from), console, locked)
        return replace(info, name=model.file, nbytes=info.params * derived.DTYPE_BYTES)
    return tokenizer(model, console, locked.get(handle), local)


def size_ratio(target: gguf_header.TokenizerInfo, draft: gguf_header.TokenizerInfo) -> float | None:
    """The draft's tensor bytes over the target's, from their headers; None when either is
    unknown, or the target is split and only its first part was read (too small a figure)."""
    if not target.nbytes or draft.nbytes is None:
        return None
    if target.split_count > 1:
        return None
    return draft.nbytes / target.nbytes


def _mb(n: int | None) -> str:
    return f"{(n or 0) / 1e6:,.0f} MB" if (n or 0) >= 1e6 else f"{n or 0:,} bytes"


def sizes(
    name: str,
    pair: Pair,
    target: gguf_header.TokenizerInfo,
    draft: gguf_header.TokenizerInfo,
    console: Console,
) -> None:
    """Refuse a pair whose draft is not smaller than its target: each draft token would cost
    about what a target token costs, so speculation cannot pay. A `plumbing: true` pair
    (kept to prove the draft path, e.g. a model drafting for itself) gets a warning."""
    ratio = size_ratio(target, draft)
    if ratio is None:
        return
    if ratio < 1.0:
        console.print(
            f"model: the draft is {ratio:.2f}× the target's size ({_mb(draft.nbytes)} of "
            f"{_mb(target.nbytes)} of weights)"
        )
        return
    said = (
        f"the draft {draft.name} ({_mb(draft.nbytes)} of weights) is {ratio:.2f}× the "
        f"target's size ({target.name}, {_mb(target.nbytes)})"
    )
    if pair.plumbing:
        console.print(
            f"warning: pair {name!r} is a plumbing pair: {said}, so it proves the draft path "
            "works but speculation cannot be faster.",
            style="yellow",
        )
        return
    raise LlamaspecError(
        f"Pair {name!r}: {said}: each draft token costs as much as a target token or more, so "
        "speculation cannot pay. Pick a smaller draft (a smaller model of the same family, or "
        "a lower-bit quantization such as Q4_K_M of the target), or a draft-free pair "
        "(`spec: ngram`); a pair kept only to prove the draft path works may say `plumbing: "
        "true`. Nothing was downloaded."
    )


def check_files(target: Path, draft: Path) -> compat.Verdict:
    """`models check --target-file T --draft-file D`: two local files, by the same rules."""
    return heads.check(gguf_header.read_local(target), gguf_header.read_local(draft))


def where_of(model: ModelFile, local: Path | None = None) -> str:
    """How a model is named in messages: the local file, else repo/file."""
    if local is not None:
        return str(local)
    return model.file if model.source != "hf" else f"{model.repo}/{model.file}"


def render_verdict(verdict: compat.Verdict, console: Console) -> None:
    table = Table(title=f"{verdict.draft} → {verdict.target}")
    for col in ("rule", "", "detail"):
        table.add_column(col)
    for rule in verdict.rules:
        table.add_row(rule.name, "[green]ok[/]" if rule.ok else "[red]FAIL[/]", rule.detail)
    console.print(table)


def check_local_dir(dest: Path) -> None:
    """`models pull --local-dir DEST`, checked before anything is read from the hub: DEST
    must be a directory this user can write into, or one that can be made (its nearest
    existing parent is such a directory). `place_plain` makes it after the download."""
    what, fix = f"--local-dir {dest}", "give a directory you can write into"
    if dest.is_symlink() and not dest.exists():
        raise LlamaspecError(f"{what} is a link to nothing; {fix}.")
    if dest.exists() and not dest.is_dir():
        raise LlamaspecError(f"{what} is a file, not a directory; {fix}.")
    existing = dest.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise LlamaspecError(f"{what} cannot be made: {existing} is a file; {fix}.")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == dest.absolute() else f" (it would be made in {existing})"
        raise LlamaspecError(f"{what} is not writable by this user{where}; {fix}.")


def pull(
    models: ModelsFile,
    name: str,
    root: Path,
    console: Console,
    local_dir: Path | None = None,
) -> PairFiles:
    """Check the pair from headers, then download and verify both models (recorded in the
    lock). With `local_dir` (`--local-dir`), that destination is checked first of all."""
    pair = get_pair(models, name)
    if local_dir is not None:
        check_local_dir(local_dir)
    verdict = check_pair(models, name, root, console)
    if verdict is not None:
        render_verdict(verdict, console)
        if not verdict.ok:
            raise LlamaspecError(heads.explain(verdict) + " Nothing was downloaded.")
    lock = lockfile.load(root)
    paths: dict[str, Path | None] = {"target": None, "draft": None}
    for role in ("target", "draft"):
        handle = getattr(pair, role)
        if handle is not None:
            paths[role] = fetch(models, handle, root, lock, console)
    assert paths["target"] is not None
    return PairFiles(name, pair, paths["target"], paths["draft"])


def fetch(models: ModelsFile, handle: str, root: Path, lock: dict, console: Console) -> Path:
    """One model's (first) file on disk, verified: the embedded model assembled, a hub model
    from the cache or downloaded (and recorded in the lock), a derived model made."""
    model = models.models[handle]
    if model.source == "embedded":
        return embedded_model(console.print)
    if model.source == "derived":
        return make_derived(models, handle, root, lock, console)
    cached = local_files(model, lock["models"].get(handle), known_only=True)
    if cached is not None:  # cache first: a verified pair needs no network at all
        console.print(f"model: {handle} ok (verified in the cache) → {cached[0]}")
        return cached[0]
    got = hub.download(handle, model, lock["models"].get(handle), console)
    record = {
        "repo": model.repo,
        "revision": got.commit,
        "sha256": dict(zip(model.parts, got.sha256, strict=True)),
    }
    if lock["models"].get(handle) != record:
        # a user's own model in the user's lock, never in the checkout's
        written = lockfile.record_model(root, handle, record)
        if written is not None:
            console.print(f"model: recorded {handle} @ {str(got.commit)[:12]} in {written}")
    console.print(f"model: {handle} ok → {got.path}")
    return got.path


def make_derived(models: ModelsFile, handle: str, root: Path, lock: dict, console: Console) -> Path:
    """A derived model's copy: used as it is when made and unchanged, else made (once, with
    progress, atomically: a temporary file renamed into place) from its source, fetched
    first, and checked against the sha256 models.yaml records."""
    model = models.models[handle]
    made = derived_made(model)
    if made is not None:
        console.print(f"model: {handle} ok (made here, verified) → {made}")
        return made
    source = str(model.derived_from)
    src = fetch(models, source, root, lock, console)
    want = models.models[source].part_sha256(0)
    assert want is not None  # config: a derived model's source records its sha256
    size = f", {model.size / 1e9:.2f} GB" if model.size else ""
    console.print(
        f"model: making {handle} once: the {model.dtype} copy of {source}{size} (reading the "
        "source's tensors takes a minute or more on a small machine)"
    )
    with progress.bar(console) as bar:
        task = bar.add_task(f"model: making {handle}, the {model.dtype} copy of {source}")

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        copy = derived.reference_copy(src, want, console.print, tick)
    if model.sha256 and copy.sha256 != model.sha256:
        from importlib.metadata import version as installed

        version = installed("gguf")
        raise LlamaspecError(
            f"The {model.dtype} copy of {source} made here ({copy.path}) has sha256 "
            f"{copy.sha256}, but models.yaml records {model.sha256} for {handle!r}, so it is "
            f"not used: the `gguf` package here (version {version}) writes the copy "
            "differently from the one that made the recorded file (models.yaml names that "
            f"version next to the model). Install that gguf version, delete {copy.path}, and "
            "run again."
        )
    hub.remember_sha256(copy.path, copy.sha256)  # later uses need not hash 1 GB again
    console.print(f"model: {handle} ok (made here, sha256 {copy.sha256[:16]}…) → {copy.path}")
    return copy.path


def pair_files(models: ModelsFile, name: str, root: Path) -> list[Path]:
    """Every file of the pair's models (each part of a split GGUF), all on disk and
    verified; a pair that is not wholly downloaded is an error naming `models pull`."""
    pair = get_pair(models, name)
    locked = lockfile.load(root)["models"]
    out: list[Path] = []
    for handle in (pair.target, pair.draft):
        if handle is None:
            continue
        files = local_files(models.models[handle], locked.get(handle))
        if files is None:
            raise LlamaspecError(
                f"{handle} of pair {name!r} is not downloaded (or changed since it was "
                f"verified); run `llamaspec models pull {name}` first."
            )
        out += files
    return out


def place_plain(files: list[Path], dest: Path, console: Console) -> list[Path]:
    """`models pull --local-dir DEST`: each verified file as a plain file DEST/<name> (a hard
    link to the cache's blob where the file system allows, else a copy), for a plain
    `-v DEST:/models:ro` mount and tools that do not follow the cache's symlinks. A file
    already there with the same bytes is kept; another file of that name is refused."""
    writable_dir(dest, f"--local-dir {dest}", "give a directory you can write into")
    placed = []
    for src in files:
        real, out = src.resolve(), dest / src.name
        if out.exists() or out.is_symlink():
            same = out.is_file() and not out.is_symlink() and (
                out.samefile(real) or hub.sha256_of(out, console.print) == hub.sha256_of(
                    real, console.print
                )
            )  # fmt: skip
            if not same:
                raise LlamaspecError(
                    f"{out} exists and is not the verified {src.name}; move it away or choose "
                    "another --local-dir, then run the pull again."
                )
            console.print(f"model: {out} is already there")
            placed.append(out)
            continue
        tmp = dest / f".{src.name}.partial"
        tmp.unlink(missing_ok=True)
        try:
            os.link(real, tmp)
            how = "hard link"
        except OSError:
            hub.check_disk(real.stat().st_size, dest, f"a copy of {src.name}")
            console.print(f"model: copying {src.name} to {dest} …")
            shutil.copyfile(real, tmp)
            how = "copy"
        os.replace(tmp, out)  # never a half-written file under the real name
        console.print(f"model: {out} ({how})")
        placed.append(out)
    return placed


def list_table(models: ModelsFile, recipes: dict) -> Table:
    """Every pair with its models, sizes and recipes."""
    by_pair: dict[str, list[str]] = {}
    for recipe in recipes.values():
        by_pair.setdefault(recipe.pair, []).append(recipe.name)
    table = Table(title="model pairs (models.yaml)")
    for col in ("pair", "spec", "target", "draft", "≈ GB", "recipes"):
        table.add_column(col, no_wrap=col in ("pair", "spec", "≈ GB"), overflow="fold")
    for name, pair in models.pairs.items():
        target = models.models[pair.target]
        draft = models.models[pair.draft] if pair.draft else None
        gb = sum(m.approx_gb or 0 for m in (target, draft) if m)
        table.add_row(
            name,
            pair.spec,
            _label(target),
            _label(draft) if draft else "—",
            f"{gb:.1f}" if gb else "?",
            ", ".join(sorted(by_pair.get(name, []))) or "—",
        )
    return table


def _label(model: ModelFile) -> str:
    if model.source == "embedded":
        return f"{model.file} (PyPI)"
    if model.source == "derived":
        return f"{model.file} ({str(model.dtype).upper()} of {model.derived_from}, made here)"
    more = f" (+{len(model.parts) - 1} parts)" if len(model.parts) > 1 else ""
    return f"{model.repo}/{model.file}{more}"
