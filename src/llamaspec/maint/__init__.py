"""Maintainers' tasks: pin bumps, the patch catalog, the build benchmarks, GPU acceptance,
the health matrix across upstream pins.

bump (what a candidate pin changes), bump_run (the `bump` command: judge, prove, edit),
bump_report and pin_edit (its report and the edit of engines.yaml and the lock), patches
(`patches status` and `lock`), build_bench and repro_bench (build-time and reproducibility
benchmarks), gpu_acceptance (every GPU promise, each step a `llamaspec` child process), health and
health_report (`maint health`: build, strict tier, bench and sweep per pin; the matrix and
its regression rule).

May import: the base modules and every stage below it: llamaspec.engine, llamaspec.models,
llamaspec.runtime, llamaspec.proof, llamaspec.perf and llamaspec.images.
"""
