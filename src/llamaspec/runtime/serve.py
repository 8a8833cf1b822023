"""A recipe's llama-server command, and `serve`: pull, check, render, run.

A recipe is rendered for a built artifact (in its dialect, checked against its own
`--help`) or, without one, for an engine at its default pin (`recipe show`). `serve` pulls
and checks the pair, renders it for the artifact, checks its RPC hosts and becomes the
server (exec); with `--restart` it stays as the server's parent instead and restarts it when
it dies (supervise.py).

Every rendering turns the server's `/metrics` on (`with_metrics`; the alert rules of
`recipe monitor` read it) and takes the user's `Serving` settings (slots, context per slot,
prompt-cache memory) over the recipe's. The speculation gate's `serve` half: where the
command loads a draft model or MTP head, `serve`, before it execs, leaves a small detached
watcher behind (`watch`). Exec keeps the server
what it was (the same process: its signals, exit status and PID, as llama-swap, systemd and
containers expect), and the watcher never touches a request: it reads `/metrics` every few
seconds until the server has generated GATE_TOKENS tokens, then says once, on the server's
own stderr, whether the draft drafted (quietly) or not (the gate's loud paragraph), and
exits; it exits as well when the server does. LLAMASPEC_SPEC_GATE=off leaves it out.
Under `--restart` the watcher follows the supervisor's PID, which outlives each server: it
skips the reads that fail while a server restarts and judges once, as without (the command
line, which is what it judges, is the same for every restart).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from llamaspec import env, netaddr, procs
from llamaspec.errors import LlamaspecError, choose
from llamaspec.paths import project_root

if TYPE_CHECKING:
    from rich.console import Console

    from llamaspec import config
    from llamaspec.engine.artifact import Artifact
    from llamaspec.models.dialects import ServerCommand
    from llamaspec.runtime.supervise import Policy


@dataclass(frozen=True)
class RenderOptions:
    """What a recipe is rendered for: a built artifact, else an engine at its default pin."""

    engine: str | None = None  # default: the artifact's, else llama.cpp
    artifact: str | None = None  # an artifact id (or prefix) in `dist`
    dist: Path = field(default_factory=lambda: Path("dist"))
    dialect: str | None = None  # default: from the engine and pin
    backend: str | None = None  # default: the artifact's, else cuda
    host: str = "127.0.0.1"
    port: int = 8080
    serving: config.Serving | None = None  # slots, context per slot, prompt-cache memory


@dataclass(frozen=True)
class Rendered:
    """A recipe rendered into a server command, and what it is missing."""

    recipe: config.Recipe
    cmd: ServerCommand
    artifact: Artifact | None
    missing: tuple[str, ...]  # model files not downloaded (or made) yet: hf://… in the command

    def llama_swap(self, ttl: int | None = None, aliases: Sequence[str] = ()) -> str:
        """The command as a llama-swap `models:` entry; refused while a model file is not
        downloaded (llama-swap would start a server that cannot open its model)."""
        from llamaspec.models import recipes

        if self.missing:
            raise LlamaspecError(
                f"A llama-swap entry must name model files llama-server can open, and "
                f"{', '.join(self.missing)} not downloaded yet. Run `llamaspec models pull "
                f"{self.recipe.pair}` first, then this again."
            )
        return recipes.llama_swap(self.recipe.name, self.cmd, ttl, aliases)


def model_path(model: config.ModelFile, locked: dict | None) -> Path | str:
    """The model's file where it was downloaded (or made), else its hf:// address (a derived
    model not made yet: `derived://SOURCE/FILE`)."""
    from llamaspec.models import catalog as models

    if model.source == "derived":
        return models.local_path(model, locked) or f"derived://{model.derived_from}/{model.file}"
    return models.local_path(model, locked) or f"hf://{model.repo}/{model.file}"


def recipe_command(
    name: str, opts: RenderOptions, console: Console, root: Path | None = None
) -> Rendered:
    """`recipe show`: the recipe `name` rendered with its models where `models pull` put
    them (their hf:// addresses where not yet downloaded)."""
    from llamaspec import lock as lockfile
    from llamaspec.models import recipes

    root = root or project_root()
    recipe, catalog = recipes.find(name, root)
    pair = catalog.pairs[recipe.pair]
    locked = lockfile.load(root)["models"]
    target = model_path(catalog.models[pair.target], locked.get(pair.target))
    draft = model_path(catalog.models[pair.draft], locked.get(pair.draft)) if pair.draft else None
    cmd, artifact = render(opts, recipe, target, draft, console)
    missing = tuple(str(p) for p in (target, draft) if p is not None and not isinstance(p, Path))
    return Rendered(recipe, cmd, artifact, missing)


def render(
    opts: RenderOptions,
    recipe: config.Recipe,
    target: Path | str,
    draft: Path | str | None,
    console: Console,
) -> tuple[ServerCommand, Artifact | None]:
    """Render for the artifact (checked against its --help) or for an engine's default pin."""
    from llamaspec import config
    from llamaspec.engine.artifact import load_artifact
    from llamaspec.models import recipes
    from llamaspec.models.dialects import dialect_for
    from llamaspec.models.server_help import server_help

    engines = config.load_engines()
    artifact = load_artifact(opts.dist, opts.artifact) if opts.artifact else None
    if artifact is not None:
        engine = artifact.manifest["engine"]
        if opts.engine and choose("engine", opts.engine, engines) != engine:
            raise LlamaspecError(
                f"--engine {opts.engine} but artifact {artifact.id} is a {engine} build; drop "
                "one of them."
            )
        dialect = opts.dialect or dialect_for(artifact, console.print)
        backend = opts.backend or artifact.manifest.get("backend", "cpu")
        variants = list(artifact.manifest.get("variants") or ())
        pin = artifact.manifest.get("commit")
        server = str(artifact.server)
    else:
        engine = choose("engine", opts.engine or "llama.cpp", engines)
        dialect = opts.dialect or engines[engine].dialect
        backend = opts.backend or "cuda"
        variants = None  # no build known: assume it has what the recipe asks for
        pin = None if opts.dialect else engines[engine].pin  # a forced dialect: no pin
        server = "llama-server"
    cmd = recipes.render(
        recipe,
        engine,
        dialect,
        target,
        draft,
        server=server,
        backend=backend,
        host=opts.host,
        port=opts.port,
        variants=variants,
        pin=pin,
        serving=opts.serving,
    )
    help_text = server_help(artifact.server) if artifact is not None else None
    cmd = with_metrics(cmd, help_text)
    cmd = with_busy_max(cmd, busy_max(recipe, opts.serving), help_text, engine, opts.dialect)
    if artifact is not None and help_text is not None:
        recipes.check_spec_types(cmd, recipe, help_text, f"build {artifact.id}")
        recipes.check_against_help(cmd, help_text, f"{artifact.id}/llama-server")
    return cmd, artifact


# The upstream server's prompt-cache bound in host memory when --cache-ram is not given.
DEFAULT_CACHE_RAM_MIB = 8192


def _value(argv: Sequence[str], flag: str) -> str | None:
    """The value after `flag` in a rendered command (None where it is not given)."""
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def capacity(argv: Sequence[str]) -> str:
    """What the command serves at once and how much host memory its prompt cache may take,
    in a sentence."""
    slots, ctx, cache = _value(argv, "-np"), _value(argv, "-c"), _value(argv, "--cache-ram")
    if slots is None:
        served = "the server's own slot count"
    elif ctx and int(ctx) > 0:
        served = f"{slots} slot(s) of {int(ctx) // int(slots)} tokens each"
    else:
        served = f"{slots} slot(s)"
    if cache is None:
        bound = (
            f"the server's default bound ({DEFAULT_CACHE_RAM_MIB} MiB upstream); "
            "--cache-ram MIB sets it"
        )
    elif cache == "0":
        bound = "none (--cache-ram 0)"
    else:
        bound = f"at most {cache} MiB (--cache-ram)"
    return f"{served}; prompt cache in host memory: {bound}"


def clients_note(recipe: config.Recipe, argv: Sequence[str]) -> str | None:
    """Where the recipe's speculation stops paying with many clients (its measured
    crossover), and whether this command's slots reach it; None where it was not measured."""
    from llamaspec.models.dialects import SERVER_FLAGS

    measured = recipe.measured
    cross = measured.crossover if measured is not None else None
    if cross is None:
        return None
    counts = ", ".join(map(str, cross.measured))
    where = f"measured at {counts} clients on {measured.hardware} ({cross.report})"
    if cross.clients is None:
        return f"many clients: speculation paid at every count, {where}"
    text = (
        f"many clients: speculation loses from {cross.clients} busy slots on, {where}; "
        "there plain decoding is faster"
    )
    slots = _value(argv, "-np")
    flag = SERVER_FLAGS["busy_max"]
    limit = _value(argv, flag)
    if slots is not None and int(slots) >= cross.clients:
        text += f". This command serves {slots} slots, so a busy server reaches it"
        if limit is not None:
            text += f"; it stops drafting while more than {limit} slots are busy ({flag})"
    return text


def busy_max(recipe: config.Recipe, serving: config.Serving | None) -> tuple[int | None, bool]:
    """How many busy slots the server drafts for at most, and whether the user chose
    it: `--spec-busy-max` (0: no limit), else the largest client count the recipe's bench
    measured below its crossover (None where speculation paid at every count measured)."""
    if serving is not None and serving.busy_max is not None:
        return (serving.busy_max or None), True
    cross = recipe.measured.crossover if recipe.measured is not None else None
    if cross is None or cross.clients is None:
        return None, False
    below = [c for c in cross.measured if c < cross.clients]
    return (max(below) if below else None), False


def with_busy_max(
    cmd: ServerCommand,
    limit: tuple[int | None, bool],
    help_text: str | None,
    engine: str,
    dialect: str | None,
) -> ServerCommand:
    """`cmd` with `--spec-busy-max N` (patch server-spec-busy-max: no drafting while more
    than N slots are busy) where the build takes the flag: its --help
    says so, or, rendered for no build, llamaspec's default llama.cpp build at its pin does.
    A limit the user chose on a build without it is refused; one derived from the recipe's
    crossover is left out with a note."""
    from llamaspec.models.dialects import SERVER_FLAGS
    from llamaspec.models.server_help import help_flags

    flag = SERVER_FLAGS["busy_max"]
    value, chosen = limit
    if value is None or flag in cmd.argv:
        return cmd
    if help_text is not None:
        takes = flag in help_flags(help_text)
    else:
        takes = engine == "llama.cpp" and dialect is None
    if takes:
        return replace(cmd, argv=(*cmd.argv, flag, str(value)))
    if chosen:
        raise LlamaspecError(
            f"{flag} {value} needs a llama-server with llamaspec's patch "
            "server-spec-busy-max, which the default llama.cpp build carries; this build "
            f"({engine}) has no such option. Build with `llamaspec build` (without "
            f"--no-default-patches) and name it with --artifact, or leave {flag} out."
        )
    note = (
        f"drafting would stop above {value} busy slots ({flag}, from the recipe's "
        "measured crossover), but this build has no such option (a stock or ik_llama.cpp "
        "build): speculation keeps drafting however many clients there are"
    )
    return replace(cmd, notes=(*cmd.notes, note))


def with_metrics(cmd: ServerCommand, help_text: str | None) -> ServerCommand:
    """`cmd` with the server's Prometheus endpoint on (`--metrics`): the alert rules of
    `recipe monitor` and the speculation gate read it. Left out only where the build's
    --help (when known) has no such flag."""
    from llamaspec.models.dialects import SERVER_FLAGS
    from llamaspec.models.server_help import help_flags

    flag = SERVER_FLAGS["metrics"]
    if flag in cmd.argv or (help_text is not None and flag not in help_flags(help_text)):
        return cmd
    return replace(cmd, argv=(*cmd.argv, flag))


def _refuse_before_download(
    opts: RenderOptions, recipe: config.Recipe, artifact: Artifact, root: Path
) -> None:
    """A spec type the build's dialect lacks (mtp on an old pin, eagle3 on ik_llama.cpp)
    is refused before the pair is downloaded, where the dialect is known without probing:
    `--dialect`, or the engine's default pin as engines.yaml records it."""
    from llamaspec import config
    from llamaspec.models import dialects

    engine = artifact.manifest["engine"]
    recorded = config.load_engines(root).get(engine)
    dialect = opts.dialect
    if dialect is None and recorded is not None and artifact.manifest.get("commit") == recorded.pin:
        dialect = recorded.dialect
    if dialect is None:
        return  # a pin engines.yaml does not record: its --help decides, at render time
    pin = artifact.manifest.get("commit")
    where = f"{engine} at {pin[:7]}" if pin else engine
    mine = recipe.for_engine(engine)
    d = dialects.find_dialect(dialect)
    why = dialects.refusal(d, mine.spec.types, f"Recipe {recipe.name!r}", where, mine.server)
    if why:
        raise LlamaspecError(why + " Nothing was downloaded.")


def serve(
    name: str,
    opts: RenderOptions,
    console: Console,
    root: Path | None = None,
    restart: Policy | None = None,
    allow_all_interfaces: bool = False,
) -> NoReturn:
    """Check the build and the recipe's RPC hosts, then download and check its pair, render
    it for the artifact (default: the newest in `dist`) and become the server (foreground);
    with a `restart` policy, run it as a child and restart it when it dies."""
    from llamaspec.engine.artifact import load_artifact, newest_artifact
    from llamaspec.models import catalog as models
    from llamaspec.models import recipes

    check_bind(opts.host, allow_all_interfaces)  # the address before anything else
    root = root or project_root()
    recipe, catalog = recipes.find(name, root)
    if opts.engine:  # a typo is named as one, not as "no such artifact"
        from llamaspec import config

        opts = replace(opts, engine=choose("engine", opts.engine, config.load_engines()))
    if not opts.artifact:
        opts = replace(opts, artifact=newest_artifact(opts.dist, opts.engine))
    # cheap checks first: the build and the rpc hosts, before any download
    artifact = load_artifact(opts.dist, opts.artifact)
    rpc_hosts = recipe.for_engine(artifact.manifest["engine"]).server.rpc
    if rpc_hosts:
        from llamaspec.models.dialects import no_rpc_build
        from llamaspec.runtime import rpc

        if "rpc" not in (artifact.manifest.get("variants") or ()):
            raise LlamaspecError(no_rpc_build(f"Recipe {recipe.name!r}", rpc_hosts))
        for host, version in rpc.check_hosts(artifact, rpc_hosts).items():
            console.print(f"serve: rpc host {host} answers, protocol {'.'.join(map(str, version))}")
    _refuse_before_download(opts, recipe, artifact, root)
    # a draft that would never draft is refused before any download, too
    from llamaspec.models.dialects import dialect_for, find_dialect

    engine = artifact.manifest["engine"]
    d = find_dialect(opts.dialect or dialect_for(artifact))
    pin = str(artifact.manifest.get("commit") or "local")[:7]
    has_draft = catalog.pairs[recipe.pair].draft is not None
    where = f"{engine} at {pin}"
    idle = recipes.draft_without_type(recipe.for_engine(engine), engine, d, where, has_draft)
    if idle:
        raise LlamaspecError(idle)
    files = models.pull(catalog, recipe.pair, root, console)
    cmd, _ = render(opts, recipe, files.target, files.draft, console)
    argv = list(cmd.argv)
    console.print(f"serve: {shlex.join(argv)}")
    console.print(f"serve: {capacity(argv)}")
    note = clients_note(recipe, argv)
    if note:
        console.print(f"serve: {note}")
    console.print(f"serve: listening on {listening(opts.host, opts.port)} (Ctrl-C stops it)")
    if restart is not None:
        console.print(
            f"serve: --restart: llamaspec stays as the server's parent and restarts it when it "
            f"dies (giving up after {restart.max_restarts} restarts in a row that do not stay "
            f"healthy for {restart.stable_s:g} s)"
        )
    if gated(argv, artifact, console):
        start_watcher(argv, opts.host, opts.port, d.name)
    if restart is None:
        os.execv(argv[0], argv)
    from llamaspec.runtime import supervise

    raise SystemExit(supervise.supervise(argv, loopback_url(opts.host, opts.port), restart))


# The gate judges once the server has generated this many tokens (a few replies' worth).
GATE_TOKENS = 64
GATE_POLL_S = 5.0
GATE_SWITCH = env.SPEC_GATE.name  # `off`: no watcher


def gated(argv: list[str], artifact: Artifact, console: Console) -> bool:
    """Whether the speculation gate watches this server: it loads a draft model or MTP head,
    the gate is on, and the build serves /metrics (which the rendering turned on)."""
    from llamaspec.models.server_help import help_flags, server_help
    from llamaspec.runtime import specgate

    if (env.get(env.SPEC_GATE) or "").lower() == "off":
        return False
    if not specgate.loaded(argv, os.environ).drafts:
        return False
    if "--metrics" not in help_flags(server_help(artifact.server)):
        return False
    console.print(
        f"serve: speculation gate: the server's /metrics counters are read until it has "
        f"generated {GATE_TOKENS} tokens ({GATE_SWITCH}=off turns this off)"
    )
    return True


def start_watcher(argv: list[str], host: str, port: int, dialect: str) -> None:
    """Fork the detached watcher (twice, so the server need not reap it) and return; this
    process then execs the server, keeping its PID, which the watcher follows (under
    `--restart` it stays the servers' parent, with the same PID)."""
    server = os.getpid()
    first = os.fork()
    if first:
        os.waitpid(first, 0)
        return
    try:
        if os.fork() == 0:
            os.setsid()
            watch(argv, host, port, dialect, server)
    finally:
        os._exit(0)


def check_bind(host: str, allow_all_interfaces: bool = False) -> None:
    """Every interface (0.0.0.0, ::, and every spelling the engine reads as one) only by
    choice: llama-server answers anyone who reaches it, prompts and all."""
    if netaddr.binds_everywhere(host) and not allow_all_interfaces:
        raise LlamaspecError(
            f"--host {host or '(empty)'} would let every network this machine is on reach "
            "the server and send it prompts (llama-server has no authentication unless "
            "given --api-key). Bind 127.0.0.1 (the default) and put a proxy with TLS and "
            "authentication in front, or bind the one interface your clients use; pass "
            "--allow-all-interfaces to bind every interface anyway."
        )


def url(host: str, port: int) -> str:
    """http://HOST:PORT, an IPv6 address in brackets."""
    bare = host.removeprefix("[").removesuffix("]")
    return f"http://[{bare}]:{port}" if ":" in bare else f"http://{bare}:{port}"


def loopback_url(host: str, port: int) -> str:
    """Where this machine reaches the server: loopback for an all-interfaces address (the
    IPv6 one for ::)."""
    if netaddr.binds_everywhere(host):
        v6 = ":" in host.removeprefix("[").removesuffix("]")
        host = "::1" if v6 else "127.0.0.1"
    return url(host, port)


def listening(host: str, port: int) -> str:
    """Where the server listens, in words a user can paste."""
    if netaddr.binds_everywhere(host):
        return f"every interface, port {port} ({loopback_url(host, port)} from this machine)"
    return url(host, port)


def watch(
    argv: list[str],
    host: str,
    port: int,
    dialect: str,
    server_pid: int,
    say=None,
    poll_s: float | None = None,
    tokens: int | None = None,
) -> str | None:
    """Poll the server's counters until it has generated `tokens` tokens, then print the
    gate's verdict when it is loud (or that the engine exports no counters) and return it.
    Returns None when the server exits first."""
    import sys
    import time

    from llamaspec.runtime import metrics, specgate

    say = say or (lambda text: print(f"llamaspec serve: {text}", file=sys.stderr, flush=True))
    poll_s = GATE_POLL_S if poll_s is None else poll_s
    tokens = GATE_TOKENS if tokens is None else tokens
    url = loopback_url(host, port)
    while procs.alive(server_pid):
        time.sleep(poll_s)
        counters = metrics.read(url)
        if counters is None:
            continue  # still loading, or between restarts
        if not counters.available:
            say(
                "speculation gate: this server exports no speculation counters (ik_llama.cpp); "
                "its log's acceptance lines say whether the draft drafts"
            )
            return "unknown"
        if counters.predicted < tokens:
            continue
        verdict = specgate.judge(argv, None, counters, dialect=dialect)
        if verdict.failed:
            say(verdict.message)
        return verdict.kind
    return None
