"""The apply worker's run as micro-batches: drain loop, capture ahead, batch plan, reducers, batch transaction."""
