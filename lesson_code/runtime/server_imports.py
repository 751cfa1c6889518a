"""Imported by the fork server only, before it forks a rank: the caller's path and modules.

`fork_server.handover` hands over, in two environment variables read and removed here
(no rank inherits them), the caller's sys.path and the modules each rank would otherwise import
for itself (`processes.start_context` says which). A module that fails to import is skipped:
multiprocessing would stop the server at any error but ImportError, and every later run with it;
skipped, the error comes from the rank that imports the module, which reports it with its
traceback. Standard library only.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

from lesson_code.runtime.fork_server import MODULES_VARIABLE, PATH_VARIABLE


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
