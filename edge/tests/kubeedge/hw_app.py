#!/usr/bin/env python3
"""A KubeEdge-style MQTT app on paho-mqtt (a client the project did not write): runs the flows
of hw_payloads.json against a broker edgecore serves, and compares every message field by field
and in order. Prints one JSON line per flow ({"flow", "ok", "problems"}) and exits 1 when any
flow failed.

usage: hw_app.py TABLE HOST PORT MANIFESTS_DIR
"""
import json
import os
import queue
import re
import sys
import time

import paho.mqtt.client as mqtt

REQUEST_SUFFIXES = ("/twin/update", "/twin/get", "/state/update", "/membership/get")
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
MISSING = object()


def lookup(doc, path):
    cur = doc
    for part in path.split("."):
        if isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return MISSING
    return cur


def check(want, got):
    """None when `got` matches `want`, else what is wrong."""
    if want == "<absent>":
        return None if got is MISSING else f"should be absent, is {got!r}"
    if got is MISSING:
        return "is missing"
    if want == "<any>":
        return None
    kinds = {
        "<int>": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "<str>": lambda v: isinstance(v, str),
        "<bool>": lambda v: isinstance(v, bool),
        "<object>": lambda v: isinstance(v, dict),
        "<null>": lambda v: v is None,
        "<rfc3339>": lambda v: isinstance(v, str) and bool(RFC3339.match(v)),
    }
    if isinstance(want, str) and want in kinds:
        return None if kinds[want](got) else f"should be {want}, is {got!r}"
    if isinstance(want, str) and want.startswith("<not:"):
        other = want[5:-1]
        return None if isinstance(got, str) and got != other else f"should be a string other than {other!r}, is {got!r}"
    return None if got == want else f"should be {want!r}, is {got!r}"


def main():
    table_path, host, port, manifests = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    with open(table_path) as f:
        table = json.load(f)
    inbox = queue.Queue()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"kubeedge-app-{os.getpid()}")

    def on_message(_client, _userdata, msg):
        if msg.topic.endswith(REQUEST_SUFFIXES):
            return  # our own requests, echoed by the subscription
        try:
            body = json.loads(msg.payload)
        except ValueError:
            body = {"<not JSON>": msg.payload.decode("utf-8", "replace")}
        inbox.put((msg.topic, body))

    subscribed = queue.Queue()
    client.on_message = on_message
    client.on_subscribe = lambda *args: subscribed.put(True)
    client.connect(host, port, keepalive=30)
    client.loop_start()
    client.subscribe("$hw/events/#", qos=1)
    subscribed.get(timeout=10)

    watched = {e["topic"] for flow in table["flows"] for e in flow["expect"]}
    failed = False
    for n, flow in enumerate(table["flows"]):
        problems = []
        if "write_manifest" in flow:
            w = flow["write_manifest"]
            tmp = os.path.join(manifests, "." + w["file"] + ".tmp")
            with open(tmp, "w") as f:
                f.write(w["content"])
            os.rename(tmp, os.path.join(manifests, w["file"]))
        if "publish" in flow:
            p = flow["publish"]
            payload = p["raw"] if "raw" in p else json.dumps(p["payload"])
            client.publish(p["topic"], payload, qos=1)
        # The expected messages, in order.
        expected = list(flow["expect"])
        seen = []
        deadline = time.time() + 15
        while expected and time.time() < deadline:
            try:
                topic, body = inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            seen.append(topic)
            if topic != expected[0]["topic"]:
                if topic in watched:
                    problems.append(f"unexpected {topic} while waiting for {expected[0]['topic']}: {body}")
                continue
            want = expected.pop(0)
            for path, value in want["fields"].items():
                why = check(value, lookup(body, path))
                if why:
                    problems.append(f"{topic}: {path} {why} (in {json.dumps(body)})")
        for e in expected:
            problems.append(f"no {e['topic']} (saw {seen})")
        # Barrier: nothing else on the watched topics before the answer to this get.
        barrier = f"barrier-{n}"
        client.publish("$hw/events/device/default/oven-1/twin/get",
                       json.dumps({"event_id": barrier, "timestamp": 0}), qos=1)
        deadline = time.time() + 15
        while time.time() < deadline:
            try:
                topic, body = inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            if isinstance(body, dict) and body.get("event_id") == barrier:
                break
            if topic in watched:
                problems.append(f"unexpected extra {topic}: {json.dumps(body)}")
        else:
            problems.append("no answer to the barrier twin/get")
        failed = failed or bool(problems)
        print(json.dumps({"flow": flow["flow"], "ok": not problems, "problems": problems}), flush=True)
    client.loop_stop()
    client.disconnect()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
