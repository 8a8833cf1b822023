"""Model files from Hugging Face: metadata, header range reads, verified downloads.

Files land in the standard HF cache layout (shared with other tools; `HF_HOME`,
`HF_HUB_CACHE`, `HF_ENDPOINT` and `HF_TOKEN` apply). `huggingface_hub` resolves metadata,
builds URLs and headers, and streams with progress and in-call retries; its
`hf_hub_download` no longer resumes across runs (each run writes a fresh temporary file),
so llamaspec keeps the partial file under a stable name and resumes it with a range
request. llamaspec adds the free-disk check, sha256 verification before a file enters the
cache, and the record of what was downloaded in llamaspec.lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import huggingface_hub as hf
from huggingface_hub import constants as hf_constants
from huggingface_hub import errors as hf_errors
from huggingface_hub.file_download import http_get, repo_folder_name
from rich.console import Console

from llamaspec.config import ModelFile
from llamaspec.errors import LlamaspecError
from llamaspec.models import gguf_header
from llamaspec.paths import cache_dir

DISK_MARGIN = 1 << 30  # keep 1 GiB free after a download


@dataclass(frozen=True)
class RemoteFile:
    """One file on the hub, as its metadata (HEAD on the resolve URL) describes it."""

    repo: str
    filename: str
    revision: str
    url: str
    size: int | None
    sha256: str | None  # the LFS object id (the hub's X-Linked-Etag)
    commit: str | None
    etag: str = ""
    location: str = ""  # where the content is (the hub redirects LFS files to a CDN)


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or hf_constants.ENDPOINT


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or hf.get_token()


def _transport_errors() -> tuple[type[Exception], ...]:
    """The HTTP client errors huggingface_hub may raise: httpx's, and httpx2's where the
    installed huggingface_hub uses that (2.x), so every version's are one paragraph."""
    found: list[type[Exception]] = [httpx.HTTPError]
    with contextlib.suppress(ImportError):
        import httpx2

        found.append(httpx2.HTTPError)
    return tuple(found)


TRANSPORT_ERRORS = _transport_errors()


@contextlib.contextmanager
def hub_errors(model: ModelFile, filename: str) -> Iterator[None]:
    """Turn huggingface_hub's exceptions into one-paragraph errors that say what to do."""
    where = f"{model.repo}/{filename}" + (f"@{model.revision[:12]}" if model.revision else "")
    try:
        yield
    except hf_errors.GatedRepoError:
        has = "The token in HF_TOKEN was refused" if _token() else "No token is set"
        raise LlamaspecError(
            f"{model.repo} is a gated repository: {has}. Accept its license at "
            f"{endpoint()}/{model.repo}, create a read token at {endpoint()}/settings/tokens, "
            "then `export HF_TOKEN=hf_...` (or `hf auth login`) and run again."
        ) from None
    except hf_errors.RevisionNotFoundError:
        raise LlamaspecError(
            f"Revision {model.revision} of {model.repo} does not exist on {endpoint()}. "
            "Fix `revision` in models.yaml (a full commit SHA of that repo)."
        ) from None
    except hf_errors.RemoteEntryNotFoundError:
        raise LlamaspecError(
            f"{filename} is not in {model.repo} on {endpoint()} ({where}). Check `file` in "
            f"models.yaml against the repo's file list at {endpoint()}/{model.repo}/tree/main."
        ) from None
    except hf_errors.RepositoryNotFoundError:
        raise LlamaspecError(
            f"Repository {model.repo} was not found on {endpoint()} (or it is private and no "
            "valid HF_TOKEN is set). Check `repo` in models.yaml."
        ) from None
    except hf_errors.OfflineModeIsEnabled:
        raise LlamaspecError(
            f"HF_HUB_OFFLINE is set and {where} is not in the cache, verified; llamaspec "
            "asks the hub only for files it does not have. Unset HF_HUB_OFFLINE and run "
            "`llamaspec models pull` once with a network, then run offline again."
        ) from None
    except (
        hf_errors.LocalEntryNotFoundError,
        OSError,
        *TRANSPORT_ERRORS,
    ) as exc:
        if isinstance(exc, hf_errors.HfHubHTTPError):
            status = exc.response.status_code if exc.response is not None else "?"
            raise LlamaspecError(
                f"{endpoint()} answered HTTP {status} for {where}: {exc.server_message or exc}. "
                "Try again later, or check HF_ENDPOINT."
            ) from None
        raise _unreachable(where, exc) from None
    except Exception as exc:
        if not unreachable(exc):
            raise
        raise _unreachable(where, exc) from None


