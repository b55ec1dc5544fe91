"""The rank scheduler every built-in engine runs (aggregated and P/D, every backend)."""
