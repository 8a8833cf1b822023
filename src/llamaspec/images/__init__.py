"""Images stage: Docker images of an artifact: specs, labels, the in-image build stage, and
container tools (docker buildx, buildah) behind one interface.

May import: the base modules, llamaspec.engine, llamaspec.models and llamaspec.proof.
"""