# the modules whose exceptions mean the hub could not be reached
NETWORK_MODULES = frozenset(
    {"httpx", "httpx2", "httpcore", "httpcore2", "h11", "h2", "anyio", "ssl", "socket"}
)


def unreachable(exc: BaseException) -> bool:
    """Whether exc means the hub could not be reached: an OS or named transport error, or
    one from a client module this code does not name (a new httpx major, say)."""
    return (
        isinstance(exc, (OSError, *TRANSPORT_ERRORS))
        or type(exc).__module__.split(".")[0] in NETWORK_MODULES
    )


def _unreachable(where: str, exc: BaseException) -> LlamaspecError:
    detail = str(exc).splitlines()[0] if str(exc) else "no detail"
    return LlamaspecError(
        f"Could not reach {endpoint()} to fetch {where} ({type(exc).__name__}: {detail}). "
        "Check the network or HF_ENDPOINT; a pair already pulled and verified is used from "
        "the cache without the network."
    )


def remote_file(model: ModelFile, filename: str) -> RemoteFile:
    """Metadata of one file: size, sha256 and the commit the revision resolves to."""
    revision = model.revision or "main"
    url = hf.hf_hub_url(model.repo or "", filename, revision=revision, endpoint=endpoint())
    with hub_errors(model, filename):
        meta = hf.get_hf_file_metadata(url, token=_token(), endpoint=endpoint())
    etag = (meta.etag or "").strip('"').removeprefix("W/").strip('"')
    sha = etag if compat_sha(etag) else None
    _check_server_id(etag, "ETag", (40, 64), model, filename)
    if meta.commit_hash is not None:
        _check_server_id(meta.commit_hash, "X-Repo-Commit", (40,), model, filename)
    return RemoteFile(
        model.repo or "",
        filename,
        revision,
        url,
        meta.size,
        sha,
        meta.commit_hash,
        etag,
        meta.location or url,
    )


