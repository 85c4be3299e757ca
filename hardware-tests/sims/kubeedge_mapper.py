#!/usr/bin/env python3
"""DMI peers the way KubeEdge's own code speaks it, on grpcio (a gRPC stack the project did not
write), compiled at start from the project's api/proto/dmi/v1beta1/api.proto.

  mapper:  a mapper written against KubeEdge's mapper-framework contract. It serves
           DeviceMapperService on its own socket, registers with edgecore (MapperRegister,
           withData), reads every field mapper-framework dereferences (property.Desired.Value,
           property.Visitors.ConfigData, device.Spec.Protocol.ConfigData) and decodes configData
           as mapper-framework's DecodeAnyValue does (String, Int32, Float, Bool and Int64
           wrappers; any other type is dropped), reports twins and states, and prints each call
           edgecore makes to it.
  edgecore: KubeEdge's edgecore calling a mapper's DeviceMapperService (GetDevice).
  load:    a mapper's reports as fast as edgecore answers them: ReportDeviceStatus of
           --properties INT values to --devices devices in turn (each value changed every
           round), --inflight calls outstanding on one channel (--api aio: grpc.aio; sync:
           the synchronous stub's futures), for --seconds;
           prints {"reports": N, "errors": {code: N}, "seconds": S, "per_second": R,
           "p50_ms", "p99_ms"}.

--authority sets the HTTP/2 :authority the client sends: "default" is grpcio's own form for a
Unix socket, and grpc-go's forms are the raw path and the percent-encoded path. Everything is
printed as one JSON object per line; "ready" once the mapper has registered.
"""
import argparse
import atexit
import json
import os
import shutil
import struct
import sys
import tempfile
import threading
import time
import urllib.parse


def load_proto(proto_root):
    from grpc_tools import protoc
    import grpc_tools

    out = tempfile.mkdtemp(prefix="dmi-proto-")
    # The generated modules are only needed until they are imported and in use: gone at exit.
    atexit.register(shutil.rmtree, out, True)
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    rc = protoc.main([
        "protoc", f"-I{proto_root}", f"-I{include}",
        f"--python_out={out}", f"--grpc_python_out={out}",
        "dmi/v1beta1/api.proto",
    ])
    if rc != 0:
        sys.exit(f"protoc failed on {proto_root}/dmi/v1beta1/api.proto")
    sys.path.insert(0, out)
    from dmi.v1beta1 import api_pb2, api_pb2_grpc
    return api_pb2, api_pb2_grpc


def emit(obj):
    print(json.dumps(obj, sort_keys=True), flush=True)


def float32_text(v):
    """Go's JSON form of a float32: the shortest decimal that reads back as the same float32."""
    packed = struct.pack("<f", v)
    for digits in range(1, 10):
        text = "%.*g" % (digits, v)
        if struct.pack("<f", float(text)) == packed:
            return float(text)
    return v


def decode_any(any_msg):
    """mapper-framework's DecodeAnyValue: (value, None) or (None, type it drops)."""
    from google.protobuf import wrappers_pb2

    kinds = {
        "google.protobuf.StringValue": wrappers_pb2.StringValue,
        "google.protobuf.Int32Value": wrappers_pb2.Int32Value,
        "google.protobuf.FloatValue": wrappers_pb2.FloatValue,
        "google.protobuf.BoolValue": wrappers_pb2.BoolValue,
        "google.protobuf.Int64Value": wrappers_pb2.Int64Value,
    }
    name = any_msg.type_url.rsplit("/", 1)[-1]
    kind = kinds.get(name)
    if kind is None:
        return None, name
    msg = kind()
    any_msg.Unpack(msg)
    value = msg.value
    if name == "google.protobuf.FloatValue":
        value = float32_text(value)
    return value, None


def config_data(customized):
    data, dropped = {}, []
    for key in sorted(customized.data):
        value, lost = decode_any(customized.data[key])
        if lost is None:
            data[key] = value
        else:
            dropped.append(f"{key}:{lost}")
    return data, dropped


def device_view(device):
    """What mapper-framework's parse reads of a device; a missing message is recorded, not
    skipped, since Go would dereference nil there."""
    spec = device.spec
    protocol, dropped = config_data(spec.protocol.configData)
    props = []
    for p in spec.properties:
        visitor, vdropped = config_data(p.visitors.configData)
        props.append({
            "name": p.name,
            "has_desired": p.HasField("desired"),
            "has_visitors": p.HasField("visitors"),
            "desired": p.desired.value,
            "visitor_protocol": p.visitors.protocolName,
            "visitor_config": visitor,
            "dropped": vdropped,
            "collect_cycle": p.collectCycle,
            "report_cycle": p.reportCycle,
        })
    return {
        "name": device.name,
        "namespace": device.namespace,
        "model": spec.deviceModelReference,
        "has_protocol": spec.HasField("protocol"),
        "protocol_name": spec.protocol.protocolName,
        "protocol_config": protocol,
        "protocol_dropped": dropped,
        "properties": props,
    }


