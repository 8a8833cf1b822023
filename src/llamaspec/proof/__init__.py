"""Proof stage: run llama-server and prove speculation changes nothing but speed.

Owns the one server client (start, /health, /completion, chat, tokenize, metrics), the
reference models (embedded F32 copy, random hybrid), smoke, verify (strict and oracle
tiers) and the benchmarks.

May import: the base modules, llamaspec.engine and llamaspec.models.
"""
