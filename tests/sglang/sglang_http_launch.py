"""SGLang 0.5.23's own `launch_server` (entrypoints/http_server.py), for the plugin's launch hook.

The function is compiled from the wheel (sglang_wheel_code.load_definitions) and registered as
`sglang.srt.entrypoints.http_server`, so SGLang's HookRegistry patches it as it would the real
module. The rest of http_server.py needs SGLang's GPU runtime, so what launch_server calls is
supplied by the caller and named here:
- `app`: a Starlette app (SGLang's is a FastAPI app, a Starlette subclass; the plugin touches only
  `app.router.routes`);
- `Engine._launch_subprocesses`: the caller's `start_schedulers()`, where SGLang starts its
  scheduler processes;
- `_setup_and_run_http_server`: the caller's `serve(app)`, where SGLang serves `app`;
- node rank 0 and no Rust server: the default HTTP mode.
Must not stand in for anything the plugin itself does.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Callable

from sglang_wheel_code import load_definitions

HTTP = "sglang.srt.entrypoints.http_server"


def build(src: Path, start_schedulers: Callable[[], None],
          serve: Callable[[Any], None]) -> ModuleType:
    from starlette.applications import Starlette

    app = Starlette()

    def not_in_http_mode(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("launch_server took a path the default HTTP mode does not")

    class Engine:
        @staticmethod
        def _launch_subprocesses(server_args: Any, **kwargs: Any) -> tuple:
            start_schedulers()
            return None, None, None, SimpleNamespace(scheduler_infos=[{}]), None, None

    def setup_and_run_http_server(server_args: Any, tokenizer_manager: Any, template_manager: Any,
                                  port_args: Any, scheduler_infos: Any, watchdog: Any,
                                  **kwargs: Any) -> None:
        serve(app)

    provided = {
        "app": app, "Engine": Engine, "ServerArgs": object,
        "init_tokenizer_manager": not_in_http_mode, "run_scheduler_process": not_in_http_mode,
        "run_detokenizer_process": not_in_http_mode, "_execute_server_warmup": not_in_http_mode,
        "get_parallel": lambda: SimpleNamespace(node_rank=0),
        "envs": SimpleNamespace(SGLANG_RUST_SERVER=SimpleNamespace(get=lambda: False)),
        "rust_server_sidecar": not_in_http_mode, "node_hosts_rust_server": not_in_http_mode,
        "_setup_and_run_http_server": setup_and_run_http_server,
    }
    return load_definitions(src, HTTP, ["launch_server"], provided, register_as=HTTP)
