"""What every engine composes: group commit, the in-memory index, the data
directory and its lock, and the memory engine (the baseline and the test fake)."""
