#!/usr/bin/env python3
"""One app publishes a 20 MiB twin/update while another keeps asking twin/get: every get must be
answered, and the oversized request must get its own error result. paho-mqtt.

usage: oversize.py HOST PORT
"""
import json
import queue
import sys
import time

import paho.mqtt.client as mqtt

DEV = "$hw/events/device/default/oven-1"


def connect(host, port, name, inbox=None):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name)
    done = queue.Queue()
    c.on_subscribe = lambda *a: done.put(True)
    if inbox is not None:
        c.on_message = lambda _c, _u, m: inbox.put((m.topic, m.payload))
    c.connect(host, port, keepalive=30)
    c.loop_start()
    if inbox is not None:
        c.subscribe(DEV + "/twin/+/result", qos=1)
        c.subscribe(DEV + "/twin/update/result", qos=1)
        done.get(timeout=10)
        done.get(timeout=10)
    return c


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    inbox = queue.Queue()
    other = connect(host, port, "other-app", inbox)
    big = connect(host, port, "big-app")
    payload = json.dumps({"event_id": "huge", "twin": {"note": {"actual": {"value": "x" * (20 << 20)}}}})
    big.publish(DEV + "/twin/update", payload, qos=1)
    answered, refused = set(), None
    for i in range(20):
        other.publish(DEV + "/twin/get", json.dumps({"event_id": f"get-{i}"}), qos=1)
        time.sleep(0.05)
    deadline = time.time() + 20
    while time.time() < deadline and (len(answered) < 20 or refused is None):
        try:
            topic, body = inbox.get(timeout=0.5)
        except queue.Empty:
            continue
        msg = json.loads(body)
        if topic.endswith("/get/result") and msg.get("event_id", "").startswith("get-"):
            answered.add(msg["event_id"])
        if topic.endswith("/update/result") and msg.get("code") is not None:
            refused = msg
    print(json.dumps({"answered": len(answered), "refused": refused}), flush=True)
    sys.exit(0 if len(answered) == 20 and refused and refused.get("code") in (413,) else 1)


if __name__ == "__main__":
    main()
