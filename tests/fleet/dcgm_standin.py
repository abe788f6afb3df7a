"""The one stand-in of the fleet tests: an HTTP exporter serving dcgm-exporter's default series names
and labels with synthetic values (there is no GPU here), on a real loopback socket.

Names, types and help follow NVIDIA/dcgm-exporter's `etc/default-counters.csv`; the text follows its
metric template (`internal/pkg/rendermetrics/render_metrics.go`: `gpu`, `UUID`, `pci_bus_id` as
"00000000:BB:DD.F", `device`, `modelName`, then `Hostname`), written by hand because
prometheus_client would rename the counter DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL. `bad=True` adds a GPU
whose series have no `Hostname` (the bad-input case). Must not be used outside tests.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FIELDS = [  # (name, type, help, value per GPU index and scrape count)
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda i, n: 40.0 + 10 * i),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda i, n: 300.0 + i),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda i, n: 70000.0 + i),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
     "Total number of NVLink bandwidth counters for all lanes.", lambda i, n: 1000.0 * n),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
     lambda i, n: 0.5 + 0.1 * i),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus - including both "
     "protocol headers and data payloads - in bytes per second.", lambda i, n: 2e6),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus - including both "
     "protocol headers and data payloads - in bytes per second.", lambda i, n: 3e6),
]


def bus_id(i: int) -> str:
    return f"00000000:{0x18 + i:02X}:00.0"


def render(host: str, gpus: int, bad: bool, n: int) -> str:
    out = []
    for name, kind, doc, fn in FIELDS:
        out += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
        for i in list(range(gpus)) + ([9] if bad else []):
            labels = (f'gpu="{i}",UUID="GPU-standin-{i}",pci_bus_id="{bus_id(i)}",device="nvidia{i}",'
                      f'modelName="NVIDIA H200"')
            if not (bad and i == 9):
                labels += f',Hostname="{host}"'
            out.append(f"{name}{{{labels}}} {fn(i, n):g}")
    return "\n".join(out) + "\n"


def start(host: str, gpus: int = 2, bad: bool = False) -> tuple[int, ThreadingHTTPServer]:
    """(port, server) of a running exporter on 127.0.0.1; stop it with server.shutdown()."""
    scrapes = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path != "/metrics":
                self.send_error(404)
                return
            scrapes[0] += 1
            body = render(host, gpus, bad, scrapes[0]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="dcgm-standin", daemon=True).start()
    return server.server_address[1], server
