"""A MongoDB simulator speaking the real wire protocol, for tests (not shipped in the wheel).

``from devtools.mongosim import MongoSim`` starts one as a child process; ``python -m
devtools.mongosim`` runs one in the foreground. See README.md.
"""

from devtools.mongosim.launcher import MongoSim, MongoSimError

__all__ = ["MongoSim", "MongoSimError"]
