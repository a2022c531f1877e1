"""The node agent: watches sources, turns what it sees into events and ships them to the engine."""
