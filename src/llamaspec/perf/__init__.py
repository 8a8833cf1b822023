"""Perf stage: how much faster speculation is, measured, predicted and tuned.

workloads (the fixed benchmark workloads), bench (plain vs speculative runs → reports),
bench_plans (which plan a `bench` run asks for: a recipe's or an ad-hoc one),
costmodel (predicted speedup from measured costs), tune (sweeps → a tuned recipe), portable
(portable vs native builds), draft_measure (`draft find --measure`), netlab and rpcstudy
(the RPC latency study across network namespaces).

May import: the base modules, llamaspec.engine, llamaspec.models, llamaspec.runtime and
llamaspec.proof.
"""
