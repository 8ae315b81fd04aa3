"""The apply's rules: what a batch evaluates per table, the UPDATE decision, the fold of a key's changes."""
