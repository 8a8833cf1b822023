"""One or two examples at the end of every command's help (checked by a unit test to parse)."""

from __future__ import annotations

import argparse

EXAMPLES: dict[str, tuple[str, ...]] = {
    "build": (
        "llamaspec build --backend cpu --source pypi",
        "llamaspec build --backend cuda --cuda-arch 90 --cuda-toolkit pypi",
    ),
    "smoke": ("llamaspec smoke --artifact llamacpp-cpu",),
    "engines": ("llamaspec engines",),
    "verify": (
        "llamaspec verify --tier strict --artifact llamacpp-cpu",
        "llamaspec verify --recipe gemma3-270m-ngram-tuned --prompts docs/examples/prompts.jsonl",
    ),
    "bench": (
        "llamaspec bench gemma3-270m-ngram-tuned --workload copy --concurrency 1",
        "llamaspec bench --target my.gguf --draft my-draft.gguf --spec draft --n-max 8",
    ),
    "tune": ("llamaspec tune gemma3-270m-ngram --budget 10",),
    "limit": (
        "llamaspec limit --artifact llamacpp-cpu --lengths 2,4 --alphas 0,0.5,0.9",
        "llamaspec limit --bench reports/bench-gemma3-270m-ngram-llamacpp-cpu.json",
    ),
    "load": (
        "llamaspec load gemma3-270m-q4-draft --artifact llamacpp-cpu --clients 1,8 --duration 120",
        "llamaspec load gemma3-270m-q4-draft --clients 8 --fault kill@30 --fault stall",
        "llamaspec load gemma3-270m-ngram --clients 4 --duration 1800 --requests 9999 "
        "--speculative-only",
    ),
    "bench-build": ("llamaspec bench-build --artifact llamacpp-cpu",),
    "bench-reproducible": ("llamaspec bench-reproducible --artifact llamacpp-cpu",),
    "bench-portable": (
        "llamaspec bench-portable --artifact llamacpp-cpu-f72fad040485 "
        "--native llamacpp-cpu-9036434bcbf5",
    ),
    "patches": ("llamaspec patches status --engine ik_llama.cpp",),
    "oracle-power": (
        "llamaspec oracle-power --artifact llamacpp-cpu-fcbde389e65a",
        "llamaspec oracle-power --short --reports power-reports",
    ),
    "patches status": ("llamaspec patches status --engine ik_llama.cpp --source pypi",),
    "patches export": ("llamaspec patches export exported-patches",),
    "patches import": ("llamaspec patches import exported-patches",),
    "patches ab": (
        "llamaspec patches ab --artifact llamacpp-cpu-7d64 --stock llamacpp-cpu-9036",
        "llamaspec patches ab --stock llamacpp-cpu-9036434bcbf5 --scenario request-control-mixed "
        "--repetitions 2",
    ),
    "lock": ("llamaspec lock",),
    "bump": (
        "llamaspec bump --engine ik_llama.cpp --source-dir ik_llama.cpp.git --to latest --dry-run",
    ),
    "health": (
        "llamaspec health --engine llama.cpp",
        "llamaspec health --mirror ik_llama.cpp=ik_llama.cpp.git --resume",
    ),
    "models": ("llamaspec models list", "llamaspec models pull gemma3-270m-ngram"),
    "models list": ("llamaspec models list",),
    "models check": (
        "llamaspec models check qwen2.5-coder-7b",
        "llamaspec models check --target-file target.gguf --draft-file draft.gguf",
    ),
    "models pull": (
        "llamaspec models pull qwen2.5-coder-7b",
        "llamaspec models pull gemma3-270m-ngram --local-dir ./models",
    ),
    "draft": (
        "llamaspec draft find ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF",
        "llamaspec draft find gemma3-270m-q4_k_m --measure --memory 4",
    ),
    "draft find": (
        "llamaspec draft find unsloth/Qwen3-32B-GGUF:Qwen3-32B-Q4_K_M.gguf",
        "llamaspec draft find ./my-model.gguf --search DRAFT --limit 40",
    ),
    "recipe": ("llamaspec recipe list", "llamaspec recipe show gemma3-270m-ngram-tuned"),
    "recipe list": ("llamaspec recipe list",),
    "recipe show": (
        "llamaspec recipe show deepseek-r1 --engine ik_llama.cpp --backend cpu",
        "llamaspec recipe show gemma3-270m-ngram --format docker --models-dir ./models",
        "llamaspec recipe show gemma3-270m-ngram --format compose --with-prometheus ./monitoring",
    ),
    "recipe monitor": (
        "llamaspec recipe monitor gemma3-270m-q4-draft --out ./monitoring",
        "llamaspec recipe monitor qwen2.5-coder-7b --out ./monitoring --baseline-acceptance 0.7",
    ),
    "serve": (
        "llamaspec serve gemma3-270m-ngram-tuned --port 8080",
        "llamaspec serve gemma3-270m-ngram-tuned --restart --max-restarts 10",
    ),
    "docker": ("llamaspec docker pull --backend cuda", "llamaspec docker build --backend cpu"),
    "docker build": (
        "llamaspec docker build --backend cpu --tool buildah",
        "llamaspec docker build --tool buildah --from-artifact llamacpp-cuda-cf8100201483",
    ),
    "docker pull": ("llamaspec docker pull --backend cuda --recipe gemma3-270m-ngram-tuned",),
    "docker smoke": ("llamaspec docker smoke localhost/llamaspec:llama.cpp-cpu",),
    "docker push": ("llamaspec docker push --record image-record.json",),
    "docker build-stage": ("llamaspec docker build-stage --backend cpu --out /out",),
    "docker matrix": ("llamaspec docker matrix",),
    "docker bake": ("llamaspec docker bake",),
    "docker base": ("llamaspec docker base",),
    "docker size": ("llamaspec docker size localhost/llamaspec:llama.cpp-cpu",),
    "rpc": ("llamaspec rpc serve --host 10.0.0.2", "llamaspec rpc check 10.0.0.2:50052"),
    "rpc serve": (
        "llamaspec rpc serve --host 10.0.0.2 --port 50052 --device CPU",
        "llamaspec rpc serve --host 0.0.0.0 --allow-all-interfaces",
    ),
    "rpc study": ("llamaspec rpc study --artifact llamacpp-vulkan --rtt 0 --rtt 1 --rtt 5",),
    "rpc check": ("llamaspec rpc check 10.0.0.2:50052 --artifact llamacpp-vulkan",),
    "doctor": ("llamaspec doctor", "llamaspec doctor --backend vulkan --fix-vulkan-headers"),
    "cuda-compile-check": ("llamaspec cuda-compile-check --engine ik_llama.cpp --source pypi",),
    "gpu-acceptance": (
        "llamaspec gpu-acceptance",
        "llamaspec gpu-acceptance --source pypi --engine llama.cpp --tune-budget 2",
    ),
}


def parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every (command path, parser) below `parser`, groups included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from parsers(sub, (*path, name))


def attach(parser: argparse.ArgumentParser) -> None:
    """End each command's help with its examples."""
    for path, sub in parsers(parser):
        lines = EXAMPLES.get(" ".join(path), ())
        if lines:
            sub.formatter_class = argparse.RawDescriptionHelpFormatter
            sub.epilog = "examples:\n" + "\n".join(f"  {line}" for line in lines)
