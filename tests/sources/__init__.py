"""The input readers: local and remote sources, unit planning, read-ahead, bad and fuzzed input."""
