"""gpuwatch's runner for Prometheus's PromQL test files: reader (the DSL), stores, compare, runner, report.

The command line is `python -m tests.promql_harness`.
"""
