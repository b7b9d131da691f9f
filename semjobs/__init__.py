"""semjobs: bulk chain-of-thought generation with SemanticSpec decoding.

The service's parts keep their top-level folders (``cli/``, ``db/``, ``jobs/``, ``worker/``,
``migrations/``) and install as ``semjobs.<folder>`` (setup.py). In a source tree this folder
holds only the package's own modules, so where it comes first on ``sys.path`` (Python started
in the repository, an installed copy beside it) the installed ``semjobs`` directories join its
path and ``semjobs.worker`` is still found.
"""

import pkgutil

__path__ = pkgutil.extend_path(__path__, __name__)
__version__ = "0.1.0"
