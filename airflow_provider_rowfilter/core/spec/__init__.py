"""The subscription spec: the YAML file, the versioned JSON document, and what each of its keys may hold."""
