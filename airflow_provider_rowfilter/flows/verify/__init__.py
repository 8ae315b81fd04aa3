"""Verify and reconcile: a subscription's tables compared with the publisher's rows, and repaired in place."""
