"""Models of the runs, index and streams cells, one module per cell kind."""
from .index import *  # noqa: F401,F403
from .runs import *  # noqa: F401,F403
from .streams import *  # noqa: F401,F403
from .tombstone import *  # noqa: F401,F403
from .lineage import *  # noqa: F401,F403