def channel_for(socket, authority):
    import grpc

    options = []
    if authority == "raw":
        options.append(("grpc.default_authority", socket))
    elif authority == "percent":
        options.append(("grpc.default_authority", urllib.parse.quote(socket, safe="")))
    elif authority != "default":
        options.append(("grpc.default_authority", authority))
    return grpc.insecure_channel("unix:" + socket, options=options)


def run_mapper(args, pb, pb_grpc):
    import grpc
    from concurrent import futures

    class MapperService(pb_grpc.DeviceMapperServiceServicer):
        def RegisterDevice(self, request, context):
            emit({"call": "RegisterDevice", "device": device_view(request.device)})
            return pb.RegisterDeviceResponse(deviceName=request.device.name,
                                             deviceNamespace=request.device.namespace)

        def UpdateDevice(self, request, context):
            emit({"call": "UpdateDevice", "device": device_view(request.device)})
            return pb.UpdateDeviceResponse()

        def RemoveDevice(self, request, context):
            emit({"call": "RemoveDevice", "name": request.deviceName,
                  "namespace": request.deviceNamespace})
            return pb.RemoveDeviceResponse()

        def CreateDeviceModel(self, request, context):
            emit({"call": "CreateDeviceModel", "model": request.model.name})
            return pb.CreateDeviceModelResponse(deviceModelName=request.model.name,
                                                deviceModelNamespace=request.model.namespace)

        def UpdateDeviceModel(self, request, context):
            emit({"call": "UpdateDeviceModel", "model": request.model.name})
            return pb.UpdateDeviceModelResponse()

        def RemoveDeviceModel(self, request, context):
            emit({"call": "RemoveDeviceModel", "model": request.modelName})
            return pb.RemoveDeviceModelResponse()

        def GetDevice(self, request, context):
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "not kept by this test mapper")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_DeviceMapperServiceServicer_to_server(MapperService(), server)
    if os.path.exists(args.own_socket):
        os.unlink(args.own_socket)
    server.add_insecure_port("unix:" + args.own_socket)
    server.start()

    stub = pb_grpc.DeviceManagerServiceStub(channel_for(args.socket, args.authority))
    info = pb.MapperInfo(name=args.name, version="v1.13.0", api_version="v1.0.0",
                         protocol=args.protocol, address=args.own_socket.encode(), state="ok")
    # mapper-framework gives MapperRegister 1 s and exits (klog.Fatal) when it fails.
    try:
        resp = stub.MapperRegister(pb.MapperRegisterRequest(withData=True, mapper=info), timeout=5)
    except grpc.RpcError as e:
        emit({"event": "register_failed", "code": e.code().name, "details": e.details()})
        sys.exit(3)
    emit({"event": "registered",
          "devices": [device_view(d) for d in resp.deviceList],
          "models": [m.name for m in resp.modelList]})

    # Commands on stdin, one JSON object a line, each answered on stdout.
    print("ready", flush=True)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        cmd = json.loads(line)
        try:
            if cmd["op"] == "report":
                twins = [pb.Twin(propertyName=name,
                                 reported=pb.TwinProperty(value=value,
                                                          metadata={"type": "string",
                                                                    "timestamp": str(int(time.time() * 1000))}),
                                 observedDesired=pb.TwinProperty(value=cmd.get("desired", {}).get(name, "")))
                         for name, value in cmd["twins"].items()]
                stub.ReportDeviceStatus(pb.ReportDeviceStatusRequest(
                    deviceName=cmd["device"], deviceNamespace=cmd.get("namespace", "default"),
                    reportedDevice=pb.DeviceStatus(twins=twins)), timeout=5)
            elif cmd["op"] == "state":
                stub.ReportDeviceStates(pb.ReportDeviceStatesRequest(
                    deviceName=cmd["device"], deviceNamespace=cmd.get("namespace", "default"),
                    state=cmd["state"]), timeout=5)
            emit({"reply": cmd["op"], "code": "OK"})
        except grpc.RpcError as e:
            emit({"reply": cmd["op"], "code": e.code().name, "details": e.details()})
    server.stop(0)


def run_edgecore(args, pb, pb_grpc):
    import grpc

    stub = pb_grpc.DeviceMapperServiceStub(channel_for(args.socket, args.authority))
    try:
        resp = stub.GetDevice(pb.GetDeviceRequest(deviceName=args.device,
                                                  deviceNamespace=args.namespace), timeout=5)
        emit({"call": "GetDevice", "code": "OK", "device": device_view(resp.device)})
    except grpc.RpcError as e:
        emit({"call": "GetDevice", "code": e.code().name, "details": e.details()})


