"""Images stage: Docker images of an artifact.

specs (what an image is made of, its labels and tags: pure), tools (the container-tool
interface: docker buildx and buildah), build (the two-phase image build, the bake file),
stage (inside the image's build stage), smoke (the smoke test and HEALTHCHECK of an image),
registry (host backend, pull, push, how to run, whose signature), remote (registry
addresses, what a registry's refusal means, the metadata calls under a short deadline),
run_line (a recipe's `docker run` line with its models mounted), base (a Debian base image
with debootstrap), size (the size report).

May import: the base modules, llamaspec.engine, llamaspec.models, llamaspec.runtime,
llamaspec.proof and llamaspec.perf.
"""
