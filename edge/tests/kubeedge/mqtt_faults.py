#!/usr/bin/env python3
"""What apps do to a broker, with paho-mqtt: a burst, keep-alive 0, a subscriber that stops
reading. Prints one JSON object.

usage: mqtt_faults.py burst|keepalive0|stalled|sameid HOST PORT [EDGECORE_CLIENT_ID]
"""
import json
import queue
import socket
import sys
import time

import paho.mqtt.client as mqtt

DEV = "$hw/events/device/default/oven-1"


def client(name, host, port, keepalive=30, inbox=None, subs=()):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name)
    c.max_queued_messages_set(0)
    c.max_inflight_messages_set(1000)
    done = queue.Queue()
    c.on_subscribe = lambda *a: done.put(True)
    c.on_connect = lambda *a: done.put("connected")
    if inbox is not None:
        c.on_message = lambda _c, _u, m: inbox.put((m.topic, m.payload))
    c.connect(host, port, keepalive=keepalive)
    c.loop_start()
    assert done.get(timeout=10) == "connected"
    for s in subs:
        c.subscribe(s, qos=1)
        done.get(timeout=10)
    return c


def get_answer(c, inbox, event_id, wait):
    c.publish(DEV + "/twin/get", json.dumps({"event_id": event_id}), qos=1)
    deadline = time.time() + wait
    while time.time() < deadline:
        try:
            topic, body = inbox.get(timeout=0.2)
        except queue.Empty:
            continue
        if topic.endswith("/get/result") and json.loads(body).get("event_id") == event_id:
            return True
    return False


def burst(host, port):
    inbox = queue.Queue()
    asker = client("asker", host, port, inbox=inbox, subs=[DEV + "/twin/get/result"])
    flood = client("flood", host, port)
    start = time.time()
    for i in range(10000):
        flood.publish(DEV + "/twin/update",
                      json.dumps({"event_id": f"b{i}", "twin": {"temperature": {"actual": {"value": str(i)}}}}),
                      qos=1)
    sent = time.time() - start
    answered = get_answer(asker, inbox, "after-burst", 30)
    took = time.time() - start
    print(json.dumps({"answered": answered, "publish_s": round(sent, 2), "answer_after_s": round(took, 2)}), flush=True)
    sys.exit(0 if answered else 1)


def keepalive0(host, port):
    inbox = queue.Queue()
    lost = []
    c = client("idle", host, port, keepalive=0, inbox=inbox, subs=[DEV + "/twin/get/result"])
    c.on_disconnect = lambda *a: lost.append(True)
    time.sleep(4)
    answered = get_answer(c, inbox, "after-idle", 10)
    print(json.dumps({"answered": answered, "disconnected": bool(lost)}), flush=True)
    sys.exit(0 if answered and not lost else 1)


def stalled(host, port):
    # A raw MQTT 3.1.1 client that subscribes and then never reads again.
    s = socket.create_connection((host, port))
    cid = b"stalled"
    connect = b"\x00\x04MQTT\x04\x02\x00\x03" + len(cid).to_bytes(2, "big") + cid
    s.sendall(b"\x10" + bytes([len(connect)]) + connect)
    s.recv(4)
    topic = b"rel/#"
    sub = b"\x00\x01" + len(topic).to_bytes(2, "big") + topic + b"\x01"
    s.sendall(b"\x82" + bytes([len(sub)]) + sub)
    s.recv(5)
    pub = client("publisher", host, port)
    payload = b"x" * (1 << 20)
    for i in range(200):
        pub.publish("rel/x", payload, qos=1).wait_for_publish(timeout=30)
    published = time.time()
    # The broker must close the stalled connection (its queue overflowed, or 1.5 x keep-alive).
    closed_after = None
    s.settimeout(0.5)
    while time.time() - published < 20:
        try:
            data = s.recv(1 << 20)
            if not data:
                closed_after = time.time() - published
                break
        except socket.timeout:
            pass
        except OSError:
            closed_after = time.time() - published
            break
    print(json.dumps({"closed_after_s": closed_after}), flush=True)
    sys.exit(0 if closed_after is not None else 1)


def sameid(host, port, edgecore_id="edgecore"):
    # An app that happens to use edgecore's own client id (its mqtt.clientId, "edgecore" by
    # default) must not take the $hw API away from every other app.
    intruder = client(edgecore_id, host, port)
    inbox = queue.Queue()
    asker = client("asker", host, port, inbox=inbox, subs=[DEV + "/twin/get/result"])
    answered = get_answer(asker, inbox, "after-same-id", 10)
    intruder.disconnect()
    print(json.dumps({"answered": answered}), flush=True)
    sys.exit(0 if answered else 1)


if __name__ == "__main__":
    mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    {"burst": burst, "keepalive0": keepalive0, "stalled": stalled, "sameid": sameid}[mode](host, port, *sys.argv[4:])
