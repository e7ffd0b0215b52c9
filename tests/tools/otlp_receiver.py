"""An OTLP/HTTP profiles receiver for pyebpf's tests, and a decoder of OTLP files.

It decodes with the upstream Python classes of the OpenTelemetry protocol (PyPI
`opentelemetry-proto`, pinned in tests/requirements.txt), not with pyebpf's own generated code,
and resolves every sample through the request's dictionary: stack -> locations -> lines ->
functions -> strings, attributes -> keys and values, mappings -> file and build id. It checks
what the protocol requires of a dictionary (a zero value first in every table) and reports
anything wrong in "problems".

    python otlp_receiver.py serve OUT.jsonl [STATUS,...]
        Listens on 127.0.0.1 (a free port, printed as "listening PORT") for
        POST /v1development/profiles and answers like an OpenTelemetry Collector: each scripted
        status in turn (503 with Retry-After: 1, 400 with a google.rpc.Status body, or
        "partial": a 200 whose ExportProfilesServiceResponse carries a partial_success), then
        200 with an empty ExportProfilesServiceResponse. Each request, decoded, is one JSON
        line of OUT.jsonl, with the status it was answered with.
    python otlp_receiver.py decode FILE
        Prints one binary ExportProfilesServiceRequest (`pyebpf record -f otlp`) as JSON.
"""
import gzip
import http.server
import json
import sys
import threading

from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2 as service
from opentelemetry.proto.profiles.v1development import profiles_pb2 as profiles

PATH = "/v1development/profiles"


def any_value(v):
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def decode(body):
    request = service.ExportProfilesServiceRequest()
    request.ParseFromString(body)
    d = request.dictionary
    problems = []
    for name, table, zero in [
        ("mapping_table", d.mapping_table, profiles.Mapping()),
        ("location_table", d.location_table, profiles.Location()),
        ("function_table", d.function_table, profiles.Function()),
        ("link_table", d.link_table, profiles.Link()),
        ("attribute_table", d.attribute_table, profiles.KeyValueAndUnit()),
        ("stack_table", d.stack_table, profiles.Stack()),
    ]:
        if len(table) == 0 or table[0] != zero:
            problems.append(f"{name}[0] is not the zero value")
        seen = set(x.SerializeToString(deterministic=True) for x in table)
        if len(seen) != len(table):
            problems.append(f"{name} has duplicates")
    if len(d.string_table) == 0 or d.string_table[0] != "":
        problems.append('string_table[0] is not ""')
    if len(set(d.string_table)) != len(d.string_table):
        problems.append("string_table has duplicates")
    s = d.string_table

    def attribute(i):
        kv = d.attribute_table[i]
        return s[kv.key_strindex], any_value(kv.value)

    def location(i):
        loc = d.location_table[i]
        if len(loc.lines) != 1:
            problems.append(f"location {i} has {len(loc.lines)} lines")
        line = loc.lines[0]
        f = d.function_table[line.function_index]
        frame = {
            "function": s[f.name_strindex],
            "file": s[f.filename_strindex],
            "start_line": f.start_line,
            "line": line.line,
            "attributes": dict(attribute(a) for a in loc.attribute_indices),
        }
        if loc.mapping_index:
            m = d.mapping_table[loc.mapping_index]
            frame["mapping"] = s[m.filename_strindex]
            frame["mapping_attributes"] = dict(attribute(a) for a in m.attribute_indices)
        return frame

    resources = []
    for rp in request.resource_profiles:
        scopes = []
        for sp in rp.scope_profiles:
            out = []
            for p in sp.profiles:
                samples = []
                for sample in p.samples:
                    stack = d.stack_table[sample.stack_index]
                    samples.append(
                        {
                            "frames": [location(i) for i in stack.location_indices],
                            "attributes": dict(attribute(a) for a in sample.attribute_indices),
                            "values": list(sample.values),
                        }
                    )
                out.append(
                    {
                        "sample_type": [s[p.sample_type.type_strindex], s[p.sample_type.unit_strindex]],
                        "period_type": [s[p.period_type.type_strindex], s[p.period_type.unit_strindex]],
                        "period": p.period,
                        "time_unix_nano": p.time_unix_nano,
                        "duration_nano": p.duration_nano,
                        "samples": samples,
                    }
                )
            scopes.append({"name": sp.scope.name, "version": sp.scope.version, "profiles": out})
        resources.append(
            {
                "attributes": {kv.key: any_value(kv.value) for kv in rp.resource.attributes},
                "scopes": scopes,
            }
        )
    tables = {
        "strings": len(d.string_table),
        "functions": len(d.function_table),
        "locations": len(d.location_table),
        "mappings": len(d.mapping_table),
        "stacks": len(d.stack_table),
        "attributes": len(d.attribute_table),
    }
    return {"resources": resources, "dictionary": tables, "problems": problems}


def rpc_status(code, message):
    """google.rpc.Status{code, message}, encoded by hand (its classes are not a dependency)."""
    text = message.encode()
    return bytes([0x08, code, 0x12, len(text)]) + text


def serve(out_path, script):
    lock = threading.Lock()
    out = open(out_path, "a", buffering=1)

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            with lock:
                step = script.pop(0) if script else "200"
            record = {
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "bytes": len(body),
            }
            try:
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                record.update(decode(body))
            except Exception as e:  # a request the Collector could not read: 400
                record["error"] = repr(e)
                step = "400"
            if self.path != PATH:
                step = "404"
            response = service.ExportProfilesServiceResponse()
            headers = {"Content-Type": "application/x-protobuf"}
            if step == "503":
                status, payload = 503, rpc_status(14, "unavailable")
                headers["Retry-After"] = "1"
            elif step in ("400", "404"):
                status, payload = int(step), rpc_status(3, record.get("error", "bad profile"))
            else:
                if step == "partial":
                    response.partial_success.rejected_profiles = 1
                    response.partial_success.error_message = "one profile was too old"
                status, payload = 200, response.SerializeToString()
            record["status"] = status
            record["step"] = step
            with lock:
                out.write(json.dumps(record) + "\n")
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        steps = sys.argv[3].split(",") if len(sys.argv) > 3 and sys.argv[3] else []
        serve(sys.argv[2], steps)
    elif sys.argv[1] == "decode":
        with open(sys.argv[2], "rb") as f:
            print(json.dumps(decode(f.read())))
    else:
        sys.exit(f"unknown command {sys.argv[1]!r}")
