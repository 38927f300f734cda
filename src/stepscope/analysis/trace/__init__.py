"""Analyses of torch.profiler (Kineto) traces: the TensorBoard plugin's and HTA's views."""
