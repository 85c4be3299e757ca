#!/usr/bin/env python3
"""An OPC UA server on asyncua (a library the project did not write) shaped like a plant: folders
and objects nested four deep, variables of many types, analog items with EURange and
EngineeringUnits, writable and read-only nodes. Every write a client sends is logged.

  python3 opcua_plant.py PORT WRITES_LOG

Objects/Plant/Line1/Oven: Temperature (Double, 0..300 degC, read-only), Setpoint (Double,
  50..250 degC, writable), Heating (Boolean), Recipe (String, writable)
Objects/Plant/Line1/Press: Strokes (UInt32), Force (Float, 0..500 kN), Mode (Int16, writable)
Objects/Plant/Line2/Tank: Level (Double, 0..10 m), Valve (Boolean, writable), Serial (Int64,
  2^40 + 3), Energy (UInt64, 2^63 + 5), Probes/T1 and Probes/T2 (Double)
Values do not change. Prints "ready" once it listens.
"""
import asyncio
import logging
import sys

from asyncua import Server, ua
from asyncua.common.callback import CallbackType

NAMESPACE = "urn:kubeedge-rs:asyncua-plant"


async def main():
    port = int(sys.argv[1])
    writes = open(sys.argv[2], "a", buffering=1)
    logging.basicConfig(level=logging.ERROR)
    server = Server()
    await server.init()
    server.set_endpoint(f"opc.tcp://127.0.0.1:{port}/plant")
    server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
    ns = await server.register_namespace(NAMESPACE)

    async def folder(parent, name):
        return await parent.add_folder(ua.NodeId(name, ns), ua.QualifiedName(name.split(".")[-1], ns))

    async def obj(parent, name):
        return await parent.add_object(ua.NodeId(name, ns), ua.QualifiedName(name.split(".")[-1], ns))

    async def var(parent, name, value, vtype, writable=False, eu=None):
        node = await parent.add_variable(
            ua.NodeId(name, ns), ua.QualifiedName(name.split(".")[-1], ns), ua.Variant(value, vtype)
        )
        if writable:
            await node.set_writable()
        if eu:
            low, high, unit = eu
            await node.add_property(
                ua.NodeId(name + ".EURange", ns), ua.QualifiedName("EURange", 0), ua.Range(Low=low, High=high)
            )
            info = ua.EUInformation(DisplayName=ua.LocalizedText(unit), Description=ua.LocalizedText(unit))
            await node.add_property(
                ua.NodeId(name + ".EngineeringUnits", ns), ua.QualifiedName("EngineeringUnits", 0), info
            )
        return node

    plant = await folder(server.nodes.objects, "Plant")
    line1 = await folder(plant, "Plant.Line1")
    oven = await obj(line1, "Plant.Line1.Oven")
    # An object's own properties (HasProperty), as the DI companion spec gives devices.
    await oven.add_property(ua.NodeId("Oven.SerialNumber", ns), ua.QualifiedName("SerialNumber", ns), "SN-7781")
    await oven.add_property(ua.NodeId("Oven.Manufacturer", ns), ua.QualifiedName("Manufacturer", ns), "Heatwell")
    await var(oven, "Oven.Temperature", 182.5, ua.VariantType.Double, eu=(0.0, 300.0, "°C"))
    await var(oven, "Oven.Setpoint", 180.0, ua.VariantType.Double, True, eu=(50.0, 250.0, "°C"))
    await var(oven, "Oven.Heating", True, ua.VariantType.Boolean)
    await var(oven, "Oven.Recipe", "BREAD-42", ua.VariantType.String, True)
    press = await obj(line1, "Plant.Line1.Press")
    await var(press, "Press.Strokes", 123456, ua.VariantType.UInt32)
    await var(press, "Press.Force", 412.25, ua.VariantType.Float, eu=(0.0, 500.0, "kN"))
    await var(press, "Press.Mode", -2, ua.VariantType.Int16, True)
    line2 = await folder(plant, "Plant.Line2")
    tank = await obj(line2, "Plant.Line2.Tank")
    await var(tank, "Tank.Level", 7.125, ua.VariantType.Double, eu=(0.0, 10.0, "m"))
    await var(tank, "Tank.Valve", False, ua.VariantType.Boolean, True)
    await var(tank, "Tank.Serial", 2**40 + 3, ua.VariantType.Int64)
    await var(tank, "Tank.Energy", 2**63 + 5, ua.VariantType.UInt64)
    probes = await folder(tank, "Plant.Line2.Tank.Probes")
    await var(probes, "Probes.T1", 21.5, ua.VariantType.Double)
    await var(probes, "Probes.T2", 22.75, ua.VariantType.Double)

    async def on_write(event, dispatcher):
        # The server writes its own status nodes too; a client's writes are external.
        if not event.is_external:
            return
        for v in event.request_params.NodesToWrite:
            writes.write(f"{v.NodeId.to_string()}\n")

    server.subscribe_server_callback(CallbackType.PreWrite, on_write)
    async with server:
        print("ready", flush=True)
        while True:
            await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main())
