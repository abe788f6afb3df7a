"""SGLang's FastAPI app with the plugin's routes, for SGLang's extra HTTP worker processes.

With `--tokenizer-worker-num N` (N > 1) SGLang serves HTTP from N fresh worker processes that
import the app named by SGLANG_HTTP_SERVER_APP_PATH (default
`sglang.srt.entrypoints.http_server:app`) and never call `load_plugins()`. The plugin's launch
hook points that variable here (when the user has not set it): importing this module imports
SGLang's module, which builds its app exactly as before, and adds GET /specdecode/phases and
/specdecode/streams to it. The workers inherit SPECDECODE_STREAM_DIR from the launching process,
so they read the same stream files as the schedulers write.

Must not change anything else of SGLang's app, and must never keep a worker from starting: a
failure to add the routes is logged and the app is served without them.
"""

from __future__ import annotations

import logging

from sglang.srt.entrypoints.http_server import app  # noqa: F401  (what the workers serve)

from probes.inserver.sglang_plugin import install_routes

try:
    install_routes(app)
except Exception as e:                   # the routes are optional; SGLang's app is not
    logging.getLogger("specdecode.sglang_plugin").warning(
        "specdecode plugin: no /specdecode routes in this HTTP worker (%s)", e)
