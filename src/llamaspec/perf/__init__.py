"""Perf stage: how much faster speculation is, measured, predicted and tuned.

workloads (the fixed benchmark workloads), bench (plain vs speculative runs), bench_report
(the frozen bench report and its JSON, Markdown and PNG), reliability (whether a run can
be trusted: the verdict a bench or tune report prints instead of a headline), bench_plans
(a recipe rendered for a build and split into plain and speculative arguments: a catalog
recipe's or an ad-hoc one; bench, tune and draft measure start from one), costmodel
(predicted speedup from measured costs), limit, ceiling and limit_report (the engine's
speculation ceiling: synthetic acceptance swept against a perfect engine of the verification
costs measured on their own, its arithmetic, and its report), tune (the sweep →
a tuned recipe), tune_report (its frozen results, state file, ranking and report),
portable (portable vs native builds), draft_measure (`draft find --measure`), netlab and
rpcstudy (the RPC latency study across network namespaces), monitoring (a recipe's
Prometheus alert rules, their promtool tests, scrape configs and Grafana dashboard, from the
templates in monitoring_templates/) and monitoring_baseline (the acceptance they compare
with, from the recipe's newest bench report).

May import: the base modules, llamaspec.engine, llamaspec.models, llamaspec.runtime and
llamaspec.proof.
"""