def compat_sha(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def _check_server_id(
    value: str, header: str, lengths: tuple[int, ...], model: ModelFile, filename: str
) -> None:
    """Refuse a server-supplied id that is not lowercase hex of an expected length.

    Commit ids and ETags become directory and file names in the HF cache; anything else
    (`../`, slashes, an empty value) could write outside it or mix up entries."""
    if len(value) in lengths and all(c in "0123456789abcdef" for c in value):
        return
    want = " or ".join(str(n) for n in lengths)
    raise LlamaspecError(
        f"{endpoint()} sent {header} {value[:80]!r} for {model.repo}/{filename}, which is not "
        f"a hex id of {want} characters; llamaspec uses it as a cache path and refuses it. "
        "Check HF_ENDPOINT (is it really a Hugging Face hub or a faithful mirror?) and run again."
    )


def range_fetcher(model: ModelFile, remote: RemoteFile) -> gguf_header.Fetch:
    """`fetch(start, end)` → the file's bytes start..end-1, by an HTTP range request
    (redirects followed); a server that ignores Range has the bytes before `start` skipped."""
    headers = hf.utils.build_hf_headers(token=_token())

    def fetch(start: int, end: int) -> bytes:
        range_header = {**headers, "Range": f"bytes={start}-{end - 1}"}
        with (
            hub_errors(model, remote.filename),
            httpx.Client(follow_redirects=True, timeout=60) as client,
            client.stream("GET", remote.url, headers=range_header) as resp,
        ):
            if resp.status_code in (401, 403, 404):
                hf.utils.hf_raise_for_status(resp)
            resp.raise_for_status()
            skip = start if resp.status_code == 200 else 0  # the whole file, from byte 0
            out = bytearray()
            for chunk in resp.iter_bytes():
                out += chunk
                if len(out) >= skip + end - start:  # a server that ignores Range: stop
                    break
            return bytes(out[skip : skip + end - start])

    return fetch


def remote_tokenizer(model: ModelFile) -> gguf_header.TokenizerInfo:
    """Tokenizer metadata of a hub model from its first file's header (no full download)."""
    first = model.parts[0]
    remote = remote_file(model, first)
    return gguf_header.read_header(
        range_fetcher(model, remote), remote.size, f"{model.repo}/{first}"
    )


def remote_split(
    model: ModelFile, filename: str, label: str
) -> tuple[gguf_header.TokenizerInfo, int]:
    """The header of a hub file with every part of its split counted (`gguf_header.read_split`:
    one small range read per later part), and the bytes of all the parts (0: unknown)."""
    remote = remote_file(model, filename)
    info = gguf_header.read_header(range_fetcher(model, remote), remote.size, label)
    sizes = [remote.size]

    def part(name: str) -> gguf_header.TokenizerInfo:
        other = remote_file(model, name)
        sizes.append(other.size)
        where = f"{model.repo}/{name}"
        return gguf_header.read_header(
            range_fetcher(model, other), other.size, where, gguf_header.PART_READ
        )

    info = gguf_header.read_split(info, filename, part)
    return info, 0 if None in sizes else sum(sizes)  # type: ignore[arg-type]


def cached_path(model: ModelFile, filename: str, locked: dict | None = None) -> Path | None:
    """The file in the HF cache at the catalog's (else the lock's, else main's) revision."""
    revision = model.revision or (locked or {}).get("revision")
    found = hf.try_to_load_from_cache(model.repo or "", filename, revision=revision)
    return Path(found) if isinstance(found, str) else None


def check_disk(needed: int, where: Path, what: str) -> None:
    """Refuse to start a download that cannot fit (plus a margin)."""
    where.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(where).free
    if needed + DISK_MARGIN > free:
        raise LlamaspecError(
            f"Not enough disk space for {what}: it needs {_gb(needed)} (plus {_gb(DISK_MARGIN)} "
            f"headroom) but {where} has {_gb(free)} free. Free some space, or point HF_HUB_CACHE "
            "at a larger disk, and run again."
        )


def _gb(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def _stamp(real: Path) -> Path:
    # Any write to the file changes its ctime (which, unlike mtime, cannot be set back), so
    # a stamp names exactly one state of one file; a changed file misses and is hashed anew.
    st = real.stat()
    key = f"{real.name}.{st.st_dev}.{st.st_ino}.{st.st_size}.{st.st_mtime_ns}.{st.st_ctime_ns}"
    return cache_dir() / "sha256" / key


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def sha256_of(path: Path, say: Callable[[str], None]) -> str:
    """sha256 of a (possibly large) file, remembered for this exact state of the file."""
    real = path.resolve()
    stamp = _stamp(real)
    if stamp.is_file():
        return stamp.read_text().strip()
    size = real.stat().st_size
    if size > (1 << 30):
        say(f"model: checking sha256 of {path.name} ({_gb(size)})")
    digest = _hash_file(real)
    remember_sha256(real, digest)
    return digest


def remember_sha256(path: Path, digest: str) -> None:
    """Record `digest` for the file's current state (after a rename, say: no second hash)."""
    stamp = _stamp(path.resolve())
    stamp.parent.mkdir(parents=True, exist_ok=True)
    tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}")
    tmp.write_text(digest)
    os.replace(tmp, stamp)


def _storage(repo: str) -> Path:
    return Path(hf_constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")


def _fetch(remote: RemoteFile, want: str, console: Console) -> Path:
    """Download one file into the HF cache layout, resuming a partial download, verified.

    The content goes to `blobs/<etag>.incomplete` (a stable name, so a later run resumes it
    with a range request), is checked against `want` and only then becomes `blobs/<etag>`,
    linked from `snapshots/<commit>/<file>` like huggingface_hub's own downloads.
    """
    storage = _storage(remote.repo)
    commit = remote.commit or remote.revision
    pointer = storage / "snapshots" / commit / remote.filename
    blob = storage / "blobs" / remote.etag
    partial = blob.with_name(f"{remote.etag}.incomplete")
    for cached in (pointer, blob):
        if cached.is_file():
            if _intact(cached, want, remote, console):
                break
            cached.resolve().unlink(missing_ok=True)  # the blob, not only the link to it
            pointer.unlink(missing_ok=True)
    if pointer.is_file():
        return pointer
    if not blob.is_file():
        blob.parent.mkdir(parents=True, exist_ok=True)
        with partial.open("ab") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LlamaspecError(
                    f"Another process is downloading {remote.repo}/{remote.filename} into "
                    f"{partial.parent}; wait for it to finish, then run again."
                ) from None
            done = f.tell()
            if done:
                console.print(
                    f"model: resuming {remote.filename} at {_gb(done)} of {_gb(remote.size or 0)}"
                )
            headers = hf.utils.build_hf_headers(token=_token())
            if urlsplit(remote.location).netloc != urlsplit(remote.url).netloc:
                headers.pop("authorization", None)  # signed CDN URLs take no token
            http_get(
                remote.location,
                f,  # type: ignore[arg-type]
                resume_size=done,
                headers=headers,
                expected_size=remote.size,
                displayed_filename=remote.filename,
            )
        digest = _hash_file(partial)
        if digest != want:
            partial.unlink()
            raise LlamaspecError(
                f"{remote.repo}/{remote.filename} downloaded with sha256 {digest}, expected "
                f"{want}. The corrupt file was removed; run again to re-download it. If it "
                "happens again, the file on the hub differs from the catalog: check models.yaml."
            )
        partial.replace(blob)
        remember_sha256(blob, digest)  # hashed once, while still .incomplete
    pointer.parent.mkdir(parents=True, exist_ok=True)
    pointer.unlink(missing_ok=True)
    pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    if remote.revision != commit:  # a branch name: record where it pointed, as the hub does
        ref = storage / "refs" / remote.revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    return pointer


def _intact(path: Path, want: str, remote: RemoteFile, console: Console) -> bool:
    """Whether a cached file still has the expected sha256 (else say so; caller removes it)."""
    got = sha256_of(path, console.print)
    if got == want:
        return True
    console.print(
        f"model: the cached {remote.repo}/{remote.filename} has sha256 {got[:16]}…, expected "
        f"{want[:16]}…: it is corrupt; removing it and downloading it again"
    )
    return False


@dataclass(frozen=True)
class Downloaded:
    """A model's files on disk, verified, and what the hub said about them."""

    paths: tuple[Path, ...]
    commit: str | None
    sha256: tuple[str, ...]

    @property
    def path(self) -> Path:
        """The file llama-server is given (the first part of a split GGUF)."""
        return self.paths[0]


def download(name: str, model: ModelFile, locked: dict | None, console: Console) -> Downloaded:
    """Download (or find in the HF cache) and verify every part of `model`."""
    locked = locked or {}
    remotes = [remote_file(model, part) for part in model.parts]
    commits = {r.commit for r in remotes}
    commit = remotes[0].commit if len(commits) == 1 else None
    expected = [
        model.part_sha256(i) or (locked.get("sha256") or {}).get(part) or remotes[i].sha256
        for i, part in enumerate(model.parts)
    ]
    for i, (remote, want) in enumerate(zip(remotes, expected, strict=True)):
        catalog = model.part_sha256(i) or (locked.get("sha256") or {}).get(remote.filename)
        if catalog and remote.sha256 and catalog != remote.sha256:
            raise LlamaspecError(
                f"{model.repo}/{remote.filename} on the hub has sha256 {remote.sha256}, but "
                f"llamaspec expects {catalog} (models.yaml or llamaspec.lock). The file changed "
                "upstream or the catalog is wrong: pin `revision` to the commit you trust, or "
                "update the sha256 after checking the new file."
            )
        if want is None:
            raise LlamaspecError(
                f"No sha256 is known for {model.repo}/{remote.filename}: models.yaml has none and "
                "the hub sent no LFS object id. Add `sha256:` to the catalog entry."
            )
    missing = [
        (part, r)
        for part, r in zip(model.parts, remotes, strict=True)
        if not cached_path(model, part)
    ]
    need = sum(r.size or 0 for _, r in missing)
    if missing:
        check_disk(need, Path(hf_constants.HF_HUB_CACHE), f"{name} ({len(missing)} file(s))")
    paths = []
    for remote, want in zip(remotes, expected, strict=True):
        with hub_errors(model, remote.filename):
            paths.append(_fetch(remote, want, console))  # type: ignore[arg-type]
    digests = [sha256_of(p, console.print) for p in paths]
    return Downloaded(tuple(paths), commit, tuple(digests))


def token() -> str | None:
    """The Hub token in use (HF_TOKEN, else the one `hf auth login` stored), or None."""
    return _token()
