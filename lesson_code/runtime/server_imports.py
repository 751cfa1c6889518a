"""Imported by the fork server only, as it starts: the caller's path and modules.

Multiprocessing imports the server's preloaded modules by name, so this step of the server's
life (`lesson_code.runtime.fork_server`, which says it all) is a module of its own: the caller's
sys.path and the modules each rank would otherwise import for itself come in two environment
variables (`fork_server.handover`), read and removed here, so that no rank inherits them. A
module that fails to import is skipped: multiprocessing would stop the server at any error but
ImportError, and every later run with it; skipped, the error comes from the rank that imports
the module, which reports it with its traceback. The server's cleanup after a caller killed
before it is registered here too. Standard library only.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import sys

from lesson_code.runtime.fork_server import (MODULES_VARIABLE, PATH_VARIABLE,
                                             remove_socket_when_orphaned)


def import_handed_over() -> None:
    """Take the caller's sys.path and import its modules, each failure skipped."""
    path = os.environ.pop(PATH_VARIABLE, None)
    if path is not None:
        sys.path[:] = json.loads(path)
    for name in json.loads(os.environ.pop(MODULES_VARIABLE, "[]")):
        try:
            importlib.import_module(name)
        except (Exception, SystemExit):  # noqa: BLE001 - the rank that needs it reports it
            pass


import_handed_over()
atexit.register(remove_socket_when_orphaned, os.getppid())
