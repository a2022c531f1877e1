"""The engine: ingest, rules, action executor, adapters, metrics."""
