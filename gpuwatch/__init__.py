"""gpuwatch: GPU, training and inference monitoring in one process."""

__version__ = "0.1.0"
