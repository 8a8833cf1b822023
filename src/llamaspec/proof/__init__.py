"""Proof stage: speculation changes nothing but speed.

reference (the embedded model's F32 copy), hybrid and hybrid_gguf (the random hybrid
reference model), oracle (the per-token check), defects (known defects), verify (strict and
oracle tiers), suite (the verify runs of a build), smoke (the smoke test of an artifact).

May import: the base modules, llamaspec.engine, llamaspec.models and llamaspec.runtime.
"""
