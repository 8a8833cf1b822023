"""Serving a recipe to many clients as a user sizes it (issue 53): slots, context per slot and
the prompt cache's host memory over the recipe's settings, /metrics always on, and the same
sizes in `load`."""

from __future__ import annotations

import pytest

from llamaspec.cli.load import plan_from
from llamaspec.cli.main import make_parser
from llamaspec.config import ServerSettings, Serving
from llamaspec.errors import LlamaspecError
from llamaspec.models import recipes
from llamaspec.runtime import serve

from runcli import cli


def test_slots_keep_the_recipes_context_per_slot_unless_told() -> None:
    one = ServerSettings(ctx=4096, parallel=1)
    assert Serving(slots=8).apply(one).model_dump(include={"ctx", "parallel"}) == {
        "ctx": 32768,
        "parallel": 8,
    }
    assert Serving(slots=8, slot_ctx=1024).apply(one).ctx == 8192
    assert Serving(slot_ctx=2048).apply(ServerSettings(ctx=8192, parallel=4)).ctx == 8192
    assert Serving(slots=2).apply(ServerSettings()).model_dump(include={"ctx", "parallel"}) == {
        "ctx": None,
        "parallel": 2,
    }
    assert Serving(cache_ram=256).apply(one).cache_ram == 256
    assert Serving().apply(one) is one


def test_the_rendered_command_serves_the_slots_asked_with_metrics_on() -> None:
    recipe, _ = recipes.find("gemma3-270m-ngram-tuned")
    cmd = recipes.render(recipe, "llama.cpp", "upstream", "t.gguf", None,
                         serving=Serving(slots=8, cache_ram=256))  # fmt: skip
    argv = list(cmd.argv)
    assert argv[argv.index("-np") + 1] == "8" and argv[argv.index("-c") + 1] == "32768"
    assert argv[argv.index("--cache-ram") + 1] == "256"
    shown = serve.with_metrics(cmd, None)
    assert shown.argv.count("--metrics") == 1
    assert serve.capacity(shown.argv) == (
        "8 slot(s) of 4096 tokens each; prompt cache in host memory: at most 256 MiB (--cache-ram)"
    )
    plain = recipes.render(recipe, "llama.cpp", "upstream", "t.gguf", None)
    assert "--cache-ram" not in plain.argv
    assert "default bound (8192 MiB upstream)" in serve.capacity(plain.argv)
    assert serve.capacity(["llama-server", "--cache-ram", "0"]).endswith("none (--cache-ram 0)")


def test_recipe_show_takes_the_sizes(tmp_path) -> None:
    proc = cli("recipe", "show", "gemma3-270m-ngram", "--slots", "4", "--ctx-per-slot", "2048",
               "--cache-ram", "512", env_cache=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "-c 8192 -np 4 --cache-ram 512" in proc.stdout and "--metrics" in proc.stdout


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--slots", "0"], "whole number of slots from 1 to 256"),
        (["--slots", "4,8"], "whole number of slots from 1 to 256"),
        (["--cache-ram", "-5"], "whole number of MiB from 0"),
        (["--ctx-per-slot", "0"], "1 or more"),
    ],
)
def test_bad_sizes_are_refused_when_parsed(argv, said, tmp_path) -> None:
    for command in (["serve", "gemma3-270m-ngram"], ["recipe", "show", "gemma3-270m-ngram"]):
        proc = cli(*command, *argv, env_cache=tmp_path)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr


def test_load_sizes_its_servers_as_asked() -> None:
    args = make_parser().parse_args(["load", "r", "--slots", "8", "--cache-ram", "256",
                                      "--clients", "16"])  # fmt: skip
    plan = plan_from(args)
    assert (plan.slots, plan.cache_ram, plan.clients) == (8, 256, (16,))
    assert plan_from(make_parser().parse_args(["load", "r"])).slots is None


HELP_WITH = "--spec-type TYPE\n--spec-busy-max N   draft only while at most N slots ...\n--metrics"
HELP_WITHOUT = "--spec-type TYPE\n--metrics"


def test_the_busy_limit_comes_from_the_measured_crossover_unless_the_user_sets_it() -> None:
    """The draft pair lost from 4 clients (measured at 1, 2, 4, 8): it drafts while at most 2
    slots are busy; a recipe that paid at every count, or none measured, gets no limit."""
    pair, _ = recipes.find("gemma3-270m-q4-draft")
    assert pair.measured.crossover.clients == 4
    assert serve.busy_max(pair, None) == (2, False)
    assert serve.busy_max(pair, Serving(busy_max=3)) == (3, True)
    assert serve.busy_max(pair, Serving(busy_max=0)) == (None, True)  # 0: no limit
    ngram, _ = recipes.find("gemma3-270m-ngram")
    assert ngram.measured.crossover.clients is None
    assert serve.busy_max(ngram, None) == (None, False)


def test_the_busy_limit_is_rendered_only_for_a_build_that_takes_it() -> None:
    pair, _ = recipes.find("gemma3-270m-q4-draft")
    cmd = recipes.render(pair, "llama.cpp", "upstream", "t.gguf", "d.gguf")
    derived, chosen = (2, False), (3, True)

    def value(c) -> str | None:
        return serve._value(c.argv, "--spec-busy-max")

    assert value(serve.with_busy_max(cmd, derived, HELP_WITH, "llama.cpp", None)) == "2"
    # rendered for no build: llamaspec's default llama.cpp build has it; a forced dialect
    # or ik_llama.cpp does not say so
    assert value(serve.with_busy_max(cmd, chosen, None, "llama.cpp", None)) == "3"
    assert value(serve.with_busy_max(cmd, derived, None, "llama.cpp", "upstream")) is None
    left = serve.with_busy_max(cmd, derived, HELP_WITHOUT, "llama.cpp", None)
    assert value(left) is None and any("no such option" in n for n in left.notes)
    with pytest.raises(LlamaspecError, match="server-spec-busy-max"):
        serve.with_busy_max(cmd, chosen, HELP_WITHOUT, "llama.cpp", None)
    assert serve.with_busy_max(cmd, (None, True), HELP_WITH, "llama.cpp", None) is cmd
    note = serve.clients_note(pair, ["llama-server", "-np", "8", "--spec-busy-max", "2"])
    assert note is not None and "stops drafting while more than 2 slots are busy" in note


def test_recipe_show_stops_drafting_above_the_crossover_or_as_told(tmp_path) -> None:
    shown = cli("recipe", "show", "gemma3-270m-q4-draft", env_cache=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "--spec-busy-max 2" in shown.stdout
    off = cli("recipe", "show", "gemma3-270m-q4-draft", "--spec-busy-max", "0", env_cache=tmp_path)
    assert off.returncode == 0 and "--spec-busy-max" not in off.stdout, off.stderr
    bad = cli("recipe", "show", "gemma3-270m-q4-draft", "--spec-busy-max", "x", env_cache=tmp_path)
    assert bad.returncode == 2 and "whole number of slots from 0" in bad.stderr, bad.stderr
