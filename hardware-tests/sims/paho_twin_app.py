#!/usr/bin/env python3
"""A `$hw` app written with paho-mqtt as users write them, for mqtt-bench.

It sends QoS 1 `$hw/events/device/default/dev-N/twin/update` with one `actual` value and waits
for each `.../twin/update/result`, matched by `event_id`, keeping `--outstanding` requests in
flight (a new one is published from the callback that received an answer, as an app does).
After `--warmup` seconds it counts for `--seconds`, then prints one JSON line:
{"acked": N, "seconds": S, "latencies_ms": [...]} (the latencies of the counted round trips).

With `--subscriptions N` it subscribes as a KubeEdge app typically does, once per device
(`.../dev-N/twin/update/result` for each of its devices, then other devices' up to N in all,
100 topics per SUBSCRIBE) instead of one wildcard.

  paho_twin_app.py --port 1883 --outstanding 32 --seconds 5 [--devices 1000 --props 10]
"""

import argparse
import json
import sys
import threading
import time

import paho.mqtt.client as mqtt


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--outstanding", type=int, default=1)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--props", type=int, default=10)
    p.add_argument("--offset", type=int, default=0, help="first device, to split devices between apps")
    p.add_argument("--client-id", default="")
    p.add_argument("--subscriptions", type=int, default=0,
                   help="one subscription per device, N in all (0: one wildcard)")
    args = p.parse_args()

    lock = threading.Lock()
    sent = {}  # event_id -> send time
    state = {"n": 0, "counting": False, "acked": 0, "lat": [], "done": False}
    ready = threading.Event()

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=args.client_id)
    client.max_inflight_messages_set(max(20, args.outstanding))

    def send_one():
        with lock:
            n = state["n"]
            state["n"] += 1
        dev = args.offset + n % args.devices
        prop = (n // args.devices) % args.props
        eid = f"{args.client_id}-{n}"
        payload = json.dumps(
            {"event_id": eid, "timestamp": int(time.time() * 1000),
             "twin": {f"p{prop}": {"actual": {"value": str(n % 1000)}}}}
        )
        with lock:
            sent[eid] = time.perf_counter()
        client.publish(f"$hw/events/device/default/dev-{dev}/twin/update", payload, qos=1)

    result = "$hw/events/device/default/{}/twin/update/result"
    if args.subscriptions > 0:
        topics = [result.format(f"dev-{args.offset + d}") for d in range(args.devices)]
        topics += [result.format(f"other-{args.client_id}-{k}")
                   for k in range(max(0, args.subscriptions - args.devices))]
        batches = [topics[i:i + 100] for i in range(0, len(topics), 100)]
    else:
        batches = [["$hw/events/device/+/+/twin/update/result"]]
    pending = {"subacks": len(batches)}

    def on_connect(c, userdata, flags, reason, properties):
        for b in batches:
            c.subscribe([(t, 1) for t in b])

    def on_subscribe(c, userdata, mid, reasons, properties):
        with lock:
            pending["subacks"] -= 1
            if pending["subacks"] == 0:
                ready.set()

    def on_message(c, userdata, msg):
        try:
            eid = json.loads(msg.payload)["event_id"]
        except (ValueError, KeyError):
            return
        now = time.perf_counter()
        with lock:
            t = sent.pop(eid, None)
            if t is None:
                return
            if state["counting"]:
                state["acked"] += 1
                state["lat"].append((now - t) * 1000.0)
            done = state["done"]
        if not done:
            send_one()

    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    client.connect(args.host, args.port, keepalive=30)
    client.loop_start()
    if not ready.wait(10 + args.subscriptions / 1000):
        print(f"{pending['subacks']} SUBACKs missing", file=sys.stderr)
        sys.exit(1)
    for _ in range(args.outstanding):
        send_one()
    time.sleep(args.warmup)
    with lock:
        state["counting"] = True
    started = time.perf_counter()
    time.sleep(args.seconds)
    with lock:
        state["counting"] = False
        state["done"] = True
        elapsed = time.perf_counter() - started
        out = {"acked": state["acked"], "seconds": elapsed, "latencies_ms": state["lat"]}
    client.loop_stop()
    client.disconnect()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
