#!/usr/bin/env python3
"""An OTLP/HTTP metrics receiver for the push-target tests, decoding with the official
`opentelemetry-proto` package (not the project's code): a request the schema does not accept is
answered 400 with the parser's reason, as a collector would.

  python3 otlp_receiver.py PORT

POST /v1/metrics  application/json (protobuf JSON mapping) or application/x-protobuf
GET  /points      every data point received, as JSON lines:
                  {"metric", "namespace", "device", "value", "time_unix_nano"}
Prints "ready" once it listens.
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

POINTS = []
LOCK = threading.Lock()


def attributes(point):
    return {a.key: a.value.string_value for a in point.attributes}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, code, body, kind="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        if self.path != "/v1/metrics":
            return self.reply(404, "{}")
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        request = ExportMetricsServiceRequest()
        try:
            if "json" in self.headers.get("content-type", ""):
                json_format.Parse(body, request)
            else:
                request.ParseFromString(body)
        except Exception as e:  # the parser's reason goes back to the sender
            return self.reply(400, json.dumps({"error": str(e)}))
        found = []
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if not m.HasField("gauge"):
                        return self.reply(400, json.dumps({"error": f"{m.name} is not a gauge"}))
                    for p in m.gauge.data_points:
                        a = attributes(p)
                        which = p.WhichOneof("value")
                        value = p.as_int if which == "as_int" else p.as_double
                        found.append({
                            "metric": m.name,
                            "namespace": a.get("device.namespace"),
                            "device": a.get("device.name"),
                            "value": value,
                            "time_unix_nano": p.time_unix_nano,
                        })
        with LOCK:
            POINTS.extend(found)
        self.reply(200, "{}")

    def do_GET(self):
        if self.path != "/points":
            return self.reply(404, "{}")
        with LOCK:
            text = "".join(json.dumps(p) + "\n" for p in POINTS)
        self.reply(200, text, "application/x-ndjson")


def main():
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
