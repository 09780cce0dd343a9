"""admission layer."""
