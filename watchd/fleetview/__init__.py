"""The whole fleet's availability: every node out of service and who took it out
(:mod:`~watchd.fleetview.drains`), and the hot spares kept idle per partition
(:mod:`~watchd.fleetview.spares`). Pure code over what the schedulers list; times are passed in."""
