"""Proof stage: speculation changes nothing but speed.

reference (the embedded model's F32 copy), hybrid and hybrid_gguf (the random hybrid
reference model), oracle (the per-token check), defects (known defects), prompts (the
built-in prompts), verify (the strict and oracle tiers, run from a VerifyPlan),
verify_report (what they found: the report and its JSON, Markdown and console table),
suite (the verify runs of a build), smoke (the smoke test of an artifact).

May import: the base modules, llamaspec.engine, llamaspec.models and llamaspec.runtime.
"""
