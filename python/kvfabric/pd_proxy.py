# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""A small P/D proxy for vLLM with KVFabricConnector (standard library only).

The two-step flow of vLLM's own disaggregated-prefill examples: each
``/v1/completions`` or ``/v1/chat/completions`` request goes first to a
prefill instance with ``max_tokens: 1`` and ``kv_transfer_params:
{"do_remote_decode": true}`` (P pushes the prompt's KV to the decoder's
agent as it computes it), then to a decode instance with the
``kv_transfer_params`` P's response carried (D waits for the push, loads
it, computes the last prompt token and decodes). Prefill and decode
instances are picked round-robin. The decode instance's answer, streamed or
not, is relayed unchanged.

    python3 -m kvfabric.pd_proxy --port 8000 \\
        --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200

``--decoder-node NAME`` (once per decode instance, same order as
``--decode``) names the decode instance's kvf-agent, sent to P as
``kvf_decoder`` so each request is pushed to the decoder that will serve it;
without it P's ``decoder`` setting applies.
"""
import argparse
import itertools
import json
import logging
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List, Optional

log = logging.getLogger("kvfabric.pd_proxy")

ROUTES = ("/v1/completions", "/v1/chat/completions")


class PDProxy:
    """Round-robin over prefill and decode instances; thread-safe."""

    def __init__(self, prefill: List[str], decode: List[str],
                 decoder_nodes: Optional[List[str]] = None,
                 timeout: float = 600.0):
        if not prefill or not decode:
            raise ValueError("pd_proxy: needs a prefill and a decode URL")
        if decoder_nodes and len(decoder_nodes) != len(decode):
            raise ValueError("pd_proxy: one --decoder-node per --decode")
        self.prefill = [u.rstrip("/") for u in prefill]
        self.decode = [u.rstrip("/") for u in decode]
        self.decoder_nodes = list(decoder_nodes or [])
        self.timeout = timeout
        self._lock = threading.Lock()
        self._p = itertools.cycle(range(len(self.prefill)))
        self._d = itertools.cycle(range(len(self.decode)))
        self.requests = 0

    def pick(self):
        with self._lock:
            self.requests += 1
            return next(self._p), next(self._d)

    def _post(self, url: str, body: dict):
        req = urllib.request.Request(
            url, data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        return urllib.request.urlopen(req, timeout=self.timeout)

    def prefill_step(self, route: str, body: dict, p: int, d: int) -> dict:
        """Sends @p body to prefill instance @p p with max_tokens 1; returns
        the kv_transfer_params for the decode step ({} when P gave none:
        D then computes the whole prompt)."""
        pb = dict(body)
        pb["max_tokens"] = 1
        pb.pop("max_completion_tokens", None)
        pb["stream"] = False
        pb.pop("stream_options", None)
        params = {"do_remote_decode": True}
        if self.decoder_nodes:
            params["kvf_decoder"] = self.decoder_nodes[d]
        pb["kv_transfer_params"] = params
        with self._post(self.prefill[p] + route, pb) as r:
            answer = json.loads(r.read())
        return answer.get("kv_transfer_params") or {}

    def decode_request(self, route: str, body: dict, kv_params: dict,
                       d: int):
        """The decode step's request (an open HTTP response)."""
        db = dict(body)
        if kv_params:
            db["kv_transfer_params"] = kv_params
        return self._post(self.decode[d] + route, db)


def _handler(proxy: PDProxy):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            log.debug(fmt, *args)

        def _reply(self, code: int, body: bytes, ctype="application/json"):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._reply(200, b"{}")
            elif self.path == "/v1/models":
                try:
                    with urllib.request.urlopen(
                            proxy.decode[0] + "/v1/models",
                            timeout=proxy.timeout) as r:
                        self._reply(r.status, r.read())
                except (urllib.error.URLError, OSError) as e:
                    self._reply(502, json.dumps({"error": str(e)}).encode())
            else:
                self._reply(404, b'{"error": "not found"}')

        def do_POST(self):
            if self.path not in ROUTES:
                self._reply(404, b'{"error": "not found"}')
                return
            n = int(self.headers.get("Content-Length", "0"))
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
            except ValueError:
                self._reply(400, b'{"error": "body is not JSON"}')
                return
            p, d = proxy.pick()
            try:
                kv = proxy.prefill_step(self.path, body, p, d)
            except urllib.error.HTTPError as e:
                self._reply(e.code, e.read())
                return
            except (urllib.error.URLError, OSError) as e:
                # prefill instance down: D computes the whole prompt
                log.warning("pd_proxy: prefill %s failed (%s): decode "
                            "computes the prompt", proxy.prefill[p], e)
                kv = {}
            try:
                r = proxy.decode_request(self.path, body, kv, d)
            except urllib.error.HTTPError as e:
                self._reply(e.code, e.read())
                return
            except (urllib.error.URLError, OSError) as e:
                self._reply(502, json.dumps({"error": str(e)}).encode())
                return
            with r:
                ctype = r.headers.get("Content-Type", "application/json")
                if not body.get("stream"):
                    self._reply(r.status, r.read(), ctype)
                    return
                self.send_response(r.status)
                self.send_header("Content-Type", ctype)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while True:
                    piece = r.read1(65536) if hasattr(r, "read1") else \
                        r.read(65536)
                    if not piece:
                        break
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

    return Handler


def serve(proxy: PDProxy, host: str, port: int) -> ThreadingHTTPServer:
    """A started server (serve_forever is the caller's)."""
    srv = ThreadingHTTPServer((host, port), _handler(proxy))
    srv.daemon_threads = True
    return srv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--prefill", action="append", required=True,
                    help="URL of a prefill (kv_producer) instance")
    ap.add_argument("--decode", action="append", required=True,
                    help="URL of a decode (kv_consumer) instance")
    ap.add_argument("--decoder-node", action="append", default=[],
                    help="kvf-agent node name of each decode instance")
    ap.add_argument("--timeout", type=float, default=600.0)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    proxy = PDProxy(a.prefill, a.decode, a.decoder_node, a.timeout)
    srv = serve(proxy, a.host, a.port)
    print(f"kvfabric pd_proxy on http://{a.host}:{srv.server_port}",
          flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
