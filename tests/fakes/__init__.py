"""Test doubles for things this machine does not have (NVML and GPUs)."""
