"""The simulation behind `--demo` and the tests: simulated NVML, GPU workloads, vLLM/SGLang servers, a training run."""
