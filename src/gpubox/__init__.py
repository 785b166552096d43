"""Layer 1, leaves: gpubox, converge and verify an NVIDIA GPU inference box."""

__version__ = "0.1.0"
