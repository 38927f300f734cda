"""Pure functions from records, samples and traces to typed results (no rendering, no torch)."""
