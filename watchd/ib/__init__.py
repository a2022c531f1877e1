"""InfiniBand/RoCE ports from sysfs: parse (sysfs.py), judge (judge.py), read (reader.py), the agent's
collector (collector.py), its metrics and its config section."""
