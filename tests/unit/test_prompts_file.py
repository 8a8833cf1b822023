"""`verify --prompts FILE`: JSON Lines prompts, validated in config; bad input is one
paragraph naming the file, the line (and column) and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from llamaspec import config
from llamaspec.errors import LlamaspecError
from llamaspec.proof import suite, verify
from llamaspec.runtime.client import Prompt, render_chat

from runcli import cli

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "prompts.jsonl"
GOOD = '{"text": "Hello", "n_predict": 8}'
CHAT = '{"messages": [{"role": "user", "content": "Hi"}]}'


def test_the_shipped_example_loads_with_code_prose_and_a_chat() -> None:
    lines = config.load_prompts(EXAMPLE)
    assert len(lines) >= 4 and all(1 <= p.n_predict <= 64 for p in lines)
    assert {"code", "prose", "chat"} <= {p.name for p in lines}
    chat = next(p for p in lines if p.messages)
    assert chat.text is None and chat.messages[-1].role == "user"
    prompts = suite.load_prompts(EXAMPLE)
    by_name = {p.name: p for p in prompts}
    assert by_name["chat"].messages[-1][0] == "user" and by_name["chat"].text == ""
    assert by_name["code"].text.startswith("Write") and by_name["code"].n_predict == 32


def test_a_good_file_names_unnamed_lines_skips_blank_ones_and_defaults_n_predict(
    tmp_path: Path,
) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(f'{GOOD}\n\n  \n{{"name": "mine", "text": "x"}}\n{CHAT}\n')
    first, mine, chat = config.load_prompts(f)
    assert (first.name, first.text, first.n_predict) == ("line-1", "Hello", 8)
    assert (mine.name, mine.n_predict) == ("mine", 64)
    assert chat.name == "line-5" and chat.messages and chat.messages[0].content == "Hi"
    with pytest.raises(ValidationError):  # frozen
        first.n_predict = 9  # type: ignore[misc]


BAD = [
    # not JSON Lines
    ('[\n  {"text": "a"}\n]\n', "line 1, column 2: not JSON", "one JSON document"),
    ('{\n  "text": "a"\n}\n', "line 1, column 2: not JSON", "write one object per line"),
    ("text: hello\n", "line 1, column 1: not JSON", "one JSON object"),
    (f'{GOOD}\n{{"text": "a"\n', "line 2, column 13: not JSON", "Expecting ','"),
    ('["a", "b"]\n', "line 1: an array, not a JSON object", ""),
    ('"just text"\n', "line 1: a string, not a JSON object", ""),
    # empty
    ("", "holds no prompts (it is empty)", "one JSON object"),
    ("\n\n   \n", "holds no prompts", ""),
    # the text
    (f'{GOOD}\n{{"n_predict": 8}}\n', "line 2: give `text` (a prompt) or `messages`", "neither"),
    ('{"text": "   "}\n', "line 1: `text` is empty", ""),
    ('{"text": 5}\n', "line 1: text must be a string, not 5", ""),
    (
        f'{{"text": "a", "messages": {json.dumps([{"role": "user", "content": "b"}])}}}\n',
        "not both",
        "",
    ),
    # tokens to generate
    ('{"text": "a", "n_predict": 0}\n', "line 1: n_predict is 0; give 1 to 1024", ""),
    ('{"text": "a", "n_predict": 1000000}\n', "n_predict is 1000000; give 1 to 1024", ""),
    ('{"text": "a", "n_predict": "64"}\n', 'must be a whole number from 1 to 1024, not "64"', ""),
    ('{"text": "a", "n_predict": 2.5}\n', "must be a whole number from 1 to 1024, not 2.5", ""),
    # unknown keys
    (
        '{"text": "a", "max_tokens": 5}\n',
        "unknown key 'max_tokens' (did you mean 'n_predict'?)",
        "",
    ),
    ('{"prompt": "a"}\n', "unknown key 'prompt' (did you mean 'text'?)", ""),
    ('{"text": "a", "n_predcit": 5}\n', "unknown key 'n_predcit' (did you mean 'n_predict'?)", ""),
    # chat messages in the wrong shape
    ('{"messages": "hi"}\n', 'messages must be a list of {"role": ..., "content": ...}', ""),
    ('{"messages": ["hi"]}\n', 'messages[0] must be a {"role": ..., "content": ...} object', ""),
    ('{"messages": [{"role": "user"}]}\n', "missing key 'messages[0].content'", ""),
    ('{"messages": [{"role": "bot", "content": "x"}]}\n', "messages[0].role: Input should be", ""),
    (
        '{"messages": [{"role": "user", "content": "x", "rol": 1}]}\n',
        "unknown key 'messages[0].rol'",
        "",
    ),
    ('{"messages": [{"role": "user", "content": ""}]}\n', "messages[0].content", ""),
    ('{"messages": []}\n', "`messages` is empty", ""),
    (
        '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n',
        "end the chat with a `user` message",
        "",
    ),
    (
        '{"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}, '
        '{"role": "user", "content": "c"}]}\n',
        "a `system` message may only come first",
        "",
    ),
    # names
    (
        '{"name": "a", "text": "x"}\n{"name": "a", "text": "y"}\n',
        "line 2: name 'a' is already used on line 1",
        "",
    ),
    ('{"name": "two words", "text": "x"}\n', "name must be 1 to 40 letters", ""),
]


@pytest.mark.parametrize(("text", "message", "also"), BAD)
def test_bad_prompts_files_are_one_paragraph(
    tmp_path: Path, text: str, message: str, also: str
) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(text)
    with pytest.raises(LlamaspecError) as err:
        config.load_prompts(f)
    said = err.value.message
    assert str(f) in said and message in said and also in said, said
    assert "\n" not in said and err.value.details is None


def test_several_bad_lines_are_named_together_up_to_five(tmp_path: Path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(['{"text": "a", "n_predict": 0}'] * 8) + "\n")
    with pytest.raises(LlamaspecError) as err:
        config.load_prompts(f)
    said = err.value.message
    assert "line 5:" in said and "line 6:" not in said and "and 3 more lines" in said


def test_unreadable_prompts_files(tmp_path: Path) -> None:
    with pytest.raises(LlamaspecError, match="does not exist.*docs/examples/prompts.jsonl"):
        config.load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(LlamaspecError, match="is a directory"):
        config.load_prompts(tmp_path)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"text": "caf\xe9"}\n')
    with pytest.raises(LlamaspecError, match="not UTF-8"):
        config.load_prompts(latin)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "line 1, column 1: not JSON"),
        (["--prompt", "short"], "--prompt NAME picks built-in prompts"),
        (["--recipe", "gemma3-270m-ngram", "--server-defaults"], "--server-defaults is for"),
        (["--recipe", "gemma3-270m-ngram", "--spec-busy-max", "2"], "--spec-busy-max is for"),
    ],
)
def test_cli_refuses_bad_prompts_before_looking_for_a_build(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text("not json\n")
    proc = cli("verify", "--prompts", str(f), "--dist", "/nonexistent", *extra, env_cache=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr + proc.stdout


class FakeServer:
    """The few server calls that rendering and the context check make."""

    def __init__(self, template: str, bos: list[int] | None = None) -> None:
        self.template, self.bos, self.posted = template, bos or [], []

    def post(self, path: str, payload: dict) -> dict:
        self.posted.append((path, payload))
        return {"prompt": self.template}

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        ids = [2] if text.startswith("<bos>") else []
        ids += [7] * len(text.removeprefix("<bos>").split())
        return [*(self.bos if add_special else []), *ids]

    def detokenize(self, tokens: list[int]) -> str:
        return "<bos>" if tokens == [2] else "?"


def test_a_chat_is_rendered_by_the_models_template_without_a_second_bos() -> None:
    chat = Prompt("c", "", 8, (("system", "Be brief."), ("user", "Hi")))
    srv = FakeServer("<bos><start_of_turn>user Hi <start_of_turn>model", bos=[2])
    out = render_chat(srv, chat)  # type: ignore[arg-type]
    assert out.text == "<start_of_turn>user Hi <start_of_turn>model"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert srv.posted == [("/apply-template", {"messages": messages})]
    # a model that adds no BOS keeps the template's text as it is
    assert render_chat(FakeServer("<bos>x y"), chat).text == "<bos>x y"  # type: ignore[arg-type]
    plain = Prompt("p", "text", 8)
    assert render_chat(srv, plain) is plain  # type: ignore[arg-type]


def test_prompts_that_do_not_fit_a_slot_are_refused_by_name() -> None:
    long = Prompt("long", " ".join(["w"] * (verify.SLOT_CTX - 10)), 64)
    setup = verify.Setup(Path("m"), Path("m"), (), (Prompt("ok", "a b", 8), long))
    with pytest.raises(LlamaspecError, match="'long' is 4086 tokens and asks for 64 more"):
        verify.prepared(FakeServer(""), setup)  # type: ignore[arg-type]
    fine = verify.Setup(Path("m"), Path("m"), (), (Prompt("c", "", 8, (("user", "Hi"),)),))
    (rendered,) = verify.prepared(FakeServer("<start_of_turn>user Hi"), fine).prompts  # type: ignore[arg-type]
    assert rendered.text == "<start_of_turn>user Hi"
