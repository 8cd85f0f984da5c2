"""pytest plugin for running the Python SDK's own integration tests against Rebound.

SDK bug (openjobspec 0.4.0, ``ojs/transport/http.py``): a successful response body is parsed
only when its Content-Type contains ``application/json``. OJS servers answer
``application/openjobspec+json`` (the spec requires it), so without help every call that reads
a body fails with a KeyError. Rebound answers the ``application/json`` alias to clients that
accept only that; this plugin makes the SDK's clients and workers say so, through the SDK's
public ``headers`` argument. The SDK's code is not changed.
"""

import ojs

ACCEPT_JSON = {"Accept": "application/json"}


def _with_accept_json(cls):
    original = cls.__init__

    def __init__(self, *args, headers=None, **kwargs):
        original(self, *args, headers={**ACCEPT_JSON, **(headers or {})}, **kwargs)

    cls.__init__ = __init__


_with_accept_json(ojs.Client)
_with_accept_json(ojs.Worker)
