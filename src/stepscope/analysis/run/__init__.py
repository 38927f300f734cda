"""Analyses of a run record: steady state, sampler signals, MFU."""
