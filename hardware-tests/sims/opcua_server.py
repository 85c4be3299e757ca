#!/usr/bin/env python3
"""An OPC UA server on the third-party python asyncua library, for the end-to-end tests and the
bench: typed variables in namespace urn:kubeedge-rs:asyncua-sim (index 2) under Objects/Line1,
and a task that changes some of them.

  python3 opcua_server.py PORT [TAGS]

Variables (ns=2;s=...):
  Speed    Double, writable          Count   Int32, writable
  Running  Boolean                   Batch   String, writable
  Locked   Double, read-only (writes are refused by the server)
  Clock    Double: the server's time in ms since the epoch, set every 100 ms
  Tick     Int32: +1 every 100 ms
  Stamp    DateTime, writable        Levels  Double[3], writable
  Tag0..TagN-1  Double, writable (TAGS of them, default 0)
Prints "ready" once it listens.
"""
import asyncio
import datetime
import logging
import sys
import time

from asyncua import Server, ua

NAMESPACE = "urn:kubeedge-rs:asyncua-sim"


async def main():
    port = int(sys.argv[1])
    tags = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    logging.basicConfig(level=logging.WARNING)
    server = Server()
    await server.init()
    server.set_endpoint(f"opc.tcp://127.0.0.1:{port}/")
    server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
    ns = await server.register_namespace(NAMESPACE)
    line = await server.nodes.objects.add_object(ua.NodeId("Line1", ns), ua.QualifiedName("Line1", ns))

    async def var(name, value, vtype, writable=False):
        node = await line.add_variable(ua.NodeId(name, ns), ua.QualifiedName(name, ns), ua.Variant(value, vtype))
        if writable:
            await node.set_writable()
        return node

    await var("Speed", 120.5, ua.VariantType.Double, True)
    await var("Count", 7, ua.VariantType.Int32, True)
    await var("Running", True, ua.VariantType.Boolean)
    await var("Batch", "B-0001", ua.VariantType.String, True)
    await var("Locked", 1.5, ua.VariantType.Double)
    clock = await var("Clock", time.time() * 1000.0, ua.VariantType.Double)
    tick = await var("Tick", 0, ua.VariantType.Int32)
    await var("Stamp", datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc), ua.VariantType.DateTime, True)
    await var("Levels", [0.5, 1.5, 2.5], ua.VariantType.Double, True)
    for k in range(tags):
        await var(f"Tag{k}", float(k), ua.VariantType.Double, True)

    async with server:
        print("ready", flush=True)
        n = 0
        while True:
            await asyncio.sleep(0.1)
            n += 1
            await clock.write_value(ua.Variant(time.time() * 1000.0, ua.VariantType.Double))
            await tick.write_value(ua.Variant(n, ua.VariantType.Int32))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
