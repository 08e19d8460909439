"""Engine adapters; each imports its engine lazily."""
