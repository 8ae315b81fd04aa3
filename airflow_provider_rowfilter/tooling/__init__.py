"""Tooling for the demo and the tests: a throwaway local PostgreSQL, the native-subscription referee, the demo.

The runtime (jobs, operators, the CLI) never imports it.
"""
