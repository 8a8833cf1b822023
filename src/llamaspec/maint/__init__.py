"""Maintainers' tasks: pin bumps and the build benchmarks.

bump (what a candidate pin changes), bump_report and pin_edit (its report and the edit of
engines.yaml and the lock), build_bench and repro_bench (build-time and reproducibility
benchmarks).

May import: the base modules and every stage below it: llamaspec.engine, llamaspec.models,
llamaspec.runtime, llamaspec.proof, llamaspec.perf and llamaspec.images.
"""
