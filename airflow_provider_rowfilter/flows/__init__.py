"""The use cases, each run in process: apply, table sync, refresh, verify and reconcile, drop, sequences, slot guard."""
