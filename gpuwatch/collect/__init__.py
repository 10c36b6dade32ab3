"""Collectors: one module a source; each returns batches of samples and never reads what it wrote.

GPU: `nvml.GpuCollector` over `pynvml` (`nvml.load_nvml()`) or `fakenvml.FakeNvml` (the demo);
metric table in `gpu_metrics`; plain data in `gpu_status`.
"""
