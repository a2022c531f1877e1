"""watchd: keeps GPU clusters healthy.

Public API: the event model (:mod:`watchd.model.events`), the Xid decoder (:mod:`watchd.xid`) and the
command line (:mod:`watchd.cli`). Everything else is internal and may change between releases.
"""

__version__ = "0.1.0"