def load_request(args, pb):
    props = [f"p{i}" for i in range(args.properties)]

    def request(n):
        device = n % args.devices
        value = str(n // args.devices)
        twins = [pb.Twin(propertyName=p,
                         reported=pb.TwinProperty(value=value, metadata={"type": "int"}))
                 for p in props]
        return pb.ReportDeviceStatusRequest(
            deviceName=f"{args.prefix}{device}", deviceNamespace=args.namespace,
            reportedDevice=pb.DeviceStatus(twins=twins))
    return request


def load_result(latencies, errors, elapsed):
    latencies.sort()
    done = len(latencies)
    pick = lambda q: latencies[min(done - 1, int(q * done))] * 1000 if done else None
    emit({"reports": done, "errors": errors, "seconds": round(elapsed, 3),
          "per_second": round(done / elapsed) if elapsed else 0,
          "p50_ms": pick(0.5), "p99_ms": pick(0.99)})


def run_load_sync(args, pb, pb_grpc):
    """The synchronous API's futures (stub.Method.future), as a threaded Python mapper would."""
    import grpc

    stub = pb_grpc.DeviceManagerServiceStub(channel_for(args.socket, args.authority))
    request = load_request(args, pb)
    window = threading.Semaphore(args.inflight)
    lock = threading.Lock()
    latencies, errors = [], {}
    measuring = [False]

    def finished(f, t0):
        took = time.perf_counter() - t0
        code = None
        try:
            f.result()
        except grpc.RpcError as e:
            code = e.code().name
        with lock:
            if measuring[0]:
                latencies.append(took)
                if code:
                    errors[code] = errors.get(code, 0) + 1
        window.release()

    n = 0
    begin = time.perf_counter()
    start = begin + args.warmup
    end = start + args.seconds
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        if not measuring[0] and now >= start:
            with lock:
                measuring[0] = True
        window.acquire()
        t0 = time.perf_counter()
        f = stub.ReportDeviceStatus.future(request(n), timeout=10)
        f.add_done_callback(lambda f, t0=t0: finished(f, t0))
        n += 1
    for _ in range(args.inflight):
        window.acquire()
    with lock:
        load_result(latencies, errors, time.perf_counter() - start)


def run_load(args, pb, pb_grpc):
    import asyncio
    import grpc

    if args.api == "sync":
        return run_load_sync(args, pb, pb_grpc)

    async def go():
        options = []
        if args.authority not in ("default",):
            options.append(("grpc.default_authority", args.authority))
        async with grpc.aio.insecure_channel("unix:" + args.socket, options=options) as ch:
            stub = pb_grpc.DeviceManagerServiceStub(ch)
            request = load_request(args, pb)

            counter = [0]
            latencies = []
            errors = {}
            loop = asyncio.get_running_loop()
            end = [loop.time() + args.warmup + args.seconds]
            start = [None]

            begin = loop.time()

            async def worker():
                while True:
                    now = loop.time()
                    if now >= end[0]:
                        return
                    n = counter[0]
                    counter[0] += 1
                    if args.rate > 0:
                        # Paced: report n is due n/rate seconds after the start, so every
                        # device reports once each devices/rate seconds, as a polling mapper does.
                        delay = begin + n / args.rate - loop.time()
                        if delay > 0:
                            await asyncio.sleep(delay)
                    t0 = time.perf_counter()
                    try:
                        await stub.ReportDeviceStatus(request(n), timeout=10)
                        code = None
                    except grpc.RpcError as e:
                        code = e.code().name
                    if start[0] is not None:
                        latencies.append(time.perf_counter() - t0)
                        if code:
                            errors[code] = errors.get(code, 0) + 1

            async def measure():
                await asyncio.sleep(args.warmup)
                start[0] = loop.time()

            await asyncio.gather(measure(), *[worker() for _ in range(args.inflight)])
            load_result(latencies, errors, loop.time() - start[0])

    asyncio.run(go())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--proto", required=True, help="the folder holding dmi/v1beta1/api.proto")
    parser.add_argument("--authority", default="default",
                        help="default (grpcio's own), raw, percent, or a literal value")
    sub = parser.add_subparsers(dest="role", required=True)
    m = sub.add_parser("mapper")
    m.add_argument("--socket", required=True, help="edgecore's DMI socket")
    m.add_argument("--own-socket", required=True)
    m.add_argument("--name", default="kubeedge-mapper")
    m.add_argument("--protocol", default="modbus")
    e = sub.add_parser("edgecore")
    e.add_argument("--socket", required=True, help="the mapper's socket")
    e.add_argument("--device", required=True)
    e.add_argument("--namespace", default="default")
    ld = sub.add_parser("load")
    ld.add_argument("--socket", required=True, help="edgecore's DMI socket")
    ld.add_argument("--devices", type=int, default=1000)
    ld.add_argument("--properties", type=int, default=1)
    ld.add_argument("--prefix", default="dev-", help="device names: PREFIX0, PREFIX1, ...")
    ld.add_argument("--namespace", default="default")
    ld.add_argument("--inflight", type=int, default=16)
    ld.add_argument("--rate", type=float, default=0,
                    help="reports per second in all (aio only; 0: as fast as they are answered)")
    ld.add_argument("--seconds", type=float, default=5)
    ld.add_argument("--warmup", type=float, default=1)
    ld.add_argument("--api", choices=["aio", "sync"], default="aio",
                    help="grpc.aio coroutines, or the synchronous API's futures")
    args = parser.parse_args()
    pb, pb_grpc = load_proto(args.proto)
    if args.role == "mapper":
        run_mapper(args, pb, pb_grpc)
    elif args.role == "load":
        run_load(args, pb, pb_grpc)
    else:
        run_edgecore(args, pb, pb_grpc)


if __name__ == "__main__":
    main()
